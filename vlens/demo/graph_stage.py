"""Stage (graphs): the counting circuit as an attribution graph of transcoder features (docs/graphs.md).

Skip transcoders (TopK) are trained on the demo's counting images (every layer's MLP input and output at
image and text positions, one pass of the model, then Adam over the stored pairs); the graph explains the
logit of the correct count minus the next count on one counting image the model answers correctly. The
section reports what the graph's replacement and completeness scores support, which features read the
image tokens and which write the count.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from vlens.core.answers import single_token
from vlens.demo.data_stage import CountingSample
from vlens.demo.report_sections import Section
from vlens.demo.settings import DemoSettings
from vlens.graphs import ExampleSettings, GraphSettings, ReplacementModel, attach_examples, attribution_graph
from vlens.graphs.pruning import influence, normalize
from vlens.graphs.replacement import linear_problem
from vlens.sae.activations import TensorSource
from vlens.sae.settings import TrainRun
from vlens.transcoders import PairSource, TranscoderTraining, evaluate_transcoders, train_transcoders
from vlens.utils.errors import UserInputError

if TYPE_CHECKING:
    from vlens.core.model import HookedVLM

GRAPH_TITLE = "The counting circuit as an attribution graph: transcoder features from image cells to the count"
GRAPH_EXPLANATION = (
    "Skip transcoders (TopK) replace every MLP; with attention patterns and norm scales frozen at one counting "
    "image's run, the model is linear in their features, so each feature's, image cell's, text token's and error "
    "node's direct effect on the answer is an exact number. The target is the logit of the correct count minus the "
    "next count, on an image the model answers correctly. The replacement score is the share of the answer's "
    "influence that reaches it from the inputs through features rather than through error nodes (the transcoders' "
    "unexplained part); the completeness score weighs each node by how much of its input comes from non-error "
    "nodes (circuit-tracer's definitions; 1 = the features explain everything). Writers: the features with the "
    "largest direct effect on the answer; image readers: the features with the largest summed |direct effect| from "
    "image cells. Bars: the largest direct effects on the answer. Feature names are L{layer}F{index}@{position}; "
    "image cells img0[row,col]. The whole graph is saved beside the report (attribution_graph/graph.html).")
TOP = 5  # features listed as readers of the image and as writers of the count


def _scores_verdict(replacement: float, completeness: float, largest: tuple[str, float] | None = None) -> str:
    """What the scores support, in words (thresholds in docs/graphs.md's reading of the scores); `largest`: the
    node with the largest direct effect on the answer, named when it is an error node."""
    if replacement >= 0.8:
        share = "the features carry most of the answer's influence: the graph is a fair account of the circuit"
    elif replacement >= 0.5:
        share = ("the features carry about half of the answer's influence or more; the rest passes through error "
                 "nodes, so the graph is a partial account")
    else:
        share = ("most of the answer's influence passes through error nodes (what the transcoders do not "
                 "reconstruct): the features shown are a partial account, not the circuit")
    if largest is not None and largest[0].startswith("err"):
        share += (f"; the largest single direct effect on the answer is an error node ({largest[0]}, "
                  f"{largest[1]:+.2f}): that step is the least explained")
    return f"replacement score {replacement:.2f}, completeness {completeness:.2f}: {share}"


def pick_prompt(model: HookedVLM, samples: list[CountingSample], count: int) -> tuple[CountingSample, int, int, bool]:
    """The first sample of `count` dots the model answers correctly (else the first of any count), whose count and
    count + 1 are single tokens: (sample, target id, contrast id, answered correctly); the first usable one when
    the model answers none correctly."""
    usable, correct = [], []
    for sample in sorted(samples, key=lambda s: s.count != count):  # stable: `count` first, then the set's order
        try:
            target = single_token(model, str(sample.count), "an attribution graph")
            contrast = single_token(model, str(sample.count + 1), "an attribution graph")
        except UserInputError:
            continue
        usable.append((sample, target, contrast))
        inputs = model.prepare(images=[sample.image], prompts=[sample.question])
        with torch.no_grad():
            if int(model(inputs)[0, -1].argmax()) == target:
                correct.append((sample, target, contrast))
                break
    if not usable:
        raise UserInputError("no counting sample whose count and count + 1 are single tokens")
    return (*correct[0], True) if correct else (*usable[0], False)


def train_demo_transcoders(model: HookedVLM, samples: list[CountingSample], settings: DemoSettings,
                           progress: bool) -> Any:
    """Skip TopK transcoders on every layer's (MLP input, MLP output) pairs of `settings.graph_prompts` images."""
    prompts = [(s.image, s.question) for s in samples[:settings.graph_prompts]]
    source = PairSource(model, prompts, positions="all", prompts_per_chunk=settings.batch_size)
    rows = torch.cat([source.chunk(i).acts for i in range(source.n_chunks)])  # one model pass; Adam reuses them
    training = TranscoderTraining(kind="skip", activation="topk", d_tc=settings.graph_d_tc, k=settings.graph_k,
                                  total_tokens=settings.graph_tokens, batch_size=256, buffer_size=4096, lr=3e-3,
                                  seed=settings.seed)
    trained = train_transcoders(TensorSource(rows, chunk_size=4096), training, TrainRun(progress=progress),
                                layers=source.layers)
    return trained.transcoders, len(rows)


GRAPH_FOLDER = "attribution_graph"  # beside report.html: graph.html (the viewer), graph.json, results.json


def graph_sections(model: HookedVLM, samples: list[CountingSample], settings: DemoSettings, out_dir: str | Path,
                   progress: bool = True) -> list[Section]:
    """The section, and the whole graph saved in `out_dir`/attribution_graph (viewer with dataset examples)."""
    problem = linear_problem(model)
    dtype = next(model.parameters()).dtype
    if problem is None and dtype != torch.float32:
        problem = (f"the model runs in {str(dtype).removeprefix('torch.')}: the demo builds its attribution graph in "
                   "float32 only (exact rows that add up to the logit difference); run the demo with --dtype float32")
    if problem is not None:
        return [Section.skipped("attribution_graph", GRAPH_TITLE, GRAPH_EXPLANATION, problem)]
    try:
        sample, target, contrast, correct = pick_prompt(model, samples, settings.graph_count)
    except UserInputError as err:
        return [Section.skipped("attribution_graph", GRAPH_TITLE, GRAPH_EXPLANATION, str(err))]
    tc, n_pairs = train_demo_transcoders(model, samples, settings, progress)
    held_out = [(s.image, s.question) for s in samples[settings.graph_prompts:settings.graph_prompts + 8]] or \
        [(s.image, s.question) for s in samples[:8]]
    quality = evaluate_transcoders(model, tc, held_out)
    inputs = model.prepare(images=[sample.image], prompts=[sample.question])
    graph = attribution_graph(ReplacementModel(model, tc), inputs, target=target, contrast=contrast,
                              settings=GraphSettings(max_features=settings.graph_max_features), images=[sample.image],
                              progress=progress)
    attach_examples(graph, model, tc, [(s.image, s.question) for s in samples[:settings.graph_prompts]],
                    ExampleSettings(top_k=4, prompts_per_chunk=settings.batch_size))
    graph.model = str(getattr(model.cfg, "model_name", "") or "")
    folder = Path(out_dir) / GRAPH_FOLDER
    graph.save(folder)
    scores = graph.scores()
    name = graph.nodes[-1]["name"]
    features = range(graph.n_features)
    image_columns = [i for i, node in enumerate(graph.nodes) if node["kind"] == "image"]
    # readers: features whose input comes most from image cells (summed |direct effect| of image nodes)
    from_image = graph.adjacency[:graph.n_features][:, image_columns].abs().sum(1)
    readers = sorted(features, key=lambda i: -float(from_image[i]))[:TOP]
    # writers: features with the largest direct effect on the answer
    writers = sorted(features, key=lambda i: -abs(float(graph.adjacency[-1, i])))[:TOP]
    input_influence = graph_input_shares(graph)
    largest = graph.edges_into(name, top=1)[0]
    numbers: dict[str, Any] = {
        "prompt": f"{sample.question} ({sample.count} dots; the model answers "
                  f"{'correctly' if correct else 'wrongly: no sample in the set was answered correctly'})",
        "target": f"{name} = {graph.target['value']:.3f}",
        "transcoders": f"skip, TopK k={settings.graph_k}, {settings.graph_d_tc} features per layer, "
                       f"{settings.graph_tokens} training tokens over {n_pairs} pairs",
        "explained variance per layer": ", ".join(f"{layer['explained_variance']:.2f}" for layer in quality.layers),
        "loss recovered": quality.loss_recovered if quality.loss_recovered is not None else "n/a",
        "active features": graph.cost["active_features"], "features attributed": graph.n_features,
        "cost (forward-equivalents)": graph.cost["forward_equivalents"],
        "replacement score": scores["replacement"], "completeness score": scores["completeness"],
        "pruned graph": f"{scores['pruned_nodes']} nodes, {scores['pruned_edges']} edges (replacement "
                        f"{scores['pruned_replacement']:.2f}, completeness {scores['pruned_completeness']:.2f})",
        "image cells' share of the input influence": input_influence["image"],
        "largest direct effect on the answer (any node)": "{} {:+.3f}".format(*largest),
        "what the scores support": _scores_verdict(scores["replacement"], scores["completeness"], largest),
        "files": f"{GRAPH_FOLDER}/graph.html (the viewer: click a feature for its dataset examples), graph.json "
                 "(circuit-tracer's schema), results.json (vlens.load_result)",
    }
    for rank, i in enumerate(writers, start=1):
        numbers[f"writer #{rank} {graph.nodes[i]['name']}"] = float(graph.adjacency[-1, i])
    for rank, i in enumerate(readers, start=1):
        numbers[f"image reader #{rank} {graph.nodes[i]['name']}"] = float(from_image[i])
    data = {"scores": scores, "cost": graph.cost, "target": graph.target, "count": sample.count,
            "correct": correct, "transcoder_evaluation": quality.to_dict(),
            "top_edges_into_target": graph.edges_into(name, top=20), "input_influence": input_influence,
            "writers": [graph.nodes[i]["name"] for i in writers], "readers": [graph.nodes[i]["name"] for i in readers],
            "folder": GRAPH_FOLDER}
    return [Section(key="attribution_graph", title=GRAPH_TITLE, explanation=GRAPH_EXPLANATION, figure=graph.plot(),
                    numbers=numbers, data=data)]


def graph_input_shares(graph: Any) -> dict[str, float]:
    """The inputs' influence on the target by kind (image cells, text tokens), as shares of all input influence."""
    totals = influence(normalize(graph.adjacency), graph.weights)
    kinds = {"image": 0.0, "token": 0.0}
    for i in range(graph.inputs.start, graph.inputs.stop):
        kinds[graph.nodes[i]["kind"]] += float(totals[i])
    whole = sum(kinds.values()) or 1.0
    return {kind: value / whole for kind, value in kinds.items()}
