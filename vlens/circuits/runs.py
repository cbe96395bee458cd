"""What the circuit methods record of a run, and the metric they read.

A run's *record* keeps, per layer, what the graph's receivers read (the residual entering the
block and the residual entering the MLP, before their norms; the final residual) and what its
senders wrote (each head's `hook_z`, each MLP's `hook_mlp_out`). The input nodes' output
entering layer m (`input_stages`) is the merged input embedding plus, for Qwen3-VL, the
DeepStack image features added after the blocks before m.

`check_additive` verifies on a clean run that the residual stream really is the sum the graph
assumes (inputs + every head's z_h W_O[h] + b_O + every MLP output): a family whose blocks are
not additive (e.g. a norm after the attention) is refused instead of scored wrongly.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from jaxtyping import Float
from PIL import Image
from torch import Tensor

from vlens.core.hooks import act_name
from vlens.core.runtime import RunState
from vlens.parallel.options import SweepOptions
from vlens.patching.conditions import gather_positions
from vlens.patching.metrics import MetricFn, MetricFunction, logit_diff
from vlens.patching.pairs import PairBatch, Readout, build_pair_batch, examples_from_pairs
from vlens.utils.errors import UserInputError
from vlens.utils.images import to_rgb

if TYPE_CHECKING:
    from vlens.core.model import HookedVLM

THUMBNAIL_SIDE = 160  # px: the picture a saved result keeps for its figure


@dataclass
class RunRecord:
    """One run of the decoder (detached unless recorded for gradients).

    resid_pre[m], resid_mid[m]: [batch, pos, d_model] what layer m's attention / MLP read
    (before the norm); final: [batch, pos, d_model] the last block's output; z[m]:
    [batch, pos, n_heads, d_head]; mlp_out[m]: [batch, pos, d_model]; ports (when recorded): hook
    name -> the activation of each port hook of the graph's mixers (hook_q / hook_k / hook_v, ...).
    """

    resid_pre: list[Tensor]
    resid_mid: list[Tensor]
    z: list[Tensor]
    mlp_out: list[Tensor]
    final: Tensor
    ports: dict[str, Tensor] | None = None


def record_names(n_layers: int) -> list[str]:
    return [act_name(kind, layer) for layer in range(n_layers) for kind in ("resid_pre", "resid_mid", "z", "mlp_out")]


def record_run(model: HookedVLM, state: RunState, ports: Sequence[str] = ()) -> RunRecord:
    """Run the decoder on `state` and keep what the graph reads and writes (and the hooks `ports`)."""
    store: dict[str, Tensor] = {}

    def keep(act: Tensor, hook) -> None:
        store[hook.name] = act

    n_layers = model.cfg.n_layers
    names = record_names(n_layers) + list(ports)
    with model.hooks(fwd_hooks=[(name, keep) for name in names]):
        final = model.run_blocks(state.resid, state)
    return RunRecord(resid_pre=[store[act_name("resid_pre", m)] for m in range(n_layers)],
                     resid_mid=[store[act_name("resid_mid", m)] for m in range(n_layers)],
                     z=[store[act_name("z", m)] for m in range(n_layers)],
                     mlp_out=[store[act_name("mlp_out", m)] for m in range(n_layers)], final=final,
                     ports={name: store[name] for name in ports} if ports else None)


def deepstack_added(state: RunState, layer: int, like: Tensor) -> Tensor | None:
    """[batch, pos, d_model] the DeepStack features block `layer` adds at the image positions (None: none)."""
    if layer not in state.deepstack:
        return None
    mask, features = state.deepstack[layer]
    out = torch.zeros_like(like)
    out[mask.to(out.device)] = features.to(out.device, out.dtype)
    return out


def input_stages(state: RunState, n_layers: int) -> list[Tensor]:
    """The input nodes' total output entering layer m, m = 0..n_layers (n_layers: the logits).

    Shared tensors where nothing is added (every layer but those after a DeepStack layer)."""
    stages = [state.resid]
    for layer in range(n_layers):
        added = deepstack_added(state, layer, state.resid)
        stages.append(stages[-1] if added is None else stages[-1] + added)
    return stages


def head_outputs(model: HookedVLM, layer: int, z: Tensor) -> Float[Tensor, "... pos n_heads d_model"]:
    """Each head's output z_h W_O[h] (no bias), from z [..., pos, n_heads, d_head]."""
    w_o = model.blocks[layer].attn.W_O  # [n_heads, d_head, d_model]
    return torch.einsum("...he,hed->...hd", z, w_o.to(z.device, z.dtype))


def additive_tolerance(dtype: torch.dtype) -> float:
    return 1e-4 if dtype in (torch.float32, torch.float64) else 3e-2


def attention_post(model: HookedVLM, layer: int) -> Callable[[Tensor], Tensor] | None:
    """What maps a layer's attention output (its heads' z_h W_O[h] summed, + b_O) to what the layer adds
    to the residual stream: None (nothing: a pre-norm block) or the block's post-attention norm
    (`ln1_post`, Gemma's sandwich blocks)."""
    return getattr(model.blocks[layer], "ln1_post", None)


def attention_sum(model: HookedVLM, layer: int, z: Tensor) -> Tensor:
    """[..., pos, d_model]: a layer's attention output before any post-norm, sum_h z_h W_O[h] + b_O."""
    attn = model.blocks[layer].attn
    return head_outputs(model, layer, z).sum(-2) + attn.b_O.to(z.device, z.dtype)


def attention_write(model: HookedVLM, layer: int, z: Tensor) -> Tensor:
    """What the layer's attention adds to the residual stream, from its heads' outputs `z`."""
    post = attention_post(model, layer)
    total = attention_sum(model, layer, z)
    return total if post is None else post(total)


def mlp_write(model: HookedVLM, layer: int, x: Tensor) -> Tensor:
    """What layer `layer`'s MLP adds to the residual stream (its `hook_mlp_out`) when it reads residual `x`:
    mlp(ln2(x)), then the post-MLP norm where the block has one (`ln2_post`, Gemma)."""
    block = model.blocks[layer]
    out = block.mlp(block.ln2(x))
    post = getattr(block, "ln2_post", None)
    return out if post is None else post(out)


def check_additive(model: HookedVLM, state: RunState, record: RunRecord) -> None:
    """Raise if the final residual is not inputs + each layer's attention write (its heads' outputs + b_O,
    through a post-norm where the block has one) + MLP outputs (+ DeepStack)."""
    final = record.final
    total = input_stages(state, model.cfg.n_layers)[-1].to(final.device, torch.float32)
    for layer in range(model.cfg.n_layers):
        z = record.z[layer].to(final.device)
        total = total + attention_write(model, layer, z).float()
        total = total + record.mlp_out[layer].to(final.device, torch.float32)
    scale = float(final.float().abs().max().clamp_min(1e-6))
    error = float((total - final.float()).abs().max()) / scale
    if not error <= additive_tolerance(final.dtype):
        raise UserInputError(
            f"this model's residual stream is not the sum of what its heads and MLPs write (relative error "
            f"{error:.2e}): circuit graphs need blocks resid + [post-norm](attn(ln1(resid))) + mlp(ln2(...)) whose "
            "attention output is o_proj of the heads' hook_z; this family's blocks are built otherwise")


# ---------------------------------------------------------------------- the metric
class CircuitMetric:
    """What the circuit methods score: one value per pair from the logits at the readout positions.

    Default: the logit difference logit[corrupt answer] - logit[clean answer] at the final
    position (as `vlens.patching`); or any differentiable ``metric(logits [n_pairs, n_readout,
    d_vocab]) -> [n_pairs]`` (``metric(logits, rows)`` to know which pairs of the batch it sees).
    """

    def __init__(self, batch: PairBatch, metric: MetricFn | MetricFunction | None = None,
                 readout: Readout = "final", rows: Sequence[int] | None = None):
        if metric is None and readout != "final":
            raise UserInputError("the default metric (logit difference) reads the final position: pass metric=... "
                                 f"to read readout={readout!r}")
        self.batch, self.readout = batch, readout
        self.scorer = None if metric is None else metric if isinstance(metric, MetricFunction) else MetricFunction(metric)
        self.name = "logit_diff" if self.scorer is None else self.scorer.name
        self.rows = list(range(batch.n_pairs)) if rows is None else [int(r) for r in rows]
        self.positions = batch.readout_positions(readout)[self.rows]

    def subset(self, rows: Sequence[int]) -> CircuitMetric:
        """The metric of some pairs (indices into this metric's batch)."""
        full_rows = [self.rows[int(r)] for r in rows]
        scorer = None if self.scorer is None else self.scorer.subset(full_rows)
        metric = CircuitMetric.__new__(CircuitMetric)
        metric.batch, metric.readout, metric.scorer, metric.name = self.batch, self.readout, scorer, self.name
        metric.rows, metric.positions = full_rows, self.batch.readout_positions(self.readout)[full_rows]
        return metric

    @property
    def n_pairs(self) -> int:
        return len(self.rows)

    def __call__(self, model: HookedVLM, resid: Float[Tensor, "copies_pairs pos d_model"]) -> Float[Tensor, "copies n_pairs"]:
        """Metric values of K stacked copies of the pairs ([K * n_pairs, pos, d_model] final residual)."""
        n = self.n_pairs
        if resid.shape[0] % n:
            raise RuntimeError(f"{resid.shape[0]} rows are not copies of {n} pairs")
        copies = resid.shape[0] // n
        positions = self.positions.to(resid.device).repeat(copies, 1)
        logits = model.finish(gather_positions(resid, positions))  # [K * n, n_readout, d_vocab]
        if self.scorer is None:
            tokens = torch.tensor(self.rows)
            clean = self.batch.clean_tokens[tokens].repeat(copies)
            corrupt = self.batch.corrupt_tokens[tokens].repeat(copies)
            return logit_diff(logits[:, -1], clean, corrupt).view(copies, n)
        values = []
        for k in range(copies):
            value = self.scorer.raw(logits[k * n:(k + 1) * n])
            if not isinstance(value, Tensor) or value.shape != (n,):
                shape = tuple(value.shape) if isinstance(value, Tensor) else type(value).__name__
                raise UserInputError(f"circuit methods need one metric value per pair [{n}], got {shape}; return a "
                                     "tensor with one value per pair (a dict of metrics is not supported here)")
            values.append(value)
        return torch.stack(values)


# ---------------------------------------------------------------------- how a run goes
def circuit_options(options: SweepOptions | None, where: str) -> SweepOptions:
    """`options` (default `SweepOptions()`), checked for what the circuit methods use: batch_size (pairs
    per chunk), max_batch (rows per patched forward), readout, progress, sharding."""
    options = SweepOptions() if options is None else options
    if not isinstance(options, SweepOptions):
        raise UserInputError(f"{where}: options must be a vlens.SweepOptions, got {type(options).__name__}")
    if options.cache_device is not None:
        raise UserInputError(f"{where} keeps its cached runs on the model's device: SweepOptions.cache_device is not "
                             "supported here (lower SweepOptions.batch_size to save memory)")
    return options


# ---------------------------------------------------------------------- pairs in
def pair_batch(model: HookedVLM, pairs: Any) -> tuple[PairBatch, Image.Image | None]:
    """(PairBatch, a thumbnail of the first clean image or None) from a PairBatch or pairs
    (`PairExample`s / `vlens.data.Pair`s)."""
    if isinstance(pairs, PairBatch):
        return pairs, None
    if not isinstance(pairs, Sequence) or isinstance(pairs, (str, bytes)) or not pairs:
        raise UserInputError("pairs must be a PairBatch (vlens.patching.build_pair_batch) or a non-empty list of "
                             f"pairs (vlens.patching.make_count_pairs), got {type(pairs).__name__}")
    examples = [p if hasattr(p, "clean_prompt") else examples_from_pairs([p])[0] for p in pairs]
    return build_pair_batch(model, examples), thumbnail(examples[0].clean_image)


def thumbnail(image: Any, side: int = THUMBNAIL_SIDE) -> Image.Image | None:
    """A small RGB copy of `image` (the first of a list), or None for text-only pairs."""
    if isinstance(image, (list, tuple)):
        image = image[0] if image else None
    if image is None:
        return None
    picture = to_rgb(image, what="pair image").copy()
    picture.thumbnail((side, side))
    return picture
