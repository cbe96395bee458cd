"""`vlens graph`: the attribution graph of one image-text prompt's answer.

    vlens graph --model tiny --transcoders runs/tc --image dots.png --prompt "How many dots are there?" \\
        --target 5 --contrast 4 --out runs/graph

Writes graph.json (circuit-tracer's graph schema, with graph-metadata.json for its frontend), graph.html
(vlens's offline viewer) and results.json (the whole graph; `vlens.load_result` reads it back). Without
--model the model is the one the transcoders record (`vlens.cli.recorded_model`).
"""

from __future__ import annotations

import argparse

from vlens.cli.console import echo
from vlens.cli.dataset_options import add_data_arguments, load_data_arg, mark_input_paths
from vlens.cli.options import (
    RESULTS_FILE,
    add_batch_size,
    add_model_options,
    add_out,
    image_nodes_arg,
    load_model_from_args,
    prepare_out,
    rendered_size,
    style_arg,
    task_arg,
)
from vlens.cli.recorded_model import choose_model
from vlens.cli.sae import generated_samples
from vlens.utils.errors import UserInputError
from vlens.utils.validation import arg_float, arg_int, arg_path

RANKINGS = ("influence", "direct")  # vlens.graphs.attribution.RANKINGS (the CLI imports no torch while parsing)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = ("The attribution graph of a prompt's answer: transcoder features, error nodes, text "
                          "tokens and image regions, by direct effects in the replacement model (docs/graphs.md "
                          "in the repository).")
    add_model_options(parser, render_default="model", recorded_by="the transcoder folder")
    source = parser.add_argument("--transcoders", required=True, type=arg_path,
                                 help="a vlens or SAELens transcoder folder, or a circuit-tracer .yaml")
    image = parser.add_argument("--image", type=arg_path, help="the prompt's image (default: a text-only prompt)")
    mark_input_paths(parser, source.dest, image.dest)
    parser.add_argument("--prompt", required=True, help="the question")
    parser.add_argument("--target", required=True, help="the answer token whose logit the graph explains")
    parser.add_argument("--contrast", help="explain the logit difference target minus this token instead")
    parser.add_argument("--no-chat", action="store_true", help="use the prompt as it is (no chat template)")
    parser.add_argument("--image-nodes", type=image_nodes_arg, default="token",
                        help="image input nodes: token (one per grid cell), image, or RxC blocks (default token)")
    parser.add_argument("--max-features", type=arg_int(min=1), default=2048,
                        help="attribute at most this many active features, chosen by --ranking (default 2048; each "
                             "row keeps the rest's summed effect)")
    parser.add_argument("--ranking", choices=RANKINGS, default="influence",
                        help="which features --max-features keeps: influence (circuit-tracer's: their influence on the "
                             "target through the graph so far, re-ranked as it grows) or direct (their direct effect "
                             "on the target); default influence")
    parser.add_argument("--node-threshold", type=arg_float(min=0, max=1), default=0.8,
                        help="pruning: keep the nodes holding this share of the influence (default 0.8)")
    parser.add_argument("--edge-threshold", type=arg_float(min=0, max=1), default=0.98,
                        help="pruning: keep the edges holding this share of the influence (default 0.98)")
    add_batch_size(parser, 32, "target rows per backward pass")
    parser.add_argument("--examples", type=arg_int(min=1), metavar="N",
                        help="the viewer's feature cards: each kept feature's top image patches and text tokens over "
                             "N prompts (the first N of --examples-data, else N generated --examples-task samples)")
    add_data_arguments(parser, flag="--examples-data", help="dataset of the --examples prompts (see --format)")
    parser.add_argument("--examples-task", type=task_arg, default="counting", help="task of generated examples (default counting)")
    parser.add_argument("--examples-style", type=style_arg, default="syndot", help="style of generated examples (default syndot)")
    parser.add_argument("--examples-top-k", type=arg_int(min=1), default=6,
                        help="examples per feature, of image patches and of text tokens each (default 6)")
    add_out(parser, f"graph.json, graph.html and {RESULTS_FILE}")
    parser.set_defaults(func=run)


def example_prompts(args: argparse.Namespace) -> list:
    """The --examples prompts: the first N rows of --examples-data, or N generated samples (seeds 0 .. N-1)."""
    if args.examples_data is not None:
        return list(load_data_arg(args, args.examples_data, args.examples).examples)
    return generated_samples(args.examples_task, args.examples_style, args.examples, 0,
                             rendered_size(args), "--examples-task")


def run(args: argparse.Namespace) -> int:
    if args.examples_data is not None and args.examples is None:
        raise UserInputError("--examples-data is read with --examples N (how many of its prompts)")
    out = prepare_out(args, RESULTS_FILE, "graph.json", "graph.html")

    from vlens.graphs import (
        ExampleSettings,
        GraphSettings,
        ReplacementModel,
        attach_examples,
        attribution_graph,
    )
    from vlens.transcoders import load_transcoders
    from vlens.utils.errors import failure_context
    from vlens.utils.images import open_image_file

    settings = GraphSettings(batch_size=args.batch_size, max_features=args.max_features, ranking=args.ranking,
                             image_nodes=args.image_nodes,
                             node_threshold=args.node_threshold, edge_threshold=args.edge_threshold,
                             slug=out.name or "graph")
    with failure_context(f"reading the transcoders {args.transcoders}"):
        transcoders = load_transcoders(args.transcoders)
    choose_model(args, transcoders.cfg.metadata, f"the transcoders {args.transcoders}", use="attributing with them")
    images = [open_image_file(args.image, "--image")] if args.image is not None else []
    model = load_model_from_args(args)
    inputs = model.prepare(images=[images] if images else None, prompts=[args.prompt], chat=not args.no_chat)
    graph = attribution_graph(ReplacementModel(model, transcoders), inputs, target=args.target, contrast=args.contrast,
                              settings=settings, images=images, progress=not args.quiet)
    graph.model = args.model
    if args.examples is not None:
        attach_examples(graph, model, transcoders, example_prompts(args), ExampleSettings(
            top_k=args.examples_top_k), progress=not args.quiet)
    graph.save(out)
    scores = graph.scores()
    echo(f"{graph.nodes[-1]['name']} = {graph.target['value']:.4f}: {graph.n_features} active features, "
         f"{scores['pruned_nodes']} nodes and {scores['pruned_edges']} edges after pruning; replacement score "
         f"{scores['replacement']:.3f}, completeness {scores['completeness']:.3f}; cost "
         f"{graph.cost['forward_equivalents']} forward-equivalents -> {out}")
    return 0
