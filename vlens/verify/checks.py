"""The checks of `vlens verify`, each against the plain HF model that shares the weights.

Every check returns a `CheckRecord`; none raises for a mismatch (a mismatch is a failed check).
"""

from __future__ import annotations

import re
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from vlens.verify.results import CheckRecord

# documented decoder hook suffixes -> the shape each must have: tokens of (batch, pos, ...) sizes
_RESID = ("hook_resid_pre", "hook_resid_mid", "hook_resid_post", "hook_attn_out", "hook_mlp_out")
_LAYER = re.compile(r"blocks\.(\d+)\.(.+)")


def _real(inputs: Any) -> Tensor:
    return inputs.attention_mask.bool()


def compare_logits(model: Any, inputs: Any, tol: Any, case: str) -> CheckRecord:
    """HookedVLM's logits vs HF's at every real position: max abs and relative difference, top-1 agreement."""
    with torch.no_grad():
        ours = model(inputs).float()
        theirs = model.hf_model(**inputs.to_hf_kwargs()).logits.float()
    if ours.shape != theirs.shape:
        return CheckRecord("logits", case, "fail", {}, f"shape {tuple(ours.shape)} vs HF {tuple(theirs.shape)}")
    real = _real(inputs).to(ours.device)
    a, b = ours[real], theirs[real]
    max_abs = float((a - b).abs().max())
    max_rel = max_abs / max(float(b.abs().max()), 1.0)
    top1 = float((a.argmax(-1) == b.argmax(-1)).float().mean())
    finite = bool(torch.isfinite(a).all())
    ok = finite and max_rel <= tol.logits_rel and top1 >= tol.top1
    detail = "" if ok else ("non-finite logits" if not finite else
                            f"max_rel {max_rel:.3g} > {tol.logits_rel:g} or top-1 {top1:.3f} < {tol.top1:g}")
    return CheckRecord("logits", case, "pass" if ok else "fail",
                       {"max_abs": max_abs, "max_rel": max_rel, "top1_agreement": top1, "positions": int(real.sum())},
                       detail)


def compare_generation(model: Any, inputs: Any, tol: Any, case: str, max_new_tokens: int) -> CheckRecord:
    """Greedy tokens of HookedVLM.generate vs HF's generate. In half precision a first difference at a
    near tie (HF's top-2 margin below the dtype's logit tolerance times the logit scale) is accepted."""
    with torch.no_grad():
        ours = model.generate(inputs, max_new_tokens=max_new_tokens).tokens.cpu()
        hf = model.hf_model.generate(**inputs.to_hf_kwargs(), max_new_tokens=max_new_tokens, do_sample=False,
                                     output_scores=True, return_dict_in_generate=True)
    theirs = hf.sequences[:, inputs.seq_len:].cpu()
    n = min(ours.shape[1], theirs.shape[1])
    same = ours[:, :n] == theirs[:, :n]
    identical = bool(same.all())
    figures: dict[str, Any] = {"identical": identical, "new_tokens": n}
    if identical:
        return CheckRecord("generate", case, "pass", figures)
    row, step = (int(i) for i in (~same).nonzero()[0])
    scores = hf.scores[step][row].float()
    top2 = scores.topk(2).values
    margin = float(top2[0] - top2[1])
    near_tie = margin <= tol.logits_rel * max(float(scores.abs().max()), 1.0)
    figures.update(first_difference_row=row, first_difference_step=step, hf_top2_margin=margin)
    if tol.exact_generation or not near_tie:
        return CheckRecord("generate", case, "fail", figures,
                           f"row {row} differs at new token {step} (HF's top-2 margin there {margin:.3g})")
    return CheckRecord("generate", case, "pass", figures, f"differs at a near tie (margin {margin:.3g})")


def _expected_shape(model: Any, name: str, batch: int, pos: int) -> tuple[int, ...] | None:
    """The documented shape of a decoder hook (None: not one whose shape is documented per layer)."""
    cfg = model.cfg
    if name in ("hook_embed", "hook_inputs_embeds", "ln_final.hook_normalized"):
        return (batch, pos, cfg.d_model)
    if name == "ln_final.hook_scale":
        return (batch, pos, 1)
    match = _LAYER.fullmatch(name)
    if match is None:
        return None
    layer, rest = int(match.group(1)), match.group(2)
    heads, d_head = cfg.heads_at(layer), cfg.d_head_at(layer)
    if rest in _RESID or re.fullmatch(r"ln[12]\.hook_normalized", rest):
        return (batch, pos, cfg.d_model)
    if re.fullmatch(r"ln[12]\.hook_scale", rest):
        return (batch, pos, 1)
    if rest == "attn.hook_z" or (rest in ("attn.hook_q", "attn.hook_rot_q") and not cfg.is_linear_attention(layer)):
        return (batch, pos, heads, d_head)
    if rest in ("attn.hook_k", "attn.hook_v", "attn.hook_rot_k") and not cfg.is_linear_attention(layer):
        return (batch, pos, cfg.kv_heads_at(layer), d_head)
    if rest in ("attn.hook_pattern", "attn.hook_attn_scores"):
        return (batch, heads, pos, pos)
    if rest == "attn.hook_result":
        return (batch, pos, heads, cfg.d_model)
    if rest in ("mlp.hook_pre", "mlp.hook_pre_linear", "mlp.hook_post") and layer not in cfg.moe_layers:
        return (batch, pos, cfg.d_mlp_at(layer))
    return None


def hook_coverage(model: Any, inputs: Any, case: str) -> CheckRecord:
    """Every documented decoder hook the model has fires once with its documented shape (attention
    scores and per-head results included); vision hooks must fire (their shapes are the family's)."""
    fired: dict[str, tuple[int, ...]] = {}
    model.set_use_attn_result(True)
    try:
        _, cache = model.run_with_cache(inputs, attn_scores=True)
        fired = {name: tuple(cache[name].shape) for name in cache.keys()}
    finally:
        model.set_use_attn_result(False)
    batch, pos = inputs.input_ids.shape
    problems: list[str] = []
    checked = 0
    for name in model.hook_dict:
        expected = _expected_shape(model, name, batch, pos)
        if expected is None:
            continue
        checked += 1
        if name not in fired:
            problems.append(f"{name} did not fire")
        elif fired[name] != expected:
            problems.append(f"{name} {fired[name]} != documented {expected}")
    silent_vision = [n for n in model.hook_dict if n.startswith("vision.") and n.endswith("hook_image_embeds")
                     and n not in fired]
    problems += [f"{name} did not fire" for name in silent_vision]
    figures = {"checked": checked, "fired": len(fired), "hook_points": len(model.hook_dict)}
    if problems:
        return CheckRecord("hooks", case, "fail", figures, "; ".join(problems[:4]) + (" ..." if len(problems) > 4 else ""))
    return CheckRecord("hooks", case, "pass", figures)


def _attention_layer(model: Any) -> int | None:
    """The last softmax-attention layer (one with a pattern hook), or None."""
    layers = [i for i in range(model.cfg.n_layers) if f"blocks.{i}.attn.hook_pattern" in model.hook_dict]
    return layers[-1] if layers else None


def causality(model: Any, inputs: Any, tol: Any, case: str) -> CheckRecord:
    """Two edits whose effect is computed by hand:

    1. zeroing head h's ``hook_z`` lowers o_proj's output by exactly ``z_h @ W_O[h]`` (read with a
       temporary torch hook on o_proj, removed on exit);
    2. a ``hook_pattern`` of head h that puts all of the final query's weight on key j makes that
       head's ``hook_z`` at the final position equal ``v_j`` of its key/value head (times the output
       gate where the family gates heads).
    """
    layer = _attention_layer(model)
    if layer is None:
        return CheckRecord("causality", case, "skip", {}, "no softmax-attention layer")
    attn = model.blocks[layer].attn
    head, n_groups = 0, attn.num_key_value_groups
    z_name, v_name = f"blocks.{layer}.attn.hook_z", f"blocks.{layer}.attn.hook_v"
    gate_name = f"blocks.{layer}.attn.hook_output_gate"
    outputs: list[Tensor] = []
    handle = attn.o_proj.register_forward_hook(lambda module, args, out: outputs.append(out.detach().float()))
    try:
        with torch.no_grad():
            _, cache = model.run_with_cache(inputs, names_filter=[z_name, v_name] + (
                [gate_name] if gate_name in model.hook_dict else []))

            def zero_head(z: Tensor, hook: Any) -> Tensor:
                z[:, :, head] = 0
                return z

            model.run_with_hooks(inputs, fwd_hooks=[(z_name, zero_head)])
    finally:
        handle.remove()
    clean, ablated = outputs[0], outputs[1]
    with torch.no_grad():
        by_hand = clean - torch.einsum("bpd,dm->bpm", cache[z_name][:, :, head].float(), attn.W_O[head].float())
    real = _real(inputs).to(clean.device)
    scale = max(float(clean[real].abs().max()), 1.0)
    err_z = float((ablated - by_hand)[real].abs().max()) / scale

    final = inputs.regions.final.to(clean.device)
    key = 0 if inputs.attention_mask[0, 0] else int(inputs.attention_mask[0].argmax())  # row 0's first real token
    rows = torch.arange(inputs.batch_size, device=clean.device)

    def one_hot(pattern: Tensor, hook: Any) -> Tensor:
        pattern[rows, head, final] = 0
        pattern[rows, head, final, key] = 1
        return pattern

    with torch.no_grad(), model.hooks(fwd_hooks=[(f"blocks.{layer}.attn.hook_pattern", one_hot)]):
        _, edited = model.run_with_cache(inputs, names_filter=[z_name])
    v = cache[v_name][rows, key, head // n_groups].float()
    if gate_name in cache.keys():
        v = v * cache[gate_name][rows, final, head].float()
    z = edited[z_name][rows, final, head].float()
    err_pattern = float((z - v).abs().max()) / max(float(v.abs().max()), 1.0)
    figures = {"layer": layer, "head": head, "zero_z_error": err_z, "pattern_error": err_pattern}
    ok = err_z <= tol.edit_rel and err_pattern <= tol.edit_rel
    detail = "" if ok else f"relative error of the hand computation above {tol.edit_rel:g}"
    return CheckRecord("causality", case, "pass" if ok else "fail", figures, detail)


def _median_time(fn: Callable[[], Any], sync: Callable[[], None]) -> float:
    sync()
    start = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - start


def cost(model: Any, inputs: Any, repeats: int, case: str) -> CheckRecord:
    """Forward time (medians of interleaved runs) and, on CUDA, peak memory above the weights, HookedVLM / HF.
    Informational: it passes unless a forward fails."""
    cuda = inputs.input_ids.device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    runs = {"ours": lambda: model(inputs), "hf": lambda: model.hf_model(**inputs.to_hf_kwargs())}
    times: dict[str, list[float]] = {"ours": [], "hf": []}
    peaks: dict[str, float] = {}
    with torch.no_grad():
        for name, fn in runs.items():  # warm-up (and the peak memory of one forward)
            if cuda:
                torch.cuda.empty_cache()
                base = torch.cuda.memory_allocated()
                torch.cuda.reset_peak_memory_stats()
            fn()
            if cuda:
                sync()
                peaks[name] = float(torch.cuda.max_memory_allocated() - base)
        for _ in range(repeats):
            for name, fn in runs.items():
                times[name].append(_median_time(fn, sync))
    ours, hf = statistics.median(times["ours"]), statistics.median(times["hf"])
    figures: dict[str, Any] = {"time_ours_s": ours, "time_hf_s": hf, "time_ratio": ours / hf if hf > 0 else None,
                               "repeats": repeats}
    if cuda:
        figures.update(peak_ours_bytes=peaks["ours"], peak_hf_bytes=peaks["hf"],
                       memory_ratio=peaks["ours"] / peaks["hf"] if peaks["hf"] > 0 else None)
    else:
        figures["memory_ratio"] = None
    return CheckRecord("cost", case, "pass", figures, "" if cuda else "peak memory is measured on CUDA only")
