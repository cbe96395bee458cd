"""The studies behind the paper's tables, on the embedded model (apart from the library: nothing
in vlens imports them).

- `ablation`: the cross-task ablation study on the synthetic task suites (`vlens ablate`).
- `interventions`: baseline / +SFT / +SFT+L_focus / +SFT+L_focus+beta (`vlens study`).
- `object_tokens`: object-token ablation vs random and high-norm tokens (`vlens study object-tokens`).
- `flow`: attention knockout of image / question / object -> final over layer windows (`vlens study flow`).
- `cli`: their commands.
"""
