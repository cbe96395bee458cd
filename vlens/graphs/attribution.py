"""Building an attribution graph for one image-text prompt (docs/graphs.md).

`attribution_graph(replacement, inputs, target="5", contrast="4")`: the prompt's real run (frozen
patterns, scales, errors), one linearised forward on `batch_size` copies, then backward passes of
`batch_size` target rows each: first the target (the logit at the last position, or the logit
difference), then every active feature, or `max_features` of them chosen as circuit-tracer chooses:
by their influence on the target through the rows computed so far (the ``(I - N)^-1`` series over the
partial graph), re-ranked every `update_interval` passes (`ranking="direct"`: by direct effect). A last forward with every input node at zero measures each row's bias, so each row sums to
its value exactly. Text tokens are input nodes one per position; image tokens are grouped as
`image_nodes` says ("token": one per grid cell, "RxC": blocks of the grid, "image").
"""

from __future__ import annotations

import base64
import io
from dataclasses import asdict, dataclass
from typing import Any, cast

import torch
from torch import Tensor
from tqdm.auto import tqdm

from vlens.circuits.graph import CircuitGraph, parse_image_nodes
from vlens.core.answer_tokens import tokenizer_of
from vlens.core.answers import single_token
from vlens.core.token_labels import str_tokens
from vlens.graphs.linear import Injection, backward_rows, linear_forward
from vlens.graphs.pruning import partial_influence
from vlens.graphs.replacement import PromptRun, ReplacementModel, linear_problem
from vlens.graphs.results import AttributionGraph, GraphNode
from vlens.utils.errors import UserInputError
from vlens.utils.validation import check_count, check_float

RANKINGS = ("influence", "direct")


@dataclass(frozen=True)
class GraphSettings:
    """How a graph is built and pruned.

    batch_size: target rows per backward pass. max_features: attribute at most this many active features (None:
        all). The others are no nodes: each row keeps their summed direct effect in `dropped`, so rows still add
        up. ranking: which features, when `max_features` leaves some out: "influence" (circuit-tracer's: the
        features with the largest influence on the target through the rows computed so far, re-ranked every
        `update_interval` backward passes) or "direct" (the largest |direct effect| on the target, one
        ranking). image_nodes: "token", "image" or
        "RxC" (blocks of each image's token grid). node_threshold / edge_threshold: pruning (circuit-tracer's
        defaults 0.8 / 0.98). slug: the graph's name in graph.json.
    """

    batch_size: int = 32
    max_features: int | None = 2048
    ranking: str = "influence"
    update_interval: int = 4
    image_nodes: str = "token"
    node_threshold: float = 0.8
    edge_threshold: float = 0.98
    slug: str = "graph"

    def __post_init__(self) -> None:
        check_count(self.batch_size, "batch_size")
        check_count(self.max_features, "max_features", allow_none=True)
        check_count(self.update_interval, "update_interval")
        if self.ranking not in RANKINGS:
            raise UserInputError(f"ranking must be one of {', '.join(RANKINGS)}, got {self.ranking!r}.")
        parse_image_nodes(self.image_nodes)
        check_float(self.node_threshold, "node_threshold", min=0, max=1)
        check_float(self.edge_threshold, "edge_threshold", min=0, max=1)


@dataclass
class ActiveFeatures:
    """The active features of a run: covered layer index, decoder layer, position, feature, activation."""

    index: Tensor
    layer: Tensor
    pos: Tensor
    feature: Tensor
    activation: Tensor

    def __len__(self) -> int:
        return int(self.index.shape[0])


def active_features(replacement: ReplacementModel, run: PromptRun) -> ActiveFeatures:
    parts = []
    for i, acts in enumerate(run.acts):
        pos, feature = acts[0].nonzero(as_tuple=True)
        parts.append((torch.full_like(pos, i), torch.full_like(pos, replacement.transcoders.cfg.layers[i]), pos, feature,
                      acts[0][pos, feature].detach().double()))
    columns = [torch.cat(column) for column in zip(*parts, strict=True)]
    return ActiveFeatures(*columns)


def token_id(model: Any, token: str | int, what: str) -> int:
    if isinstance(token, bool):
        raise UserInputError(f"{what}: give a token (text) or a token id, got {token!r}.")
    if isinstance(token, int):
        if not 0 <= token < model.cfg.d_vocab:
            raise UserInputError(f"{what} id {token} is outside the vocabulary (0 .. {model.cfg.d_vocab - 1}).")
        return token
    return single_token(model, str(token), "an attribution graph")


def input_groups(model: Any, inputs: Any, image_nodes: str) -> tuple[list[dict[str, Any]], Tensor]:
    """Input nodes (text tokens one per position, image groups) and their position masks [n_inputs, pos]."""
    regions = inputs.token_regions
    seq = inputs.input_ids.shape[1]
    labels = str_tokens(tokenizer_of(model), inputs.input_ids[0].tolist())
    nodes, masks = [], []
    is_image = regions.mask("image", seq)[0]
    for pos in range(seq):
        if not bool(is_image[pos]):
            nodes.append({"name": f"tok{pos}", "kind": "token", "layer": None, "pos": pos, "feature": None,
                          "activation": None, "label": labels[pos], "positions": [pos],
                          "token_id": int(inputs.input_ids[0, pos])})
            mask = torch.zeros(seq, dtype=torch.bool)
            mask[pos] = True
            masks.append(mask)
    if bool(is_image.any()):
        graph = CircuitGraph.for_batch(model, regions, image_nodes)
        image_masks = graph.input_masks(regions, seq)[:, 0]
        for node, mask in zip(graph.inputs[1:], image_masks[1:], strict=True):
            positions = mask.nonzero().flatten().tolist()
            nodes.append({"name": node.name, "kind": "image", "layer": None, "pos": positions[0] if positions else 0,
                          "feature": None, "activation": None, "label": node.name, "positions": positions,
                          "image": node.image, "token_id": int(inputs.input_ids[0, positions[0]]) if positions else 0})
            masks.append(mask)
    return nodes, torch.stack(masks).double()


def image_payload(model: Any, inputs: Any, images: list[Any] | None, groups: list[dict[str, Any]]
                  ) -> tuple[list[dict[str, Any]], dict[str, list[float]]]:
    """The images as PNG data URLs and each image group's pixel box (for the viewer)."""
    shown, boxes = [], {}
    for image in images or []:
        buffer = io.BytesIO()
        image.convert("RGB").save(buffer, format="PNG")
        shown.append({"width": image.width, "height": image.height,
                      "src": "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")})
    regions = inputs.token_regions
    for node in groups:
        if node["kind"] != "image" or node.get("image") is None or node["image"] >= len(shown):
            continue
        try:
            cells = [regions.token_box(node["image"], pos) for pos in node["positions"]]
        except (UserInputError, IndexError, ValueError):
            continue  # a part of the image with no pixel box (newline tokens, a class token)
        boxes[node["name"]] = [node["image"], min(c[0] for c in cells), min(c[1] for c in cells),
                               max(c[2] for c in cells), max(c[3] for c in cells)]
    return shown, boxes


def attribution_graph(replacement: ReplacementModel, inputs: Any, target: str | int, contrast: str | int | None = None,
                      settings: GraphSettings | None = None, images: list[Any] | None = None,
                      progress: bool = False) -> AttributionGraph:
    """The attribution graph of `target` (minus `contrast`) at the last position of a one-prompt `inputs`.

    images: the prompt's PIL images, shown by the viewer (optional).
    """
    settings = settings or GraphSettings()
    model, tc = replacement.model, replacement.transcoders
    problem = linear_problem(model)
    if problem is not None:
        raise UserInputError(f"no attribution graph for this model: {problem}.")
    inputs = model.coerce_inputs(inputs)
    if inputs.input_ids.shape[0] != 1:
        raise UserInputError(f"an attribution graph is of one prompt; these inputs hold {inputs.input_ids.shape[0]}.")
    if not bool(inputs.attention_mask.bool().all()):
        raise UserInputError("the prompt holds padding: build it alone (model.prepare with one prompt).")
    target_id = token_id(model, target, "target")
    contrast_id = None if contrast is None else token_id(model, contrast, "contrast")
    if contrast_id == target_id:
        raise UserInputError(f"target and contrast are the same token ({target_id}).")
    run = replacement.run(inputs)
    features = active_features(replacement, run)
    seq, n_layers = inputs.input_ids.shape[1], model.cfg.n_layers
    last = seq - 1
    lm_head = model.unembed.lm_head
    scale = float(getattr(model.unembed, "logit_scale", 1.0))  # Cohere's logits are lm_head's output x logit_scale
    direction = lm_head.weight[target_id].detach().double() * scale
    bias = float(lm_head.bias[target_id]) * scale if lm_head.bias is not None else 0.0
    logits = run.logits[0, last].double()
    value = float(logits[target_id])
    if contrast_id is not None:
        direction = direction - lm_head.weight[contrast_id].detach().double() * scale
        bias -= float(lm_head.bias[contrast_id]) * scale if lm_head.bias is not None else 0.0
        value -= float(logits[contrast_id])

    n_feat = len(features)
    groups, group_masks = input_groups(model, inputs, settings.image_nodes)
    n_err, n_in = n_layers * seq, len(groups)
    n_nodes = n_feat + n_err + n_in + 1  # the width of a full row (every active feature a source)
    decoders = [tc.W_dec[i].detach().double() for i in range(tc.cfg.n_layers)]
    errors = [e[0].detach().double() for e in run.errors]

    def source_row(embeds: Tensor, constants: list[Tensor], deepstack: dict[int, Tensor], forward: Any,
                   rows: int) -> Tensor:
        """[rows, n_nodes] direct effects of every source on the rows' targets."""
        out = torch.zeros(rows, n_nodes, dtype=torch.float64)
        grads = [c[:rows].double() for c in constants]
        for i in range(tc.cfg.n_layers):
            chosen = (features.index == i).nonzero().flatten()
            if not len(chosen):
                continue
            pos, feat, act = features.pos[chosen], features.feature[chosen], features.activation[chosen]
            total = torch.zeros(rows, len(chosen), dtype=torch.float64)
            for j in tc.cfg.targets(i):
                layer_j = tc.cfg.layers[j]
                total += (grads[layer_j][:, pos] * decoders[i][feat, j - i]).sum(-1)
            out[:, chosen] = total * act
        for layer in range(n_layers):
            out[:, n_feat + layer * seq:n_feat + (layer + 1) * seq] = (grads[layer] * errors[layer]).sum(-1)
        per_pos = (embeds[:rows].double() * forward.embeds[0].detach().double()).sum(-1)
        for layer, (positions, leaf) in forward.deepstack.items():
            values = leaf.detach().reshape(forward.embeds.shape[0], -1, leaf.shape[-1])[0].double()
            per_pos[:, positions] += (deepstack[layer][:rows].double() * values).sum(-1)
        out[:, n_feat + n_err:n_feat + n_err + n_in] = per_pos @ group_masks.T
        return out

    batch = min(settings.batch_size, 1 + n_feat)
    forward = linear_forward(replacement, run, batch)
    encoders = tc.W_enc.detach()
    n_rows = n_feat if settings.max_features is None else min(settings.max_features, n_feat)
    # full-width rows as they are computed (row 0: the target), and the node each row belongs to
    computed = torch.zeros(1 + n_rows, n_nodes, dtype=torch.float64)
    row_nodes = torch.zeros(1 + n_rows, dtype=torch.long)
    embeds, constants, deepstack = backward_rows(forward, Injection([-1], [last], direction[None]))
    computed[0], row_nodes[0] = source_row(embeds, constants, deepstack, forward, 1)[0], n_nodes - 1
    filled, backward_passes, updates = 1, 1, 0
    visited = torch.zeros(n_feat, dtype=torch.bool)
    bar = tqdm(total=n_rows, desc="graph", disable=not progress, unit="feature")
    try:
        while filled < 1 + n_rows:
            wanted = 1 + n_rows - filled
            if n_rows == n_feat or settings.ranking == "direct":
                # every feature gets a row, or the ranking never changes: one queue, by |direct effect|
                queue = torch.argsort(computed[0, :n_feat].abs(), descending=True)[:wanted]
            else:
                # circuit-tracer's ranking: influence on the target through the rows computed so far
                scores = partial_influence(computed[:filled], row_nodes[:filled], 
                                           torch.eye(1, filled, dtype=torch.float64)[0])
                ranked = torch.argsort(scores[:n_feat], descending=True)
                queue = ranked[~visited[ranked]][:min(settings.update_interval * batch, wanted)]
                updates += 1
            for start in range(0, len(queue), batch):
                chosen = queue[start:start + batch]
                vectors = torch.stack([encoders[int(features.index[k])][:, int(features.feature[k])] for k in chosen])
                injection = Injection([int(features.layer[k]) for k in chosen],
                                      [int(features.pos[k]) for k in chosen], vectors)
                embeds, constants, deepstack = backward_rows(forward, injection)
                backward_passes += 1
                computed[filled:filled + len(chosen)] = source_row(embeds, constants, deepstack, forward, len(chosen))
                row_nodes[filled:filled + len(chosen)] = chosen
                visited[chosen] = True
                filled += len(chosen)
                bar.update(len(chosen))
    finally:
        bar.close()
    # the graph: attributed features (in their original order), errors, inputs, the target
    selected = visited.nonzero().flatten()
    place = torch.full((n_feat,), -1, dtype=torch.long)
    place[selected] = torch.arange(len(selected))
    others = place < 0
    n_kept = len(selected) + n_err + n_in + 1
    targets = torch.cat([torch.tensor([n_kept - 1]), place[row_nodes[1:]]])
    columns = torch.cat([selected, torch.arange(n_feat, n_nodes)])
    adjacency = torch.zeros(n_kept, n_kept, dtype=torch.float64)
    adjacency[targets] = computed[:, columns]
    dropped: list[float | None] = [None] * n_kept
    for row, left_out in zip(targets.tolist(), computed[:, :n_feat][:, others].sum(1).tolist(), strict=True):
        dropped[row] = left_out
    # the constant of every row: the same forward with every input node at zero
    zero = linear_forward(replacement, run, 1, zero_inputs=True)
    values: list[float | None] = [None] * n_kept
    biases: list[float | None] = [None] * n_kept
    with torch.no_grad():
        values[-1] = value
        biases[-1] = float(zero.final[0, last].double() @ direction) + bias
        for k in selected.tolist():
            i, layer, pos, feat = (int(features.index[k]), int(features.layer[k]), int(features.pos[k]),
                                   int(features.feature[k]))
            values[int(place[k])] = float(features.activation[k])
            biases[int(place[k])] = float(zero.mlp_inputs[layer][0, pos].double() @ encoders[i][:, feat].double()
                              + tc.b_enc[i, feat].double())
    names = feature_nodes(features, selected) + error_nodes(n_layers, seq) + groups
    target_name = f'logit["{token_text(model, target_id)}"' + (
        f'-"{token_text(model, contrast_id)}"]' if contrast_id is not None else "]")
    names.append({"name": target_name, "kind": "logit", "layer": n_layers, "pos": last, "feature": target_id,
                  "activation": None, "label": target_name, "contrast": contrast_id})
    shown, boxes = image_payload(model, inputs, images, groups)
    feature_maps = {}
    for i, acts in enumerate(run.acts):
        for feat in acts[0].nonzero(as_tuple=True)[1].unique().tolist():
            feature_maps[f"L{tc.cfg.layers[i]}F{feat}"] = acts[0][:, feat].double().tolist()
    cost = {"forwards": {"real": 2, "linearised": batch, "constant": 1}, "backward_passes": backward_passes,
            "rows_per_backward": batch, "features_attributed": len(selected), "active_features": n_feat,
            # a backward pass costs about two forwards of its rows; a ranking update is matrix-vector products over
            # the rows computed so far (no model pass)
            "forward_equivalents": 2 + batch + 1 + 2 * batch * backward_passes,
            "ranking": settings.ranking, "ranking_updates": updates}
    return AttributionGraph(nodes=cast(list[GraphNode], names), adjacency=adjacency, values=values, biases=biases, dropped=dropped,
                            target={"token": token_text(model, target_id), "token_id": target_id,
                                    "contrast": None if contrast_id is None else token_text(model, contrast_id),
                                    "contrast_id": contrast_id, "value": value},
                            prompt_tokens=str_tokens(tokenizer_of(model), inputs.input_ids[0].tolist()),
                            feature_maps=feature_maps, images=shown, boxes=boxes, cost=cost,
                            settings=asdict(settings), model=str(getattr(model.cfg, "model_name", "") or ""),
                            n_layers=n_layers)


def token_text(model: Any, token: int | None) -> str:
    return "" if token is None else str(str_tokens(tokenizer_of(model), [token])[0])


def feature_nodes(features: ActiveFeatures, selected: Tensor) -> list[dict[str, Any]]:
    return [{"name": f"L{int(features.layer[k])}F{int(features.feature[k])}@{int(features.pos[k])}", "kind": "feature",
             "layer": int(features.layer[k]), "pos": int(features.pos[k]), "feature": int(features.feature[k]),
             "activation": float(features.activation[k]), "label": f"L{int(features.layer[k])}F{int(features.feature[k])}"}
            for k in selected.tolist()]


def error_nodes(n_layers: int, seq: int) -> list[dict[str, Any]]:
    return [{"name": f"err{layer}@{pos}", "kind": "error", "layer": layer, "pos": pos, "feature": None,
             "activation": None, "label": f"err{layer}@{pos}"} for layer in range(n_layers) for pos in range(seq)]
