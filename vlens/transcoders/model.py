"""The transcoder module: per-layer encoders, decoders to the same (PLT) or every later (CLT) layer.

Shapes (m covered layers, d = d_model, f = d_tc):
    W_enc [m, d, f], b_enc [m, f], threshold [m, f] (JumpReLU only)
    W_dec[i] [f, n_targets(i), d]   (PLT / skip: 1 target, layer i itself; CLT: layers i..m-1)
    b_dec [m, d], W_skip [m, d, d]  (skip only: ``out_j += x_j @ W_skip[j]``)

Layer j's reconstruction of the MLP output is ``sum_{i <= j writing j} acts_i @ W_dec[i][:, j - i] + b_dec[j]``
(+ the skip term). A feature's activation equals its pre-activation wherever it is active (ReLU,
TopK after ReLU and JumpReLU all pass it unchanged), which is what makes attribution graphs exact.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from jaxtyping import Float
from torch import Tensor, nn

from vlens.sae.architectures import jump_gate
from vlens.sae.config import torch_dtype
from vlens.transcoders.config import TranscoderConfig
from vlens.utils.errors import UserInputError


class Transcoders(nn.Module):
    """A set of MLP transcoders (see the module doc); `cfg` says which kind."""

    def __init__(self, cfg: TranscoderConfig):
        super().__init__()
        self.cfg = cfg
        m, d, f = cfg.n_layers, cfg.d_model, cfg.d_tc
        dtype = torch_dtype(cfg.dtype)
        self.W_enc = nn.Parameter(torch.zeros(m, d, f, dtype=dtype))
        self.b_enc = nn.Parameter(torch.zeros(m, f, dtype=dtype))
        self.W_dec = nn.ParameterList([nn.Parameter(torch.zeros(f, len(cfg.targets(i)), d, dtype=dtype))
                                       for i in range(m)])
        self.b_dec = nn.Parameter(torch.zeros(m, d, dtype=dtype))
        self.threshold = nn.Parameter(torch.zeros(m, f, dtype=dtype)) if cfg.activation == "jumprelu" else None
        self.W_skip = nn.Parameter(torch.zeros(m, d, d, dtype=dtype)) if cfg.kind == "skip" else None
        self.bandwidth: float | None = None  # set while training JumpReLU: the gate's pseudo-derivative width

    @property
    def dtype(self) -> torch.dtype:
        return self.W_enc.dtype

    def extra_repr(self) -> str:
        c = self.cfg
        return f"{c.kind} {c.activation}: layers={list(c.layers)}, d_model={c.d_model}, d_tc={c.d_tc}"

    # ------------------------------------------------------------------ encoding
    def pre_acts(self, i: int, x: Float[Tensor, "... d_model"]) -> Float[Tensor, "... d_tc"]:
        """Pre-activations of covered layer index `i`: ``x @ W_enc[i] + b_enc[i]``."""
        return x.to(self.dtype) @ self.W_enc[i] + self.b_enc[i]

    def activate(self, i: int, pre: Float[Tensor, "... d_tc"]) -> Float[Tensor, "... d_tc"]:
        activation = self.cfg.activation
        if activation == "relu":
            return torch.relu(pre)
        if activation == "topk":
            values, indices = torch.topk(pre, self.cfg.k, dim=-1, sorted=False)
            return torch.zeros_like(pre).scatter(-1, indices, torch.relu(values))
        assert self.threshold is not None
        if self.bandwidth is not None and self.training:
            return torch.relu(pre) * jump_gate(pre, self.threshold[i], self.bandwidth)
        return torch.relu(pre) * (pre > self.threshold[i]).to(pre)

    def encode(self, i: int, x: Float[Tensor, "... d_model"]) -> Float[Tensor, "... d_tc"]:
        """Feature activations of covered layer index `i` from that layer's MLP input."""
        return self.activate(i, self.pre_acts(i, x))

    # ------------------------------------------------------------------ decoding
    def writers(self, j: int) -> list[int]:
        """The covered layer indices whose features write layer index `j`."""
        return [i for i in range(j + 1) if j in self.cfg.targets(i)]

    def decoder(self, i: int, j: int) -> Float[Tensor, "d_tc d_model"]:
        """Layer index i's decoder into layer index j."""
        return self.W_dec[i][:, j - i]

    def decode(self, j: int, acts: Sequence[Tensor | None], x: Tensor | None = None) -> Float[Tensor, "... d_model"]:
        """Layer index `j`'s reconstruction of its MLP output.

        acts: feature activations per covered layer index (at least those that write j; [..., d_tc]).
        x: layer j's MLP input, for the skip term (needed by kind "skip").
        """
        out: Tensor = self.b_dec[j]
        for i in self.writers(j):
            a = acts[i]
            if a is None:
                raise RuntimeError(f"decoding layer index {j} needs the activations of layer index {i}")
            out = out + a.to(self.dtype) @ self.decoder(i, j)
        if self.W_skip is not None:
            if x is None:
                raise UserInputError("a skip transcoder's output needs its MLP input (x) for the skip term.")
            out = out + self.skip(j, x)
        return out

    def skip(self, j: int, x: Float[Tensor, "... d_model"]) -> Float[Tensor, "... d_model"]:
        """The skip term ``x @ W_skip[j]`` (zeros without a skip connection)."""
        if self.W_skip is None:
            return torch.zeros_like(x, dtype=self.dtype)
        return x.to(self.dtype) @ self.W_skip[j]

    def forward(self, xs: Sequence[Tensor]) -> tuple[list[Tensor], list[Tensor]]:
        """(reconstructions, activations) per covered layer from each layer's MLP input ``[..., d_model]``."""
        if len(xs) != self.cfg.n_layers:
            raise UserInputError(f"expected {self.cfg.n_layers} MLP inputs (one per covered layer), got {len(xs)}.")
        acts = [self.encode(i, x) for i, x in enumerate(xs)]
        return [self.decode(j, acts, xs[j]) for j in range(len(xs))], acts

    def decoder_norms(self, i: int) -> Float[Tensor, "d_tc"]:
        """Each feature's decoder norm over every layer it writes (the L1 penalty's weights)."""
        return self.W_dec[i].pow(2).sum(dim=(1, 2)).sqrt()

    # ------------------------------------------------------------------ helpers
    @torch.no_grad()
    def initialize(self, generator: torch.Generator | None = None, decoder_norm: float = 0.1) -> Transcoders:
        """Decoder rows uniform on a sphere of radius `decoder_norm` (split over the layers a CLT feature
        writes), encoders random with unit-variance pre-activations for unit inputs, biases zero."""
        d, f = self.cfg.d_model, self.cfg.d_tc
        for i in range(self.cfg.n_layers):
            n = self.W_dec[i].shape[1]
            w = torch.randn(f, n, d, generator=generator)
            self.W_dec[i].copy_(w / w.norm(dim=-1, keepdim=True) * decoder_norm / n ** 0.5)
            self.W_enc[i].copy_(torch.randn(d, f, generator=generator) / d ** 0.5)
        self.b_enc.zero_()
        self.b_dec.zero_()
        if self.W_skip is not None:
            self.W_skip.zero_()
        return self

    def state(self) -> dict[str, Tensor]:
        """The parameters as flat tensors (``W_dec.{i}`` per layer index): what vlens's file holds."""
        return {name: value.detach().contiguous() for name, value in self.state_dict().items()}

    def load_state(self, state: dict[str, Tensor]) -> None:
        expected = self.state_dict()
        if set(state) != set(expected):
            raise UserInputError(f"transcoder weights hold {sorted(state)} but this {self.cfg.kind} / "
                                 f"{self.cfg.activation} set needs {sorted(expected)}.")
        for name, value in expected.items():
            if tuple(state[name].shape) != tuple(value.shape):
                raise UserInputError(f"transcoder weight {name} has shape {tuple(state[name].shape)}, the config "
                                     f"needs {tuple(value.shape)}.")
        self.load_state_dict({k: v.to(self.dtype) for k, v in state.items()})
