"""Circuit benchmarks on the embedded model: cost of EAP / EAP-IG against exact patching of every edge,
how well their scores rank the exact edge effects, and the circuits they find.

1. Cost, in forward-equivalents: each method's time divided by the time of one plain forward of
   the same pair batch (clean inputs, vision tower included), measured in the same run; CPU
   seconds of the process (steadier on a shared machine) and wall seconds.
2. Agreement: Spearman rank correlation of the EAP and EAP-IG scores with the exact single-edge
   effects (`path_patch(..., "all")`), over every edge and per edge type (sender kind -> receiver
   kind), and how many of the exact top-50 edges each finds in its own top 50.
3. Circuits: the faithfulness (exact, with 95% bootstrap intervals) of the top-k circuits by each
   ranking (EAP, EAP-IG, and the exact effects themselves as the reference), and the smallest
   EAP-IG circuit reaching 0.9.

    python benchmarks/bench_circuits.py [--pairs 16] [--image-nodes token] [--ig-steps 5] [--threads 1] [--seed 0]
        [--out benchmarks/figures/circuits/bench_circuits.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import replace
from pathlib import Path

import torch

import vlens
from vlens import SweepOptions
from vlens.circuits import CircuitSettings, edge_attribution, extract_circuit, path_patch
from vlens.patching import build_pair_batch, make_count_pairs, spearman


def timed(fn):
    """(result, cpu seconds, wall seconds) of fn()."""
    cpu, wall = time.process_time(), time.perf_counter()
    out = fn()
    return out, time.process_time() - cpu, time.perf_counter() - wall


def forward_seconds(model, batch, repeats: int = 5) -> tuple[float, float]:
    """Median (cpu, wall) seconds of one forward of the clean batch."""
    cpus, walls = [], []
    with torch.no_grad():
        model(batch.clean)
        for _ in range(repeats):
            _, cpu, wall = timed(lambda: model(batch.clean))
            cpus.append(cpu)
            walls.append(wall)
    return statistics.median(cpus), statistics.median(walls)


def agreement(graph, estimate: torch.Tensor, exact: torch.Tensor, top: int = 50) -> dict:
    """Spearman over every edge and per edge type; the exact top-`top` edges found in the estimate's top `top`."""
    types = graph.edge_types
    per_type = {}
    for kind in sorted(set(types)):
        rows = [e for e, t in enumerate(types) if t == kind]
        if len(rows) >= 3:
            value = spearman(estimate[rows], exact[rows])
            per_type[kind] = {"n_edges": len(rows), "spearman": value}
    per_receiver = {}
    for kind in ("q", "k", "v", "mlp", "logits"):
        rows = [e for e, t in enumerate(types) if t.endswith(f"->{kind}")]
        per_receiver[kind] = {"n_edges": len(rows), "spearman": spearman(estimate[rows], exact[rows])}
    best = set(exact.abs().argsort(descending=True)[:top].tolist())
    found = set(estimate.abs().argsort(descending=True)[:top].tolist())
    return {"spearman": spearman(estimate, exact), "spearman_abs": spearman(estimate.abs(), exact.abs()),
            "per_receiver": per_receiver, "per_type": per_type, f"top{top}_found": len(best & found)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=16)
    parser.add_argument("--image-nodes", default="token")
    parser.add_argument("--ig-steps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/figures/circuits/bench_circuits.json"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model = vlens.load()
    pairs = make_count_pairs(args.pairs, seed=args.seed)
    batch = build_pair_batch(model, pairs)
    fwd_cpu, fwd_wall = forward_seconds(model, batch)
    costs = {}
    quiet, shown = SweepOptions(progress=False), SweepOptions(progress=True)
    settings = CircuitSettings(seed=args.seed)
    eap, cpu, wall = timed(lambda: edge_attribution(model, batch, method="eap", image_nodes=args.image_nodes,
                                                    options=quiet))
    costs["EAP"] = (cpu, wall)
    eap_ig, cpu, wall = timed(lambda: edge_attribution(model, batch, method="eap-ig", ig_steps=args.ig_steps,
                                                       image_nodes=args.image_nodes, options=quiet))
    costs[f"EAP-IG ({args.ig_steps} steps)"] = (cpu, wall)
    exact, cpu, wall = timed(lambda: path_patch(model, batch, "all", image_nodes=args.image_nodes, options=shown))
    costs["exact patching of every edge"] = (cpu, wall)
    graph = eap.graph
    effects = exact.edge_effects()
    results = {
        "command": f"python benchmarks/bench_circuits.py --pairs {args.pairs} --image-nodes {args.image_nodes} "
                   f"--ig-steps {args.ig_steps} --threads {args.threads} --seed {args.seed}",
        "seed": args.seed,
        "model": model.summary(), "n_pairs": batch.n_pairs, "seq_len": batch.seq_len, "graph": repr(graph),
        "n_edges": graph.n_edges, "forward_seconds": {"cpu": fwd_cpu, "wall": fwd_wall},
        "clean_metric_mean": float(exact.clean_metric.mean()), "corrupt_metric_mean": float(exact.corrupt_metric.mean()),
        "cost": {name: {"cpu_s": c, "wall_s": w, "forward_equivalents_cpu": c / fwd_cpu,
                        "forward_equivalents_wall": w / fwd_wall} for name, (c, w) in costs.items()},
        "agreement": {"EAP": agreement(graph, eap.scores, effects),
                      "EAP-IG": agreement(graph, eap_ig.scores, effects)},
    }
    ks = [k for k in (8, 16, 32, 64, 128, 256, 512) if k < graph.n_edges]
    curves = {}
    for name, scores in (("EAP", eap), ("EAP-IG", eap_ig)):
        curves[name] = [extract_circuit(model, batch, scores=scores, top_k=k, settings=settings, options=quiet) for k in ks]
    oracle = replace(eap, scores=effects.nan_to_num(0.0), method="exact")  # rank by the exact effects themselves
    curves["exact effects"] = [extract_circuit(model, batch, scores=oracle, top_k=k, settings=settings, options=quiet) for k in ks]
    results["faithfulness_top_k"] = {name: [{"k": c.k, "n_edges": c.n_edges, "faithfulness": c.faithfulness,
                                             "low": c.interval[0], "high": c.interval[1]} for c in found]
                                     for name, found in curves.items()}
    circuit, cpu, wall = timed(lambda: extract_circuit(model, batch, scores=eap_ig, target=0.9, settings=settings, options=quiet))
    results["circuit_target_0.9"] = {"k": circuit.k, "n_edges": circuit.n_edges, "faithfulness": circuit.faithfulness,
                                     "interval": list(circuit.interval), "points_measured": len(circuit.curve),
                                     "cpu_s": cpu, "wall_s": wall, "forward_equivalents_cpu": cpu / fwd_cpu,
                                     "edges": circuit.edge_names}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1) + "\n")
    print(json.dumps({k: v for k, v in results.items() if k not in ("faithfulness_top_k",)}, indent=1)[:6000])
    print(json.dumps(results["faithfulness_top_k"], indent=1))


if __name__ == "__main__":
    main()
