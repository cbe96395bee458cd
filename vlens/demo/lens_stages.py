"""Stages 5-6 (lenses): the logit lens of the true count per layer, and the HeadLens head taxonomy."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from vlens.core.answers import answer_ids
from vlens.demo.data_stage import CountingSample
from vlens.demo.report_sections import Section
from vlens.demo.settings import DemoSettings
from vlens.lens.corpus import collect_residuals, task_samples
from vlens.lens.head_scores import compute_head_scores
from vlens.lens.headlens import HeadLens
from vlens.lens.logit_lens import LogitLensResult, logit_lens
from vlens.lens.readout import LensReadout
from vlens.lens.taxonomy import classify_heads
from vlens.lens.translators import LensTraining, Translators, train_translators
from vlens.parallel.options import SweepOptions
from vlens.utils.stats import format_interval, format_share

if TYPE_CHECKING:
    from vlens.core.model import HookedVLM


LENS_SEED_OFFSET = 1_000_003  # translator-training samples never coincide with scored samples
SHIPPED_LENS_DIR = "lens"  # a trained lens shipped next to the model weights, if any

LOGIT_TITLE = "Logit lens: the true count per layer"
LOGIT_EXPLANATION = ("The residual stream at the final prompt position after each layer, read through the final norm "
                     "and unembedding: mean probability (top, 95% bootstrap interval over images) and median rank "
                     "(bottom, 1 = top token; bars from the 25th to the 75th percentile) of the true count.")
HEADLENS_TITLE = "HeadLens taxonomy (layer x head)"
HEADLENS_EXPLANATION = ("Each head's output at the final position decoded through a per-layer translator, scored "
                        "(visual / number tokens, image attention relative to the image-token share, answer "
                        "alignment) and classified by explicit thresholds; the table lists every head outside "
                        "'other' with the share of bootstrap resamples of the examples that give it its class "
                        "(columns defined under it; ? on the map: unstable).")


def logit_lens_section(model: HookedVLM, samples: list[CountingSample], settings: DemoSettings) -> Section:
    answers = [s.answer for s in samples]
    try:  # multi-token answers ("12" -> "1", "2") are scored whole (vlens.core.answers)
        tokens = [answer_ids(model, a, example=f"count-{i}") for i, a in enumerate(answers)]
    except ValueError as err:  # e.g. a word-level vocabulary without the count
        return Section.skipped("logit_lens", LOGIT_TITLE, LOGIT_EXPLANATION, str(err))
    results = []
    for start in range(0, len(samples), settings.batch_size):
        chunk = samples[start:start + settings.batch_size]
        inputs = model.prepare(images=[s.image for s in chunk], prompts=[s.question for s in chunk], chat=True)
        results.append(logit_lens(model, inputs, tokens[start:start + len(chunk)],
                                  answers=answers[start:start + len(chunk)]))
    result = LogitLensResult.concat(results)
    median_rank = result.median_rank
    first_top = next((layer for layer in range(result.n_layers) if float(median_rank[layer]) == 1.0), None)
    low, high = result.probability_interval(seed=settings.seed)
    numbers = {"examples": len(samples), "final-layer mean p": float(result.mean_probability[-1]),
               "final-layer mean p 95% CI": format_interval(float(result.mean_probability[-1]), float(low[-1]),
                                                            float(high[-1])),
               "final-layer top-1": float(result.top1_accuracy[-1]),
               "final-layer top-1 95% CI": format_share(float(result.top1_accuracy[-1]), len(samples)),
               "first layer with median rank 1": "none" if first_top is None else first_top}
    numbers.update({f"layer {layer} mean p [95% CI]": format_interval(float(p), float(low[layer]), float(high[layer]))
                    for layer, p in enumerate(result.mean_probability)})
    return Section(key="logit_lens", title=LOGIT_TITLE, explanation=LOGIT_EXPLANATION,
                   figure=result.plot(title="Logit lens of the true count (final prompt position)"),
                   numbers=numbers, data={**result.to_dict(),
                                          "mean_probability_interval": {"level": 0.95,
                                                                        "method": "bootstrap over examples",
                                                                        "low": low.tolist(), "high": high.tolist()}})


def _translators(model: HookedVLM, settings: DemoSettings, lens_dir: Path | None, progress: bool):
    """A shipped lens when the model folder has one, else translators trained for a few steps."""
    if lens_dir is not None and (lens_dir / "config.json").is_file():
        return Translators.load(lens_dir, model=model), {"source": str(lens_dir)}
    samples = task_samples(settings.lens_samples, seed=settings.seed + LENS_SEED_OFFSET, size=settings.image_side)
    resid = collect_residuals(model, samples, positions="text",
                              options=SweepOptions(batch_size=settings.batch_size, progress=progress))
    translators = Translators.for_model(model)
    report = train_translators(translators, resid, LensReadout.from_model(model),
                               training=LensTraining(steps=settings.lens_steps), progress=progress)
    return translators, {"source": f"trained here: {settings.lens_samples} samples, {settings.lens_steps} steps",
                         **report.to_dict()}


# Short column names of the HeadLens table, each defined under the table (docs/method.md, section 5).
SCORE_COLUMNS = {
    "vgs": ("VGS", "visual grounding score: share of the head's top-10 decoded tokens that are visual words "
                   "(colours, shapes, edges, sizes)"),
    "cter": ("CTER", "counting-token emergence rate: share of the top-10 decoded tokens that are numbers"),
    "image_attention": ("img attn", "attention mass from the final position onto the image tokens"),
    "image_attention_ratio": ("img ratio", "image attention divided by the share of image tokens among the keys "
                                           "(1 = uniform attention; routing needs >= 1, aggregation <= 0.25)"),
    "answer_alignment": ("align", "share of examples where the head's top-1 token is the model's own answer"),
    "existence_response": ("exist", "share of examples where the head's top-1 is an existence word "
                                    "('yes', '1', ...) while the answer is not"),
    "difficulty_response": ("diff", "P(top-1 is a difficulty word | >= 7 objects) - P(same | fewer)"),
}


def class_summary(counts: dict[str, int]) -> tuple[list[str], list[str]]:
    """(classes with heads, paper classes with none) — the empty ones are named, never implied."""
    paper = [name for name in counts if name not in ("other", "non-finite")]
    return [name for name in paper if counts[name]], [name for name in paper if not counts[name]]


def class_statement(taxonomy) -> str:
    """Per paper class: how many heads, how many of them stable, the count's interval (from the result)."""
    counts = taxonomy.counts()
    parts = []
    for name in (c for c in counts if c not in ("other", "non-finite")):
        heads = taxonomy.heads_of(name)
        if taxonomy.stability is None:
            parts.append(f"{name} {len(heads)}")
            continue
        low, high = taxonomy.stability.counts.get(name, (0.0, 0.0))
        parts.append(f"{name} {len(heads)} ({len(taxonomy.stable_heads_of(name))} stable; 95% interval of the "
                     f"count {low:g}-{high:g})")
    return "; ".join(parts)


def headlens_section(model: HookedVLM, settings: DemoSettings, lens_dir: Path | None = None, progress: bool = True) -> Section:
    translators, lens_info = _translators(model, settings, lens_dir, progress)
    samples = task_samples(settings.headlens_samples, seed=settings.seed, size=settings.image_side)
    scores = compute_head_scores(model, samples, HeadLens(model, translators),
                                 options=SweepOptions(batch_size=settings.batch_size, progress=progress))
    taxonomy = classify_heads(scores, seed=settings.seed)
    rows = []
    for head in taxonomy.heads_json():
        if head["class"] == "other":
            continue
        row = {"head": f"L{head['layer']}H{head['head']}", "class": head["class"]}
        if "stability" in head:
            row["stability"] = head["stability"] if head["stable"] else f"{head['stability']:.2f} (unstable)"
        for name, (column, _) in SCORE_COLUMNS.items():
            value = head["scores"].get(name)
            row[column] = None if value is None else round(float(value), 2)
        row["top tokens"] = ", ".join(str(t) for t, _ in head["top_tokens"][:5])
        rows.append(row)
    counts = taxonomy.counts()
    found, empty = class_summary(counts)
    empty_text = (f" No head on this model passes the thresholds of {', '.join(empty)}, so those classes are empty "
                  "here.") if empty else ""
    unstable = 0 if taxonomy.stability is None else int(taxonomy.stability.unstable.sum())
    share = "" if scores.image_share is None else (f" Image tokens are {scores.image_share:.0%} of the keys the final "
                                                    "position sees, so a head attending uniformly has image "
                                                    f"attention {scores.image_share:.2f} and ratio 1.")
    stability_text = ("" if taxonomy.stability is None else
                      f" {unstable} of {len(taxonomy.classes)} heads change class on more than "
                      f"{1 - taxonomy.stability.stable_share:.0%} of {taxonomy.stability.n_resamples} bootstrap "
                      "resamples of the examples (unstable).")
    explanation = (f"{HEADLENS_EXPLANATION} Heads per class: {class_statement(taxonomy)} "
                   f"({counts.get('other', 0)} heads are 'other'; scored on {scores.n_examples} task-suite "
                   f"examples).{empty_text}{stability_text}{share}")
    definitions = {column: meaning for column, meaning in SCORE_COLUMNS.values()}
    definitions["stability"] = "share of bootstrap resamples of the examples that give the head this class"
    return Section(
        key="headlens", title=HEADLENS_TITLE, explanation=explanation,
        figure=taxonomy.plot(title="HeadLens classes per head"),
        table=rows or [{"head": "-", "class": "every head is 'other' under the default thresholds"}],
        definitions=definitions,
        numbers={"scored examples": scores.n_examples, **{f"{name} heads": n for name, n in counts.items()},
                 "unstable heads": unstable, "empty classes": ", ".join(empty) or "none"},
        data={"lens": lens_info, "classes_found": found, "classes_empty": empty, **taxonomy.to_dict()},
    )
