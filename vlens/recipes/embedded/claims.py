"""What the embedded model can and cannot do, written from its evaluation.json (never by hand).

The README's paragraph about the embedded model and the model card's note on its evaluation
sources come from here, so they change with the weights:

- every accuracy carries its 95% Wilson interval over the held-out samples;
- a source is called "held out of training" (unseen, out of distribution) only when its share
  is 0 in the mix of every training stage the file records; otherwise the text says it was
  trained on, with its share;
- yes/no tasks are compared with their chance level (50%);
- a task is called weaker (with a warning about its circuits) when its interval reaches below 85%.

`benchmarks/regenerate_claims.py` writes the README block; the card uses `sources_note`.
"""

from __future__ import annotations

from vlens.utils.marked_sections import section_markers
from vlens.utils.stats import wilson_interval

README_SECTION = "embedded-model-claims"  # the README section readme_paragraph fills (vlens.utils.marked_sections)
README_BEGIN, README_END = section_markers(README_SECTION)
YES_NO_TASKS = ("existence", "spatial")  # answers are "yes" / "no": chance is 50%
COUNTING_NAMES = {
    "counting/syndot": "black dots (SynDot)",
    "counting/synpoly": "coloured polygons (SynPoly)",
    "counting/dot_variants": "dots from a second renderer (dot_variants)",
    "counting/synreal": "shaded objects on textured backgrounds (SynReal-lite)",
    "foreign/counting": "shapes from a third, PIL-drawn renderer in plain CSS colours (foreign)",
    "counting/subset": "a named colour or shape among other objects (SynPoly subset)",
    "counting/groups": "a named colour or shape beside one group of another (SynPoly groups)",
}
# Question sources beyond the task suite's own (named in the text with their accuracy).
OTHER_NAMES = {
    "foreign/colour": "colour questions on the foreign renderer",
    "foreign/shape": "shape questions on the foreign renderer",
    "foreign/existence": "existence questions on the foreign renderer",
    "foreign/spatial": "spatial questions on the foreign renderer",
}
# Sources whose questions another source's training samples also ask (SynPoly counting draws "How many
# red objects?" among other objects too): such a source is never called held out while that one trains.
ALSO_DRAWN_BY = {"counting/subset": "counting/synpoly", "counting/groups": "counting/synpoly"}
SUITE_TASKS = ("colour", "shape", "spatial", "arithmetic", "existence")
SOLID = 0.85  # a task whose interval lies above this is reported as answered; below it, as weaker


def stage_mixes(evaluation: dict) -> list[dict[str, float] | None]:
    """The training mix of every stage, oldest first (None where the file does not record it)."""
    stages = list(evaluation.get("previous_stages") or []) + [{"mix": (evaluation.get("data") or {}).get("mix")}]
    return [stage.get("mix") for stage in stages]


def training_shares(evaluation: dict, source: str) -> list[float] | None:
    """The source's share of each stage's mix (None if some stage's mix is not recorded)."""
    mixes = stage_mixes(evaluation)
    known = [mix for mix in mixes if mix is not None]
    if len(known) < len(mixes):
        return None
    return [float(mix.get(source, 0.0)) for mix in known]


def held_out(evaluation: dict, source: str) -> bool:
    """True only when the source, and any source that also draws its questions, is absent from every recorded stage's mix."""
    shares = training_shares(evaluation, source)
    if shares is None or max(shares, default=0.0) > 0.0:
        return False
    parent = ALSO_DRAWN_BY.get(source)
    return parent is None or held_out(evaluation, parent)


def exposure(evaluation: dict, source: str) -> str:
    """'never in training' or 'in the training mix of every stage (2-4%)' etc."""
    shares = training_shares(evaluation, source)
    if shares is None:
        return "training exposure not recorded"
    used = [s for s in shares if s > 0]
    if not used:
        parent = ALSO_DRAWN_BY.get(source)
        if parent is not None and not held_out(evaluation, parent):
            return f"no source of its own in training, but {parent} asks such questions: {exposure(evaluation, parent)}"
        return "held out of all training"
    low, high = 100 * min(used), 100 * max(used)
    share = f"{low:.0f}%" if round(low) == round(high) else f"{low:.0f}-{high:.0f}%"
    stages = "every stage" if len(used) == len(shares) else f"{len(used)} of {len(shares)} stages"
    return f"in the training mix of {stages}, {share}"


def accuracy_text(result: dict) -> str:
    """'94.3% [91.1, 96.4]' (95% Wilson interval over the n held-out samples)."""
    accuracy, n = float(result["accuracy"]), int(result["n"])
    low, high = wilson_interval(round(accuracy * n), n)
    return f"{100 * accuracy:.1f}% [{100 * float(low):.1f}, {100 * float(high):.1f}]"


def lone_object_accuracy(evaluation: dict, task: str) -> dict | None:
    per_objects = (evaluation.get("evaluation") or {}).get("per_objects", {}).get(task, {})
    return per_objects.get("1")


def readme_paragraph(evaluation: dict) -> str:
    """The README's sentences about the embedded model, from its evaluation.json."""
    per_task = evaluation["evaluation"]["per_task"]
    n = next(iter(per_task.values()))["n"]
    counting = []
    for source, name in COUNTING_NAMES.items():
        if source in per_task:
            counting.append(f"{name} {accuracy_text(per_task[source])} ({exposure(evaluation, source)})")
    names = {**COUNTING_NAMES, **OTHER_NAMES}
    unseen = [names.get(s, s) for s in per_task if held_out(evaluation, s)]
    solid: list[str] = []
    weak: list[str] = []
    for task in SUITE_TASKS:
        if task in per_task:
            chance = " (chance 50%: yes/no)" if task in YES_NO_TASKS else ""
            text = f"{task} {accuracy_text(per_task[task])}{chance}"
            (solid if interval_low(per_task[task]) >= SOLID else weak).append(text)
    lone = lone_object_accuracy(evaluation, "colour")
    lone_text = (f"; it names the colour of a lone object ({100 * float(lone['accuracy']):.0f}% of {lone['n']})"
                 if lone and lone.get("n") else "")
    extra = [s for s in per_task if s not in COUNTING_NAMES and s not in SUITE_TASKS]
    extra_text = ("" if not extra else " Other sources: " + "; ".join(
        f"{OTHER_NAMES.get(s, s)} {accuracy_text(per_task[s])} ({_chance(s)}{exposure(evaluation, s)})" for s in extra) + ".")
    unseen_text = (f" Sources held out of all training (the only numbers here that measure generalisation to "
                   f"an unseen renderer): {', '.join(unseen)}." if unseen else
                   " Every evaluated source is in its training mix (no source is held out), so none of these "
                   "numbers measures generalisation to an unseen renderer.")
    return (f"Held-out accuracy (greedy, exact match, {n} unseen samples per source, 95% intervals"
            f"): it counts {'; '.join(counting)}{lone_text}.{_tasks_text(solid, weak)}{extra_text}{unseen_text}")


def _chance(source: str) -> str:
    """"chance 50%, " for a source whose questions are yes / no (foreign/spatial), else nothing."""
    return "chance 50%, " if source.rpartition("/")[2] in YES_NO_TASKS else ""


def interval_low(result: dict) -> float:
    """The lower end of the 95% Wilson interval of a held-out accuracy."""
    n = int(result["n"])
    return float(wilson_interval(round(float(result["accuracy"]) * n), n)[0])


def _tasks_text(solid: list[str], weak: list[str]) -> str:
    """The suite's other tasks (binding one object among several by shape or colour, yes/no, arithmetic),
    split at SOLID: the weak ones carry the warning about their circuits."""
    text = ""
    if solid:
        text += f" Of the other tasks (most pick out one object among several) it answers {', '.join(solid)}."
    if weak:
        lead = " It is weaker on" if solid else " The other tasks (most pick out one object among several) are weaker:"
        text += f"{lead} {', '.join(weak)}; treat circuits found for those tasks with care."
    return text


def sources_note(evaluation: dict) -> str:
    """The model card's note under its accuracy tables: what each counting source is and whether it was trained on."""
    parts = []
    for source, name in {**COUNTING_NAMES, **OTHER_NAMES}.items():
        if source in evaluation["evaluation"]["per_task"]:
            parts.append(f"{source}: {name}, {exposure(evaluation, source)}")
    return "; ".join(parts) + "."


__all__ = ["README_BEGIN", "README_END", "README_SECTION", "SOLID", "accuracy_text", "interval_low", "exposure", "held_out", "readme_paragraph",
           "sources_note", "stage_mixes", "training_shares"]
