"""Training an SAE on an activation stream: losses, dead features, schedule, checkpoints (docs/sae.md).

One step: a shuffled batch ``x`` from the `ShuffleBuffer`; ``pre = pre_acts(x)``, ``acts``,
``x_hat``; loss = ``|x - x_hat|^2`` (summed over d, mean over tokens) + the architecture's
sparsity term (standard: ``l1 * sum_f acts_f |W_dec,f|``; JumpReLU: ``l0 * sum_f H(pre_f - θ_f)``
with the straight-through threshold gradient; TopK: none) + the auxiliary loss when dead features
are handled with "aux". Adam, gradient norm clipped to 1, the learning rate a function of the step.
TopK's decoder rows are kept at unit norm. Every checkpoint holds the whole state (weights, Adam,
buffer, generators, firing counters, log), so a resumed run ends on the same bits as one that never
stopped (on the CPU, for a fixed thread count).
"""

from __future__ import annotations

import os
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar, TypedDict, cast

import torch
from torch import Tensor
from tqdm.auto import tqdm

from vlens.sae.activations import ActivationStream
from vlens.sae.architectures import JumpReLUSAE, jump_gate
from vlens.sae.base import SAE
from vlens.sae.buffer import ShuffleBuffer
from vlens.sae.interrupts import steps_interruptible
from vlens.sae.metrics import dead_fraction, explained_variance, l0
from vlens.sae.registry import build_sae, make_config
from vlens.sae.saelens_format import load_sae, save_sae
from vlens.sae.schedule import lr_at, warmup_factor
from vlens.sae.settings import SAETraining, TrainRun
from vlens.utils.errors import UserInputError
from vlens.utils.fileio import atomic_write, load_tensor_file
from vlens.utils.results import Result

STATE_FILE = "trainer_state.pt"


class TrainingMetrics(TypedDict, total=False):
    """A trainer's last figures as results.json records them (checked when a file is read). Every key optional: a
    result built by hand holds none, and the figures of the last log row are absent before the first one."""

    steps: int
    tokens: int
    finished: bool
    explained_variance: float
    l0: float
    dead_fraction: float
    mse: float
    evaluation: dict[str, Any]  # `vlens transcoder train --evaluate`: the transcoder_evaluation it measured


@dataclass
class TrainedSAE(Result):
    """A trained SAE, its training log and final metrics. `save(folder)` writes the SAELens folder
    (cfg.json, sae_weights.safetensors) plus results.json (settings, log, metrics)."""

    sae: SAE
    training: SAETraining
    log: list[dict[str, float]] = field(default_factory=list)
    metrics: TrainingMetrics = field(default_factory=lambda: TrainingMetrics())

    kind: ClassVar[str] = "sae_training"

    def to_dict(self) -> dict:
        return {"kind": "sae_training", "settings": asdict(self.training), "sae": self.sae.cfg.to_dict(),
                "log": self.log, "metrics": self.metrics}

    def save(self, path: str | os.PathLike) -> Path:
        folder = Path(path)
        save_sae(self.sae, folder)
        return super().save(folder)

    @classmethod
    def from_saved(cls, data: dict, folder: Path | None = None) -> TrainedSAE:
        """The result `save` wrote: results.json with the SAELens folder it sits in (the weights)."""
        if folder is None:
            raise UserInputError("a trained SAE is read from its folder (results.json beside cfg.json and "
                                 "sae_weights.safetensors): pass the folder")
        sae = load_sae(folder)
        sae.cfg.metadata = dict(data["sae"].get("metadata", {}))  # as trained (the folder's adds the format's)
        result = cls(sae=sae, training=SAETraining(**data["settings"]), log=list(data.get("log", [])),
                     metrics=cast(TrainingMetrics, dict(data.get("metrics", {}))))
        body = {key: value for key, value in data.items() if key not in ("kind", "provenance")}
        return cls.attach_saved(result, body, data.get("provenance"))

    def plot(self, *args: Any, **kwargs: Any) -> Any:
        return plot_training_log(self.log, "SAE training")


def plot_training_log(log: list[dict], title: str) -> Any:
    """Explained variance, L0 and the dead fraction along a training log (plotly figure)."""
    import plotly.graph_objects as go

    figure = go.Figure()
    steps = [row["step"] for row in log]
    for key in ("explained_variance", "l0", "dead_fraction"):
        figure.add_trace(go.Scatter(x=steps, y=[row[key] for row in log], name=key))
    return figure.update_layout(title=title, xaxis_title="step")


def run_steps(trainer: Any, total: int, settings: TrainRun, desc: str) -> None:
    """The loop every trainer here shares: `trainer.train_step(record)` until `total` steps (or `stop_after`
    more), a row of `trainer.log` every `log_every` steps (only those steps compute the metrics: `record`),
    checkpoints every `checkpoint_every` steps and at the end (`trainer.save_checkpoint()` when it has a
    `checkpoint_dir`; at the end only with `settings.final_checkpoint`), a tqdm bar.

    Ctrl-C finishes the step under way; it, or an error, then saves the state of the last finished step in
    the `checkpoint_dir` (a step whose update had begun when the error came cannot be saved whole: the last
    checkpoint stays), so `resume` continues where the run stopped."""
    end = total if settings.stop_after is None else min(total, trainer.step + settings.stop_after)
    bar = tqdm(total=total, initial=trainer.step, desc=desc, disable=not settings.progress, unit="step")
    try:
        with steps_interruptible() as interrupt:
            while trainer.step < end:
                coming = trainer.step + 1
                row = trainer.train_step(record=coming % settings.log_every == 0 or coming == total)
                if row is not None:
                    trainer.log.append(row)
                    bar.set_postfix(ev=f"{row['explained_variance']:.3f}", l0=f"{row['l0']:.1f}")
                bar.update(1)
                if settings.checkpoint_every and trainer.step % settings.checkpoint_every == 0 and trainer.step < end:
                    trainer.save_checkpoint()
                if interrupt.requested:
                    raise KeyboardInterrupt
    except BaseException:
        save_after_failure(trainer)
        raise
    finally:
        bar.close()
    if trainer.checkpoint_dir is not None and settings.final_checkpoint:
        trainer.save_checkpoint()


def save_after_failure(trainer: Any) -> None:
    """Save a stopped run's state for `resume`, saying where (a warning); never hides the error that stopped it."""
    if trainer.checkpoint_dir is None:
        return
    if trainer.updating:
        warnings.warn(f"training stopped inside the update of step {trainer.step + 1}: its state is not whole, so "
                      f"it is not saved; resume continues from the last checkpoint in {trainer.checkpoint_dir} "
                      "(if any)", stacklevel=3)
        return
    try:
        trainer.save_checkpoint()
    except Exception as error:  # noqa: BLE001 - the error that stopped the run is the one to report
        warnings.warn(f"training stopped at step {trainer.step}, and saving its state failed too ({error})",
                      stacklevel=3)
        return
    warnings.warn(f"training stopped at step {trainer.step}: its state is saved in {trainer.checkpoint_dir}; "
                  "continue with resume (--resume)", stacklevel=3)


def new_sae(training: SAETraining, d_in: int, hook_name: str | None, first_batch: Tensor) -> SAE:
    extra: dict[str, Any] = {"k": training.k, "rescale_acts_by_decoder_norm": False} \
        if training.architecture == "topk" else {}
    cfg = make_config(training.architecture, d_in=d_in, d_sae=training.d_sae, hook_name=hook_name, **extra)
    sae = build_sae(cfg)
    generator = torch.Generator().manual_seed(training.seed)
    sae.initialize(generator, decoder_norm=1.0 if training.architecture == "topk" else 0.1)
    with torch.no_grad():
        sae.b_dec.copy_(first_batch.mean(0))  # the data's mean: features start centred
        if isinstance(sae, JumpReLUSAE):
            sae.threshold.fill_(training.jumprelu_init_threshold)
    return sae


class SAETrainer:
    """Trains one SAE on a stream; `run()` returns a `TrainedSAE`."""

    def __init__(self, stream: ActivationStream, training: SAETraining, run: TrainRun | None = None,
                 hook_name: str | None = None, sae: SAE | None = None):
        self.stream, self.training, self.settings = stream, training, run or TrainRun()
        self.hook_name = hook_name if hook_name is not None else getattr(getattr(stream, "options", None),
                                                                         "hook_name", None)
        self.buffer = ShuffleBuffer(stream, training.buffer_size, seed=training.seed + 1)
        self.generator = torch.Generator().manual_seed(training.seed + 2)
        self.step, self.tokens_seen = 0, 0
        self.updating = False  # True inside a step's update (a state saved then would not be whole)
        self.log: list[dict[str, float]] = []
        first = self.buffer.next_batch(training.batch_size)
        self.pending: Tensor | None = first
        self.sae = sae if sae is not None else new_sae(training, first.shape[-1], self.hook_name, first)
        if isinstance(self.sae, JumpReLUSAE):
            self.sae.bandwidth = training.jumprelu_bandwidth
        self.optimizer = torch.optim.Adam(self.sae.parameters(), lr=training.lr, betas=(0.9, 0.999))
        self.last_fired = torch.zeros(training.d_sae, dtype=torch.long)
        self.checkpoint_dir = Path(self.settings.checkpoint_dir) if self.settings.checkpoint_dir else None
        if self.settings.resume:
            self.load_checkpoint()

    # ------------------------------------------------------------------ one step
    def batch(self) -> Tensor:
        if self.pending is not None:
            batch, self.pending = self.pending, None
            return batch
        return self.buffer.next_batch(self.training.batch_size)

    def dead_mask(self) -> Tensor:
        return (self.tokens_seen - self.last_fired) >= self.training.dead_window

    def losses(self, x: Tensor) -> tuple[Tensor, dict[str, Tensor], Tensor, Tensor]:
        t, sae = self.training, self.sae
        pre = sae.pre_acts(x)
        acts = sae.activate(pre)
        x_hat = sae.decode(acts)
        mse = (x_hat - x).pow(2).sum(-1).mean()
        parts = {"mse": mse}
        ramp = warmup_factor(self.step, t.sparsity_warmup_steps)
        if t.architecture == "standard":
            parts["l1_loss"] = t.l1_coefficient * ramp * (acts * sae.W_dec.norm(dim=1)).sum(-1).mean()
        elif isinstance(sae, JumpReLUSAE):
            parts["l0_loss"] = t.l0_coefficient * ramp * jump_gate(pre, sae.threshold, t.jumprelu_bandwidth).sum(-1).mean()
        if t.dead_mode == "aux" and self.tokens_seen >= t.dead_window:
            dead = self.dead_mask()
            n_dead = int(dead.sum())
            if n_dead:
                k_aux = min(t.aux_k, n_dead)
                # the dead features' largest ReLU pre-activations (Gao et al.'s AuxK): features outside
                # every token's top k still get a gradient
                values, indices = torch.topk(torch.relu(pre).masked_fill(~dead, 0.0), k_aux, dim=-1)
                aux_acts = torch.zeros_like(pre).scatter(-1, indices, values)
                residual = (x - x_hat).detach()
                parts["aux_loss"] = t.aux_coefficient * (aux_acts @ sae.W_dec - residual).pow(2).sum(-1).mean()
        return sum(parts.values(), torch.zeros(())), parts, acts, x_hat

    def train_step(self, record: bool = True) -> dict[str, float] | None:
        """One step; its metrics row when `record` (None otherwise: the metrics cost a pass over the batch)."""
        t = self.training
        x = self.batch()
        lr = lr_at(self.step, t.steps, t.lr, t.warmup_steps, t.decay, t.lr_end_fraction)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.sae.train()
        try:
            loss, parts, acts, x_hat = self.losses(x)
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
        except BaseException:
            self.pending = x  # nothing was updated: this batch comes first again, so a state saved now is whole
            raise
        self.updating = True
        torch.nn.utils.clip_grad_norm_(self.sae.parameters(), 1.0)
        self.optimizer.step()
        with torch.no_grad():
            if t.architecture == "topk":
                self.sae.W_dec.div_(self.sae.W_dec.norm(dim=-1, keepdim=True).clamp(min=1e-8))
            if isinstance(self.sae, JumpReLUSAE):
                self.sae.threshold.clamp_(min=1e-6)
        self.tokens_seen += x.shape[0]
        fired = (acts.detach() != 0).any(dim=0)
        self.last_fired[fired] = self.tokens_seen
        self.step += 1
        if t.dead_mode == "resample" and self.step % t.resample_every == 0 and self.tokens_seen >= t.dead_window:
            self.resample(x, x_hat.detach())
        self.updating = False
        if not record:
            return None
        row = {"step": float(self.step), "loss": float(loss.detach()), "lr": lr,
               "explained_variance": explained_variance(x, x_hat.detach()), "l0": l0(acts.detach()),
               "dead_fraction": dead_fraction(self.last_fired, self.tokens_seen, t.dead_window)}
        row.update({k: float(v.detach()) for k, v in parts.items()})
        return row

    @torch.no_grad()
    def resample(self, x: Tensor, x_hat: Tensor) -> None:
        """Dead features restart on inputs the SAE reconstructs badly (drawn with probability ∝ error²):
        decoder row = the centred input's direction, encoder column = it scaled to 0.2 x the alive
        encoder norm, bias 0, their Adam moments reset."""
        dead = self.dead_mask().nonzero().flatten()
        if not len(dead):
            return
        sae = self.sae
        error = (x - x_hat).pow(2).sum(-1)
        if float(error.sum()) <= 0:
            return
        picks = torch.multinomial(error.pow(2) / error.pow(2).sum(), len(dead), replacement=True,
                                  generator=self.generator)
        directions = x[picks] - sae.b_dec
        directions = directions / directions.norm(dim=-1, keepdim=True).clamp(min=1e-8)
        alive = ~self.dead_mask()
        scale = sae.W_enc[:, alive].norm(dim=0).mean() if bool(alive.any()) else torch.tensor(1.0)
        sae.W_dec[dead] = directions * sae.W_dec[alive].norm(dim=-1).mean() if bool(alive.any()) else directions
        sae.W_enc[:, dead] = directions.T * 0.2 * scale
        sae.b_enc[dead] = 0.0
        for param, index in ((sae.W_dec, (dead,)), (sae.W_enc, (slice(None), dead)), (sae.b_enc, (dead,))):
            state = self.optimizer.state.get(param, {})
            for key in ("exp_avg", "exp_avg_sq"):
                if key in state:
                    state[key][index] = 0.0
        self.last_fired[dead] = self.tokens_seen  # a fresh window for the restarted features

    # ------------------------------------------------------------------ the run
    def run(self) -> TrainedSAE:
        t = self.training
        run_steps(self, t.steps, self.settings, "sae")
        self.sae.eval()
        last: dict[str, float] = self.log[-1] if self.log else {}
        metrics = cast(TrainingMetrics, {"steps": self.step, "tokens": self.tokens_seen, "finished": self.step >= t.steps,
                                         **{k: last[k] for k in ("explained_variance", "l0", "dead_fraction", "mse")
                                            if k in last}})
        return TrainedSAE(self.sae, t, list(self.log), metrics)

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        return {"sae": self.sae.state(), "optimizer": self.optimizer.state_dict(), "buffer": self.buffer.state_dict(),
                "pending": self.pending, "generator": self.generator.get_state(), "last_fired": self.last_fired,
                "step": self.step, "tokens_seen": self.tokens_seen, "log": self.log,
                "training": asdict(self.training)}

    def save_checkpoint(self) -> Path:
        assert self.checkpoint_dir is not None
        self.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        save_sae(self.sae, self.checkpoint_dir / "sae")
        return atomic_write(self.checkpoint_dir / STATE_FILE, lambda staging: torch.save(self.state_dict(), staging))

    def load_checkpoint(self) -> None:
        assert self.checkpoint_dir is not None
        path = self.checkpoint_dir / STATE_FILE
        if not path.exists():
            raise UserInputError(f"nothing to resume: {path} does not exist (run without resume first).")
        state = load_tensor_file(path, "the SAE training state", "delete the checkpoint folder to train afresh")
        if not isinstance(state, dict) or not isinstance(state.get("training"), dict):
            raise UserInputError(f"{path} is not an SAE training state this version writes: delete the checkpoint "
                                 "folder to train afresh")
        if state["training"] != asdict(self.training):
            changed = sorted(k for k, v in asdict(self.training).items() if state["training"].get(k) != v)
            raise UserInputError(f"{path} was trained with other settings ({', '.join(changed)} differ): "
                                 "resume with the same settings, or use another checkpoint folder.")
        self.sae = load_sae(self.checkpoint_dir / "sae")
        self.sae.load_state(state["sae"])
        if isinstance(self.sae, JumpReLUSAE):
            self.sae.bandwidth = self.training.jumprelu_bandwidth
        self.optimizer = torch.optim.Adam(self.sae.parameters(), lr=self.training.lr, betas=(0.9, 0.999))
        self.optimizer.load_state_dict(state["optimizer"])
        self.buffer.load_state_dict(state["buffer"])
        self.pending = state["pending"]
        self.generator.set_state(state["generator"])
        self.last_fired = state["last_fired"]
        self.step, self.tokens_seen, self.log = state["step"], state["tokens_seen"], list(state["log"])


def train_sae(stream: ActivationStream, training: SAETraining, run: TrainRun | None = None,
              hook_name: str | None = None) -> TrainedSAE:
    """Train an SAE on `stream` (an `ActivationSource`, `TensorSource` or any `ActivationStream`)."""
    return SAETrainer(stream, training, run, hook_name=hook_name).run()
