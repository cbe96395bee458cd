"""The decoder as a graph: who writes into the residual stream, who reads it, and every edge between them.

Senders (nodes that write into the residual stream), in topological order:

    tokens                         the token embeddings at every non-image position
    img0 | img0[r2,c3] | img0[r0-1,c2-3]   image 0's tokens: the whole image, one token (one cell
                                   of the merged patch grid), or a block of the grid (rows 0-1,
                                   cols 2-3 of the token grid)
    img0.tile[r0,c1], img0.newline, img0.cls   the other parts of an image whose tokens are more
                                   than one grid (`inputs.regions.tiles`): each anyres tile
                                   (by its place in the tile layout), the row-end tokens, a
                                   class token; the grid nodes cover the view of the whole
                                   image (the base view of an anyres image)
    L{l}H{h}                       head h of layer l: its output z_h W_O[h] (bias b_O left out:
                                   it is the same in every run)
    MLP{l}                         layer l's MLP output

Receivers (inputs that read the residual stream, *before* the block's norm):

    L{l}H{h}.q                     head h's queries
    L{l}H{h}.k / L{l}H{h}.v        key / value head h (one per head without grouped-query attention)
    L{l}H{a}-{b}.k / .v            with grouped-query attention: the key / value head read by heads a..b
    L{l}H{h}.gate                  with a gated softmax attention (Qwen3.5's full-attention layers): the
                                   gate each head's output is multiplied by (`hook_output_gate`)
    L{l}H{a}-{b}.q / .k, L{l}H{h}.v / .beta / .g / .gate
                                   a Gated DeltaNet layer (Qwen3.5): its query / key heads (each read by
                                   a group of value heads), and per value head its values, write
                                   strength, decay and output gate (`hook_q`, `hook_k`, `hook_v`,
                                   `hook_beta`, `hook_g`, `hook_output_gate`)
    MLP{l}                         the MLP's input
    logits                         the final residual stream (what the final norm and unembedding read)

An edge ``u->v`` joins every sender u upstream of receiver v: heads and MLPs of earlier layers
and every input node for a layer's q / k / v; the same plus that layer's heads for its MLP;
everything for the logits. A sender's contribution along an edge is its output *added to the
receiver's residual input before the norm*: the pre-norm residual stream is exactly the sum of
the senders' outputs and constant biases, so each receiver's input splits into one term per
incoming edge (the standard edge attribution formulation; `vlens.circuits.runs` checks the
sum on every model it runs).

Senders are ordered so that the senders upstream of any receiver are a *prefix* of the sender
list; a receiver's edges are contiguous in the edge list (receiver by receiver, sender by
sender), which is how scores are stored.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any

import torch
from jaxtyping import Bool
from torch import Tensor

from vlens.core.architectures.base import ImageTile, whole_image_tiles
from vlens.utils.errors import UserInputError

if TYPE_CHECKING:
    from vlens.core.inputs import TokenRegions
    from vlens.core.model import HookedVLM

TOKENS = "tokens"
LOGITS = "logits"
RECEIVER_KINDS: tuple[str, ...] = ("q", "k", "v", "beta", "g", "gate", "mlp", "logits")
SENDER_KINDS: tuple[str, ...] = ("input", "head", "mlp")
# how the image tokens become input nodes
ImageNodes = str | tuple[int, int]


@dataclass(frozen=True)
class InputNode:
    """An input node: the text tokens (`image` None), or tokens of image `image`.

    rows / cols: the cells of the image's grid (its whole-image view) it covers, [start, stop);
    part: instead, the index of one other part of the image (`ImagePart`: a tile, newlines, ...);
    both: the cells rows x cols of that part (a video's frame, ``img0.f3[r2,c1]``);
    neither: the whole image.
    """

    name: str
    image: int | None = None
    rows: tuple[int, int] | None = None
    cols: tuple[int, int] | None = None
    part: int | None = None


@dataclass(frozen=True)
class ImagePart:
    """One part of an image's tokens, as every row of a batch has it (an `ImageTile` without positions)."""

    kind: str
    grid: tuple[int, int]
    layout: tuple[int, int] | None = None
    spatial: bool = True

    @property
    def is_view(self) -> bool:
        """The part whose grid covers the whole image (what grid nodes and maps are laid on); an image whose
        tokens are no places on it (Idefics2's perceiver latents) has a non-spatial one, a row of latents."""
        return self.kind in ("image", "base")


def image_records(regions: TokenRegions, row: int, image: int) -> list[ImageTile]:
    """The parts of one image of one row with their positions in the row (`regions.tiles`, or the
    image as one grid where the regions were built without tile records)."""
    if row < len(regions.tiles) and image < len(regions.tiles[row]) and regions.tiles[row][image]:
        return list(regions.tiles[row][image])
    positions = regions.images[row][image]
    rows, cols = regions.image_grid[row][image]
    return [ImageTile(r.kind, positions[r.positions], r.grid, r.index, r.layout, r.box, r.spatial)
            for r in whole_image_tiles(len(positions), (int(rows), int(cols)))]


def image_parts(regions: TokenRegions, row: int, image: int) -> list[ImagePart]:
    return [ImagePart(r.kind, (int(r.grid[0]), int(r.grid[1])),
                      None if r.layout is None else (int(r.layout[0]), int(r.layout[1])), r.spatial)
            for r in image_records(regions, row, image)]


@dataclass(frozen=True)
class MixerPort:
    """One kind of input a layer's token mixer reads from the residual: `count` receivers, receiver j
    read by heads j*group .. (j+1)*group - 1; its value is hook `hook` (head j on dim 2)."""

    kind: str
    hook: str
    count: int
    group: int = 1


@dataclass(frozen=True)
class LayerSpec:
    """A layer's token mixer as the graph sees it: its heads (senders) and its ports (receivers)."""

    n_heads: int
    ports: tuple[MixerPort, ...]
    mixer: str = "attention"  # or "linear_attention" (Gated DeltaNet), "short_conv" (LFM2)

    @classmethod
    def attention(cls, n_heads: int, n_kv_heads: int, gated: bool = False) -> LayerSpec:
        """Softmax attention; `gated`: each head's output is also multiplied by a gate read from the
        residual (Qwen3.5's full-attention layers: port "gate", `hook_output_gate`)."""
        if n_heads % n_kv_heads:
            raise UserInputError(f"{n_heads} heads do not split into {n_kv_heads} key/value heads")
        groups = n_heads // n_kv_heads
        ports = (MixerPort("q", "q", n_heads), MixerPort("k", "k", n_kv_heads, groups),
                 MixerPort("v", "v", n_kv_heads, groups))
        return cls(n_heads, (*ports, MixerPort("gate", "output_gate", n_heads)) if gated else ports)

    @classmethod
    def linear_attention(cls, n_heads: int, n_key_heads: int) -> LayerSpec:
        if n_heads % n_key_heads:
            raise UserInputError(f"{n_heads} value heads do not split into {n_key_heads} key heads")
        groups = n_heads // n_key_heads
        return cls(n_heads, (MixerPort("q", "q", n_key_heads, groups), MixerPort("k", "k", n_key_heads, groups),
                             MixerPort("v", "v", n_heads), MixerPort("beta", "beta", n_heads),
                             MixerPort("g", "g", n_heads), MixerPort("gate", "output_gate", n_heads)),
                   "linear_attention")

    @classmethod
    def short_conv(cls, n_heads: int) -> LayerSpec:
        """LFM2's gated short convolution: head h (a group of channels) reads only its own channels of the
        input gate b, the output gate c and the values x."""
        return cls(n_heads, (MixerPort("b", "b", n_heads), MixerPort("c", "c", n_heads), MixerPort("x", "x", n_heads)),
                   "short_conv")

    def to_dict(self) -> dict[str, Any]:
        return {"n_heads": self.n_heads, "mixer": self.mixer,
                "ports": [[p.kind, p.hook, p.count, p.group] for p in self.ports]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LayerSpec:
        return cls(int(data["n_heads"]), tuple(MixerPort(k, h, int(c), int(g)) for k, h, c, g in data["ports"]),
                   str(data["mixer"]))


def require_sequential_blocks(model: HookedVLM) -> None:
    """Refuse a model whose blocks run attention and MLP in parallel (Cohere's layout): the circuit graph's MLP
    reads its own layer's heads (resid_mid), a parallel block's MLP does not."""
    if any(getattr(block, "parallel", False) for block in model.blocks):
        raise UserInputError(f"circuits need attention before the MLP in each block; {model.cfg.architecture}'s blocks "
                             "run attention and MLP in parallel from one norm (Cohere's layout), which the circuit "
                             "graph does not model yet: use patching, knockout, the lenses or attribution graphs")


def mixer_spec(model: HookedVLM, layer: int) -> LayerSpec:
    """The graph's view of layer `layer`'s token mixer (softmax attention, Gated DeltaNet or a short conv)."""
    attn = getattr(model.blocks[layer], "attn", None)
    if attn is not None and getattr(attn, "mixer", None) == "short_conv":
        return LayerSpec.short_conv(int(attn.n_heads))
    if attn is not None and getattr(attn, "is_linear_attention", False) and all(
            hasattr(attn, f"hook_{name}") for name in ("q", "k", "v", "beta", "g", "output_gate", "z")):
        return LayerSpec.linear_attention(int(attn.n_heads), int(attn.n_key_heads))
    if attn is None or model.cfg.is_linear_attention(layer) or not all(
            hasattr(attn, name) for name in ("hook_q", "hook_k", "hook_v", "hook_z", "q_proj", "k_proj", "v_proj")):
        raise UserInputError(f"layer {layer}'s token mixer is neither softmax attention with q/k/v projections, a "
                             "Gated DeltaNet layer nor a short convolution: circuit graphs do not cover it")
    return LayerSpec.attention(model.cfg.n_heads, model.cfg.n_key_value_heads, gated=hasattr(attn, "hook_output_gate"))


@dataclass(frozen=True)
class Receiver:
    """One input port: kind "q" / "k" / "v" (index = head / key-value head), "mlp" or "logits".

    layer: its layer (n_layers for the logits); heads: the heads it feeds; n_senders: its
    upstream senders are `graph.senders[:n_senders]`.
    """

    name: str
    kind: str
    layer: int
    index: int
    heads: tuple[int, ...]
    n_senders: int


def parse_image_nodes(spec: ImageNodes) -> ImageNodes:
    """"image", "token", or a (rows, cols) block grid (also written "3x3")."""
    if isinstance(spec, str):
        text = spec.strip().lower()
        if text in ("image", "token"):
            return text
        match = re.fullmatch(r"(\d+)\s*x\s*(\d+)", text)
        if match:
            spec = (int(match[1]), int(match[2]))
        else:
            raise UserInputError(f"image_nodes {spec!r}: use 'image' (one node per image), 'token' (one per image "
                                 "token) or ROWSxCOLS (blocks of the token grid, e.g. 3x3)")
    if (not isinstance(spec, tuple) or len(spec) != 2 or not all(isinstance(v, int) for v in spec)
            or min(spec) < 1):
        raise UserInputError(f"image_nodes {spec!r}: a block grid is two positive ints (rows, cols)")
    return spec


def _splits(n: int, parts: int) -> list[tuple[int, int]]:
    """[start, stop) of `parts` near-equal blocks of range(n)."""
    edges = [round(i * n / parts) for i in range(parts + 1)]
    return list(zip(edges[:-1], edges[1:], strict=True))


def _span(prefix: str, span: tuple[int, int]) -> str:
    return f"{prefix}{span[0]}" if span[1] - span[0] == 1 else f"{prefix}{span[0]}-{span[1] - 1}"


def _part_name(image: int, part: ImagePart, index: int, parts: Sequence[ImagePart]) -> str:
    if part.kind == "tile" and part.layout is not None:
        return f"img{image}.tile[r{part.layout[0]},c{part.layout[1]}]"
    same = [p for p in parts if p.kind == part.kind]
    return f"img{image}.{part.kind}" if len(same) == 1 else f"img{image}.{part.kind}{same.index(part)}"


def image_input_nodes(image: int, grid: tuple[int, int], spec: ImageNodes,
                      parts: Sequence[ImagePart] | None = None) -> list[InputNode]:
    """The input nodes of image `image` under `spec`: its view's grid `grid` (cells row-major), then
    one node per other part (`parts`: the image's parts; default: the grid alone)."""
    if spec == "image":
        return [InputNode(f"img{image}", image)]
    parts = list(parts) if parts is not None else [ImagePart("image", grid)]
    nodes = []
    frames = 0
    for index, part in enumerate(parts):
        if part.kind == "frame":  # a video's frame (temporal patch): its grid cells / blocks, img{i}.f{k}[r,c]
            rows, cols = part.grid
            blocks = (rows, cols) if spec == "token" else spec
            assert isinstance(blocks, tuple)
            blocks = (min(blocks[0], rows), min(blocks[1], cols))
            nodes += [InputNode(f"img{image}.f{frames}[{_span('r', r)},{_span('c', c)}]", image, r, c, part=index)
                      for r in _splits(rows, blocks[0]) for c in _splits(cols, blocks[1])]
            frames += 1
            continue
        if not part.is_view:
            nodes.append(InputNode(_part_name(image, part, index, parts), image, part=index))
            continue
        rows, cols = part.grid
        blocks = (rows, cols) if spec == "token" else spec
        assert isinstance(blocks, tuple)
        if blocks[0] > rows or blocks[1] > cols:
            raise UserInputError(f"image_nodes {blocks[0]}x{blocks[1]}: image {image} has only a {rows}x{cols} "
                                 "token grid; use at most that many blocks (or 'token')")
        nodes += [InputNode(f"img{image}[{_span('r', r)},{_span('c', c)}]", image, r, c)
                  for r in _splits(rows, blocks[0]) for c in _splits(cols, blocks[1])]
    return nodes


class CircuitGraph:
    """Nodes, receivers and edges of a decoder with `n_layers` x `n_heads` heads (`n_kv_heads` key/value
    heads; or each layer's own `LayerSpec`, e.g. Gated DeltaNet layers) reading `grids` images (each
    its merged token grid (rows, cols)).

    Build it with `CircuitGraph.for_batch(model, batch.clean, image_nodes)` (the grids of the
    pairs' images) or directly. Attributes: `inputs`, `senders` (names), `receivers`,
    `n_edges`; edge e joins sender `edge_sender[e]` to receiver `edge_receiver[e]`; `n_heads` is
    the most heads of any layer (`layers[l].n_heads` a layer's own).
    """

    def __init__(self, n_layers: int, n_heads: int, n_kv_heads: int, grids: Sequence[tuple[int, int]] = (),
                 image_nodes: ImageNodes = "token", parts: Sequence[Sequence[ImagePart]] | None = None,
                 layers: Sequence[LayerSpec] | None = None):
        self.layers = list(layers) if layers is not None else [LayerSpec.attention(n_heads, n_kv_heads)] * n_layers
        if len(self.layers) != n_layers:
            raise RuntimeError(f"{len(self.layers)} layer specs for {n_layers} layers")
        self.n_layers, self.n_kv_heads = n_layers, n_kv_heads
        self.n_heads = max((spec.n_heads for spec in self.layers), default=n_heads)
        self.image_nodes = parse_image_nodes(image_nodes)
        self.grids = [(int(r), int(c)) for r, c in grids]
        self.parts = [list(p) for p in parts] if parts is not None else [[ImagePart("image", g)] for g in self.grids]
        if len(self.parts) != len(self.grids):
            raise RuntimeError(f"{len(self.parts)} images of parts for {len(self.grids)} grids")
        self.inputs: list[InputNode] = [InputNode(TOKENS)]
        for image, grid in enumerate(self.grids):
            self.inputs += image_input_nodes(image, grid, self.image_nodes, self.parts[image])
        self.n_inputs = len(self.inputs)
        self.senders: list[str] = [node.name for node in self.inputs]
        self._bases: list[int] = []
        for layer, spec in enumerate(self.layers):
            self._bases.append(len(self.senders))
            self.senders += [f"L{layer}H{h}" for h in range(spec.n_heads)] + [f"MLP{layer}"]
        self.receivers: list[Receiver] = []
        self._receiver_starts: list[int] = []
        for layer, spec in enumerate(self.layers):
            upstream = self.layer_base(layer)
            self._receiver_starts.append(len(self.receivers))
            for port in spec.ports:
                for j in range(port.count):
                    heads = tuple(range(j * port.group, (j + 1) * port.group))
                    label = f"L{layer}H{heads[0]}" if port.group == 1 else f"L{layer}H{heads[0]}-{heads[-1]}"
                    self.receivers.append(Receiver(f"{label}.{port.kind}", port.kind, layer, j, heads, upstream))
            self.receivers.append(Receiver(f"MLP{layer}", "mlp", layer, 0, (), upstream + spec.n_heads))
        self._receiver_starts.append(len(self.receivers))
        self.receivers.append(Receiver(LOGITS, "logits", n_layers, 0, (), len(self.senders)))
        counts = torch.tensor([r.n_senders for r in self.receivers], dtype=torch.long)
        self.offsets = torch.cat([torch.zeros(1, dtype=torch.long), counts.cumsum(0)])
        self.n_edges = int(self.offsets[-1])
        self.edge_receiver = torch.repeat_interleave(torch.arange(len(self.receivers)), counts)
        self.edge_sender = torch.cat([torch.arange(int(c)) for c in counts])

    @classmethod
    def for_model(cls, model: HookedVLM, grids: Sequence[tuple[int, int]] = (), image_nodes: ImageNodes = "token",
                  parts: Sequence[Sequence[ImagePart]] | None = None) -> CircuitGraph:
        """The graph of `model`'s decoder (every block: softmax attention or Gated DeltaNet, then an MLP)."""
        cfg = model.cfg
        layers = [mixer_spec(model, layer) for layer in range(cfg.n_layers)]
        return cls(cfg.n_layers, cfg.n_heads, cfg.n_key_value_heads, grids, image_nodes, parts, layers)

    @classmethod
    def for_batch(cls, model: HookedVLM, regions: TokenRegions, image_nodes: ImageNodes = "token") -> CircuitGraph:
        """The graph for inputs with these token regions: every row must show its images in the same
        layout (grids, tiles) unless `image_nodes="image"` (then a row may hold fewer images)."""
        spec = parse_image_nodes(image_nodes)
        n_rows = len(regions.images)
        if spec == "image":
            count = max((len(row) for row in regions.images), default=0)
            return cls.for_model(model, [(1, 1)] * count, spec)  # no grid: one node per image
        layouts = [[image_parts(regions, row, i) for i in range(len(regions.images[row]))] for row in range(n_rows)]
        if any(layout != layouts[0] for layout in layouts):
            seen = sorted({str([tuple(g) for g in regions.image_grid[row]]) for row in range(n_rows)})
            raise UserInputError(f"the pairs show images with different token grids or tiles ({', '.join(seen[:3])}): "
                                 "grid-cell nodes need one layout; use image_nodes='image' or images of one size")
        parts = layouts[0] if layouts else []
        grids: list[tuple[int, int]] = []
        for image, image_parts_ in enumerate(parts):
            views = [p.grid for p in image_parts_ if p.is_view or p.kind == "frame"]  # a video: its frames' grid
            grids.append(views[0] if views else (1, 1))
            if not views:
                raise UserInputError(f"image {image} has no grid that covers the whole image (its tokens: "
                                     f"{[p.kind for p in image_parts_]}): use image_nodes='image'")
        return cls.for_model(model, grids, spec, parts)

    # ------------------------------------------------------------------ indices
    def layer_base(self, layer: int) -> int:
        """Index of sender L{layer}H0 (the senders of layer `layer` start there; its MLP follows its heads);
        n_layers: the number of senders."""
        return self._bases[layer] if layer < self.n_layers else len(self.senders)

    def head_sender(self, layer: int, head: int) -> int:
        return self.layer_base(layer) + head

    def mlp_sender(self, layer: int) -> int:
        return self.layer_base(layer) + self.layers[layer].n_heads

    def layer_receivers(self, layer: int) -> range:
        """Indices of layer `layer`'s receivers: its mixer's ports in order, then its MLP (n_layers: the logits)."""
        if layer >= self.n_layers:
            return range(len(self.receivers) - 1, len(self.receivers))
        return range(self._receiver_starts[layer], self._receiver_starts[layer + 1])

    @cached_property
    def sender_index(self) -> dict[str, int]:
        return {name: i for i, name in enumerate(self.senders)}

    @cached_property
    def receiver_index(self) -> dict[str, int]:
        return {r.name: i for i, r in enumerate(self.receivers)}

    @cached_property
    def edge_names(self) -> list[str]:
        return [f"{self.senders[s]}->{self.receivers[r].name}"
                for r, s in zip(self.edge_receiver.tolist(), self.edge_sender.tolist(), strict=True)]

    def sender_kind(self, sender: int) -> str:
        if sender < self.n_inputs:
            return "input"
        return "mlp" if sender == self.mlp_sender(self.sender_layer(sender)) else "head"

    def sender_layer(self, sender: int) -> int:
        """-1 for input nodes."""
        if sender < self.n_inputs:
            return -1
        return max(layer for layer, base in enumerate(self._bases) if base <= sender)

    def edge(self, sender: str, receiver: str) -> int:
        """Index of the edge `sender->receiver` (raises UserInputError naming what does not exist)."""
        if sender not in self.sender_index:
            raise UserInputError(f"no sender {sender!r} in this graph (senders look like tokens, img0[r2,c3], L2H7, "
                                 f"MLP3; this graph has {len(self.senders)}, e.g. {self.senders[:3]})")
        if receiver not in self.receiver_index:
            raise UserInputError(f"no receiver {receiver!r} in this graph (receivers look like L2H7.q, "
                                 f"{self.receivers[self.n_heads].name}, MLP3, logits)")
        r, s = self.receiver_index[receiver], self.sender_index[sender]
        if s >= self.receivers[r].n_senders:
            raise UserInputError(f"{sender} is not upstream of {receiver}: there is no edge {sender}->{receiver}")
        return int(self.offsets[r]) + s

    def edge_index(self, edge: str | int | tuple[str, str]) -> int:
        """An edge given as "u->v", (u, v) or its index."""
        if isinstance(edge, bool):
            raise UserInputError(f"an edge is 'sender->receiver' or an index, got {edge!r}")
        if isinstance(edge, int):
            if not 0 <= edge < self.n_edges:
                raise UserInputError(f"edge index {edge} is outside the graph's {self.n_edges} edges")
            return edge
        if isinstance(edge, str):
            sender, arrow, receiver = edge.partition("->")
            if not arrow:
                raise UserInputError(f"edge {edge!r}: write it as 'sender->receiver', e.g. 'L0H1->MLP2'")
            return self.edge(sender.strip(), receiver.strip())
        if isinstance(edge, tuple) and len(edge) == 2:
            return self.edge(*edge)
        raise UserInputError(f"an edge is 'sender->receiver', (sender, receiver) or an index, got {edge!r}")

    def edge_set(self, edges: Iterable[str | int | tuple[str, str]]) -> Tensor:
        """Sorted unique edge indices of `edges`."""
        return torch.tensor(sorted({self.edge_index(e) for e in edges}), dtype=torch.long)

    def edges_from(self, sender: str) -> Tensor:
        """Every edge out of `sender` (indices)."""
        if sender not in self.sender_index:
            raise UserInputError(f"no sender {sender!r} in this graph")
        return (self.edge_sender == self.sender_index[sender]).nonzero().flatten()

    @cached_property
    def edge_types(self) -> list[str]:
        """"{sender kind}->{receiver kind}" per edge (input/head/mlp -> q/k/v/mlp/logits)."""
        kinds = [self.sender_kind(s) for s in range(len(self.senders))]
        return [f"{kinds[s]}->{self.receivers[r].kind}"
                for r, s in zip(self.edge_receiver.tolist(), self.edge_sender.tolist(), strict=True)]

    # ------------------------------------------------------------------ positions of the input nodes
    def input_masks(self, regions: TokenRegions, seq_len: int) -> Bool[Tensor, "n_inputs batch pos"]:
        """Where each input node sits in each row: `tokens` = every non-image position (padding too,
        which is the same in both runs), an image node = its tokens of that row's image."""
        batch = len(regions.image)
        masks = torch.zeros(self.n_inputs, batch, seq_len, dtype=torch.bool)
        masks[0] = True
        for row in range(batch):
            masks[0, row, regions.image[row].cpu()] = False
            images = regions.images[row]
            records: dict[int, list[ImageTile]] = {}
            for index, node in enumerate(self.inputs[1:], start=1):
                assert node.image is not None
                if node.image >= len(images):
                    continue
                if node.part is None and node.rows is None:
                    masks[index, row, images[node.image].cpu()] = True
                    continue
                if node.image not in records:
                    records[node.image] = image_records(regions, row, node.image)
                parts = records[node.image]
                if node.part is not None and node.rows is not None and node.cols is not None:  # cells of a video frame
                    frame = parts[node.part]
                    cells = [r * frame.grid[1] + c for r in range(*node.rows) for c in range(*node.cols)]
                    masks[index, row, frame.positions.cpu()[cells]] = True
                    continue
                if node.part is not None:
                    masks[index, row, parts[node.part].positions.cpu()] = True
                    continue
                assert node.rows is not None and node.cols is not None
                view = next(p for p in parts if p.kind in ("image", "base"))  # the view (see ImagePart.is_view)
                cols = view.grid[1]
                cells = [r * cols + c for r in range(*node.rows) for c in range(*node.cols)]
                masks[index, row, view.positions.cpu()[cells]] = True
        return masks

    # ------------------------------------------------------------------ circuits
    def prune(self, keep: Bool[Tensor, " n_edges"]) -> Bool[Tensor, " n_edges"]:
        """The edges of `keep` that lie on a path from an input node to the logits using only edges of
        `keep`. The others change nothing when the circuit runs (a sender whose every input is
        corrupt writes its corrupt output; a node that reaches no logits path is never read)."""
        keep = keep.bool().cpu()
        n_senders = len(self.senders)
        sender_of, receiver_of = self.edge_sender, self.edge_receiver
        reached = torch.zeros(n_senders, dtype=torch.bool)
        reached[: self.n_inputs] = True
        fed = torch.zeros(len(self.receivers), dtype=torch.bool)
        for r, receiver in enumerate(self.receivers):  # receivers in layer order: their senders are settled
            lo, hi = int(self.offsets[r]), int(self.offsets[r + 1])
            fed[r] = bool((keep[lo:hi] & reached[sender_of[lo:hi]]).any())
            if receiver.kind not in ("mlp", "logits") and fed[r]:
                for h in receiver.heads:
                    reached[self.head_sender(receiver.layer, h)] = True
            elif receiver.kind == "mlp" and fed[r]:
                reached[self.mlp_sender(receiver.layer)] = True
        # backwards: which receivers' nodes lead on to the logits
        leads = torch.zeros(n_senders, dtype=torch.bool)  # sender -> has a kept edge into a leading receiver
        receiver_leads = torch.zeros(len(self.receivers), dtype=torch.bool)
        for r in range(len(self.receivers) - 1, -1, -1):
            receiver = self.receivers[r]
            if receiver.kind == "logits":
                receiver_leads[r] = True
            elif receiver.kind == "mlp":
                receiver_leads[r] = bool(leads[self.mlp_sender(receiver.layer)])
            else:
                receiver_leads[r] = bool(any(leads[self.head_sender(receiver.layer, h)] for h in receiver.heads))
            if receiver_leads[r]:
                lo, hi = int(self.offsets[r]), int(self.offsets[r + 1])
                leads[sender_of[lo:hi][keep[lo:hi]]] = True
        return keep & reached[sender_of] & receiver_leads[receiver_of]

    # ------------------------------------------------------------------ saving
    def to_dict(self) -> dict[str, Any]:
        spec = self.image_nodes
        uniform = all(spec == LayerSpec.attention(self.n_heads, self.n_kv_heads) for spec in self.layers)
        return {"n_layers": self.n_layers, "n_heads": self.n_heads, "n_kv_heads": self.n_kv_heads,
                **({} if uniform else {"layers": [spec.to_dict() for spec in self.layers]}),
                "grids": [list(g) for g in self.grids],
                "parts": [[{"kind": p.kind, "grid": list(p.grid), "layout": None if p.layout is None else list(p.layout),
                            "spatial": p.spatial} for p in parts] for parts in self.parts],
                "image_nodes": spec if isinstance(spec, str) else list(spec), "n_edges": self.n_edges}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CircuitGraph:
        spec = data["image_nodes"]
        parts = None if "parts" not in data else [
            [ImagePart(p["kind"], (int(p["grid"][0]), int(p["grid"][1])),
                       None if p["layout"] is None else (int(p["layout"][0]), int(p["layout"][1])), bool(p["spatial"]))
             for p in image] for image in data["parts"]]
        layers = None if "layers" not in data else [LayerSpec.from_dict(layer) for layer in data["layers"]]
        graph = cls(int(data["n_layers"]), int(data["n_heads"]), int(data["n_kv_heads"]),
                    [(int(g[0]), int(g[1])) for g in data["grids"]], spec if isinstance(spec, str) else tuple(spec),
                    parts, layers)
        if "n_edges" in data and int(data["n_edges"]) != graph.n_edges:
            raise UserInputError(f"stored graph has {data['n_edges']} edges, rebuilt {graph.n_edges}")
        return graph

    def __repr__(self) -> str:
        return (f"CircuitGraph({self.n_layers} layers x {self.n_heads} heads ({self.n_kv_heads} kv), "
                f"{self.n_inputs} input nodes, {len(self.receivers)} receivers, {self.n_edges} edges)")
