"""vlens with the tools researchers pair it with: nnsight traces with several invokes (`vlens.interop.nnsight`).
Needs the `nnsight` extra."""
