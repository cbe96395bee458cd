"""Training transcoders on (MLP input, MLP output) pairs, with the SAE trainer's machinery (docs/transcoders.md).

One step: a shuffled batch of rows ``[x_0, y_0, ...]`` from the `ShuffleBuffer`; per covered layer j the
reconstruction ``y_hat_j`` (`Transcoders.decode`); loss = ``sum_j |y_j - y_hat_j|^2`` (summed over
d_model, mean over tokens) + the sparsity term (ReLU: ``l1 * sum_f acts_f |W_dec,f|`` with the
decoder norm over every layer a feature writes; JumpReLU: ``l0 * sum_f H(pre_f - θ_f)`` with the
straight-through threshold gradient; TopK: none). Adam, gradient norm clipped to 1, the learning
rate from `vlens.sae.schedule`. Checkpoints are safetensors (weights, Adam moments, the buffer,
generator states) + JSON (step, log, settings): no pickle; a resumed run ends on the same bits as one
that never stopped (CPU, fixed thread count).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar, cast

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor

from vlens.sae.activations import ActivationStream
from vlens.sae.architectures import jump_gate
from vlens.sae.buffer import ShuffleBuffer
from vlens.sae.metrics import explained_variance, l0
from vlens.sae.schedule import lr_at, warmup_factor
from vlens.sae.settings import TrainRun
from vlens.sae.trainer import TrainingMetrics, plot_training_log, run_steps
from vlens.transcoders.activations import split_pairs
from vlens.transcoders.config import TranscoderConfig
from vlens.transcoders.formats import load_transcoders, save_transcoders
from vlens.transcoders.model import Transcoders
from vlens.transcoders.settings import TranscoderTraining
from vlens.utils.errors import UserInputError
from vlens.utils.fileio import read_json_file
from vlens.utils.results import Result

STATE_TENSORS = "trainer_state.safetensors"
STATE_JSON = "trainer_state.json"


@dataclass
class TrainedTranscoders(Result):
    """Trained transcoders, the training log and final metrics. `save(folder)` writes vlens's transcoder
    folder (`save_transcoders`) plus results.json (settings, log, metrics)."""

    transcoders: Transcoders
    training: TranscoderTraining
    log: list[dict[str, float]] = field(default_factory=list)
    metrics: TrainingMetrics = field(default_factory=lambda: TrainingMetrics())

    kind: ClassVar[str] = "transcoder_training"

    def to_dict(self) -> dict:
        return {"kind": "transcoder_training", "settings": asdict(self.training),
                "transcoders": self.transcoders.cfg.to_dict(), "log": self.log, "metrics": self.metrics}

    def save(self, path: str | os.PathLike) -> Path:
        folder = Path(path)
        save_transcoders(self.transcoders, folder)
        return super().save(folder)

    @classmethod
    def from_saved(cls, data: dict, folder: Path | None = None) -> TrainedTranscoders:
        if folder is None:
            raise UserInputError("trained transcoders are read from their folder (results.json beside the weights): "
                                 "pass the folder")
        result = cls(transcoders=load_transcoders(folder), training=TranscoderTraining(**data["settings"]),
                     log=list(data.get("log", [])), metrics=cast(TrainingMetrics, dict(data.get("metrics", {}))))
        body = {key: value for key, value in data.items() if key not in ("kind", "provenance")}
        return cls.attach_saved(result, body, data.get("provenance"))

    def plot(self, *args: Any, **kwargs: Any) -> Any:
        return plot_training_log(self.log, "Transcoder training")


def new_transcoders(training: TranscoderTraining, layers: tuple[int, ...], d_model: int, first: Tensor,
                    metadata: dict[str, Any] | None = None) -> Transcoders:
    cfg = TranscoderConfig(kind=training.kind, activation=training.activation, layers=layers, d_model=d_model,
                           d_tc=training.d_tc, k=training.k if training.activation == "topk" else 0,
                           metadata=dict(metadata or {}))
    tc = Transcoders(cfg).initialize(torch.Generator().manual_seed(training.seed),
                                     decoder_norm=1.0 if training.activation == "topk" else 0.1)
    _, ys = split_pairs(first, cfg.n_layers)
    with torch.no_grad():
        for j, y in enumerate(ys):
            tc.b_dec[j].copy_(y.mean(0))  # outputs start centred
        if tc.threshold is not None:
            tc.threshold.fill_(training.jumprelu_init_threshold)
    return tc


class TranscoderTrainer:
    """Trains one set of transcoders on a pair stream; `run()` returns `TrainedTranscoders`.

    stream: rows ``[x_0, y_0, x_1, y_1, ...]`` (`PairSource`, or `TensorSource` over `join_pairs`).
    layers: the decoder layers the rows cover (default: the stream's ``layers``).
    """

    def __init__(self, stream: ActivationStream, training: TranscoderTraining, run: TrainRun | None = None,
                 layers: tuple[int, ...] | None = None):
        self.stream, self.training, self.settings = stream, training, run or TrainRun()
        layers = layers if layers is not None else getattr(stream, "layers", None)
        if layers is None:
            raise UserInputError("say which decoder layers the pairs come from (layers=...).")
        self.layers = tuple(layers)
        self.buffer = ShuffleBuffer(stream, training.buffer_size, seed=training.seed + 1)
        self.step, self.tokens_seen = 0, 0
        self.updating = False  # True inside a step's update (a state saved then would not be whole)
        self.log: list[dict[str, float]] = []
        first = self.buffer.next_batch(training.batch_size)
        width = first.shape[-1]
        if width % (2 * len(self.layers)):
            raise UserInputError(f"rows of width {width} are no (input, output) pairs of {len(self.layers)} layers.")
        self.pending: Tensor | None = first
        self.tc = new_transcoders(training, self.layers, width // (2 * len(self.layers)), first)
        self.tc.bandwidth = training.jumprelu_bandwidth
        self.optimizer = torch.optim.Adam(self.tc.parameters(), lr=training.lr)
        self.last_fired = torch.zeros(len(self.layers), training.d_tc, dtype=torch.long)
        self.checkpoint_dir = Path(self.settings.checkpoint_dir) if self.settings.checkpoint_dir else None
        if self.settings.resume:
            self.load_checkpoint()

    def batch(self) -> Tensor:
        if self.pending is not None:
            batch, self.pending = self.pending, None
            return batch
        return self.buffer.next_batch(self.training.batch_size)

    def losses(self, rows: Tensor) -> tuple[Tensor, dict[str, Tensor], list[Tensor], list[Tensor], list[Tensor]]:
        t, tc = self.training, self.tc
        xs, ys = split_pairs(rows, len(self.layers))
        pres = [tc.pre_acts(i, x) for i, x in enumerate(xs)]
        acts = [tc.activate(i, pre) for i, pre in enumerate(pres)]
        y_hats = [tc.decode(j, acts, xs[j]) for j in range(len(xs))]
        parts = {"mse": sum(((y_hat - y).pow(2).sum(-1).mean() for y, y_hat in zip(ys, y_hats, strict=True)),
                            torch.zeros(()))}
        ramp = warmup_factor(self.step, t.sparsity_warmup_steps)
        if t.activation == "relu":
            parts["l1_loss"] = t.l1_coefficient * ramp * sum(
                ((a * tc.decoder_norms(i)).sum(-1).mean() for i, a in enumerate(acts)), torch.zeros(()))
        elif t.activation == "jumprelu":
            assert tc.threshold is not None
            parts["l0_loss"] = t.l0_coefficient * ramp * sum(
                (jump_gate(pre, tc.threshold[i], t.jumprelu_bandwidth).sum(-1).mean() for i, pre in enumerate(pres)),
                torch.zeros(()))
        return sum(parts.values(), torch.zeros(())), parts, acts, ys, y_hats

    def train_step(self, record: bool = True) -> dict[str, float] | None:
        """One step; its metrics row when `record` (None otherwise)."""
        t = self.training
        rows = self.batch()
        lr = lr_at(self.step, t.steps, t.lr, t.warmup_steps, t.decay, t.lr_end_fraction)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.tc.train()
        try:
            loss, parts, acts, ys, y_hats = self.losses(rows)
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
        except BaseException:
            self.pending = rows  # nothing was updated: this batch comes first again, so a state saved now is whole
            raise
        self.updating = True
        torch.nn.utils.clip_grad_norm_(self.tc.parameters(), 1.0)
        self.optimizer.step()
        with torch.no_grad():
            if t.activation == "topk":
                for w in self.tc.W_dec:
                    w.div_(w.pow(2).sum(dim=(1, 2), keepdim=True).sqrt().clamp(min=1e-8))
            if self.tc.threshold is not None:
                self.tc.threshold.clamp_(min=1e-6)
        self.tokens_seen += rows.shape[0]
        for i, a in enumerate(acts):
            self.last_fired[i, (a.detach() != 0).any(dim=0)] = self.tokens_seen
        self.step += 1
        self.updating = False
        if not record:
            return None
        y, y_hat = torch.cat(ys, -1), torch.cat([h.detach() for h in y_hats], -1)
        row = {"step": float(self.step), "loss": float(loss.detach()), "lr": lr,
               "explained_variance": explained_variance(y, y_hat),
               "l0": sum(l0(a.detach()) for a in acts) / len(acts), "dead_fraction": self.dead_fraction()}
        row.update({k: float(v.detach()) for k, v in parts.items()})
        return row

    def dead_fraction(self) -> float:
        if self.tokens_seen < self.training.dead_window:
            return 0.0
        return float((self.tokens_seen - self.last_fired >= self.training.dead_window).float().mean())

    def run(self) -> TrainedTranscoders:
        t = self.training
        run_steps(self, t.steps, self.settings, "transcoders")
        self.tc.eval()
        self.tc.bandwidth = None
        last: dict[str, float] = self.log[-1] if self.log else {}
        metrics = cast(TrainingMetrics, {"steps": self.step, "tokens": self.tokens_seen, "finished": self.step >= t.steps,
                                         **{k: last[k] for k in ("explained_variance", "l0", "dead_fraction", "mse")
                                            if k in last}})
        return TrainedTranscoders(self.tc, t, list(self.log), metrics)

    # ------------------------------------------------------------------ checkpoints (safetensors + JSON)
    def save_checkpoint(self) -> Path:
        assert self.checkpoint_dir is not None
        self.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        tensors = {f"model.{k}": v for k, v in self.tc.state().items()}
        optimizer = self.optimizer.state_dict()
        for index, state in optimizer["state"].items():
            for key, value in state.items():
                tensors[f"adam.{index}.{key}"] = torch.as_tensor(value).clone()
        buffer = self.buffer.state_dict()
        if buffer["held"] is not None:
            tensors["buffer.held"] = buffer["held"].contiguous()
        if self.pending is not None:
            tensors["pending"] = self.pending.contiguous()
        tensors["buffer.generator"] = buffer["generator"]
        tensors["last_fired"] = self.last_fired
        scalars = {"step": self.step, "tokens_seen": self.tokens_seen, "log": self.log, "training": asdict(self.training),
                   "layers": list(self.layers), "buffer": {k: buffer[k] for k in ("next_chunk", "epoch", "tokens_read")},
                   "param_groups": optimizer["param_groups"]}
        tmp = self.checkpoint_dir / (STATE_TENSORS + ".tmp")
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp))
        os.replace(tmp, self.checkpoint_dir / STATE_TENSORS)
        tmp_json = self.checkpoint_dir / (STATE_JSON + ".tmp")
        tmp_json.write_text(json.dumps(scalars) + "\n", encoding="utf-8")
        os.replace(tmp_json, self.checkpoint_dir / STATE_JSON)
        return self.checkpoint_dir

    def load_checkpoint(self) -> None:
        assert self.checkpoint_dir is not None
        tensors_path, json_path = self.checkpoint_dir / STATE_TENSORS, self.checkpoint_dir / STATE_JSON
        if not tensors_path.exists() or not json_path.exists():
            raise UserInputError(f"nothing to resume in {self.checkpoint_dir} (run without resume first).")
        scalars = read_json_file(json_path, "the transcoder training state", f"delete {self.checkpoint_dir} to train afresh")
        if scalars["training"] != asdict(self.training) or tuple(scalars["layers"]) != self.layers:
            changed = sorted(k for k, v in asdict(self.training).items() if scalars["training"].get(k) != v)
            raise UserInputError(f"{self.checkpoint_dir} was trained with other settings ({', '.join(changed) or 'layers'} "
                                 "differ): resume with the same settings, or use another checkpoint folder.")
        tensors = load_file(str(tensors_path))
        self.tc.load_state({k.removeprefix("model."): v for k, v in tensors.items() if k.startswith("model.")})
        state: dict[int, dict[str, Tensor]] = {}
        for key, value in tensors.items():
            if key.startswith("adam."):
                _, index, name = key.split(".", 2)
                state.setdefault(int(index), {})[name] = value
        self.optimizer.load_state_dict({"state": state, "param_groups": scalars["param_groups"]})
        self.buffer.load_state_dict({"held": tensors.get("buffer.held"), "generator": tensors["buffer.generator"],
                                     **scalars["buffer"]})
        self.pending = tensors.get("pending")
        self.last_fired = tensors["last_fired"]
        self.step, self.tokens_seen, self.log = scalars["step"], scalars["tokens_seen"], list(scalars["log"])


def train_transcoders(stream: ActivationStream, training: TranscoderTraining, run: TrainRun | None = None,
                      layers: tuple[int, ...] | None = None) -> TrainedTranscoders:
    """Train transcoders on `stream` (a `PairSource`, or any stream of pair rows with `layers` given)."""
    return TranscoderTrainer(stream, training, run, layers=layers).run()
