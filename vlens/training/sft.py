"""LoRA supervised fine-tuning with the object-focused attention loss (docs/method.md, section 7).

    L = L_SFT + lambda * L_focus

L_SFT is the cross-entropy on the answer tokens only; L_focus (vlens.interventions.focus) is
computed from attention probabilities captured only at its target layers (every other layer
keeps SDPA). LoRA (peft) on q/k/v/o of every decoder layer, rank 64; AdamW, lr 2e-5, 3%
linear warm-up then linear decay to 0, micro-batch 2, 2 epochs, bf16 autocast on GPUs that
support it, gradient accumulation, gradient clipping at 1.0 (our choice; the paper is silent).

Resumable: a checkpoint (LoRA weights, AdamW state, RNG, step) is written every
`checkpoint_every` optimizer steps and at the end; with `resume=True` training continues from
the latest one and gives the same weights as an uninterrupted run (the data order is a pure
function of (seed, epoch), the learning rate of the step). A NaN/inf loss or gradient stops
training with `NonFiniteLossError` before the optimizer step, so the last checkpoint stays good.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

import torch
from tqdm.auto import tqdm

from vlens.interventions.focus import capture_patterns, focus_loss, model_focus_layers
from vlens.training.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from vlens.training.data import SFTBatch, SFTExample, answer_loss, check_answers, collate
from vlens.training.export import save_adapters
from vlens.training.lora import ATTENTION_PROJECTIONS, add_lora, has_lora, lora_parameters
from vlens.training.memory import answer_only_loss, gradient_checkpointing, use_checkpointing
from vlens.training.schedule import learning_rate_at
from vlens.utils.errors import UserInputError
from vlens.utils.fileio import read_json_file
from vlens.utils.results import Result, own_fields
from vlens.utils.validation import check_count, check_float
from vlens.viz.optional import require_plotly

if TYPE_CHECKING:
    from vlens.core.model import HookedVLM



class NonFiniteLossError(FloatingPointError):
    """The loss (or its gradient) became NaN/inf; training stopped before the bad update."""


LOG_FILE = "train_log.jsonl"


@dataclass
class SFTConfig:
    """Fine-tuning settings; the defaults are the paper's recipe (ours where it is silent).

    focus_weight: lambda (0 disables L_focus and its attention hooks: plain LoRA SFT).
    focus_layers: target layers (default: the paper's 2 and 18-22 of 28, mapped to the depth).
    focus_query: "final" (the final prompt position, default) or "answer" (the final prompt
        position and every answer position but the last, i.e. all positions that predict answer tokens).
    bf16: "auto" (bf16 autocast where the device supports it: CUDA with bf16), True or False.
    gradient_checkpointing: "auto" (on for models with d_model >= 1024: every 7-8B model), True
        or False. Recomputes each decoder block in the backward; same gradients, less memory.
    answer_only_logits: unembed only the positions that predict answer tokens (True, default)
        instead of the full [batch, seq, d_vocab] logits (False: for comparison only).
    max_steps: stop after this many optimizer steps (None: all epochs).
    """

    lora_rank: int = 64
    lora_alpha: float | None = None
    lora_dropout: float = 0.0
    projections: tuple[str, ...] = ATTENTION_PROJECTIONS
    focus_weight: float = 1.0
    focus_layers: list[int] | None = None
    focus_sigma: float = 1.0
    focus_query: str = "final"
    focus_eps: float = 1e-8
    learning_rate: float = 2e-5
    weight_decay: float = 0.0
    warmup_ratio: float = 0.03
    batch_size: int = 2
    grad_accum: int = 1
    epochs: int = 2
    max_grad_norm: float = 1.0
    bf16: str | bool = "auto"
    gradient_checkpointing: str | bool = "auto"
    answer_only_logits: bool = True
    seed: int = 0
    max_steps: int | None = None
    checkpoint_every: int = 50
    keep_checkpoints: int = 2
    log_every: int = 1

    def check(self) -> None:
        """Every field in its range (integers >= 1, finite floats), else `UserInputError`."""
        for name in ("lora_rank", "batch_size", "grad_accum", "epochs", "checkpoint_every", "log_every"):
            check_count(getattr(self, name), name)
        check_count(self.max_steps, "max_steps", allow_none=True)
        check_count(self.keep_checkpoints, "keep_checkpoints", min=0)
        check_float(self.focus_weight, "focus_weight (lambda)", min=0)
        for name in ("learning_rate", "focus_sigma", "focus_eps", "max_grad_norm"):
            check_float(getattr(self, name), name, min=0, min_open=True)
        check_float(self.weight_decay, "weight_decay", min=0)
        check_float(self.lora_dropout, "lora_dropout", min=0, max=1, max_open=True)
        if self.lora_alpha is not None:
            check_float(self.lora_alpha, "lora_alpha", min=0, min_open=True)
        if self.focus_query not in ("final", "answer"):
            raise UserInputError(f"focus_query must be 'final' or 'answer', got {self.focus_query!r}")
        if not 0 <= self.warmup_ratio < 1:
            raise UserInputError(f"warmup_ratio must be in [0, 1), got {self.warmup_ratio}")


@dataclass
class SFTResult(Result):
    """What a run did: steps, losses, time per step, where things were written (the run's folder
    holds `sft_result.json` and `train_log.jsonl`, the losses every `log_every` steps)."""

    filename: ClassVar[str] = "sft_result.json"
    kind: ClassVar[str] = "sft"

    steps: int
    total_steps: int
    final_sft_loss: float | None
    final_focus_loss: float | None
    mean_step_time_s: float
    resumed_from: int | None
    out_dir: str
    config: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> SFTResult:
        return cls(**own_fields(cls, data))

    def plot(self, title: str = "Fine-tuning losses"):
        """L_SFT (and L_focus) per logged step, read from the run's `train_log.jsonl`."""
        go = require_plotly()
        lines = [json.loads(line) for line in (Path(self.out_dir) / LOG_FILE).read_text().splitlines() if line.strip()]
        steps = [row for row in lines if "step" in row and "sft_loss" in row]
        figure = go.Figure([go.Scatter(x=[r["step"] for r in steps], y=[r["sft_loss"] for r in steps], name="L_SFT")])
        if any(r.get("focus_loss") is not None for r in steps):
            figure.add_trace(go.Scatter(x=[r["step"] for r in steps], y=[r.get("focus_loss") for r in steps],
                                        name="L_focus"))
        return figure.update_layout(title=title, xaxis_title="optimizer step", yaxis_title="loss")


def use_bf16(setting: str | bool, device: torch.device) -> bool:
    if setting == "auto":
        return device.type == "cuda" and torch.cuda.is_bf16_supported()
    return bool(setting)


class StepPlan:
    """Which examples each optimizer step uses: a pure function of (seed, epoch, step)."""

    def __init__(self, n_examples: int, config: SFTConfig):
        self.n = n_examples
        self.config = config
        self.micro_per_epoch = math.ceil(n_examples / config.batch_size)
        self.steps_per_epoch = math.ceil(self.micro_per_epoch / config.grad_accum)
        full = self.steps_per_epoch * config.epochs
        self.total_steps = min(full, config.max_steps) if config.max_steps else full
        # linear warm-up over ceil(warmup_ratio * total) steps, then linear decay to 0 (HF's schedule)
        self.warmup_steps = math.ceil(config.warmup_ratio * self.total_steps)

    def rate_at(self, step: int) -> float:
        return learning_rate_at(step, self.total_steps, self.config.learning_rate, self.warmup_steps, "linear")

    def order(self, epoch: int) -> list[int]:
        generator = torch.Generator().manual_seed(self.config.seed * 100_003 + epoch)
        return torch.randperm(self.n, generator=generator).tolist()

    def micro_batches(self, step: int) -> list[list[int]]:
        epoch, within = divmod(step, self.steps_per_epoch)
        order = self.order(epoch)
        size, accum = self.config.batch_size, self.config.grad_accum
        first = within * accum
        last = min(first + accum, self.micro_per_epoch)
        return [order[m * size : (m + 1) * size] for m in range(first, last)]


def query_positions(batch: SFTBatch, mode: str) -> torch.Tensor:
    if mode == "final":
        return batch.prompt_final
    # every position that predicts an answer token (answers of a batch may differ in length:
    # shorter rows repeat their final prompt position, which does not change the row's mean much)
    n_answer = (batch.labels != -100).sum(-1)  # includes the closing token
    longest = int(n_answer.max())
    offsets = torch.arange(longest - 1, -1, -1, device=batch.labels.device)
    positions = batch.labels.shape[1] - 2 - offsets  # [T]: ..., seq - 2
    first = batch.prompt_final[:, None]
    return torch.maximum(positions[None, :].expand(len(n_answer), -1), first)


def _sft_loss(model: HookedVLM, batch: SFTBatch, config: SFTConfig) -> torch.Tensor:
    if config.answer_only_logits:
        return answer_only_loss(model, model(batch.inputs, stop_at_layer=model.cfg.n_layers), batch.labels)
    return answer_loss(model(batch.inputs), batch.labels)


@contextmanager
def micro_batch(
    model: HookedVLM, batch: SFTBatch, config: SFTConfig, layers: Sequence[int], autocast=None
) -> Iterator[tuple[torch.Tensor, torch.Tensor | None]]:
    """(L_SFT, L_focus or None) of one micro-batch; call ``backward`` inside the ``with``.

    The attention-pattern hooks of L_focus stay on until the block exits, so a block that
    gradient checkpointing recomputes in the backward takes the same (materialised) attention
    path as in the forward. ``autocast`` (a context, e.g. bf16) covers the forward only.
    """
    use_focus = config.focus_weight > 0 and batch.prior is not None
    capture = (
        capture_patterns(model, layers, query_positions(batch, config.focus_query)) if use_focus else nullcontext()
    )
    with capture as captured:
        with autocast or nullcontext():
            sft = _sft_loss(model, batch, config)
        focus = None
        if use_focus:
            assert captured is not None and batch.prior is not None  # what use_focus means
            focus = focus_loss(captured, batch.prior, config.focus_eps)
        yield sft, focus


def batch_losses(
    model: HookedVLM, batch: SFTBatch, config: SFTConfig, layers: Sequence[int]
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(L_SFT, L_focus or None) of one micro-batch, for evaluation (no backward: the hooks are gone
    on return; train through :func:`micro_batch`)."""
    with micro_batch(model, batch, config, layers) as losses:
        return losses


def train_sft(
    model: HookedVLM,
    examples: Sequence[SFTExample],
    config: SFTConfig | None = None,
    out_dir: str | Path = "sft_out",
    resume: bool = True,
    stop_after: int | None = None,
    progress: bool = True,
    force_resume: bool = False,
) -> SFTResult:
    """Fine-tune `model` (a HookedVLM) in place with LoRA; writes checkpoints, a JSONL log and
    the final adapters (peft format for the HF model) under `out_dir`.

    stop_after: return after this many optimizer steps of *this call* (a checkpoint is written
        first), e.g. to split a run; a later call with resume=True continues.
    force_resume: resume even if the checkpoint was written with other data or settings (each
        checkpoint records a hash of both; by default a mismatch is an error, not a silent mix).
    """
    config = config or SFTConfig()
    config.check()
    if not examples:
        raise UserInputError("train_sft got no examples: pass at least one SFTExample (e.g. from a --data folder)")
    check_answers(model, examples)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(config.seed)
    if not has_lora(model):
        add_lora(
            model,
            rank=config.lora_rank,
            alpha=config.lora_alpha,
            dropout=config.lora_dropout,
            projections=config.projections,
        )
    params = lora_parameters(model)
    optimizer = torch.optim.AdamW(params.values(), lr=config.learning_rate, weight_decay=config.weight_decay)
    plan = StepPlan(len(examples), config)
    layers = (
        model_focus_layers(model) if config.focus_layers is None else list(config.focus_layers)
    )
    device = model.unembed.device
    autocast = (
        torch.autocast(device_type=device.type, dtype=torch.bfloat16)
        if use_bf16(config.bf16, device)
        else nullcontext()
    )

    start_step, resumed_from = 0, None
    fingerprint = run_fingerprint(config, examples)
    latest = latest_checkpoint(out_dir) if resume else None
    if not resume and (out_dir / "checkpoints").is_dir():
        # starting over must neither mix with nor overwrite the earlier run's checkpoints: keep them aside
        kept = _set_aside(out_dir / "checkpoints")
        warnings.warn(f"resume=False: the checkpoints already in {out_dir} were moved to {kept}", stacklevel=2)
    if latest is not None:
        check_resume(latest, config, fingerprint, len(examples), force=force_resume)  # before touching weights
        info = load_checkpoint(latest, params, optimizer)
        start_step = resumed_from = info["step"]

    def checkpoint(step: int, losses: dict) -> None:
        save_checkpoint(
            out_dir,
            step,
            params,
            optimizer,
            {"config": asdict(config), "n_examples": len(examples), "fingerprint": fingerprint, "losses": losses},
            keep=config.keep_checkpoints,
        )

    checkpointing = use_checkpointing(config.gradient_checkpointing, model)
    model.train()
    log_path = out_dir / LOG_FILE
    step_times: list[float] = []
    last: dict[str, float | None] = {"sft": None, "focus": None}
    step = start_step
    try:
        with (
            gradient_checkpointing(model, checkpointing),
            log_path.open("a") as log,
            tqdm(
                total=plan.total_steps,
                initial=start_step,
                disable=not progress,
                desc="sft" + (" + focus" if config.focus_weight > 0 else ""),
            ) as bar,
        ):
            log.write(
                json.dumps(
                    {
                        "event": "start",
                        "step": start_step,
                        "total_steps": plan.total_steps,
                        "config": asdict(config),
                        "focus_layers": layers,
                        "gradient_checkpointing": checkpointing,
                    }
                )
                + "\n"
            )
            while step < plan.total_steps:
                if stop_after is not None and step - start_step >= stop_after:
                    break
                begin = time.perf_counter()
                lr = plan.rate_at(step)
                for group in optimizer.param_groups:
                    group["lr"] = lr
                micro = plan.micro_batches(step)
                sft_total, focus_total = 0.0, 0.0
                optimizer.zero_grad(set_to_none=True)
                for rows in micro:
                    batch = collate(
                        model,
                        [examples[i] for i in rows],
                        sigma=config.focus_sigma,
                        with_prior=config.focus_weight > 0,
                    )
                    with micro_batch(model, batch, config, layers, autocast) as (sft, focus):
                        loss = sft + config.focus_weight * focus if focus is not None else sft
                        sft_value = sft.detach().item()
                        focus_value = None if focus is None else focus.detach().item()
                        if not torch.isfinite(loss.detach()):
                            _non_finite(step, sft_value, focus_value, out_dir)
                        (loss / len(micro)).backward()
                    sft_total += sft_value / len(micro)
                    focus_total += (focus_value or 0.0) / len(micro)
                grad_norm = torch.nn.utils.clip_grad_norm_(list(params.values()), config.max_grad_norm)
                if not torch.isfinite(grad_norm):
                    _non_finite(step, sft_total, focus_total, out_dir, what="gradient norm")
                optimizer.step()
                step += 1
                step_times.append(time.perf_counter() - begin)
                last = {"sft": sft_total, "focus": focus_total if config.focus_weight > 0 else None}
                bar.update(1)
                bar.set_postfix(sft=f"{sft_total:.4f}", focus=f"{focus_total:.4f}", lr=f"{lr:.2e}")
                if step % config.log_every == 0 or step == plan.total_steps:
                    log.write(
                        json.dumps(
                            {
                                "step": step,
                                "sft_loss": sft_total,
                                "focus_loss": last["focus"],
                                "lr": lr,
                                "grad_norm": float(grad_norm),
                                "step_time_s": round(step_times[-1], 4),
                            }
                        )
                        + "\n"
                    )
                    log.flush()
                if (
                    step % config.checkpoint_every == 0
                    or step == plan.total_steps
                    or (stop_after is not None and step - start_step >= stop_after)
                ):
                    checkpoint(step, last)
    finally:
        model.eval()
    if step == plan.total_steps:
        save_adapters(model, out_dir / "adapter", overwrite=True)  # this run's own folder
    result = SFTResult(
        steps=step,
        total_steps=plan.total_steps,
        final_sft_loss=last["sft"],
        final_focus_loss=last["focus"],
        mean_step_time_s=sum(step_times) / len(step_times) if step_times else 0.0,
        resumed_from=resumed_from,
        out_dir=str(out_dir),
        config=asdict(config),
    )
    result.save(out_dir)
    return result


# settings that may change between a run and its resumption without changing its result
_RESUME_FREE_FIELDS = ("checkpoint_every", "keep_checkpoints", "log_every")


def run_fingerprint(config: SFTConfig, examples: Sequence[SFTExample]) -> dict:
    """sha256 of the settings that shape the result and of the data (questions, answers, objects,
    image pixels), stored in every checkpoint so a resume can tell it continues the same run."""
    settings = {k: v for k, v in asdict(config).items() if k not in _RESUME_FREE_FIELDS}
    data = hashlib.sha256()
    for example in examples:
        data.update(json.dumps([example.question, example.answer, example.objects], default=str).encode())
        for image in example.images:
            data.update(f"{image.mode}{image.size}".encode())
            data.update(image.tobytes())
    return {"settings": hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest(),
            "data": data.hexdigest()}


def check_resume(folder: Path, config: SFTConfig, fingerprint: dict, n_examples: int, force: bool = False) -> None:
    """Refuse (`UserInputError`) to resume from a checkpoint of a run with other data or settings."""
    info = read_json_file(folder / "state.json", "the checkpoint state", f"delete {folder} to resume from the one before")
    stored = info.get("fingerprint")
    if stored is None:  # a checkpoint from before fingerprints: only seed and data size can be compared
        same = info.get("config", {}).get("seed") == config.seed and info.get("n_examples") == n_examples
    else:
        same = stored == fingerprint
    if same or force:
        return
    old = {k: v for k, v in info.get("config", {}).items() if k not in _RESUME_FREE_FIELDS}
    new = {k: v for k, v in json.loads(json.dumps(asdict(config), default=str)).items()  # as stored: tuples -> lists
           if k not in _RESUME_FREE_FIELDS}
    changed = [f"{k} {old.get(k)!r} -> {new.get(k)!r}" for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)]
    if (stored or {}).get("data") != fingerprint.get("data"):
        changed.append(f"the data ({info.get('n_examples')} -> {n_examples} examples, or their content)")
    raise UserInputError(
        f"{folder} belongs to a run with other settings ({'; '.join(changed) or 'settings hash differs'}); "
        "resuming would mix two runs. Use a fresh --out, --no-resume to start over, or --force-resume to "
        "continue anyway."
    )


def _set_aside(folder: Path) -> Path:
    """Rename `folder` to the first free `<name>.previous-N` beside it; returns the new path."""
    n = 1
    while (target := folder.with_name(f"{folder.name}.previous-{n}")).exists():
        n += 1
    folder.rename(target)
    return target


def _non_finite(step: int, sft: float, focus: float | None, out_dir: Path, what: str = "loss") -> None:
    latest = latest_checkpoint(out_dir)
    where = f"the last good checkpoint is {latest}" if latest else "no checkpoint was written yet"
    raise NonFiniteLossError(
        f"non-finite {what} at optimizer step {step + 1} (L_SFT={sft}, L_focus={focus}); training stopped "
        f"before updating the weights and {where}. Lower the learning rate or check the batch, then rerun "
        "with resume=True to continue from that checkpoint."
    )
