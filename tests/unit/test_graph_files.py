"""The graph files: graph.json read back with a reader of circuit-tracer's schema written here, and graph.html
in headless Chromium (image groups drawn on the image, a click lists a node's edges, a feature's map)."""

from __future__ import annotations

import json
import re
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.helpers import browser
from tests.unit.test_graphs import planted_graph
from vlens.graphs import ExampleSettings, attach_examples
from vlens.testing import random_image
from vlens.utils.results import load_result

NODE_FIELDS = {"node_id": str, "feature": int, "layer": str, "ctx_idx": int, "feature_type": str, "token_prob": float,
               "is_target_logit": bool, "run_idx": int, "reverse_ctx_idx": int, "jsNodeId": str, "clerp": str}
FEATURE_TYPES = {"cross layer transcoder", "mlp reconstruction error", "embedding", "logit"}


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    model, _, replacement, graph, last = planted_graph()
    graph.supernode("answer writer", [f"L1F3@{last}"])
    examples = [(random_image(seed=30 + i), q) for i, q in enumerate(["How many dots are there?", "Count them.",
                                                                      "Dots here?"])]
    attach_examples(graph, model, replacement.transcoders, examples, ExampleSettings(top_k=3, prompts_per_chunk=2))
    folder = tmp_path_factory.mktemp("graph")
    graph.save(folder)
    return graph, folder, last


def test_graph_json_follows_circuit_tracers_schema(saved):
    graph, folder, last = saved
    data = json.loads((folder / "graph.json").read_text())
    assert set(data) == {"metadata", "qParams", "nodes", "links"}
    meta = data["metadata"]
    assert meta["prompt_tokens"] == graph.prompt_tokens and isinstance(meta["scan"], str) and meta["slug"] == "graph"
    ids = set()
    for node in data["nodes"]:
        for name, kind in NODE_FIELDS.items():
            assert isinstance(node[name], kind), (name, node)
        assert node["feature_type"] in FEATURE_TYPES
        ids.add(node["node_id"])
    assert len(ids) == len(data["nodes"])
    for link in data["links"]:
        assert link["source"] in ids and link["target"] in ids and isinstance(link["weight"], float)
    logits = [n for n in data["nodes"] if n["is_target_logit"]]
    assert len(logits) == 1 and logits[0]["layer"] == str(graph.n_layers + 1)
    writer = next(n for n in data["nodes"] if n.get("vlens_name") == f"L1F3@{last}")
    assert writer["node_id"] == f"1_3_{last}" and writer["feature_type"] == "cross layer transcoder"
    into_logit = {link["source"]: link["weight"] for link in data["links"] if link["target"] == logits[0]["node_id"]}
    assert into_logit[writer["node_id"]] == pytest.approx(graph.edge(graph.nodes[-1]["name"], f"L1F3@{last}"))
    assert data["qParams"]["supernodes"] == [["answer writer", writer["node_id"]]]
    index = json.loads((folder / "graph-metadata.json").read_text())
    assert index["graphs"][0]["slug"] == "graph"


def test_graph_html_is_offline_and_holds_the_pruned_graph(saved):
    graph, folder, last = saved
    page = (folder / "graph.html").read_text()
    assert not re.search(r"""(src|href)=["']https?://""", page)  # nothing fetched from the network
    data = json.loads(re.search(r"const G = (\{.*?\});\n", page, re.S)[1])
    assert f"L1F3@{last}" in {n["name"] for n in data["nodes"]}
    assert data["patches"] and all(len(p["box"]) == 5 for p in data["patches"].values())
    # the dataset examples of the features the viewer shows, and the whole set in results.json
    hits = data["examples"]["L1F3"]
    assert data["n_prompts"] == 3 and len(hits["image"]) == 3 and len(hits["text"]) == 3
    assert set(data["examples"]) == {n["label"] for n in data["nodes"] if n["kind"] == "feature"}
    assert load_result(folder).examples == graph.examples


@pytest.mark.skipif(not browser.available(), reason=browser.SKIP_REASON)
def test_graph_html_in_headless_chromium(saved):
    graph, folder, last = saved
    checks = browser.inspect_page(folder / "graph.html")
    assert checks["errors"] == []
    name = f"L1F3@{last}"
    with tempfile.TemporaryDirectory() as tmp:
        result = subprocess.run([str(browser.CHROMIUM), *browser.FLAGS, f"--user-data-dir={Path(tmp) / 'p'}",
                                 "--virtual-time-budget=20000", "--dump-dom",
                                 (folder / "graph.html").as_uri() + f"#node={name}"],
                                capture_output=True, text=True, timeout=240)
    dom = result.stdout
    assert f'<h3 id="selected">{name}</h3>' in dom  # the click target opened
    assert 'id="incoming"' in dom and 'id="outgoing"' in dom and 'id="toptokens"' in dom
    assert dom.count('class="patch"') == len(graph.boxes)
    assert "rgba(224,27,36" in dom  # the feature's activation painted on the image patches
    # its card's dataset examples: top image patches (as images) and text tokens in context
    hits = graph.examples["features"]["L1F3"]
    patches = re.findall(r'class="expatch"><img src="data:image/png', dom)  # drawn, not the script's template
    assert 'id="examples"' in dom and len(patches) == sum("src" in h for h in hits["image"]) == 3
    assert len(re.findall(r"<mark>(?!\$)", dom)) == len(hits["text"]) == 3
