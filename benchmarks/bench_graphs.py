"""Attribution graph cost vs model size and prompt length, and transcoder training throughput.

    python benchmarks/bench_graphs.py --threads 2 --runs 3

Graphs: tiny random Qwen2.5-VL models (`vlens.testing`) of growing width / depth, image sizes giving
growing prompt lengths, random cross-layer TopK transcoders (k = 4 per layer and token, so the number
of active features grows with layers x positions); per case the wall time of `attribution_graph`
divided by one forward of the model on the same prompt (medians of `--runs` interleaved runs), the
graph's own count of forward-equivalents, active features and backward passes. Training: transcoder
steps on pairs already in memory vs the `PairSource`'s model forwards (tokens/s, medians). Prints JSON
and Markdown tables; ratios, not absolute times, are the result.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from vlens import HookedVLM
from vlens.data import make_task_sample
from vlens.graphs import GraphSettings, ReplacementModel, attribution_graph
from vlens.sae.activations import TensorSource
from vlens.testing import random_image, tiny_hf_model, tiny_qwen_processor
from vlens.transcoders import PairSource, TranscoderConfig, Transcoders, TranscoderTraining, train_transcoders


def build(n_layers: int, d_model: int) -> HookedVLM:
    hf = tiny_hf_model("qwen2_5_vl", seed=0, n_layers=n_layers, d_model=d_model, n_heads=4, n_kv_heads=2, d_mlp=2 * d_model)
    return HookedVLM.from_hf(hf, processor=tiny_qwen_processor())


def transcoders(model: HookedVLM, d_tc: int) -> Transcoders:
    cfg = TranscoderConfig(kind="clt", activation="topk", layers=tuple(range(model.cfg.n_layers)),
                           d_model=model.cfg.d_model, d_tc=d_tc, k=4)
    return Transcoders(cfg).initialize(torch.Generator().manual_seed(0), decoder_norm=1.0)


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def graph_case(n_layers: int, d_model: int, size: int, runs: int) -> dict:
    model = build(n_layers, d_model)
    inputs = model.prepare(images=[[random_image(size, size, seed=1)]], prompts=["How many dots are there?"])
    replacement = ReplacementModel(model, transcoders(model, 4 * d_model))
    settings = GraphSettings(batch_size=32, max_features=None)
    forwards, graphs, graph = [], [], None
    for _ in range(runs):  # interleaved: the load moves both alike
        with torch.no_grad():
            forwards.append(timed(lambda: model(inputs)))
        start = time.perf_counter()
        graph = attribution_graph(replacement, inputs, target=3, contrast=4, settings=settings)
        graphs.append(time.perf_counter() - start)
    assert graph is not None
    forward, total = statistics.median(forwards), statistics.median(graphs)
    return {"n_layers": n_layers, "d_model": d_model, "image_px": size, "prompt_tokens": len(graph.prompt_tokens),
            "active_features": graph.cost["active_features"], "backward_passes": graph.cost["backward_passes"],
            "forward_equivalents": graph.cost["forward_equivalents"], "forward_s": forward, "graph_s": total,
            "graph_over_forward": total / forward}


def training_case(runs: int, prompts: int) -> dict:
    model = build(2, 64)
    samples = []
    for i in range(prompts):
        image, record = make_task_sample("counting", seed=i, size=56, style="syndot")
        samples.append({"image": image, **record})
    source_times, step_times, n_tokens = [], [], 0
    training = TranscoderTraining(kind="clt", activation="relu", d_tc=256, total_tokens=4096, batch_size=256,
                                  buffer_size=1024, warmup_steps=5)
    for _ in range(runs):
        source = PairSource(model, samples, positions="all", prompts_per_chunk=8)
        start = time.perf_counter()
        rows = torch.cat([source.chunk(i).acts for i in range(source.n_chunks)])
        source_times.append(time.perf_counter() - start)
        n_tokens = rows.shape[0]
        stream = TensorSource(rows, 1024)
        step_times.append(timed(lambda stream=stream: train_transcoders(stream, training, layers=(0, 1))))
    source_rate = n_tokens / statistics.median(source_times)
    step_rate = training.total_tokens / statistics.median(step_times)
    return {"prompts": prompts, "pairs_per_pass": n_tokens, "source_tok_s": source_rate, "steps_tok_s": step_rate,
            "steps_over_source": step_rate / source_rate}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    cases = [graph_case(2, 32, 56, args.runs), graph_case(2, 64, 56, args.runs), graph_case(4, 64, 56, args.runs),
             graph_case(4, 128, 56, args.runs), graph_case(2, 64, 84, args.runs), graph_case(2, 64, 112, args.runs)]
    training = training_case(args.runs, 32)
    print(json.dumps({"graphs": cases, "training": training, "threads": args.threads}, indent=1))
    print("\n| layers | d_model | image px | prompt tokens | active features | backward passes | forward-equivalents "
          "(graph's count) | graph / one forward (wall) |\n|---|---|---|---|---|---|---|---|")
    for c in cases:
        print(f"| {c['n_layers']} | {c['d_model']} | {c['image_px']} | {c['prompt_tokens']} | {c['active_features']} | "
              f"{c['backward_passes']} | {c['forward_equivalents']} | {c['graph_over_forward']:.0f} |")
    t = training
    print(f"\n| pairs per pass | source (forwards) tok/s | transcoder steps tok/s | steps / source |\n|---|---|---|---|\n"
          f"| {t['pairs_per_pass']} | {t['source_tok_s']:.0f} | {t['steps_tok_s']:.0f} | {t['steps_over_source']:.1f} |")


if __name__ == "__main__":
    main()
