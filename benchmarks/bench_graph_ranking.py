"""Feature ranking by influence (circuit-tracer's) vs by direct effect, on the embedded model's counting graph.

    python benchmarks/bench_graph_ranking.py --threads 1

The demo's `--quick` transcoders (`vlens.demo.graph_stage`: skip TopK, trained on the demo's counting
images) and prompt (the first 4-dot image the model answers correctly, target the count minus the next);
per (max_features, batch_size, ranking): backward passes, forward-equivalents and ranking updates
(`graph.cost`), the process CPU seconds of `attribution_graph` and the graph's scores. Prints Markdown.
"""

from __future__ import annotations

import argparse
import time

import torch

import vlens
from vlens.demo.data_stage import counting_samples
from vlens.demo.graph_stage import pick_prompt, train_demo_transcoders
from vlens.demo.settings import DemoSettings
from vlens.graphs import GraphSettings, ReplacementModel, attribution_graph

CASES = [(32, 8), (64, 8), (64, 32), (256, 32)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model = vlens.load()
    model.eval()
    settings = DemoSettings.quick()
    samples = counting_samples(settings)
    sample, target, contrast, _ = pick_prompt(model, samples, settings.graph_count)
    with torch.enable_grad():
        tc, _ = train_demo_transcoders(model, samples, settings, progress=False)
    inputs = model.prepare(images=[sample.image], prompts=[sample.question])
    replacement = ReplacementModel(model, tc)
    print("| max_features | batch | ranking | backward passes | forward-equivalents | ranking updates | CPU (s) "
          "| replacement | completeness |")
    print("|---|---|---|---|---|---|---|---|---|")
    for max_features, batch in [*CASES, (None, 32)]:
        for ranking in ("direct", "influence") if max_features is not None else ("influence",):
            start = time.process_time()
            graph = attribution_graph(replacement, inputs, target=target, contrast=contrast, settings=GraphSettings(
                max_features=max_features, batch_size=batch, ranking=ranking))
            cpu = time.process_time() - start
            scores, cost = graph.scores(), graph.cost
            print(f"| {max_features or 'every feature (' + str(cost['active_features']) + ')'} | {batch} | {ranking} | "
                  f"{cost['backward_passes']} | {cost['forward_equivalents']:,} | {cost['ranking_updates']} | {cpu:.2f} | "
                  f"{scores['replacement']:.3f} | {scores['completeness']:.3f} |", flush=True)


if __name__ == "__main__":
    main()
