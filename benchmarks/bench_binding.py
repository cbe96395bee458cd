"""Why the embedded model's binding questions (existence, spatial, colour of a named shape
among several objects) stay at chance: the experiments of RESULTS.md's issue-34 section.

    python benchmarks/bench_binding.py shipped [--n 200] [--model FOLDER]
        held-out accuracy per source with 95% Wilson intervals, the answers given
        (how often each answer word), and accuracy by number of objects
    python benchmarks/bench_binding.py single TASK [--steps 150] [--examples 3000]
            [--image-size 168] [--max-objects K] [--lr 2e-3] [--tower FOLDER] [--decoder fresh|tower]
            [--rope-theta T] [--mrope-section t,h,w] [--minimal-pairs] [--question-first P] [--eval-every N]
        one task alone: the decoder (fresh, seeded; or the tower folder's own) trained on
        that task only, the vision tower taken from FOLDER (default: the shipped model)
        and kept frozen (its tokens cached), then held-out accuracy from unseen seeds (the
        question after the image; with --question-first P > 0 also before it)

All on one torch thread. Every number is printed as one JSON line.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections import Counter
from pathlib import Path

import torch

from vlens.recipes.embedded.evaluate import answer_questions, is_correct
from vlens.recipes.embedded.loop import TrainingState
from vlens.recipes.embedded.recipe import build_untrained, load_for_continuation
from vlens.recipes.embedded.settings import TrainSettings
from vlens.recipes.embedded.train import train_model
from vlens.recipes.embedded.training_set import (
    HELD_OUT_SEED_BASE,
    held_out_samples,
    render_training_set,
    source_makers,
)
from vlens.utils.stats import wilson_interval
from vlens.zoo import model_path


def _row(hits: list[bool]) -> dict:
    low, high = wilson_interval(sum(hits), len(hits))
    return {
        "accuracy": round(sum(hits) / len(hits), 3),
        "ci": [round(float(low), 3), round(float(high), 3)],
        "n": len(hits),
    }


def report(samples: list, predictions: list[str]) -> dict:
    """Per source: accuracy with its interval, the answers given, accuracy by object count."""
    by_source: dict[str, list[bool]] = {}
    answers: dict[str, Counter] = {}
    by_objects: dict[str, dict[int, list[bool]]] = {}
    for (_, record), prediction in zip(samples, predictions, strict=True):
        source = record["source"]
        hit = is_correct(prediction, record)
        by_source.setdefault(source, []).append(hit)
        answers.setdefault(source, Counter())[prediction] += 1
        if record["task"] != "counting":
            by_objects.setdefault(source, {}).setdefault(len(record["objects"]), []).append(hit)
    return {
        source: {
            **_row(hits),
            "answers": dict(answers[source].most_common(8)),
            **(
                {"by_objects": {k: _row(v) for k, v in sorted(by_objects[source].items())}}
                if source in by_objects
                else {}
            ),
        }
        for source, hits in sorted(by_source.items())
    }


def shipped(folder: str | None, n: int) -> None:
    from transformers import Qwen2_5_VLForConditionalGeneration

    from vlens.zoo.processor import load_processor

    folder = folder or str(model_path())
    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(folder).eval()
    samples = held_out_samples(n)
    start = time.time()
    predictions = answer_questions(
        model, load_processor(folder), [s[0] for s in samples], [s[1]["question"] for s in samples]
    )
    print(json.dumps({"model": folder, "n_per_source": n, "seconds": round(time.time() - start),
                      "per_source": report(samples, predictions)}))


def held_out_task(task: str, n: int, max_objects: int | None) -> list:
    make = source_makers(vary=False, max_objects=max_objects)[task]
    return [
        (image, {**record, "source": task})
        for image, record in (make(HELD_OUT_SEED_BASE + 50_000_000 + i) for i in range(n))
    ]


def _template_of(processor, example) -> str:
    words = processor.tokenizer.convert_ids_to_tokens(example.input_ids)
    return "colour" if "object" in words else "shape"


def single(args: argparse.Namespace) -> None:
    tower_folder = args.tower or str(model_path())
    _, processor, donor = load_for_continuation(tower_folder, args.image_size)
    if args.decoder == "fresh":
        tokenizer, processor, model = build_untrained(
            args.seed, args.image_size, args.rope_theta, args.mrope_section, args.text_layers
        )
        model.model.visual.load_state_dict(donor.model.visual.state_dict())
    else:
        tokenizer, model = processor.tokenizer, donor
    if args.token_scale != 1.0:  # scale what the tower hands the decoder (its last linear map)
        with torch.no_grad():
            last = model.model.visual.merger.mlp[2]
            last.weight.mul_(args.token_scale)
            last.bias.mul_(args.token_scale)
    start = time.time()
    rendered = render_training_set(
        processor, args.examples, args.seed, False, {args.task: 1.0}, args.max_objects, args.minimal_pairs,
        args.question_first,
    )
    if args.template:  # keep the examples of one template only
        if rendered.partners is not None:
            raise SystemExit("--template and --minimal-pairs cannot be combined")
        keep = [i for i, e in enumerate(rendered.examples) if _template_of(processor, e) == args.template]
        rendered.examples = [rendered.examples[i] for i in keep]
    render_s = time.time() - start
    settings = TrainSettings(
        steps=args.steps, batch_size=args.batch_size, learning_rate=args.lr,
        warmup_steps=args.warmup, seed=args.seed, log_every=25, freeze_vision=True,
    )
    samples = held_out_task(args.task, args.n, args.max_objects)
    if args.template:
        samples = [s for s in samples if ("object" in s[1]["question"]) == (args.template == "colour")]
    curve: dict[int, float] = {}

    def on_checkpoint(step: int) -> dict:  # held-out accuracy along the way
        predictions = answer_questions(model, processor, [s[0] for s in samples], [s[1]["question"] for s in samples])
        curve[step] = report(samples, predictions)[args.task]["accuracy"]
        return {"held_out": curve[step]}

    with tempfile.TemporaryDirectory() as tmp:
        start = time.time()
        state = TrainingState(Path(tmp), {}, args.eval_every) if args.eval_every else None
        training = train_model(
            model, rendered.examples, rendered.images, settings, tokenizer.pad_token_id,
            processor.image_token_id, Path(tmp) / "log.jsonl", on_checkpoint=on_checkpoint, progress=False,
            state=state, partners=rendered.partners,
        )
        train_s = time.time() - start
    losses = [r["loss"] for r in training["log"] if "loss" in r]
    model.eval()
    predictions = answer_questions(
        model, processor, [s[0] for s in samples], [s[1]["question"] for s in samples]
    )
    both_orders = {}
    if args.question_first:  # the same held-out samples asked question first too
        asked = answer_questions(model, processor, [s[0] for s in samples], [s[1]["question"] for s in samples],
                                 question_first=True)
        both_orders = {"held_out_question_first": report(samples, asked)[args.task]}
    print(json.dumps({
        "task": args.task, "steps": args.steps, "examples": args.examples, "lr": args.lr,
        "image_size": args.image_size, "max_objects": args.max_objects, "decoder": args.decoder,
        "tower": tower_folder, "template": args.template, "token_scale": args.token_scale, "text_layers": args.text_layers or 4,
        "rope_theta": args.rope_theta, "mrope_section": args.mrope_section, "minimal_pairs": args.minimal_pairs,
        "question_first": args.question_first, "seed": args.seed,
        "n_train": len(rendered.examples), "render_s": round(render_s), "train_s": round(train_s),
        "loss_every_25_steps": [round(x, 3) for x in losses],
        "held_out_by_step": curve,
        "held_out": report(samples, predictions)[args.task],
        **both_orders,
    }))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    one = commands.add_parser("shipped")
    one.add_argument("--n", type=int, default=200)
    one.add_argument("--model", default=None)
    two = commands.add_parser("single")
    two.add_argument("task", choices=["existence", "colour", "shape", "spatial"])
    two.add_argument("--steps", type=int, default=150)
    two.add_argument("--examples", type=int, default=3000)
    two.add_argument("--batch-size", type=int, default=48)
    two.add_argument("--lr", type=float, default=2e-3)
    two.add_argument("--warmup", type=int, default=20)
    two.add_argument("--image-size", type=int, default=168)
    two.add_argument("--max-objects", type=int, default=None)
    two.add_argument("--tower", default=None)
    two.add_argument("--decoder", choices=["fresh", "tower"], default="fresh")
    two.add_argument("--seed", type=int, default=0)
    two.add_argument("--n", type=int, default=300)
    two.add_argument("--template", choices=["colour", "shape"], default=None,
                     help="existence: only 'Is there a {color} object?' or only 'Is there a {shape}?'")
    two.add_argument("--eval-every", type=int, default=0, help="held-out accuracy every N steps too")
    two.add_argument("--text-layers", type=int, default=None, help="fresh decoder depth (default 4)")
    two.add_argument("--token-scale", type=float, default=1.0, help="multiply the image tokens by this")
    two.add_argument("--rope-theta", type=float, default=10000.0, help="fresh decoder's M-RoPE theta")
    two.add_argument("--mrope-section", type=lambda t: [int(x) for x in t.split(",")], default=None,
                     help="fresh decoder's M-RoPE (time,height,width) frequency counts, e.g. 2,2,4")
    two.add_argument("--minimal-pairs", action="store_true",
                     help="every sample with its minimal-pair partner (same image, other noun) in the batch")
    two.add_argument("--question-first", type=float, default=0.0, metavar="P",
                     help="share of training samples with the question before the image (0-1, per sample seed)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.command == "shipped":
        shipped(args.model, args.n)
    else:
        single(args)


if __name__ == "__main__":
    main()
