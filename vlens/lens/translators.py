"""Per-layer affine translators (tuned-lens form) into the final residual space.

``T_l(h) = h + A_l h + b_l``, zero-initialised (so an untrained lens is the logit lens).
``T_l`` maps the residual stream *after* block l (``blocks.{l}.hook_resid_post``) to the
final residual (before ``ln_final``); heads of layer l are decoded through ``T_l`` because
their contribution is part of resid_post of l. Training minimises, per layer,

    KL( softmax(final logits) || softmax(readout(T_l(resid_post_l))) )

over residuals of a corpus (``vlens.lens.corpus``: task-suite images + questions through
``model.prepare``), with a held-out split for early stopping. Training positions default to
all *text* positions (non-image, non-padding): HeadLens reads heads at text positions (the
final one by default), and image positions, most of a VLM prompt, would otherwise dominate
the fit; ``positions="final"`` trains on the final positions only, ``"all"`` on everything.
Saved as a directory: ``config.json`` (layers, d_model, model name, unembedding hash,
training report) + ``translators.safetensors`` (``A`` [L, d, d], ``b`` [L, d]).
"""

from __future__ import annotations

import json
import math
import warnings
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from jaxtyping import Float
from safetensors.torch import save_file
from torch import Tensor, nn
from tqdm.auto import tqdm

from vlens.lens.base import Lens
from vlens.lens.kl import TargetTerms, layer_kl
from vlens.lens.readout import LensReadout, unembedding_hash
from vlens.utils.errors import UserInputError
from vlens.utils.fileio import atomic_folder, load_float_tensors, read_json_file
from vlens.utils.finite import finite_rows, warn_non_finite
from vlens.utils.provenance import stamp
from vlens.utils.results import Result, own_fields
from vlens.utils.validation import check_count, check_float
from vlens.viz.optional import require_plotly

if TYPE_CHECKING:
    from vlens.core.model import HookedVLM


CONFIG_FILE = "config.json"
WEIGHTS_FILE = "translators.safetensors"
FORMAT_VERSION = 1


class LensMismatchError(UserInputError):
    """A saved lens was made for another model (different unembedding or shapes)."""


class Translators(nn.Module):
    """One affine translator per layer: ``T_l(h) = h + h @ A_l^T + b_l``.

    Attributes:
        A: ``[n_layers, d_model, d_model]`` (zero at init), b: ``[n_layers, d_model]`` (zero).
        info: dict saved in config.json (model_name, unembed_hash, training report, ...).
    """

    def __init__(self, n_layers: int, d_model: int, info: dict | None = None):
        super().__init__()
        if n_layers < 1 or d_model < 1:
            raise UserInputError(f"n_layers and d_model must be positive, got {n_layers}, {d_model}")
        self.A = nn.Parameter(torch.zeros(n_layers, d_model, d_model))
        self.b = nn.Parameter(torch.zeros(n_layers, d_model))
        self.info: dict = dict(info or {})
        self.provenance: dict | None = None  # how a loaded lens was made (vlens.utils.provenance)

    @classmethod
    def for_model(cls, model: HookedVLM) -> Translators:
        """Identity translators for `model`, stamped with its name and unembedding hash."""
        cfg = model.cfg
        info = {"model_name": cfg.model_name or cfg.architecture, "unembed_hash": unembedding_hash(model)}
        return cls(cfg.n_layers, cfg.d_model, info).to(model.unembed.device)

    @property
    def n_layers(self) -> int:
        return self.A.shape[0]

    @property
    def d_model(self) -> int:
        return self.A.shape[1]

    def linear(self, h: Float[Tensor, "... d_model"], layer: int) -> Float[Tensor, "... d_model"]:
        """The linear part ``h + A_l h`` (what each additive component of the residual gets)."""
        h = h.to(self.A.dtype)
        return h + h @ self.A[layer].T

    def forward(self, h: Float[Tensor, "... d_model"], layer: int) -> Float[Tensor, "... d_model"]:
        """``T_l(h) = h + A_l h + b_l``."""
        return self.linear(h, layer) + self.b[layer]

    def forward_all(self, h: Float[Tensor, "... n_layers d_model"]) -> Float[Tensor, "... n_layers d_model"]:
        """Every layer's translator on its own residual: ``h[..., l, :] -> T_l(h[..., l, :])``."""
        h = h.to(self.A.dtype)
        return h + torch.einsum("...lj,lij->...li", h, self.A) + self.b

    # ---------------------------------------------------------------- checks
    def check_model(self, model: HookedVLM) -> None:
        """Raise `LensMismatchError` unless this lens was made for `model`."""
        cfg = model.cfg
        if (cfg.n_layers, cfg.d_model) != (self.n_layers, self.d_model):
            raise LensMismatchError(
                f"this lens has {self.n_layers} layers x d_model {self.d_model} but the model has "
                f"{cfg.n_layers} x {cfg.d_model}: train a lens for this model (`vlens lens train`)."
            )
        expected = self.info.get("unembed_hash")
        actual = unembedding_hash(model)
        if expected is not None and expected != actual:
            raise LensMismatchError(
                f"this lens was trained for model {self.info.get('model_name')!r} (unembedding hash {expected}) "
                f"but the model's unembedding hash is {actual}: the lens would decode into the wrong "
                "vocabulary space. Train a lens for this model with `vlens lens train --model ...`."
            )

    # ---------------------------------------------------------------- save / load
    def save(self, folder: str | Path, overwrite: bool = False) -> Path:
        """Write ``config.json`` + ``translators.safetensors`` as `folder`, whole or not at all
        (`vlens.utils.fileio.atomic_folder`); replacing an existing lens folder needs `overwrite`."""


        with atomic_folder(folder, overwrite=overwrite, name="lens folder") as out:
            config = stamp(self.to_dict())  # a loaded lens keeps how it was made; a new one gets its provenance
            (out / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
            save_file({"A": self.A.detach().float().cpu().contiguous(),
                       "b": self.b.detach().float().cpu().contiguous()}, str(out / WEIGHTS_FILE))
        return Path(folder)

    kind = "lens"  # what config.json records as "kind" (`vlens.load_result` of a `vlens lens train` folder)

    def to_dict(self) -> dict:
        """What config.json holds: kind, format version, shape and `info`, and the provenance of a loaded lens."""
        made = getattr(self, "provenance", None)
        return {"kind": self.kind, "format_version": FORMAT_VERSION, "n_layers": self.n_layers,
                "d_model": self.d_model, **self.info, **({"provenance": made} if made is not None else {})}

    @classmethod
    def load(cls, folder: str | Path, model: HookedVLM | None = None, device=None) -> Translators:
        """Read a saved lens (its folder, or the folder's config.json); with `model`, check it belongs
        to that model (`LensMismatchError`)."""
        folder = Path(folder)
        if folder.name == CONFIG_FILE and folder.is_file():
            folder = folder.parent
        for name in (CONFIG_FILE, WEIGHTS_FILE):
            if not (folder / name).is_file():
                raise FileNotFoundError(f"{folder} holds no {name}: is it a folder written by Translators.save "
                                        "or `vlens lens train --out`?")
        config = read_json_file(folder / CONFIG_FILE, "the lens config", "save the lens again (vlens lens train)")
        tensors = load_float_tensors(folder / WEIGHTS_FILE, "the lens weights", "save the lens again (vlens lens train)")
        n_layers, d_model = int(config.pop("n_layers")), int(config.pop("d_model"))
        config.pop("format_version", None)
        config.pop("kind", None)
        made = config.pop("provenance", None)  # how the lens was trained (kept when it is saved again)
        if tuple(tensors["A"].shape) != (n_layers, d_model, d_model) or tuple(tensors["b"].shape) != (n_layers, d_model):
            raise UserInputError(f"{folder}: tensor shapes do not match config.json ({n_layers} layers, d_model {d_model})")
        lens = cls(n_layers, d_model, config)
        lens.provenance = made
        with torch.no_grad():
            lens.A.copy_(tensors["A"])
            lens.b.copy_(tensors["b"])
        if model is not None:
            lens.check_model(model)
            device = device or model.unembed.device
        return lens.to(device) if device is not None else lens


class TunedLens(Lens):
    """The tuned lens: each layer's translator, then the frozen final norm and unembedding.

    ``forward(resid, layer) = readout(T_l(resid))``; with identity translators (untrained) it
    equals the logit lens up to the fp32 read-out.
    """

    def __init__(self, translators: Translators, readout: LensReadout):
        super().__init__()
        self.translators = translators
        self.readout = readout

    @classmethod
    def from_model(cls, model: HookedVLM, translators: Translators | None = None) -> TunedLens:
        """A lens for `model`: `translators` (checked against its unembedding) or identity ones."""
        if translators is None:
            translators = Translators.for_model(model)
        else:
            translators.check_model(model)
        device = model.unembed.device
        return cls(translators.to(device), LensReadout.from_model(model).to(device))

    def transform(self, resid: Float[Tensor, "... d_model"], layer: int) -> Float[Tensor, "... d_model"]:
        return self.translators(resid.float(), layer)

    def forward(self, resid: Float[Tensor, "... d_model"], layer: int) -> Float[Tensor, "... d_vocab"]:
        return self.readout.logits(self.transform(resid, layer))


# -------------------------------------------------------------------- training
@dataclass
class TrainingReport(Result):
    """Per-layer KL(final || lens) on the held-out split, before and after training (nats)."""

    kl_before: list[float]
    kl_after: list[float]
    steps: int
    best_step: int
    n_train: int
    n_val: int
    stopped_early: bool
    val_history: list[float] = field(default_factory=list)

    kind: ClassVar[str] = "lens_training"
    saved_dims: ClassVar[dict[str, str]] = {"kl_before": "n_layers", "kl_after": "n_layers"}  # checked when a file is read

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> TrainingReport:
        return cls(**own_fields(cls, data))

    def plot(self, title: str = "Translator fit: held-out KL(final || lens) per layer"):
        """The held-out KL per layer before and after training (lines)."""
        go = require_plotly()
        layers = list(range(len(self.kl_before)))
        figure = go.Figure([go.Scatter(x=layers, y=self.kl_before, mode="lines+markers", name="before (logit lens)"),
                            go.Scatter(x=layers, y=self.kl_after, mode="lines+markers", name="after (tuned lens)")])
        return figure.update_layout(title=title, xaxis_title="layer", yaxis_title="KL (nats)")

    def table(self) -> str:
        lines = ["| layer | KL before | KL after |", "|---|---|---|"]
        lines += [f"| {layer} | {b:.4f} | {a:.4f} |"
                  for layer, (b, a) in enumerate(zip(self.kl_before, self.kl_after, strict=True))]
        return "\n".join(lines)


@dataclass(frozen=True)
class LensTraining:
    """How the translators are fitted (Adam on the KL to the final distribution, early stopping).

    Attributes:
        steps: optimizer steps at most.
        lr: Adam learning rate.
        batch_size: residual rows per step.
        val_fraction: held-out share of the rows; training stops after `patience` evaluations
            (every `eval_every` steps) without a better mean held-out KL, keeping the best weights.
        weight_decay: Adam's weight decay.
        seed: the split and the row sampling.
    """

    steps: int = 300
    lr: float = 1e-3
    batch_size: int = 128
    val_fraction: float = 0.2
    eval_every: int = 20
    patience: int = 5
    weight_decay: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "eval_every", "patience"):
            check_count(getattr(self, name), name)
        check_float(self.lr, "lr", min=0, min_open=True)
        check_float(self.val_fraction, "val_fraction", min=0, max=1, min_open=True, max_open=True)
        check_float(self.weight_decay, "weight_decay", min=0)


def train_translators(
    translators: Translators,
    resid: Float[Tensor, "n n_layers d_model"],
    readout: LensReadout,
    training: LensTraining | None = None,
    final: Float[Tensor, "n d_model"] | None = None,
    progress: bool = True,
    **legacy: Any,
) -> TrainingReport:
    """Fit every ``T_l`` to minimise KL(final || readout(T_l(resid_l))), in place.

    Args:
        translators: the lens being trained (its device is where training runs).
        resid: residual streams after each block at the training positions (fp32, any device).
        readout: the frozen final norm + unembedding (``LensReadout.from_model(model)``).
        training: steps, learning rate, batch size, held-out share, early stopping, seed
            (`LensTraining`).
        final: the final residual per row (default ``resid[:, -1]``, and then the last layer's
            translator is not trained: it is the identity exactly).
        progress: show a tqdm bar.
    Returns:
        a `TrainingReport` (held-out KL per layer before and after).
    """
    names = {f.name for f in fields(LensTraining)}
    unknown = sorted(set(legacy) - names)
    if unknown:
        raise TypeError(f"train_translators() got an unexpected keyword argument {unknown[0]!r}")
    if legacy:
        warnings.warn(f"train_translators: the keywords {', '.join(f'{k}=' for k in sorted(legacy))} moved into "
                      "training=LensTraining(...)", DeprecationWarning, stacklevel=2)
        if training is not None:
            raise UserInputError(f"train_translators: give {', '.join(sorted(legacy))} in training=LensTraining(...)"
                                 " only")
    if training is not None and not isinstance(training, LensTraining):
        raise UserInputError(f"train_translators: training must be a LensTraining, got {type(training).__name__} "
                             "(the final residual goes in final=...)")
    training = LensTraining(**legacy) if training is None else training
    steps, lr, batch_size, val_fraction = training.steps, training.lr, training.batch_size, training.val_fraction
    eval_every, patience, weight_decay, seed = training.eval_every, training.patience, training.weight_decay, \
        training.seed
    if resid.ndim != 3 or resid.shape[1:] != (translators.n_layers, translators.d_model):
        raise UserInputError(f"resid must be [n, {translators.n_layers}, {translators.d_model}], got "
                             f"{tuple(resid.shape)}")
    # the last layer's residual *is* the final residual: its translator stays the exact identity
    trained_layers = range(translators.n_layers - 1) if final is None else range(translators.n_layers)
    final = resid[:, -1] if final is None else final
    ok = finite_rows(resid, dims=2) & finite_rows(final)
    if not bool(ok.all()):  # NaN rows would make every translator NaN
        bad_layers = sorted(set((~torch.isfinite(resid)).any(-1).nonzero()[:, 1].tolist()))
        warn_non_finite("lens training", f"{int((~ok).sum())} of {len(ok)} residual rows (layers {bad_layers[:6]}); "
                        "those rows are left out of training")
        resid, final = resid[ok.to(resid.device)], final[ok.to(final.device)]
        if resid.shape[0] < 2:
            raise FloatingPointError(f"cannot train a lens: {int((~ok).sum())} of {len(ok)} residual rows are NaN/inf "
                                     f"(from layers {bad_layers[:6]}): the model's activations are not finite "
                                     "(check its weights); see the NonFiniteWarning for the first non-finite hook")
    n = resid.shape[0]
    if n < 2:
        raise UserInputError(f"need at least 2 residual rows to train and hold out, got {n}: use more samples")
    generator = torch.Generator().manual_seed(seed)
    order = torch.randperm(n, generator=generator)
    n_val = max(1, int(math.ceil(n * val_fraction)))
    val_idx, train_idx = order[:n_val], order[n_val:]
    if len(train_idx) == 0:
        raise UserInputError(f"val_fraction {val_fraction} leaves no training rows out of {n}")
    device = translators.A.device
    readout.to(device)
    resid, final = resid.float(), final.float()

    kl_before = layer_kl(translators, resid[val_idx], readout, final[val_idx])
    best_val, best_step, bad_evals, stopped_early = float(kl_before.mean()), 0, 0, False
    best_state = {k: v.detach().clone() for k, v in translators.state_dict().items()}
    history = [best_val]
    optimizer = torch.optim.Adam(translators.parameters(), lr=lr, weight_decay=weight_decay)
    bar = tqdm(range(1, steps + 1), desc="training translators", disable=not progress)
    step = 0
    targets = TargetTerms(final, readout)  # the final distribution's terms, once per row (vlens.lens.kl)
    for step in bar:
        rows = train_idx[torch.randint(len(train_idx), (min(batch_size, len(train_idx)),), generator=generator)]
        h = resid[rows].to(device)
        optimizer.zero_grad(set_to_none=True)
        loss_value = 0.0
        for layer in trained_layers:  # layers are independent: backward one at a time saves memory
            loss = targets.kl(rows, translators(h[:, layer], layer)).mean()
            loss.backward()
            loss_value += loss.item()
        optimizer.step()
        if step % eval_every == 0 or step == steps:
            val = float(layer_kl(translators, resid[val_idx], readout, final[val_idx]).mean())
            history.append(val)
            bar.set_postfix(train_kl=f"{loss_value / max(len(trained_layers), 1):.4f}", val_kl=f"{val:.4f}")
            if val < best_val - 1e-6:
                best_val, best_step, bad_evals = val, step, 0
                best_state = {k: v.detach().clone() for k, v in translators.state_dict().items()}
            else:
                bad_evals += 1
                if bad_evals >= patience:
                    stopped_early = True
                    break
    translators.load_state_dict(best_state)
    kl_after = layer_kl(translators, resid[val_idx], readout, final[val_idx])
    return TrainingReport(kl_before=kl_before.tolist(), kl_after=kl_after.tolist(), steps=step,
                          best_step=best_step, n_train=len(train_idx), n_val=n_val,
                          stopped_early=stopped_early, val_history=history)
