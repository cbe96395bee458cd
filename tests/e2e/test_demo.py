"""`vlens demo --quick` end to end, every report section backed by results.json, and the demo's glue.

The end-to-end run uses the embedded model when its weights are present, else the random tiny
model (then only the accuracy-dependent checks are skipped).
"""

from __future__ import annotations

import contextlib
import html
import io
import json
import os
import re
from pathlib import Path

import pytest
import torch

from tests.helpers.family_commands import check_loads_back
from vlens import SweepOptions
from vlens.demo.geometry_stage import count_alignment
from vlens.demo.interventions_stage import interventions_rows, interventions_section
from vlens.demo.report_sections import Section, build_report, jsonable, results_document
from vlens.demo.settings import DemoSettings
from vlens.evaluation import subitizing_limit

CHROMIUM = Path("/usr/bin/chromium")
SECTION_KEYS = [
    "model", "findings", "key_numbers", "data", "counting_accuracy", "confusion_matrix", "counting_accuracy_synpoly", "confusion_matrix_synpoly",
    "attention_share", "attention_image",
    "attention_circuitsvis", "vap_layer_region", "vap_layer_head", "counting_circuit", "attribution_graph", "logit_lens", "headlens",
    "ablation_jaccard",
    "geometry_pca", "geometry_tsne", "interventions",
]


# VLENS_DEMO_MODEL: run these tests on another model folder (e.g. a checkpoint of the zoo recipe);
# by default the embedded model, whose weights ship with the package (absent weights fail here)
MODEL = os.environ.get("VLENS_DEMO_MODEL") or "tiny"
# random-tiny's word-level tokenizer lacks the task-suite answers ("yellow", ...): the ablation
# study skips there with its reason; another model has no stored interventions table
ALLOWED_SKIPS = {"tiny": set(), "random-tiny": {"interventions", "ablation_jaccard", "logit_lens"}}.get(
    MODEL, {"interventions"})
PRINTED: dict[str, str] = {}  # what the demo run printed on stdout


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    from vlens.cli import main

    out = tmp_path_factory.mktemp("demo")
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = main(["demo", "--model", MODEL, "--quick", "--out", str(out), "--threads", "1"])
    assert code == 0
    PRINTED["stdout"] = printed.getvalue()
    results = json.loads((out / "results.json").read_text(encoding="utf-8"))
    page = (out / "report.html").read_text(encoding="utf-8")
    return out, results, page


def test_quick_demo_writes_every_section_in_order(demo_run):
    out, results, page = demo_run
    assert check_loads_back(out, "DemoResults").section_order == SECTION_KEYS  # vlens.load_result
    assert results["section_order"] == SECTION_KEYS
    assert list(results["sections"]) == SECTION_KEYS
    titles = re.findall(r"<h2>(.*?)</h2>", page)
    assert titles == [html.escape(results["sections"][key]["title"]) for key in SECTION_KEYS]
    assert set(results["timings_s"]) >= {"counting evaluation", "visual activation patching", "total"}
    assert set(results["cpu_s"]) == set(results["timings_s"]) - {"total"}
    wall = results["wall_s"]  # what the command printed: since it started, imports included
    assert wall["since_the_command_started"] == pytest.approx(wall["stages"] + wall["before_the_stages"], abs=0.01)
    assert wall["stages"] == results["timings_s"]["total"] and wall["before_the_stages"] > 0
    provenance = results["provenance"]  # how the report was made (vlens.utils.provenance)
    assert provenance["command"] == "demo" and provenance["command_line"].startswith("vlens demo --model")
    assert provenance["model"]["spec"] == MODEL and len(provenance["model"]["weights_digest"]) == 16
    assert provenance["seeds"]["seed"] == results["settings"]["seed"]  # the stages' seeds are recorded


def test_every_section_is_backed_by_numbers(demo_run):
    _, results, page = demo_run
    for key, section in results["sections"].items():
        assert section["explanation"].strip(), key
        assert html.escape(section["explanation"]) in page, key
        if section["status"] == "skipped":
            assert key in ALLOWED_SKIPS, f"{key} skipped: {section['reason']}"
            assert section["reason"] in html.unescape(page)
            continue
        assert section["status"] == "ok"
        assert section["numbers"], f"{key} has no headline numbers"
        assert section["data"], f"{key} has no data behind its figure"
        for name in section["numbers"]:  # every headline number is shown under its section
            assert f"<dt>{html.escape(name)}</dt>" in page, (key, name)


def test_numbers_agree_with_the_data_behind_them(demo_run):
    _, results, _ = demo_run
    sections = results["sections"]
    counting = sections["counting_accuracy"]
    predictions = counting["data"]["predictions"]
    quick = DemoSettings.quick()
    assert counting["numbers"]["examples"] == len(predictions) == quick.subitizing_per_count * len(quick.counts)
    for style in quick.subitizing_styles:  # each style's evaluation feeds the subitizing finding
        key = "counting_accuracy" if style == quick.style else f"counting_accuracy_{style}"
        assert sections[key]["data"]["style"] == style
    subitizing = next(f for f in sections["findings"]["data"]["findings"] if f["key"] == "subitizing")
    assert [t["style"] for t in subitizing["numbers"]["styles"]] == list(quick.counting_styles())
    assert counting["numbers"]["accuracy"] == pytest.approx(sum(p["correct"] for p in predictions) / len(predictions))
    per_count = dict(zip(counting["data"]["counts"], counting["data"]["accuracy_per_count"], strict=True))
    for count, accuracy in per_count.items():
        rows = [p for p in predictions if p["target"] == count]
        assert accuracy == pytest.approx(sum(p["correct"] for p in rows) / len(rows))
    confusion = sections["confusion_matrix"]
    assert confusion["numbers"]["on diagonal"] == sum(p["correct"] for p in predictions)
    assert sum(confusion["numbers"][k] for k in ("on diagonal", "off diagonal", "unparsed")) == len(predictions)

    share = torch.tensor(sections["attention_share"]["data"]["image_attention_share"])
    layer, head = divmod(int(share.argmax()), share.shape[1])
    assert sections["attention_share"]["numbers"]["top head"] == f"L{layer}H{head}"
    assert ((share >= 0) & (share <= 1 + 1e-5)).all()  # a share of one softmax row
    attention = sections["attention_share"]["numbers"]
    near = [f"L{i // share.shape[1]}H{i % share.shape[1]}" for i in range(share.numel())
            if float(share.flatten()[i]) >= float(share.max()) - 0.01]
    assert attention["heads within 0.01 of the top"] == ", ".join(near) and f"L{layer}H{head}" in near
    assert 0.0 <= attention["top head stays top (bootstrap share)"] <= 1.0

    vap = sections["vap_layer_region"]
    rate = torch.tensor(vap["data"]["overwrite_rate"])
    assert rate.shape == (results["model"]["n_layers"], 4)
    assert vap["numbers"]["image: max rate"] == pytest.approx(float(rate[:, 0].max()))
    handover = next((layer for layer in range(rate.shape[0]) if rate[layer, 2] > rate[layer, 0]), "none")
    assert vap["numbers"]["handover layer (final > image)"] == handover
    # Patching every position at layer 0 turns the clean run into the corrupt run: the overwrite rate there
    # is exactly the share of pairs with both runs correct.
    baseline = vap["data"]["baseline"]
    both = [a and b for a, b in zip(baseline["clean_correct"], baseline["corrupt_correct"], strict=True)]
    assert float(rate[0, 3]) == pytest.approx(sum(both) / len(both), abs=1e-6)
    model = results["model"]
    assert len(sections["vap_layer_head"]["data"]["patch_effect"]) == model["n_layers"]

    circuit = sections["counting_circuit"]
    assert circuit["data"]["faithfulness"] >= circuit["numbers"]["target"]
    assert 0 < circuit["numbers"]["circuit edges"] == len(circuit["data"]["edges"]) < circuit["numbers"]["graph edges"]
    low, high = circuit["data"]["faithfulness_interval"]["low"], circuit["data"]["faithfulness_interval"]["high"]
    assert low <= circuit["data"]["faithfulness"] <= high

    # Greedy generation's first token is the last layer's top token, so the logit lens's final-layer top-1
    # agrees example by example with "the answer starts with the true count" (the lens's images are the first
    # of the counting evaluation's: the same seeds).
    if sections["logit_lens"]["status"] == "ok":
        last_ranks = sections["logit_lens"]["data"]["ranks"][-1]
        starts_right = [(p["output"].split() or [""])[0] == str(p["target"]) for p in predictions[:len(last_ranks)]]
        assert [rank == 1 for rank in last_ranks] == starts_right

    geometry = sections["geometry_pca"]
    assert len(geometry["data"]["alignment_per_layer"]) == model["n_layers"]
    assert all(0.0 <= a <= 1.0 for a in geometry["data"]["alignment_per_layer"])
    heads = sections["headlens"]["data"]["heads"]
    assert len(heads) == model["n_layers"] * model["n_heads"]


def test_report_is_self_contained(demo_run):
    _, _, page = demo_run
    assert not re.search(r"<script[^>]+src=", page)  # plotly / circuitsvis are inlined
    markup = re.sub(r"<script.*?</script>", "", page, flags=re.DOTALL)  # the bundles mention URLs in strings
    assert not re.search(r'(src|href)="(https?:)?//', markup)  # nothing is fetched from the network
    assert page.count('class="plotly-graph-div"') >= 10
    assert "data:image/png;base64," in page  # the attention overlay PNG


def test_the_paper_findings_are_decided_by_their_tests_on_the_results(demo_run):
    from vlens.utils.stats import fisher_greater

    _, results, page = demo_run
    sections = results["sections"]
    findings = {f["key"]: f for f in sections["findings"]["data"]["findings"]}
    assert list(findings) == ["subitizing", "handoff", "late_logit_lens", "head_classes", "interventions",
                              "jaccard_ordering"]
    for finding in findings.values():
        assert finding["verdict"] in ("shown", "not shown", "not tested", "not testable on this model")
        assert finding["test"] and finding["evidence"]
        assert f"{finding['name']}: {finding['verdict']}." in html.unescape(page)
    # the same verdicts printed in the terminal after the run, one line each, in order
    printed = PRINTED["stdout"].splitlines()
    start = printed.index(f"The paper's findings on this model ({len(findings)}):")
    assert printed[start + 1:start + 1 + len(findings)] == [
        f"  {f['name']}: {f['verdict']}" + (f" ({f['caveat'].split('.')[0]})" if f["caveat"] else "")
        for f in findings.values()]
    # recompute two verdicts from the other sections' data
    predictions = sections["counting_accuracy"]["data"]["predictions"]
    small = [p["correct"] for p in predictions if p["target"] <= 4]
    large = [p["correct"] for p in predictions if p["target"] > 4]
    p_value = fisher_greater(sum(small), len(small), sum(large), len(large))
    styles = {t["style"]: t for t in findings["subitizing"]["numbers"]["styles"]}
    assert styles[sections["counting_accuracy"]["data"]["style"]]["p_value"] == pytest.approx(p_value)
    assert findings["subitizing"]["shown"] is any(t["p_holm"] < 0.05 for t in styles.values())
    assert all(t["p_holm"] >= t["p_value"] for t in styles.values())
    # the shipped model is 4 layers deep: the depth findings say the test is weak there
    if results["model"]["n_layers"] < 8:
        assert findings["late_logit_lens"]["caveat"].startswith(f"weak test: {results['model']['n_layers']} layers")
    handover = sections["vap_layer_region"]["data"]["handover"]
    assert handover["layer"] == sections["vap_layer_region"]["numbers"]["handover layer (final > image)"]
    if findings["handoff"]["shown"]:
        assert handover["present_share"] >= 0.975 and handover["image_max_before"]["low"] > 0
    heads = sections["headlens"]["data"]["heads"]
    stable_classes = {h["class"] for h in heads if h["stable"]}
    four = {"visual grounding", "cross-modal routing", "counting aggregation", "awareness"}
    if findings["head_classes"]["shown"]:
        assert four <= stable_classes
    if not four <= stable_classes:
        assert findings["head_classes"]["shown"] in (False, None)
    if findings["head_classes"]["shown"] is None:  # a class cannot fire here: the reason is measured and named
        assert findings["head_classes"]["numbers"]["untestable"] and not findings["head_classes"]["testable"]


@pytest.mark.skipif(MODEL != "tiny", reason="VLENS_DEMO_MODEL chose another model: only the embedded model's "
                                             "accuracy is known")
def test_embedded_model_subitizes_and_the_circuit_is_visible(demo_run):
    _, results, _ = demo_run
    sections = results["sections"]
    counting = sections["counting_accuracy"]
    per_count = dict(zip(counting["data"]["counts"], counting["data"]["accuracy_per_count"], strict=True))
    assert min(per_count[1], per_count[2]) >= 0.8  # the smallest counts are subitized
    assert counting["numbers"]["accuracy"] > 0.4  # chance is 1/8
    vap = sections["vap_layer_region"]["numbers"]
    assert vap["clean accuracy"] > 0.5
    assert vap["image: max rate"] > 0.2  # the count travels through the image tokens
    assert vap["handover layer (final > image)"] != "none"  # ... and then into the final position
    lens = sections["logit_lens"]["data"]["mean_probability"]
    assert lens[-1] > lens[0] + 0.2  # the true count becomes readable with depth


def test_the_attribution_graph_section_states_what_its_scores_support(demo_run):
    """The graph saved beside the report loads back; the section's scores, verdict and writers are that graph's."""
    from vlens.utils.results import load_result

    out, results, _ = demo_run
    section = results["sections"]["attribution_graph"]
    numbers, data = section["numbers"], section["data"]
    graph = load_result(out / data["folder"])
    scores = graph.scores()
    assert numbers["replacement score"] == pytest.approx(scores["replacement"]) == data["scores"]["replacement"]
    assert numbers["completeness score"] == pytest.approx(scores["completeness"])
    assert f"replacement score {scores['replacement']:.2f}, completeness" in numbers["what the scores support"]
    largest = graph.edges_into(graph.nodes[-1]["name"], top=1)[0]
    assert numbers["largest direct effect on the answer (any node)"] == f"{largest[0]} {largest[1]:+.3f}"
    assert (largest[0] in numbers["what the scores support"]) == largest[0].startswith("err")
    assert (graph.target["token"], graph.target["contrast"]) == (str(data["count"]), str(data["count"] + 1))
    target = graph.nodes[-1]["name"]
    for rank, name in enumerate(data["writers"], start=1):
        assert numbers[f"writer #{rank} {name}"] == pytest.approx(graph.edge(target, name))
    total = float(graph.adjacency[-1].sum()) + graph.biases[-1] + graph.dropped[-1]
    assert total == pytest.approx(graph.target["value"], abs=1e-3)  # the target's row adds up to the logit difference
    assert graph.examples["features"] and (out / data["folder"] / "graph.html").is_file()  # the viewer's cards
    if MODEL == "tiny":
        assert data["correct"] and data["count"] == DemoSettings.quick().graph_count


@pytest.mark.browser
@pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian chromium (/usr/bin/chromium) is not installed; "
                                                  ".ci/run installs it")
def test_demo_report_renders_readably_in_headless_chromium(demo_run):
    """One browser run: no console errors, every figure drawn with trace types its bundle has, integer
    layer ticks, no colliding titles or bar labels, one colour scale across compared tiles,
    distinguishable coinciding lines, tables that fit and define their abbreviations."""
    from tests.helpers.browser import inspect_page, page_problems

    out, results, page = demo_run
    checks = inspect_page(out / "report.html")
    assert page_problems(checks) == []
    assert len(checks["figures"]) == page.count('class="plotly-graph-div"') >= 10
    assert checks["circuitsvis"] > 0  # the circuitsvis view rendered
    by_section = {f["section"]: f for f in checks["figures"]}
    tiles = next(f for key, f in by_section.items() if key.startswith("attention-over-the-image"))
    assert {t["coloraxis"] for t in tiles["traces"] if t["type"] == "heatmap"} == {"coloraxis"}
    headlens = next(t for t in checks["tables"] if t["section"].startswith("headlens"))
    assert {"VGS", "CTER"} <= set(headlens["defined"])
    # partial plotly bundle, compact figure data (a 196-px model's images and 7 x 7 maps: 3.33 MB on v6)
    assert len(page.encode()) < 3_450_000


# ---------------------------------------------------------------------- the glue, on known answers
def test_subitizing_limit_on_hand_made_curves():
    assert subitizing_limit({1: 1.0, 2: 0.9, 3: 0.5, 4: 0.9}) == 2
    assert subitizing_limit({1: 0.7, 2: 1.0}) == 0
    assert subitizing_limit({1: 1.0, 2: 1.0, 3: 0.8}) == 3
    assert subitizing_limit({2: 0.9, 3: 0.95}, threshold=0.9) == 3


def test_handover_layer_on_hand_made_rates():
    from vlens.demo.patching_stage import handover_layer

    assert handover_layer(torch.tensor([0.8, 0.8, 0.1]), torch.tensor([0.0, 0.1, 0.8]), [0, 1, 2]) == 2
    assert handover_layer(torch.tensor([0.5, 0.5]), torch.tensor([0.5, 0.4]), [3, 4]) == "none"
    assert handover_layer(torch.tensor([0.0, 0.9]), torch.tensor([0.2, 0.0]), [5, 6]) == 5


def test_count_alignment_is_one_for_points_ordered_by_count_and_zero_when_flat():
    counts = [1, 2, 3, 4, 5, 6]
    ordered = torch.stack([torch.tensor(counts, dtype=torch.float32) * -2.0, torch.randn(6)], dim=1)
    assert count_alignment(ordered, counts) == pytest.approx(1.0)
    flat = torch.zeros(6, 2)
    assert count_alignment(flat, counts) == 0.0
    shuffled = torch.stack([torch.tensor([1.0, 3, 2, 5, 4, 6]), torch.zeros(6)], dim=1)
    assert count_alignment(shuffled, counts) == pytest.approx(1 - 6 * 4 / (6 * 35))  # Spearman by hand


@pytest.mark.parametrize("stored", [
    [{"setting": "baseline", "accuracy": 0.5}, {"setting": "+SFT", "accuracy": 0.75, "curve": [1, 2]}],
    {"rows": [{"name": "baseline", "accuracy": 0.5}, {"name": "+SFT", "accuracy": 0.75}]},
    {"arms": {"baseline": {"accuracy": 0.5}, "+SFT": {"accuracy": 0.75}}},
    {"baseline": {"accuracy": 0.5}, "+SFT": {"accuracy": 0.75}, "note": "made by hand"},
])
def test_interventions_rows_accept_the_usual_shapes(stored):
    rows = interventions_rows(stored)
    assert [(r["setting"], r["accuracy"]) for r in rows] == [("baseline", 0.5), ("+SFT", 0.75)]
    assert all("curve" not in r for r in rows)  # non-scalar fields stay out of the table


def test_interventions_rows_read_the_table_a_study_json_holds():
    """`vlens study` writes its table as "rows" next to the raw per-seed results."""
    study = {"settings": {"conditions": ["baseline"], "eval_sets": ["colour"]},
             "results": {"0": {"baseline": {"colour": {"accuracy": 0.5}}}},
             "rows": [{"setting": "baseline", "colour accuracy": 0.5}]}
    assert interventions_rows(study) == [{"setting": "baseline", "colour accuracy": 0.5}]


def test_interventions_rows_reject_a_file_without_rows():
    with pytest.raises(ValueError, match="no rows"):
        interventions_rows({"note": "nothing"})


def test_interventions_section_reads_a_stored_file_and_says_so_when_absent(tmp_path):
    missing = interventions_section(tmp_path)
    assert missing.status == "skipped" and "interventions.json" in missing.reason and "vlens study" in missing.reason
    rows = [{"setting": arm, "accuracy": acc} for arm, acc in
            [("baseline", 0.4), ("+SFT", 0.6), ("+SFT+L_focus", 0.7), ("+SFT+L_focus+beta", 0.72)]]
    (tmp_path / "interventions.json").write_text(json.dumps({"rows": rows}))
    section = interventions_section(tmp_path)
    assert section.status == "ok"
    assert section.numbers["+SFT+L_focus+beta: accuracy"] == 0.72
    assert [list(bar.y) for bar in section.figure.data] == [[0.4], [0.6], [0.7], [0.72]]


def test_sections_round_trip_into_report_and_results():
    sections = [
        Section("a", "First", "One line.", numbers={"x": torch.tensor(0.5), "nan": float("nan")},
                data={"grid": torch.eye(2)}),
        Section.skipped("b", "Second", "Another line.", "the model has no such tokens"),
    ]
    document = results_document(sections, {"name": "m"}, {}, {"total": 1.0})
    assert document["sections"]["a"]["numbers"] == {"x": 0.5, "nan": None}
    assert document["sections"]["a"]["data"]["grid"] == [[1.0, 0.0], [0.0, 1.0]]
    assert document["sections"]["b"]["status"] == "skipped"
    page = build_report(sections, "T", "").to_html()
    assert "Not shown: the model has no such tokens" in page
    with pytest.raises(ValueError, match="duplicate"):
        results_document(sections + [sections[0]], {}, {}, {})
    assert jsonable({1: (torch.tensor(2), float("inf"))}) == {"1": [2, None]}


def test_settings_are_checked():
    settings = DemoSettings.quick()
    settings.check()
    settings.n_pairs = 0
    with pytest.raises(ValueError, match="n_pairs"):
        settings.check()
    with pytest.raises(ValueError, match="two tasks"):
        DemoSettings(ablation_tasks=("counting",)).check()


def test_cli_reports_a_missing_interventions_file(tmp_path, capsys):
    from vlens.cli import main

    code = main(["demo", "--model", "random-tiny", "--quick", "--out", str(tmp_path),
                 "--interventions", str(tmp_path / "nope.json"), "--quiet"])
    assert code == 2
    assert "nope.json" in capsys.readouterr().err


def test_cli_says_how_to_get_the_embedded_model_when_it_is_missing(tmp_path, capsys, monkeypatch):
    import vlens.zoo.embedded
    from vlens.cli import main

    monkeypatch.setattr(vlens.zoo.embedded, "WEIGHTS_FOLDER", tmp_path / "no-weights")  # as if they were never built
    assert main(["demo", "--quick", "--out", str(tmp_path / "out"), "--quiet"]) == 2
    assert "vlens zoo train" in capsys.readouterr().err


def test_final_position_readouts_match_the_cache_by_hand(qwen_pair):
    from vlens.data import render_syndot
    from vlens.demo.attention_stage import final_to_image_attention, image_attention_share
    from vlens.demo.data_stage import CountingSample
    from vlens.lens.corpus import collect_residuals

    _, model = qwen_pair("qwen2_5_vl")
    samples = []
    for count, seed, question in ((2, 0, "How many dots are there?"), (5, 1, "Count the dots.")):
        image, record = render_syndot(count=count, seed=seed, size=168)
        samples.append(CountingSample(image, question, count, record))
    inputs = model.prepare(images=[s.image for s in samples], prompts=[s.question for s in samples], chat=True)
    with torch.no_grad():
        _, cache = model.run_with_cache(inputs)
    maps = final_to_image_attention(model, inputs)  # [batch, L, H, n_image]
    residuals = collect_residuals(model, [(s.image, s.question, s.record) for s in samples], positions="final",
                                  options=SweepOptions(batch_size=2, progress=False)).transpose(0, 1)  # [L, batch, d]
    for row in range(2):
        final, image = int(inputs.regions.final[row]), inputs.regions.image[row]
        for layer in range(model.cfg.n_layers):
            pattern = cache[f"blocks.{layer}.attn.hook_pattern"][row]
            assert torch.allclose(maps[row, layer], pattern[:, final, image])
            resid = cache[f"blocks.{layer}.hook_resid_post"][row, final]
            assert torch.allclose(residuals[layer, row], resid, atol=1e-5)
    share = image_attention_share(model, samples, batch_size=1)  # one image per batch: no padding
    alone = [final_to_image_attention(model, model.prepare(images=[s.image], prompts=[s.question], chat=True))[0]
             for s in samples]
    assert torch.allclose(share, (alone[0].sum(-1) + alone[1].sum(-1)) / 2, atol=1e-6)


def test_key_numbers_copy_headlines_and_leave_out_skipped_stages():
    from vlens.demo.report_sections import key_numbers_section

    sections = [
        Section("counting_accuracy", "Counting", "x", numbers={"accuracy": 0.75, "MAE": 0.3,
                                                               "accuracy 95% CI": "0.75 [0.41, 0.93]"}),
        Section.skipped("logit_lens", "Lens", "x", "no tokens"),
        Section("geometry_pca", "PCA", "x", numbers={"most count-ordered layer": 2}),
    ]
    section = key_numbers_section(sections)
    assert section.numbers == {"Counting: accuracy": 0.75, "PCA: most count-ordered layer": 2}
    assert [row["value"] for row in section.table] == [0.75, 2]
    assert [row["interval / compare with"] for row in section.table] == ["accuracy 95% CI: 0.75 [0.41, 0.93]", "-"]
    assert section.data["source_sections"] == {"Counting: accuracy": "counting_accuracy",
                                               "PCA: most count-ordered layer": "geometry_pca"}
