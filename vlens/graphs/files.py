"""The files of an attribution graph: circuit-tracer's graph JSON and vlens's offline HTML viewer.

graph.json follows the schema circuit-tracer's frontend reads (``metadata``, ``qParams``, ``nodes``,
``links``) for the pruned graph: node ids ``{layer}_{feature}_{pos}`` (features), ``0_{layer}_{pos}``
(errors), ``E_{token id}_{pos}`` (inputs; an image group by its first token), ``{n_layers + 1}_{token id}_{pos}``
(the target logit); ``feature_type`` "cross layer transcoder", "mlp reconstruction error",
"embedding", "logit"; ``links`` hold source, target and the direct effect as weight. Supernodes go to
``qParams.supernodes`` as ``[name, node ids...]``. Each node also carries ``vlens_name`` (``L2F17@5``).

graph.html draws the same pruned graph with no network access: inputs at the bottom, the target at the
top, one row per layer; image-group nodes are drawn on the image as boxes; clicking a node lists its
strongest incoming and outgoing edges and, for a feature, shows its activation on every image patch
and its top tokens, and (when attached: `vlens.graphs.examples`) its top image patches and text tokens
over a dataset. ``graph.html#node=NAME`` opens with that node selected.
"""

from __future__ import annotations

import html
import json
import math
from pathlib import Path
from typing import Any

import torch


def _node_id(node: dict[str, Any], n_layers: int, input_ids: dict[int, int]) -> str:
    kind = node["kind"]
    if kind == "feature":
        return f"{node['layer']}_{node['feature']}_{node['pos']}"
    if kind == "error":
        return f"0_{node['layer']}_{node['pos']}"
    if kind in ("token", "image"):
        return f"E_{input_ids.get(node['pos'], 0)}_{node['pos']}"
    return f"{n_layers + 1}_{node['feature']}_{node['pos']}"


FEATURE_TYPES = {"feature": "cross layer transcoder", "error": "mlp reconstruction error", "token": "embedding",
                 "image": "embedding", "logit": "logit"}


def pruned_view(graph: Any) -> tuple[list[int], list[tuple[int, int, float]], list[float]]:
    """(kept node indices, kept edges (target, source, weight), each node's cumulative influence)."""
    pruned = graph.prune()
    keep = pruned.nodes
    edges = pruned.edges & keep[:, None] & keep[None, :]
    rows, cols = edges.nonzero(as_tuple=True)
    links = [(int(r), int(c), float(graph.adjacency[r, c])) for r, c in zip(rows.tolist(), cols.tolist(), strict=True)]
    used = {r for r, _, _ in links} | {c for _, c, _ in links}
    kinds = [node["kind"] for node in graph.nodes]
    kept = [i for i in keep.nonzero().flatten().tolist() if i in used or kinds[i] in ("token", "image", "logit")]
    return kept, links, pruned.cumulative.tolist()


def circuit_tracer_json(graph: Any, slug: str) -> dict[str, Any]:
    """The pruned graph in circuit-tracer's frontend schema (module doc)."""
    kept, links, cumulative = pruned_view(graph)
    input_ids = {int(node["pos"]): int(node.get("token_id", 0)) for node in graph.nodes if node["kind"] in ("token", "image")}
    ids = {i: _node_id(graph.nodes[i], graph.n_layers, input_ids) for i in range(len(graph.nodes))}
    nodes = []
    for i in kept:
        node = graph.nodes[i]
        is_logit = node["kind"] == "logit"
        nodes.append({"node_id": ids[i], "feature": int(node["feature"]) if node["feature"] is not None else
                      (-1 if node["kind"] == "error" else int(node["pos"])),
                      "layer": "E" if node["kind"] in ("token", "image") else str(node["layer"] if not is_logit
                                                                                   else graph.n_layers + 1),
                      "ctx_idx": int(node["pos"]), "feature_type": FEATURE_TYPES[node["kind"]],
                      "token_prob": 1.0 if is_logit else 0.0, "is_target_logit": is_logit, "run_idx": 0,
                      "reverse_ctx_idx": 0, "jsNodeId": ids[i], "clerp": node["label"] if is_logit else "",
                      "influence": cumulative[i], "activation": node.get("activation"), "vlens_name": node["name"]})
    by_name = {node["name"]: ids[i] for i, node in enumerate(graph.nodes)}
    metadata = {"slug": slug, "scan": f"vlens-{graph.model or 'model'}", "transcoder_list": [],
                "prompt_tokens": graph.prompt_tokens, "prompt": "".join(graph.prompt_tokens),
                "node_threshold": graph.settings.get("node_threshold")}
    return {"metadata": metadata,
            "qParams": {"pinnedIds": [], "supernodes": [[name, *(by_name[m] for m in members)]
                                                        for name, members in graph.supernodes.items()],
                        "linkType": "both", "clickedId": "", "sg_pos": ""},
            "nodes": nodes,
            "links": [{"source": ids[c], "target": ids[r], "weight": w} for r, c, w in links]}


def viewer_data(graph: Any) -> dict[str, Any]:
    kept, links, cumulative = pruned_view(graph)
    nodes = []
    for i in kept:
        node = graph.nodes[i]
        entry = {"name": node["name"], "kind": node["kind"], "layer": node["layer"], "pos": node["pos"],
                 "label": node["label"], "activation": node.get("activation"), "influence": cumulative[i],
                 "value": graph.values[i]}
        if node["kind"] == "feature":
            entry["map"] = graph.feature_maps.get(f"L{node['layer']}F{node['feature']}", [])
        if node["name"] in graph.boxes:
            entry["box"] = graph.boxes[node["name"]]
        nodes.append(entry)
    index = {i: k for k, i in enumerate(kept)}
    shown = {graph.nodes[i]["label"] for i in kept if graph.nodes[i]["kind"] == "feature"}
    patches = {}
    for node in graph.nodes:
        if node["kind"] == "image" and node["name"] in graph.boxes:
            patches[node["name"]] = {"box": graph.boxes[node["name"]], "positions": node["positions"]}
    return {"nodes": nodes, "links": [[index[c], index[r], w] for r, c, w in links if r in index and c in index],
            "images": graph.images, "patches": patches, "tokens": graph.prompt_tokens, "target": graph.target,
            "n_layers": graph.n_layers, "scores": graph.scores(), "supernodes": graph.supernodes,
            "examples": {label: hits for label, hits in graph.examples.get("features", {}).items() if label in shown},
            "n_prompts": graph.examples.get("n_prompts", 0)}


_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>__TITLE__</title>
<style>
body{font-family:system-ui,sans-serif;margin:0;display:flex;gap:12px;padding:10px;color:#222}
#left{flex:1 1 auto;min-width:0} #right{width:360px;flex:0 0 360px;font-size:13px}
svg text{font-size:10px} .node{cursor:pointer} .sel{stroke:#000;stroke-width:2.5}
#details table{border-collapse:collapse;width:100%} #details td{padding:1px 4px;border-bottom:1px solid #eee}
.pos{color:#1a5fb4} .neg{color:#c01c28} #imgwrap{position:relative;display:inline-block}
.patch{position:absolute;border:1px solid rgba(0,0,0,.35);box-sizing:border-box;cursor:pointer}
h1{font-size:16px;margin:0 0 6px} .muted{color:#666}
.expatch{display:inline-block;margin:2px;text-align:center;font-size:10px} .expatch img{border:1px solid #ccc}
#extext mark{background:#fc6}
</style></head><body>
<div id="left"><h1 id="title"></h1><div class="muted" id="scores"></div><svg id="graph" width="100%"></svg></div>
<div id="right"><div id="imgwrap"></div><div id="details"><p class="muted">Click a node to see its edges.</p></div></div>
<script>
const G = __DATA__;
const kinds = {feature: "#3584e4", error: "#9a9996", token: "#33d17a", image: "#f6d32d", logit: "#e01b24"};
const W = 900, rowH = 70, nL = G.n_layers;
const rowOf = n => n.kind === "token" || n.kind === "image" ? nL + 1 : n.kind === "logit" ? 0 : nL - n.layer;
const maxPos = Math.max(1, ...G.nodes.map(n => n.pos));
const rows = {};
G.nodes.forEach((n, i) => { (rows[rowOf(n)] = rows[rowOf(n)] || []).push(i); });
const xy = G.nodes.map(() => [0, 0]);
Object.entries(rows).forEach(([r, idx]) => {
  idx.sort((a, b) => G.nodes[a].pos - G.nodes[b].pos);
  idx.forEach((i, k) => { xy[i] = [30 + (W - 60) * (idx.length === 1 ? G.nodes[i].pos / maxPos : k / (idx.length - 1)),
                                   20 + rowH * Number(r)]; });
});
const svg = document.getElementById("graph");
svg.setAttribute("height", String(rowH * (nL + 2) + 20));
svg.setAttribute("viewBox", `0 0 ${W} ${rowH * (nL + 2) + 20}`);
const NS = "http://www.w3.org/2000/svg";
const maxW = Math.max(1e-12, ...G.links.map(l => Math.abs(l[2])));
const edges = G.links.map(([s, t, w]) => {
  const line = document.createElementNS(NS, "line");
  line.setAttribute("x1", xy[s][0]); line.setAttribute("y1", xy[s][1]);
  line.setAttribute("x2", xy[t][0]); line.setAttribute("y2", xy[t][1]);
  line.setAttribute("stroke", w >= 0 ? "#1a5fb4" : "#c01c28");
  line.setAttribute("stroke-opacity", String(0.15 + 0.6 * Math.abs(w) / maxW));
  line.setAttribute("stroke-width", String(0.5 + 3 * Math.abs(w) / maxW));
  svg.appendChild(line); return line;
});
const circles = G.nodes.map((n, i) => {
  const c = document.createElementNS(NS, "circle");
  c.setAttribute("cx", xy[i][0]); c.setAttribute("cy", xy[i][1]); c.setAttribute("r", "6");
  c.setAttribute("fill", kinds[n.kind]); c.setAttribute("class", "node"); c.dataset.name = n.name;
  const tip = document.createElementNS(NS, "title"); tip.textContent = n.name + " " + n.label; c.appendChild(tip);
  c.addEventListener("click", () => select(i)); svg.appendChild(c);
  if (n.kind !== "feature" && n.kind !== "error") {
    const t = document.createElementNS(NS, "text"); t.setAttribute("x", xy[i][0] - 8); t.setAttribute("y", xy[i][1] + 18);
    t.textContent = n.kind === "image" ? n.name.replace(/^img\\d+/, "") : n.label; svg.appendChild(t);
  }
  return c;
});
document.getElementById("title").textContent = "Attribution graph: " + G.nodes[G.nodes.length - 1].name;
const s = G.scores;
document.getElementById("scores").textContent = `replacement score ${s.replacement.toFixed(3)}, completeness ${s.completeness.toFixed(3)}` +
  ` (pruned: ${s.pruned_replacement.toFixed(3)}, ${s.pruned_completeness.toFixed(3)}; ${s.pruned_nodes} nodes, ${s.pruned_edges} edges)`;
const wrap = document.getElementById("imgwrap");
const patchDivs = {};
if (G.images.length) {
  const img = document.createElement("img"); img.src = G.images[0].src; img.width = 340;
  img.alt = "the prompt's image"; wrap.appendChild(img);
  const scale = 340 / G.images[0].width;
  Object.entries(G.patches).forEach(([name, p]) => {
    if (p.box[0] !== 0) return;
    const d = document.createElement("div"); d.className = "patch";
    d.style.left = p.box[1] * scale + "px"; d.style.top = p.box[2] * scale + "px";
    d.style.width = (p.box[3] - p.box[1]) * scale + "px"; d.style.height = (p.box[4] - p.box[2]) * scale + "px";
    d.title = name; const i = G.nodes.findIndex(n => n.name === name);
    if (i >= 0) { d.style.borderColor = "#e5a50a"; d.style.borderWidth = "2px"; d.addEventListener("click", () => select(i)); }
    wrap.appendChild(d); patchDivs[name] = d;
  });
}
function row(name, w) { return `<tr><td>${esc(name)}</td><td class="${w >= 0 ? "pos" : "neg"}">${w.toPrecision(3)}</td></tr>`; }
function esc(t) { return String(t).replace(/[&<>"]/g, c => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;"}[c])); }
function select(i) {
  const n = G.nodes[i];
  circles.forEach((c, k) => c.classList.toggle("sel", k === i));
  edges.forEach((e, k) => { const [a, b] = G.links[k]; e.setAttribute("visibility", a === i || b === i ? "visible" : "hidden"); });
  const ins = G.links.filter(l => l[1] === i).sort((a, b) => Math.abs(b[2]) - Math.abs(a[2])).slice(0, 15);
  const outs = G.links.filter(l => l[0] === i).sort((a, b) => Math.abs(b[2]) - Math.abs(a[2])).slice(0, 15);
  let h = `<h3 id="selected">${esc(n.name)}</h3><p>${esc(n.kind)}${n.activation != null ? ", activation " + n.activation.toPrecision(3) : ""}` +
          `${n.value != null ? ", value " + n.value.toPrecision(4) : ""}</p>`;
  h += `<b>incoming</b><table id="incoming">${ins.map(l => row(G.nodes[l[0]].name, l[2])).join("")}</table>`;
  h += `<b>outgoing</b><table id="outgoing">${outs.map(l => row(G.nodes[l[1]].name, l[2])).join("")}</table>`;
  Object.values(patchDivs).forEach(d => { d.style.background = "none"; });
  if (n.map) {
    const top = n.map.map((a, p) => [a, p]).filter(x => x[0] > 0).sort((a, b) => b[0] - a[0]).slice(0, 8);
    h += `<b>top tokens</b><table id="toptokens">${top.map(([a, p]) => row(`${p}: ${G.tokens[p]}`, a)).join("")}</table>`;
    const peak = Math.max(1e-12, ...n.map);
    Object.entries(G.patches).forEach(([name, p]) => {
      const a = Math.max(0, ...p.positions.map(q => n.map[q] || 0));
      if (patchDivs[name] && a > 0) patchDivs[name].style.background = `rgba(224,27,36,${(0.7 * a / peak).toFixed(3)})`;
    });
  }
  const ex = G.examples[n.label];
  if (n.kind === "feature" && ex) {
    h += `<b>dataset examples</b> <span class="muted">(top over ${G.n_prompts} prompts)</span><div id="examples">` +
         ex.image.filter(e => e.src).map(e => `<figure class="expatch"><img src="${e.src}" alt="prompt ${e.prompt}, ` +
           `position ${e.position}"><figcaption>#${e.prompt} ${e.activation.toPrecision(3)}</figcaption></figure>`).join("") +
         `</div><table id="extext">` + ex.text.map(e => `<tr><td class="pos">${e.activation.toPrecision(3)}</td><td>#${e.prompt}: ` +
           e.context.map((t, k) => k === e.focus ? `<mark>${esc(t)}</mark>` : esc(t)).join(" ") + `</td></tr>`).join("") + `</table>`;
  }
  document.getElementById("details").innerHTML = h;
}
const wanted = decodeURIComponent((location.hash.match(/node=([^&]+)/) || [])[1] || "");
if (wanted) { const i = G.nodes.findIndex(n => n.name === wanted); if (i >= 0) select(i); }
</script></body></html>
"""


def write_viewer(graph: Any, path: str | Path) -> Path:
    """Write graph.html (module doc): one self-contained page, no network access."""
    data = json.dumps(viewer_data(graph), allow_nan=False, default=_finite).replace("</", "<\\/")
    title = html.escape(f"vlens attribution graph: {graph.nodes[-1]['name']}")
    path = Path(path)
    path.write_text(_PAGE.replace("__TITLE__", title).replace("__DATA__", data), encoding="utf-8")
    return path


def _finite(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.tolist()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")
