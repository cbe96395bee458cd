"""MODEL_CARD.md for the embedded model: config, size, data, training, held-out accuracy."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from vlens.recipes.embedded.architecture import ROPE_THETA, TEXT_LAYERS
from vlens.recipes.embedded.claims import accuracy_text, sources_note
from vlens.recipes.embedded.foreign import FOREIGN_TASKS
from vlens.recipes.embedded.settings import RecipeSettings
from vlens.utils.marked_sections import marked_sections

# Held-out accuracy targets of the recipe (SynReal-lite counting and the held-out dot
# renderer are reported, not targeted). Colour's is set for images of 2-3 objects; the card's
# colour row counts every image (1-5 objects), which the table's "met" compares with it.
TARGETS: dict[str, float] = {
    "counting/syndot": 0.97,
    "counting/synpoly": 0.90,
    "colour": 0.90,
    "shape": 0.85,
    "spatial": 0.85,
    "existence": 0.90,
    "arithmetic": 0.70,
}


def _accuracy_table(per_task: dict) -> list[str]:
    lines = ["| source | accuracy [95% CI] | n | target | met |", "|---|---|---|---|---|"]
    for source, row in per_task.items():
        target = TARGETS.get(source)
        met = "" if target is None else ("yes" if row["accuracy"] >= target else "no")
        target_text = "reported" if target is None else f"{target:.0%}"
        lines.append(f"| {source} | {accuracy_text(row)} | {row['n']} | {target_text} | {met} |")
    return lines


def _unmet_target_lines(per_task: dict) -> list[str]:
    """A plain statement of the targets this model misses (none: no line)."""
    missed = [
        f"{name} ({per_task[name]['accuracy']:.0%} < {target:.0%})"
        for name, target in TARGETS.items()
        if name in per_task and per_task[name]["accuracy"] < target
    ]
    if not missed:
        return []
    return [
        "- Targets missed: " + ", ".join(missed) + ". Questions about one object picked out by a word",
        '  ("What colour is the star?", "How many red objects...") need the answer position to bind a question',
        "  word to image tokens; where these sit near chance the model has not learned that binding, and counts",
        "  or guesses instead.",
    ]


def _count_table(per_count: dict, with_n: bool = False) -> list[str]:
    """Accuracy per source (rows) and per count or object number (columns)."""
    counts = sorted({count for rows in per_count.values() for count in rows})
    lines = ["| source | " + " | ".join(str(c) for c in counts) + " |", "|---" * (len(counts) + 1) + "|"]
    for source, rows in per_count.items():
        cells = [
            f"{rows[c]['accuracy']:.0%}" + (f" ({rows[c]['n']})" if with_n else "") if c in rows else ""
            for c in counts
        ]
        lines.append(f"| {source} | " + " | ".join(cells) + " |")
    return lines


def objects_section(per_objects: dict) -> list[str]:
    """Other tasks' accuracy by number of objects in the image (none recorded: no section)."""
    if not per_objects:
        return []
    return [
        "## Other tasks by number of objects in the image",
        "Accuracy (n) per number of objects; one object needs no binding of a question word to an object.",
        "",
        *_count_table(per_objects, with_n=True),
        "",
    ]


def _number(value: float) -> str:
    """A float as short as it reads back exactly (30.0 -> "30", 0.0005 -> "0.0005")."""
    short = f"{value:g}"
    return short if float(short) == value else repr(value)


# How close the shares a card's --mix reads back as must be to the recorded ones, and the largest
# whole-number total mix_text tries.
MIX_TOLERANCE = 1e-12
_MAX_MIX_TOTAL = 10_000


def _reads_back(weights: list[float], shares: list[float]) -> bool:
    total = sum(weights)
    return total > 0 and all(abs(w / total - s) <= MIX_TOLERANCE for w, s in zip(weights, shares, strict=True))


def mix_text(mix: dict[str, float]) -> str:
    """A recorded (normalised) mix as a --mix value that reads back as the same shares (within
    MIX_TOLERANCE), as short as it can be: the shares themselves where they have at most four decimals
    (0.06, 0.2); else the smallest whole-number weights with those shares, scaled by a power of ten to
    sum to between 1 and 10 (stage 4's mix plus counting/groups=0.15, renormalised, reads 0.05, ...,
    0.15 again, not 0.0434782608696, ...); else 12 significant digits."""
    names, shares = list(mix), list(mix.values())

    def written(texts: list[str]) -> str:
        return ",".join(f"{name}={text}" for name, text in zip(names, texts, strict=True))

    if all(abs(round(share, 4) - share) <= MIX_TOLERANCE for share in shares):
        return written([f"{share:.12g}" for share in shares])
    for total in range(1, _MAX_MIX_TOTAL + 1):
        counts = [round(share * total) for share in shares]
        if sum(counts) != total:
            continue
        scale = 10 ** (len(str(total)) - 1)
        texts = [f"{count / scale:g}" for count in counts]
        if _reads_back([float(text) for text in texts], shares):
            return written(texts)
    return written([f"{share:.12g}" for share in shares])


# A stage record's optional settings as `vlens zoo train` flags, in the card's order: (record key,
# flag, how its value is written; None: a switch).
_FLAGS: tuple[tuple[str, str, Callable[[Any], str] | None], ...] = (
    ("max_objects", "--max-objects", str),
    ("minimal_pairs", "--minimal-pairs", None),
    ("arithmetic_pairs", "--arithmetic-pairs", None),
    ("question_first", "--question-first", _number),
    ("grow_vision_depth", "--grow-vision-depth", str),
    ("grow_text_layers", "--grow-text-layers", str),
    ("fresh_decoder", "--fresh-decoder", None),
    ("text_layers", "--text-layers", str),
    ("rope_theta", "--rope-theta", _number),
    ("mrope_section", "--mrope-section", lambda section: ",".join(str(n) for n in section)),
    ("vision_aux_weight", "--vision-aux-weight", str),
    ("freeze_vision", "--freeze-vision", None),
)


def stage_command(
    stage: dict, out: str, init_from: str | None, held_out: int | None = None, vision_from: str | None = None
) -> str:
    """The `vlens zoo train` command of one stage: a flag for every setting the stage's record
    holds that changes the trained weights (recipe.training_record), and `--held-out` when given
    (the last stage: the size of the evaluation this card reports)."""
    schedule = stage.get("schedule_steps") or stage["steps"]
    command = (
        f"vlens zoo train --out {out}"
        + (" --stage vision" if stage.get("stage") == "vision" else "")
        + f" --seed {stage['seed']} --steps {schedule} "
        f"--batch-size {stage['batch_size']} --lr {stage['learning_rate']} --warmup {stage['warmup_steps']} "
        f"--examples {stage['n_examples']} --threads {stage['threads']}"
    )
    if held_out is not None and held_out != RecipeSettings.held_out_per_source:
        command += f" --held-out {held_out}"
    if stage["steps"] < schedule:
        command += f" --stop-after {stage['steps']}"
    if stage.get("mix") is not None:  # always written (the recipe's default mix has changed before)
        command += " --mix " + mix_text(stage["mix"])
    for key, flag, written in _FLAGS:
        if stage.get(key):  # unset (None, False, 0.0): the flag's default
            command += f" {flag}" + ("" if written is None else f" {written(stage[key])}")
    if stage.get("device", "cpu") != "cpu":
        command += f" --device {stage['device']}"
    if stage.get("image_size") is not None:
        command += f" --image-size {stage['image_size']}"
    return (command + (f" --init-from {init_from}" if init_from else "")
            + (f" --vision-from {vision_from}" if vision_from else ""))


def _key(stage: dict) -> str:
    """A stage record's identity: a tower that continues one of the model's own stages lists that
    stage again (the same record), and it is one run, not two."""
    return json.dumps(stage, sort_keys=True, default=str)


def reproduce_commands(
    stages: list[dict], held_out: int | None, prefix: str = "", known: dict[str, str] | None = None
) -> list[str]:
    """The `vlens zoo train` commands of `stages`, oldest first, each continuing the one before
    (out folders stage1, stage2, ..., the last DIR); a --vision-from stage's tower is reproduced
    first, by its own stages' commands (folders stageK-tower-stage1, ...), except the stages it
    shares with the model (`known`: a stage's record -> the folder already written for it)."""
    known = {} if known is None else known
    lines: list[str] = []
    previous = None
    for index, stage in enumerate(stages, start=1):
        last = index == len(stages) and not prefix
        if _key(stage) in known and not last:
            previous = known[_key(stage)]
            continue
        tower = None
        if stage.get("vision_from_stages"):
            lines += reproduce_commands(stage["vision_from_stages"], None, f"{prefix}stage{index}-tower-", known)
            tower = known[_key(stage["vision_from_stages"][-1])]
        out = "DIR" if last else f"{prefix}stage{index}"
        lines.append(stage_command(stage, out, previous, held_out if last else None, tower))
        known[_key(stage)] = previous = out
    return lines


def _with_towers(stages: list[dict]) -> list[dict]:
    """`stages` and, before each --vision-from stage, the stages that trained its tower (each run
    once: a tower stage that is also one of the model's stages is not repeated)."""
    runs: dict[str, dict] = {}
    for stage in stages:
        for run in [*_with_towers(stage.get("vision_from_stages") or []), stage]:
            runs.setdefault(_key(run), run)
    return list(runs.values())


def _where(stage: dict) -> str:
    device = stage.get("device", "cpu")
    return f"{stage['threads']} torch thread(s)" + ("" if device == "cpu" else f" on {device}")


def training_stages(summary: dict) -> list[dict]:
    """Every training stage behind a recipe summary, oldest first: each stage's "training"
    dict with its data settings (n_examples, mix, max_objects) merged in."""
    data = summary["data"]
    current = {
        **summary["training"],
        "n_examples": data["n_examples"],
        "mix": data["mix"],
        "max_objects": data.get("max_objects"),
    }
    return [*summary.get("previous_stages", []), current]


def stage_kind(stage: dict) -> str:
    """'vision pretraining', 'language, tower frozen' or 'language'."""
    if stage.get("stage") == "vision":
        return "vision pretraining"
    return "language, tower frozen" if stage.get("freeze_vision") else "language"


def _shipped_stage_line(summary: dict) -> str:
    """Which stage these weights are: the last of the stages listed under Training."""
    stages = training_stages(summary)
    return (
        f"Weights in this folder: stage {len(stages)} of {len(stages)} ({stage_kind(stages[-1])}, "
        f"{stages[-1]['steps']} steps), the last stage listed under Training."
    )


def _stage_notes(stage: dict) -> list[str]:
    """What set a stage apart from plain training (curriculum, growth, size, vision loss)."""
    notes = []
    if stage.get("stage") == "vision":
        notes.append(
            "vision pretraining: the tower and merger alone on dense cell labels (shape, colour, object "
            "centres per cell; vlens.recipes.embedded.vision_pretrain), the language model untouched"
        )
    if stage.get("freeze_vision"):
        notes.append("vision tower and merger frozen")
    if stage.get("max_objects") is not None:
        noun = "object" if stage["max_objects"] == 1 else "objects"
        notes.append(f"curriculum: non-counting tasks with at most {stage['max_objects']} {noun}")
    if stage.get("grow_vision_depth") is not None:
        notes.append(
            f"vision tower first grown to {stage['grow_vision_depth']} blocks (new blocks start as the identity)"
        )
    if stage.get("grow_text_layers") is not None:
        notes.append(
            f"decoder first grown to {stage['grow_text_layers']} layers (new layers interleaved, starting as "
            "the identity)"
        )
    if stage.get("image_size") is not None:
        notes.append(f"images at {stage['image_size']} px")
    if stage.get("text_layers") is not None and not stage.get("fresh_decoder"):
        notes.append(f"a {stage['text_layers']}-layer decoder")
    if stage.get("rope_theta") is not None or stage.get("mrope_section") is not None:
        theta = stage["rope_theta"] if stage.get("rope_theta") is not None else ROPE_THETA
        section = stage.get("mrope_section") or "the default [2, 3, 3]"
        notes.append(f"decoder M-RoPE theta {_number(theta)}, sections {section}")
    if stage.get("minimal_pairs"):
        counted = [name for name in ("counting/subset", "counting/groups") if (stage.get("mix") or {}).get(name, 0) > 0]
        notes.append(
            "minimal pairs: each binding question (existence, spatial, colour, shape"
            + (f"; {' and '.join(counted)}'s counts among other objects" if counted else "")
            + ("; arithmetic with the other operation" if stage.get("arithmetic_pairs") else "")
            + ") also asked with another noun about the same image, in the same batch "
            "(vlens.recipes.embedded.minimal_pairs)"
        )
    if stage.get("question_first"):  # missing (a record from before the option): image first
        notes.append(
            f"question before the image with probability {_number(stage['question_first'])} per sample "
            "(otherwise after it; a minimal pair keeps its sample's order)"
        )
    if stage.get("vision_aux_weight"):
        notes.append(
            f"plus the dense vision-token shape/colour loss (weight {stage['vision_aux_weight']}, "
            "vlens.recipes.embedded.vision_aux; its heads are not saved)"
        )
    return notes


def _stage_start(stage: dict, index: int) -> str:
    """Where stage `index` (1-based) started: from scratch, a new decoder, or the last weights."""
    if index == 1:
        return "from scratch"
    if stage.get("fresh_decoder"):
        layers = stage.get("text_layers") or TEXT_LAYERS
        return f"a new {layers}-layer decoder on stage {index - 1}'s vision tower and merger"
    if stage.get("vision_from_stages"):
        towers = len(stage["vision_from_stages"])
        # the tower's stage lines follow this one; its commands may all be the model's own (nothing stageK-tower-*)
        return (f"stage {index - 1}'s decoder on the vision tower and merger of another run ({towers} stage(s), "
                f"listed below as stage {index}'s tower)")
    return f"continuing stage {index - 1}"


def _stage_lines(
    stages: list[dict], label: str = "stage", indent: str = "", known: dict[str, str] | None = None
) -> list[str]:
    """One line per stage; a --vision-from stage's tower stages follow it, indented (a tower stage
    that is one of the model's own stages, `known`, is named, not described again)."""
    known = {} if known is None else known
    lines = []
    for index, stage in enumerate(stages, start=1):
        if _key(stage) in known:
            lines.append(f"{indent}- {label} {index}: {known[_key(stage)]} above")
            continue
        known[_key(stage)] = f"{label} {index}"
        start = _stage_start(stage, index)
        lines.append(
            f"{indent}- {label} {index} ({start}): seed {stage['seed']}, {stage['steps']} steps"
            + (
                f" (of a {stage['schedule_steps']}-step schedule)"
                if stage["steps"] < (stage.get("schedule_steps") or stage["steps"])
                else ""
            )
            + f" of batch {stage['batch_size']} "
            f"on {stage['n_examples']:,} examples, AdamW lr {stage['learning_rate']} ({stage['warmup_steps']} warm-up "
            f"steps, cosine decay), {_where(stage)}, {stage['wall_time_s'] / 60:.1f} min"
            + "".join(f"; {note}" for note in _stage_notes(stage))
        )
        if stage.get("vision_from_stages"):
            lines += _stage_lines(stage["vision_from_stages"], f"stage {index}'s tower, stage", indent + "  ", known)
    return lines


def training_lines(summary: dict) -> list[str]:
    """One line per training stage (a continued model lists its earlier stages first) and
    the commands that reproduce them."""
    stages = training_stages(summary)
    current = stages[-1]
    lines = _stage_lines(stages)
    everything = _with_towers(stages)
    total_minutes = sum(stage["wall_time_s"] for stage in everything) / 60
    on_cpu = all(stage.get("device", "cpu") == "cpu" for stage in everything)
    losses = []
    if any(stage.get("stage") == "vision" for stage in everything):
        losses.append("the vision stage's loss on dense cell labels")
    if any(stage.get("stage", "language") == "language" for stage in everything):
        losses.append(
            "language stages' loss on answer tokens"
            + (
                " (plus the vision-token loss where said)"
                if any(s.get("vision_aux_weight") for s in everything)
                else ""
            )
        )
    final = "dense-label" if current.get("stage") == "vision" else "answer-token"
    lines += [
        f"- {' and '.join(losses)}; total training wall time {total_minutes:.1f} min "
        f"{'on a shared 2-core CPU' if on_cpu else '(devices as listed)'}; "
        f"final smoothed ({final}) loss {current['final_loss']:.4f}",
        "- reproduce (deterministic for a given seed and thread count):",
        "```",
    ]
    lines += reproduce_commands(stages, summary["data"].get("held_out_per_source"))
    lines.append("```")
    return lines


def _probe_section(summary: dict) -> list[str]:
    """Linear-probe accuracy of the tower after each stage (stages without a probe: none)."""
    stages = [
        (index, stage) for index, stage in enumerate(training_stages(summary), start=1) if stage.get("probe")
    ]
    if not stages:
        return []
    lines = [
        "## Vision tower probes per stage",
        "Linear probes (softmax regression) on the frozen tower's merged token at each object's centre, "
        "held-out SynPoly scenes with 1-6 objects (vlens.recipes.embedded.probe; chance 17%):",
        "",
        "| stage | kind | shape | colour | objects (fit / test) |",
        "|---|---|---|---|---|",
    ]
    for index, stage in stages:
        probe = stage["probe"]
        kind = stage_kind(stage)
        lines.append(
            f"| {index} | {kind} | {probe['shape']:.1%} | {probe['colour']:.1%} | {probe['n_train']} / {probe['n_test']} |"
        )
    dense = summary["training"].get("dense")
    if dense:
        lines += [
            "",
            "Held-out dense accuracy of the pretraining heads (this stage): "
            + ", ".join(f"{name.replace('_', ' ')} {value:.1%}" for name, value in dense.items()),
        ]
    return [*lines, ""]


def _foreign_sources(per_task: dict) -> list[str]:
    """The foreign/* sources a card's evaluation holds (all of them where it holds none: an untrained stage)."""
    held = [f"foreign/{task}" for task in FOREIGN_TASKS if f"foreign/{task}" in per_task]
    return held or [f"foreign/{task}" for task in FOREIGN_TASKS]


def _foreign_tasks_text(per_task: dict) -> str:
    """"colour, shape and counting": the foreign sources' tasks, as the accuracy note names them."""
    tasks = [source.removeprefix("foreign/") for source in _foreign_sources(per_task)]
    tasks = [task for task in ("colour", "shape", "counting", "existence", "spatial") if task in tasks]  # prose order
    return tasks[0] if len(tasks) == 1 else f"{', '.join(tasks[:-1])} and {tasks[-1]}"


def _two_lines(head: str, listing: str, tail: str, indent: str = "") -> list[str]:
    """head + listing + tail broken after the listing's first item (the cards' wrapping before the list grew)."""
    first, _, rest = listing.partition(", ")
    return [f"{head}{first}{',' if rest else ''}", f"{indent}{rest}{tail}"] if rest else [f"{head}{first}{tail}"]


def _evaluation_sections(summary: dict) -> list[str]:
    evaluation = summary["evaluation"]
    if not evaluation.get("per_task"):
        return [
            "## Held-out accuracy",
            "Not measured: this folder is a vision pretraining stage, whose language model is untrained "
            "(the probes below say what its tower learned).",
            "",
        ]
    return [
        "## Held-out accuracy (greedy generation, exact match)",
        *_accuracy_table(evaluation["per_task"]),
        "",
        "## Counting accuracy per count (the subitizing curve)",
        *_count_table(evaluation["per_count"]),
        "",
        *_two_lines("Unseen renderer (no training stage may use it): foreign/* are ",
                    _foreign_tasks_text(evaluation["per_task"]),
                    " questions drawn with PIL's own primitives in plain CSS colours"),
        "(vlens.recipes.embedded.foreign; those colours lie inside the shade ranges training uses, so this",
        "is an unseen renderer, not unseen colours). counting/dot_variants are dots from a second renderer",
        "(vlens.recipes.embedded.dot_variants), held out only if no stage below trained on it. What each counting source is, and whether the model",
        "trained on it (a source is called held out only when no training stage's mix has it): "
        + sources_note(summary),
        "",
        *objects_section(evaluation.get("per_objects", {})),
    ]


def render_model_card(summary: dict) -> str:
    """Markdown text from the recipe's summary dict (keys: config, parameters, data,
    training, evaluation, status, previous_stages)."""
    config, evaluation, data = summary["config"], summary["evaluation"], summary["data"]
    lines = [
        "# tiny-qwen2.5-vl: vlens's embedded model",
        "",
        "A `Qwen2_5_VLForConditionalGeneration` trained from scratch on vlens's synthetic task suites",
        "(counting 1-10 on SynDot and SynPoly, colour, shape, spatial, arithmetic, existence), so that every",
        "analysis, demo and notebook has a real vision-language model to run on without downloads.",
        "",
        f"Status: {summary['status']}",
        "",
        _shipped_stage_line(summary),
        "",
        "## Use",
        "```python",
        "import vlens",
        "model = vlens.load()",
        'out = model.generate(model.prepare(images=[img], prompts=["How many dots are there?"]))',
        "print(out.texts)  # ['3']",
        "```",
        "Plain transformers: `Qwen2_5_VLForConditionalGeneration.from_pretrained(folder)` and",
        "`AutoProcessor.from_pretrained(folder)`. transformers' Qwen processors also build a video processor,",
        "which needs torchvision; without it use `vlens.zoo.processor.load_processor(folder)` (the same",
        "`Qwen2_5_VLProcessor`, images only). `vlens zoo evaluate` re-measures the tables below.",
        "",
        "## Architecture",
        f"- parameters: {summary['parameters']:,}",
        f"- image: resized to {config['image_size']} px, {config['patch_size']} px patches, 2x2 merge -> "
        f"{config['merged_grid']}x{config['merged_grid']} = {config['merged_grid'] ** 2} image tokens",
        f"- vision tower: depth {config['vision_depth']}, width {config['vision_width']}, {config['vision_heads']} heads, "
        f"window attention in blocks outside {config['vision_full_attention_blocks']}",
        f"- language model: {config['text_layers']} layers, d_model {config['text_width']}, {config['text_heads']} heads "
        f"over {config['text_kv_heads']} key/value heads (d_head {config['text_width'] // config['text_heads']}), "
        f"MLP {config['text_mlp']}, M-RoPE sections {config['mrope_section']}"
        + (f", theta {config['rope_theta']:g}" if "rope_theta" in config else ""),
        f"- tokenizer: word level, {config['vocab_size']} tokens (Qwen special tokens, task-suite words, numbers 0-20)",
        "",
        "## Data",
        f"- {data['n_examples']:,} pre-rendered training examples (last stage), mix: "
        + ", ".join(f"{name} {share:.0%}" for name, share in data["mix"].items()),
        "- variety: image sizes 112-448 px before the resize, wider ranges of dot and polygon sizes, and most",
        "  SynDot / SynPoly training images redrawn with other shades of each colour name, other star and",
        "  polygon proportions, outlines, tinted / gradient / noisy backgrounds, blur, grain and JPEG",
        "  (vlens.recipes.embedded.appearance); held-out images are the data module's own renderer",
        *_two_lines("- held out of every stage: the foreign renderer vlens.recipes.embedded.foreign (",
                    ", ".join(_foreign_sources(summary["evaluation"].get("per_task") or {})),
                    "); the second dot renderer (counting/dot_variants) only where no", indent="  "),
        "  stage's mix has it (the sources note below says, per source, how many stages trained on it)",
        f"- held-out: {data['held_out_per_source']} samples per source from unseen seeds, drawn at "
        f"{data['held_out_size']} px and resized",
        "  to the model's input size like every image (counting sources cycle through counts 1-10 evenly)",
        "",
        "## Training",
        *training_lines(summary),
        "",
        *_evaluation_sections(summary),
        *_probe_section(summary),
        "## Limits",
        *_unmet_target_lines(evaluation.get("per_task", {})),
        "- A toy: it knows only the task-suite vocabulary and question templates, and counts 1-10.",
        "- Images are always resized to the fixed input size; very small objects may vanish.",
        "",
    ]
    return "\n".join(lines)


def rewrite_model_card(folder: str | Path) -> Path:
    """Re-render MODEL_CARD.md from the folder's evaluation.json (the recipe's summary)."""
    summary = json.loads((Path(folder) / "evaluation.json").read_text())
    for key in ("per_count", "per_objects"):
        for rows in summary["evaluation"].get(key, {}).values():  # JSON turned the counts into strings
            for count in list(rows):
                rows[int(count)] = rows.pop(count)
    return write_model_card(summary, folder)


def added_sections(card: str) -> list[str]:
    """The marked sections other commands added to a card's text, in order (`vlens study --model-card` writes
    one: vlens.utils.marked_sections); the recipe's summary does not hold them, so a re-render keeps them."""
    return marked_sections(card)


def write_model_card(summary: dict, folder: str | Path) -> Path:
    """Write MODEL_CARD.md into `folder` and return its path. Sections that other commands added to
    the card there (between vlens markers) are kept, after the re-rendered text."""
    path = Path(folder) / "MODEL_CARD.md"
    text = render_model_card(summary)
    kept = added_sections(path.read_text()) if path.is_file() else []
    path.write_text(text.rstrip("\n") + "".join(f"\n\n{section}" for section in kept) + "\n")
    return path
