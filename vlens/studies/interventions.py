"""The paper's ablation table, reproduced at toy scale on the embedded model.

Conditions (the paper's ablation table; docs/method.md, sections 7-8): baseline / +SFT /
+SFT+L_focus / +SFT+L_focus+beta.
Fine-tuning data: SynDot + SynPoly counting only. Evaluation: SynReal-lite counting (out of
distribution), SynDot / SynPoly counting (in distribution) and the other task suites
(colour, shape, spatial, arithmetic, existence: the "general reasoning" side).

Scaled down so it runs in minutes on a CPU (the paper: 8,000 images, 2 epochs, lr 2e-5,
LoRA 64, a 7B model on a GPU). Our defaults: 200 + 200 images, 1 epoch, lr 1e-3 (the embedded
model was trained from scratch at 2e-3; LoRA at 2e-4 for 30 steps left every answer of an
early checkpoint unchanged, at 2e-5 a few hundred steps barely move the adapters), LoRA rank 64
(d_model is 128 on the embedded model, so this is near full rank), batch 2, lambda 1, focus
layers: the paper's mapped to the depth (`default_focus_layers`: 0 and 2 of 4). beta: importance
= mean-ablation answer log-prob drop per head on held-out SynDot + SynPoly counting, measured on
the +SFT+L_focus model (the model it is applied to), top-4 heads, alpha 1.2, gamma normalised by
the largest, beta floored at 1 (see `vlens.interventions.temperature`). Seeds of every data
split are disjoint from each other and from the embedded model's training and held-out seeds.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from tqdm.auto import tqdm

from vlens.ablation import TaskBatch, build_task_batch, collect_reference, head_ablation_sweep
from vlens.data import make_task_sample
from vlens.evaluation import HookedVLMBackend, counting_metrics, parse_count
from vlens.interventions.temperature import HeadTemperature, fit_temperature, importance_from_result
from vlens.parallel.options import SweepOptions
from vlens.training.data import SFTExample, example_from_sample
from vlens.training.sft import SFTConfig, train_sft
from vlens.utils.errors import UserInputError
from vlens.utils.finite import json_safe
from vlens.utils.marked_sections import replace_marked_section, section_markers
from vlens.utils.provenance import provenance, stamp
from vlens.utils.results import Result, own_fields
from vlens.utils.validation import check_count
from vlens.viz.optional import require_plotly

if TYPE_CHECKING:
    from vlens.core.model import HookedVLM


CONDITIONS: dict[str, str] = {
    "baseline": "baseline",
    "sft": "+SFT",
    "sft_focus": "+SFT+L_focus",
    "sft_focus_beta": "+SFT+L_focus+beta",
}
# evaluation set name -> (task, style); counting sets get accuracy and MAE
EVAL_SETS: dict[str, tuple[str, str]] = {
    "synreal": ("counting", "synreal"),
    "syndot": ("counting", "syndot"),
    "synpoly": ("counting", "synpoly"),
    "colour": ("colour", "synpoly"),
    "shape": ("shape", "synpoly"),
    "spatial": ("spatial", "synpoly"),
    "arithmetic": ("arithmetic", "synpoly"),
    "existence": ("existence", "synpoly"),
}
# Counting sets relative to the fine-tuning data (SynDot + SynPoly). Not "OOD": the embedded model's own
# training mix has SynReal-lite (vlens.recipes.embedded.claims says how much).
SET_ROLES = {"synreal": "counting, not in the SFT data", "syndot": "counting, SFT style",
             "synpoly": "counting, SFT style"}
TRAIN_SEED_BASE = 700_000_000  # fine-tuning images
EVAL_SEED_BASE = 710_000_000  # evaluation images (+ 1,000,000 per set)
IMPORTANCE_SEED_BASE = 730_000_000  # ablation examples for gamma (reference set: + 1,000,000)
CARD_SECTION = "interventions-study"  # the model card section this study writes (vlens.utils.marked_sections)
CARD_BEGIN, CARD_END = section_markers(CARD_SECTION)


@dataclass
class StudySettings:
    """Scaled-down settings (see the module docstring for the paper's)."""

    seeds: list[int] = field(default_factory=lambda: [0])
    n_train_per_style: int = 200
    epochs: int = 1
    learning_rate: float = 1e-3
    lora_rank: int = 64
    batch_size: int = 2
    grad_accum: int = 1
    focus_weight: float = 1.0
    focus_layers: list[int] | None = None
    alpha: float = 1.2
    top_k_heads: int = 4
    importance_examples: int = 40
    n_eval: int = 100
    image_size: int = 224
    eval_batch_size: int = 50
    max_new_tokens: int = 3
    conditions: list[str] = field(default_factory=lambda: list(CONDITIONS))
    eval_sets: list[str] = field(default_factory=lambda: list(EVAL_SETS))

    def check(self) -> None:
        unknown = set(self.conditions) - set(CONDITIONS)
        if unknown:
            raise UserInputError(f"unknown conditions {sorted(unknown)}; choose from {list(CONDITIONS)}")
        unknown = set(self.eval_sets) - set(EVAL_SETS)
        if unknown:
            raise UserInputError(f"unknown evaluation sets {sorted(unknown)}; choose from {list(EVAL_SETS)}")
        if "sft_focus_beta" in self.conditions and "sft_focus" not in self.conditions:
            raise UserInputError("+SFT+L_focus+beta is applied to the +SFT+L_focus model: keep 'sft_focus' too")

    def sft_config(self, seed: int, focus: bool) -> SFTConfig:
        return SFTConfig(
            lora_rank=self.lora_rank,
            focus_weight=self.focus_weight if focus else 0.0,
            focus_layers=self.focus_layers,
            learning_rate=self.learning_rate,
            batch_size=self.batch_size,
            grad_accum=self.grad_accum,
            epochs=self.epochs,
            seed=seed,
            checkpoint_every=10_000,
        )


# ---------------------------------------------------------------------- data


def _counting_sample(style: str, seed: int, count: int, size: int):
    return make_task_sample("counting", seed, size=size, style=style, counts=(count,))


def training_examples(settings: StudySettings, seed: int) -> list[SFTExample]:
    """SynDot + SynPoly counting examples (counts 1-10 evenly), with object centres."""
    examples = []
    for style_index, style in enumerate(("syndot", "synpoly")):
        for i in range(settings.n_train_per_style):
            sample_seed = TRAIN_SEED_BASE + 10_000_000 * seed + 100_000 * style_index + i
            examples.append(
                example_from_sample(*_counting_sample(style, sample_seed, 1 + i % 10, settings.image_size))
            )
    return examples


def evaluation_sets(settings: StudySettings) -> dict[str, list[tuple]]:
    """name -> (image, record) samples; counting sets cycle through counts 1-10 evenly."""
    out = {}
    for set_index, name in enumerate(settings.eval_sets):
        task, style = EVAL_SETS[name]
        samples = []
        for i in range(settings.n_eval):
            seed = EVAL_SEED_BASE + 1_000_000 * set_index + i
            if task == "counting":
                samples.append(_counting_sample(style, seed, 1 + i % 10, settings.image_size))
            else:
                samples.append(make_task_sample(task, seed, size=settings.image_size, style=style))
        out[name] = samples
    return out


# ---------------------------------------------------------------------- evaluation


def evaluate_sets(
    model: HookedVLM,
    sets: dict[str, list[tuple]],
    fwd_hooks: Sequence = (),
    batch_size: int = 50,
    max_new_tokens: int = 3,
    progress: bool = True,
) -> dict[str, dict]:
    """Greedy answers -> per set: accuracy (and MAE, n_unparsed for counting sets) and "correct", 0 / 1
    per image in set order (paired across conditions and seeds: the evaluation images are fixed).

    Counting: the first number parsed from the answer (lmms-eval's parser); MAE over parsed
    answers. Other tasks: the answer's first word must equal the target (case-insensitive).
    """
    backend = HookedVLMBackend(model, fwd_hooks=fwd_hooks)
    results = {}
    for name, samples in sets.items():
        outputs = []
        for start in tqdm(range(0, len(samples), batch_size), desc=f"eval {name}", disable=not progress):
            chunk = samples[start : start + batch_size]
            outputs += backend.generate(
                [[image] for image, _ in chunk], [r["question"] for _, r in chunk], max_new_tokens
            )
        records = [record for _, record in samples]
        if EVAL_SETS.get(name, ("",))[0] == "counting":
            metrics = counting_metrics([parse_count(o) for o in outputs], [int(r["answer"]) for r in records])
            hits = [parse_count(o) == int(r["answer"]) for o, r in zip(outputs, records, strict=True)]
            results[name] = {
                "accuracy": metrics.accuracy,
                "mae": metrics.mae,
                "n": metrics.n,
                "n_unparsed": metrics.n_unparsed,
                "correct": [int(h) for h in hits],  # per image (the same images in every condition and seed)
            }
        else:
            hits = [
                (o.split() or [""])[0].lower() == str(r["answer"]).lower()
                for o, r in zip(outputs, records, strict=True)
            ]
            results[name] = {"accuracy": sum(hits) / len(hits), "n": len(hits), "correct": [int(h) for h in hits]}
    return results


def head_importance(model: HookedVLM, settings: StudySettings, seed: int, progress: bool = True):
    """Mean-ablation log-prob drop per head on held-out SynDot + SynPoly counting."""
    n = settings.importance_examples
    base = IMPORTANCE_SEED_BASE + 10_000 * seed
    task = TaskBatch.concat(
        "counting (SynDot + SynPoly)",
        [
            build_task_batch(model, "counting@syndot", n, seed=base, image_size=settings.image_size),
            build_task_batch(model, "counting@synpoly", n, seed=base, image_size=settings.image_size),
        ],
    )
    reference = TaskBatch.concat(
        "reference",
        [
            build_task_batch(
                model, "counting@syndot", n, seed=base, image_size=settings.image_size, reference=True
            ),
            build_task_batch(
                model, "counting@synpoly", n, seed=base, image_size=settings.image_size, reference=True
            ),
        ],
    )
    options = SweepOptions(progress=progress)
    means = collect_reference(model, reference, alignment="region", options=options)
    return head_ablation_sweep(model, task, method="mean", reference=means, options=options)


# ---------------------------------------------------------------------- the study


@dataclass
class StudyResult(Result):
    """results[seed][condition][set] = metrics; plus what was trained and the temperatures used."""

    filename: ClassVar[str] = "study.json"
    kind: ClassVar[str] = "study"
    # results kept as the dicts their kinds wrote, read back and checked when a file is read
    nested_results: ClassVar[tuple[str, ...]] = ("temperatures", "training")

    settings: dict
    results: dict[int, dict[str, dict[str, dict]]]
    training: dict[int, dict[str, dict]] = field(default_factory=dict)
    temperatures: dict[int, dict] = field(default_factory=dict)
    wall_time_s: float = 0.0
    model: str = ""
    provenance: dict = field(default_factory=dict)  # vlens.utils.provenance: when, which vlens, which weights

    def to_dict(self) -> dict:
        """The study as JSON, with its table (`rows`) and the labels of its conditions and sets."""
        return {**asdict(self), "labels": dict(CONDITIONS), "set_roles": dict(SET_ROLES), "rows": self.rows()}

    def save(self, path: str | Path) -> Path:
        """Write `study.json` and `STUDY.md` into the folder `path`; returns the folder."""
        out = Path(path)
        out.mkdir(parents=True, exist_ok=True)
        (out / self.filename).write_text(json.dumps(json_safe(stamp(self.to_dict())), indent=1, allow_nan=False)
                                         + "\n")
        (out / "STUDY.md").write_text(self.report() + "\n")
        return out

    def rows(self) -> list[dict]:
        """One row per condition: accuracy (and MAE for counting sets) per evaluation set, mean over seeds."""
        rows = []
        for condition in self.settings["conditions"]:
            row: dict = {"setting": CONDITIONS.get(condition, condition)}
            for name in self.settings["eval_sets"]:
                row[f"{name} accuracy"] = self.mean(condition, name, "accuracy")
                if name in SET_ROLES:
                    row[f"{name} MAE"] = self.mean(condition, name, "mae")
            rows.append(row)
        return rows

    def plot(self):
        """Grouped bars: accuracy of each condition on each evaluation set (mean over seeds)."""
        go = require_plotly()
        sets = self.settings["eval_sets"]
        figure = go.Figure([go.Bar(name=row["setting"], x=list(sets), y=[row[f"{name} accuracy"] for name in sets])
                            for row in self.rows()])
        return figure.update_layout(barmode="group", title="Accuracy per intervention and evaluation set",
                                    yaxis={"title": "accuracy", "range": [0, 1.05]},
                                    xaxis={"title": "evaluation set"})

    @classmethod
    def from_dict(cls, data: dict) -> StudyResult:
        """The study `to_dict` wrote (its study.json)."""
        data = dict(data)
        for derived in ("labels", "set_roles", "rows"):
            data.pop(derived, None)
        data["results"] = {int(k): v for k, v in data["results"].items()}
        data["training"] = {int(k): v for k, v in data.get("training", {}).items()}
        data["temperatures"] = {int(k): v for k, v in data.get("temperatures", {}).items()}
        return cls(**own_fields(cls, data))

    def mean(self, condition: str, name: str, key: str) -> float | None:
        values = [
            r[condition][name].get(key)
            for r in self.results.values()
            if condition in r and name in r[condition]
        ]
        present = [v for v in values if v is not None]
        return sum(present) / len(present) if present else None

    def table(self) -> str:
        """Markdown: one row per condition; counting sets as 'acc / MAE', others as acc (%)."""
        sets = self.settings["eval_sets"]
        header = ["method"] + [f"{name} ({SET_ROLES[name]})" if name in SET_ROLES else name for name in sets]
        if any(name not in SET_ROLES for name in sets):
            header.append("general mean")
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        for condition in self.settings["conditions"]:
            cells = [CONDITIONS[condition]]
            general = []
            for name in sets:
                acc = self.mean(condition, name, "accuracy")
                if acc is None:
                    cells.append("")
                    continue
                if name in SET_ROLES:
                    mae = self.mean(condition, name, "mae")
                    cells.append(
                        f"{100 * acc:.1f} / {mae:.2f}" if mae is not None else f"{100 * acc:.1f} / -"
                    )
                else:
                    general.append(acc)
                    cells.append(f"{100 * acc:.1f}")
            if any(name not in SET_ROLES for name in sets):
                cells.append(f"{100 * sum(general) / len(general):.1f}" if general else "")
            lines.append("| " + " | ".join(cells) + " |")
        return "\n".join(lines)

    def report(self) -> str:
        s = self.settings
        seeds = ", ".join(str(seed) for seed in self.results)
        lines = [
            "## Interventions ablation (the paper's ablation table, toy scale)",
            "",
            f"Model: {self.model or 'the embedded tiny Qwen2.5-VL'}. Seeds: {seeds} (mean over seeds). "
            f"Counting cells: accuracy % / MAE; other tasks: accuracy %. n = {s['n_eval']} per set.",
            "",
            self.table(),
            "",
            f"Fine-tuning: {s['n_train_per_style']} SynDot + {s['n_train_per_style']} SynPoly counting images "
            f"({s['image_size']} px), {s['epochs']} epoch(s), LoRA rank {s['lora_rank']} on q/k/v/o, lr "
            f"{s['learning_rate']}, batch {s['batch_size']} x accumulation {s['grad_accum']}, lambda "
            f"{s['focus_weight']}; the paper: 8,000 images, 2 epochs, lr 2e-5 on a 7B model.",
            f"beta: top-{s['top_k_heads']} heads by mean-ablation answer log-prob drop on held-out SynDot + "
            f"SynPoly counting ({2 * s['importance_examples']} examples), measured on the +SFT+L_focus model, "
            f"alpha {s['alpha']}, gamma = importance / max, beta = max(1, alpha * gamma): a head whose "
            "alpha * gamma is below 1 is selected but left unchanged (beta 1).",
        ]
        if len(self.results) > 1:
            for name in [n for n in s["eval_sets"] if n in SET_ROLES][:1]:
                per_seed = "; ".join(
                    f"{CONDITIONS[c]} "
                    + "/".join(f"{100 * rows[c][name]['accuracy']:.1f}" for rows in self.results.values())
                    for c in s["conditions"]
                )
                lines.append(f"{name} accuracy per seed ({seeds}): {per_seed}.")
        for seed, temp in self.temperatures.items():
            fitted = HeadTemperature.from_dict(temp)
            floored = set(fitted.floored())
            heads = ", ".join(f"L{layer}H{head} beta={beta:.2f}" + (" (floor: unchanged)" if (layer, head) in floored
                                                                   else "")
                              for (layer, head), beta in sorted(fitted.betas.items()))
            lines.append(f"Seed {seed} heads: {heads}; {len(fitted.changed())} of {len(fitted.betas)} sharpened.")
        for seed, runs in self.training.items():
            parts = [
                f"{CONDITIONS[c]}: {r['steps']} steps, {r['mean_step_time_s'] * 1000:.0f} ms/step, final "
                f"L_SFT {r['final_sft_loss']:.3f}"
                + (f", L_focus {r['final_focus_loss']:.3f}" if r.get("final_focus_loss") is not None else "")
                for c, r in runs.items()
            ]
            lines.append(f"Seed {seed} training: " + "; ".join(parts) + ".")
        lines.append(f"Wall time: {self.wall_time_s / 60:.1f} min.")
        if self.provenance:
            p = self.provenance
            lines.append(f"Measured {p.get('written_at') or p.get('measured_at')} (vlens {p.get('vlens_version')}, "
                         f"commit {p.get('git_commit') or p.get('commit')}, "
                         f"weights fingerprint {p.get('weights_fingerprint')}).")
        return "\n".join(lines)


def run_study(
    load_model: Callable[[], object],
    settings: StudySettings | None = None,
    out_dir: str | Path = "study_out",
    progress: bool = True,
    model_name: str = "",
) -> StudyResult:
    """Run every condition for every seed; `load_model()` returns a fresh base HookedVLM each call.

    Writes `out_dir/study.json` and `out_dir/STUDY.md` (and the adapters of each run) and
    returns the result. Reports what comes out, whichever way it goes.
    """
    settings = settings or StudySettings()
    settings.check()
    out_dir = Path(out_dir)
    start = time.time()
    sets = evaluation_sets(settings)
    result = StudyResult(settings=asdict(settings), results={}, model=model_name)
    evaluate = lambda model, hooks=(): evaluate_sets(  # noqa: E731
        model, sets, hooks, settings.eval_batch_size, settings.max_new_tokens, progress
    )

    def fresh_model():
        model = load_model()
        if "sft_focus_beta" in settings.conditions:  # before any training, not after it
            check_count(settings.top_k_heads, "top_k_heads", max=model.cfg.n_heads_total)
        return model

    for seed in settings.seeds:
        rows, training = {}, {}
        if "baseline" in settings.conditions:
            base = fresh_model()
            if not result.provenance:
                result.provenance = provenance(base, fingerprint=True)
            rows["baseline"] = evaluate(base)
        examples = (
            training_examples(settings, seed) if any(c != "baseline" for c in settings.conditions) else []
        )
        for condition, focus in (("sft", False), ("sft_focus", True)):
            if condition not in settings.conditions:
                continue
            model = fresh_model()
            run = train_sft(
                model,
                examples,
                settings.sft_config(seed, focus),
                out_dir / f"seed{seed}" / condition,
                resume=False,
                progress=progress,
            )
            training[condition] = run.to_dict()
            rows[condition] = evaluate(model)
            if condition == "sft_focus" and "sft_focus_beta" in settings.conditions:
                ablation = head_importance(model, settings, seed, progress)
                temp = fit_temperature(
                    importance_from_result(ablation),
                    top_k=settings.top_k_heads,
                    alpha=settings.alpha,
                    source={
                        "importance": "mean-ablation log-prob drop, SynDot+SynPoly counting",
                        "seed": seed,
                    },
                )
                temp.save(out_dir / f"seed{seed}" / "temperature.json")
                result.temperatures[seed] = temp.to_dict()
                rows["sft_focus_beta"] = evaluate(model, temp.hooks(model))
        result.results[seed] = rows
        result.training[seed] = training
        result.wall_time_s = time.time() - start
        result.save(out_dir)  # partial results survive an interruption between seeds
    return result


def write_model_card_section(result: StudyResult, card_path: str | Path) -> Path:
    """Put the study's report into a model card (replacing an earlier one between the markers)."""
    path = Path(card_path)
    text = replace_marked_section(path.read_text() if path.is_file() else "", CARD_SECTION, result.report())
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path
