"""The explicit attention path (`run_with_cache` with the pattern) now against before, interleaved in one process.

Cases, alternated in one process (order reversed every other run; each run's ratio to the forward of the same
run, so load that shifts between runs cancels): the forward (`model(inputs)`, SDPA attention);
`run_with_cache(inputs)` (every hook, the pattern included) with the explicit path as it is; the same with the
explicit path as it was before issue 42 ("before": scores scaled, the additive mask added, the mask value
written, then a softmax into a new tensor); and every hook but the pattern (attention stays on SDPA).
Every cached activation of "now" is compared with "before" (the largest difference is printed). Times are CPU
seconds of this process (user + system; one torch thread: what the work costs whatever else runs), with
the wall seconds and the minor page faults beside them.

    python benchmarks/bench_explicit_attention.py [--model embedded|larger] [--runs 10] [--threads 1]
        [--image-size 840] [--tokens 1536] [--padded] [--profile | --steps]

--model embedded: `vlens.load()` and one image (--image-size 840: 916 tokens); --model larger: a random tiny
LLaVA (Llama decoder, 4 layers, d_model 512, 16 heads of 32, 4 key/value heads) on --tokens text tokens
(--padded: a batch of two rows, the second left-padded by a quarter of them).
--profile: instead of timing, torch.profiler's self CPU time per op of one call of each cached case.
--steps: instead, the CPU milliseconds of each step of the explicit path, before and now, per layer at this
model's shape ([1, n_heads, tokens, tokens]; medians of --runs passes over n_layers layers whose patterns are
kept, as the cache keeps them, so fresh memory is faulted in where the forward faults it).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import time

import torch

CASES = ("forward", "cache_all", "cache_all_before", "cache_no_pattern")


def _before(self, q, k, v, masks):
    """The explicit path before issue 42 (vlens/core/components/attention.py at 23a4e6a), pattern hook only."""
    from transformers.integrations.sdpa_attention import repeat_kv

    k = repeat_kv(k, self.num_key_value_groups)
    v = repeat_kv(v, self.num_key_value_groups)
    scores = torch.matmul(q, k.transpose(2, 3))
    scores = scores.mul_(self.scaling).add_(masks.additive)
    scores = scores.masked_fill_(~masks.allowed, torch.finfo(scores.dtype).min)
    pattern = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    pattern = self.hook_pattern(pattern)
    return torch.matmul(pattern, v).transpose(1, 2).contiguous()


def _setup(args):
    import vlens

    if args.model == "embedded":
        from vlens.core.devices import configure_resolution
        from vlens.testing import random_image

        model = vlens.load()
        configure_resolution(model.processor, image_size=args.image_size)
        size = args.image_size
        return model, model.prepare(images=[random_image(size, size, 0)], prompts=["How many dots are there?"])
    from vlens.testing.llava import tiny_llava_model, tiny_llava_processor

    hf = tiny_llava_model(n_layers=4, d_model=512, n_heads=16, n_kv_heads=4, d_mlp=1024,
                          max_position_embeddings=max(4096, args.tokens))
    model = vlens.HookedVLM.from_hf(hf, processor=tiny_llava_processor())
    rows = 2 if args.padded else 1
    ids = torch.randint(5, hf.config.text_config.vocab_size, (rows, args.tokens),
                        generator=torch.Generator().manual_seed(0))
    mask = torch.ones(rows, args.tokens, dtype=torch.long)
    mask[rows - 1, : args.tokens // 4 if args.padded else 0] = 0
    return model, model.coerce_inputs(input_ids=ids, attention_mask=mask)


def _call(model, inputs, case: str):
    from vlens.core.components.attention import Attention

    explicit = Attention._explicit_attention
    try:
        if case == "cache_all_before":
            Attention._explicit_attention = _before  # type: ignore[method-assign]
        with torch.no_grad():
            if case == "forward":
                return model(inputs), None
            if case == "cache_no_pattern":
                return model.run_with_cache(inputs, names_filter=lambda name: not name.endswith(
                    ("hook_pattern", "hook_attn_scores")))
            return model.run_with_cache(inputs)
    finally:
        Attention._explicit_attention = explicit  # type: ignore[method-assign]


def _profile(model, inputs) -> dict:
    from torch.profiler import ProfilerActivity, profile

    shares = {}
    for case in ("cache_all", "cache_all_before", "forward"):
        _call(model, inputs, case)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            _call(model, inputs, case)
        events = prof.key_averages()
        total = sum(e.self_cpu_time_total for e in events)
        top = sorted(events, key=lambda e: -e.self_cpu_time_total)[:10]
        shares[case] = {"self_cpu_ms": round(total / 1e3, 1),
                        "top_ops_share": {e.key: round(e.self_cpu_time_total / total, 3) for e in top}}
    return shares


def _steps(model, inputs, runs: int) -> dict:
    from transformers.integrations.sdpa_attention import repeat_kv

    from vlens.core.components.attention import causal_scores

    cfg, n = model.cfg, inputs.seq_len
    generator = torch.Generator().manual_seed(0)
    q = torch.randn(1, n, cfg.n_heads, cfg.d_head, generator=generator).transpose(1, 2)
    k, v = (torch.randn(1, n, cfg.n_key_value_heads, cfg.d_head, generator=generator).transpose(1, 2)
            for _ in range(2))
    masked = torch.ones(n, n, dtype=torch.bool).triu(1)[None, None]
    additive = torch.zeros(1, 1, n, n).masked_fill_(masked, torch.finfo(torch.float32).min)
    lowest, scaling, groups = torch.finfo(torch.float32).min, cfg.d_head ** -0.5, cfg.n_heads // cfg.n_key_value_heads
    times: dict[str, dict[str, list[float]]] = {"before": {}, "now": {}, "reference": {}}

    def step(path: str, name: str, fn, *args, **kwargs):
        start = time.thread_time()
        out = fn(*args, **kwargs)
        times[path].setdefault(name, []).append(time.thread_time() - start)
        return out

    def pattern_v(pattern, v_groups):
        return torch.matmul(pattern, v_groups).transpose(1, 2).contiguous()

    for _ in range(runs):
        kept = []
        for _layer in range(cfg.n_layers):
            k_g, v_g = step("before", "repeat_kv", lambda: (repeat_kv(k, groups), repeat_kv(v, groups)))
            scores = step("before", "QK matmul", torch.matmul, q, k_g.transpose(2, 3))
            step("before", "scale (mul_)", scores.mul_, scaling)
            step("before", "add the mask (add_)", scores.add_, additive)
            step("before", "mask value (masked_fill_)", scores.masked_fill_, masked, lowest)
            pattern = step("before", "softmax into a new tensor", torch.softmax, scores, -1, dtype=torch.float32)
            kept.append(pattern)
            step("before", "pattern @ v", pattern_v, pattern, v_g)
            del scores
        kept.clear()
        for _layer in range(cfg.n_layers):
            k_g, v_g = step("now", "repeat_kv", lambda: (repeat_kv(k, groups), repeat_kv(v, groups)))
            scores = step("now", "causal_scores (QK blocks, scale, mask)", causal_scores, q, k_g, scaling)
            pattern = step("now", "softmax in place", torch.softmax, scores, -1, out=scores)
            kept.append(pattern)
            step("now", "pattern @ v", pattern_v, pattern, v_g)
            # what faulting in (and zeroing) fresh memory of the pattern's size costs, kept like the patterns
            kept.append(step("reference", "fault in a fresh [heads, n, n] tensor (empty + fill_)",
                             torch.full_like, scores, 0.0))
    out = {}
    for path, steps in times.items():
        medians = {name: statistics.median(values) * 1e3 for name, values in steps.items()}
        total = sum(medians.values())
        out[path] = {"ms_per_layer": round(total, 2),
                     "steps_ms_share": {name: (round(ms, 2), round(ms / total, 3)) for name, ms in medians.items()}}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=("embedded", "larger"), default="embedded")
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--image-size", type=int, default=840)
    parser.add_argument("--tokens", type=int, default=1536)
    parser.add_argument("--padded", action="store_true", help="--model larger: two rows, one left-padded")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--steps", action="store_true")
    args = parser.parse_args()
    if args.padded and args.model != "larger":
        parser.error("--padded is for --model larger")
    torch.set_num_threads(args.threads)
    model, inputs = _setup(args)
    if args.steps:
        print(json.dumps({"model": args.model, "tokens": inputs.seq_len, "threads": args.threads,
                          "steps": _steps(model, inputs, args.runs)}, indent=1))
        return
    if args.profile:
        print(json.dumps({"tokens": inputs.seq_len, "threads": args.threads, "profile": _profile(model, inputs)},
                         indent=1))
        return
    now, now_cache = _call(model, inputs, "cache_all")
    before, before_cache = _call(model, inputs, "cache_all_before")
    diff = max((now_cache[name] - before_cache[name]).abs().max().item() for name in before_cache.cache_dict)
    assert set(now_cache.cache_dict) == set(before_cache.cache_dict)
    del now_cache, before_cache
    cpu: dict[str, list[float]] = {case: [] for case in CASES}
    wall: dict[str, list[float]] = {case: [] for case in CASES}
    faults: dict[str, list[int]] = {case: [] for case in CASES}
    _call(model, inputs, "forward")
    _call(model, inputs, "cache_no_pattern")
    for run in range(args.runs):
        for case in CASES if run % 2 == 0 else CASES[::-1]:
            usage, start, start_cpu = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter(), time.process_time()
            out = _call(model, inputs, case)
            cpu[case].append(time.process_time() - start_cpu)
            wall[case].append(time.perf_counter() - start)
            faults[case].append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - usage.ru_minflt)
            del out

    def ratios(values, baseline):
        per_run = [v / b for v, b in zip(values, baseline, strict=True)]
        return {"median": round(statistics.median(per_run), 3), "min": round(min(per_run), 3),
                "max": round(max(per_run), 3)}

    result = {
        "model": args.model, "padded": args.padded, "tokens": inputs.seq_len, "threads": args.threads, "runs": args.runs,
        "load_average": os.getloadavg(),
        "max_abs_diff_now_vs_before_every_cached_activation": diff, "logits_equal": bool(torch.equal(now, before)),
        "cpu_s_median": {case: round(statistics.median(v), 4) for case, v in cpu.items()},
        "wall_s_median": {case: round(statistics.median(v), 4) for case, v in wall.items()},
        "minor_faults_median": {case: statistics.median(v) for case, v in faults.items()},
        "cpu_over_forward_per_run": {case: ratios(cpu[case], cpu["forward"]) for case in CASES[1:]},
        "wall_over_forward_per_run": {case: ratios(wall[case], wall["forward"]) for case in CASES[1:]},
        "cpu_now_over_before_per_run": ratios(cpu["cache_all"], cpu["cache_all_before"]),
        "wall_now_over_before_per_run": ratios(wall["cache_all"], wall["cache_all_before"]),
    }
    print(json.dumps(result, indent=1), flush=True)


if __name__ == "__main__":
    main()
