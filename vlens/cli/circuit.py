"""``vlens circuit``: edge attribution (EAP / EAP-IG), a circuit with exactly measured faithfulness.

    vlens circuit --model tiny --make-pairs 32 --method eap-ig --out runs/circuit
    vlens circuit --model tiny --pairs data/pairs --target 0.8 --exact-check 50 --image-attribution --out runs/c

Scores every edge of the decoder's graph (input nodes, heads, MLPs, logits), then takes the
smallest set of top-ranked edges whose faithfulness, measured exactly by edge patching, reaches
``--target`` (or the top ``--top-k``). Writes ``results.json`` (the circuit, its faithfulness
curve with bootstrap intervals, every edge's score), ``circuit.html`` (the graph, image regions
drawn on the first pair's picture) and ``faithfulness.html``; ``--exact-check K`` also patches
the K top-ranked edges one at a time and reports the rank correlation of their scores with the
exact effects; ``--image-attribution`` adds per image-token scores (``image_attribution.html``).
Under torchrun the pair chunks and patched runs are split across the processes.
"""

from __future__ import annotations

import argparse
import logging
import math

from vlens.cli.console import echo, non_finite_exit
from vlens.cli.options import (
    RESULTS_FILE,
    add_model_options,
    add_out,
    image_nodes_arg,
    load_model_from_args,
    prepare_out,
    write_figure,
    write_results,
)
from vlens.cli.patch import add_pair_arguments, load_batch, load_examples
from vlens.utils.finite import add_allow_nan_argument
from vlens.utils.validation import arg_float, arg_int

logger = logging.getLogger(__name__)

CIRCUIT_FILE = "circuit.html"
CURVE_FILE = "faithfulness.html"
IMAGE_FILE = "image_attribution.html"
DEFAULT_TARGET = 0.9


def configure(parser: argparse.ArgumentParser) -> None:
    add_model_options(parser, render_default="model")
    add_pair_arguments(parser)  # --pairs | --make-pairs, --only-correct, --limit, --seed, --style, --pair-batch-size
    add_out(parser, f"{RESULTS_FILE}, {CIRCUIT_FILE}, {CURVE_FILE} (and {IMAGE_FILE})")
    parser.add_argument("--method", default="eap-ig", choices=("eap", "eap-ig"),
                        help="edge scores: EAP (clean gradients) or EAP-IG (integrated along corrupt -> clean inputs; "
                             "default)")
    parser.add_argument("--ig-steps", type=arg_int(min=1), default=None, metavar="M",
                        help="EAP-IG steps (default 5; eap-ig only)")
    parser.add_argument("--image-nodes", type=image_nodes_arg, default="token", metavar="SPEC",
                        help="input nodes of an image: token (one per image token, default), image (one per image) "
                             "or ROWSxCOLS blocks of the token grid (e.g. 3x3)")
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--target", type=arg_float(min=0.0, max=1.0, min_open=True), default=None,
                      help=f"faithfulness the circuit must reach (default {DEFAULT_TARGET})")
    size.add_argument("--top-k", type=arg_int(min=1), default=None, metavar="K",
                      help="take the K top-ranked edges instead of a target")
    parser.add_argument("--rank-by", default="abs", choices=("abs", "signed"),
                        help="rank edges by |score| (default) or by signed score")
    parser.add_argument("--no-prune", action="store_true",
                        help="keep edges that lie on no input-to-logits path within the circuit")
    parser.add_argument("--exact-check", type=arg_int(min=0), default=0, metavar="K",
                        help="also patch the K top-ranked edges one at a time, exactly, and report the rank "
                             "correlation of their scores with the exact effects (default 0: off)")
    parser.add_argument("--image-attribution", action="store_true",
                        help=f"also score every image token (gradient x input, attribution patching, exact token "
                             f"patching) into results.json and {IMAGE_FILE}")
    parser.add_argument("--max-batch", type=arg_int(min=1), default=64,
                        help="rows (copies x pairs) per patched forward (default 64)")
    add_allow_nan_argument(parser)
    parser.set_defaults(func=run_circuit, shardable=True)  # torchrun splits pair chunks and patched runs


def run_circuit(args: argparse.Namespace) -> int:
    from vlens.circuits.graph import parse_image_nodes
    from vlens.utils.errors import UserInputError

    if args.method == "eap" and args.ig_steps is not None:
        raise UserInputError("--ig-steps applies to --method eap-ig only")
    image_nodes = parse_image_nodes(args.image_nodes)  # checked before the model loads
    names = [RESULTS_FILE, CIRCUIT_FILE, CURVE_FILE] + ([IMAGE_FILE] if args.image_attribution else [])
    out = prepare_out(args, *names)

    import torch

    from vlens.circuits import (
        CircuitSettings,
        edge_attribution,
        extract_circuit,
        image_attribution,
        path_patch,
    )
    from vlens.circuits.runs import thumbnail
    from vlens.parallel.options import SweepOptions
    from vlens.patching.attribution import spearman
    from vlens.utils.finite import collect_non_finite

    model = load_model_from_args(args)
    examples = load_examples(args)
    batch = load_batch(model, args, examples)
    by_id = {e.pair_id: e for e in examples}
    picture = thumbnail(by_id[batch.pair_ids[0]].clean_image)
    options = SweepOptions(batch_size=args.batch_size, max_batch=args.max_batch, progress=not args.quiet,
                           sharding=args.sharding)
    with collect_non_finite() as problems:
        scores = edge_attribution(model, batch, method=args.method, ig_steps=args.ig_steps, image_nodes=image_nodes,
                                  options=options)
        scores.thumbnail = picture
        target = None if args.top_k is not None else (DEFAULT_TARGET if args.target is None else args.target)
        settings = CircuitSettings(method=args.method, ig_steps=args.ig_steps, image_nodes=image_nodes,
                                   rank_by=args.rank_by, prune=not args.no_prune, seed=args.seed)
        circuit = extract_circuit(model, batch, scores=scores, target=target, top_k=args.top_k, settings=settings,
                                  options=options)
        if args.exact_check:
            top = [name for name, _ in scores.top(min(args.exact_check, scores.graph.n_edges), by=args.rank_by)]
            exact = path_patch(model, batch, top, image_nodes=image_nodes, options=options)
            index = torch.tensor([scores.graph.edge_index(name) for name in top])
            check = exact_check_summary(scores.scores[index], exact.effects, [scores.graph.edge_types[i] for i in index],
                                        spearman)
            check["edges"] = top
            check["exact_effects"] = exact.effects.tolist()
            circuit.extra["exact_check"] = check
            echo(f"exact check of the top {len(top)} edges: Spearman(score, exact effect) = {check['spearman']:.3f}")
        attribution = None
        if args.image_attribution:
            attribution = image_attribution(model, [by_id[i] for i in batch.pair_ids], options=options)
            circuit.extra["image_attribution"] = attribution.to_dict()
    if not args.sharding.is_main:  # every rank holds the result; rank 0 writes it
        return non_finite_exit(problems, True, "vlens circuit")
    circuit.extra.update({"model": args.model, "world_size": args.sharding.world_size})  # + provenance on write
    written = [write_results(out, circuit.to_dict()), write_figure(circuit.plot, out / CIRCUIT_FILE),
               write_figure(circuit.plot_curve, out / CURVE_FILE)]
    if attribution is not None:
        written.append(write_figure(attribution.plot, out / IMAGE_FILE))
    measured = (f"faithfulness {circuit.faithfulness:.3f} [{circuit.interval[0]:.3f}, {circuit.interval[1]:.3f}]"
                if math.isfinite(circuit.faithfulness) else
                "faithfulness undefined (NaN: the clean and corrupt runs differ by no more than their noise floor)")
    echo(f"circuit: {circuit.n_edges} of {scores.graph.n_edges} edges (top {circuit.k} by {args.rank_by} "
         f"{args.method} score), {measured} on {batch.n_pairs} pairs")
    logger.info("wrote %s", ", ".join(str(p) for p in written if p))
    return non_finite_exit(problems, args.allow_nan, "vlens circuit")


def exact_check_summary(scores, effects, types: list[str], spearman) -> dict:
    """Rank correlation of scores with exact effects, overall and per edge type (types with >= 3 edges)."""
    out: dict = {"n_edges": len(types), "spearman": spearman(scores, effects) if len(types) >= 2 else float("nan"),
                 "per_type": {}}
    for kind in sorted(set(types)):
        rows = [i for i, t in enumerate(types) if t == kind]
        if len(rows) >= 3:
            out["per_type"][kind] = {"n_edges": len(rows), "spearman": spearman(scores[rows], effects[rows])}
    return out
