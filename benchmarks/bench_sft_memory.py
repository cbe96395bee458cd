"""Peak memory of one LoRA SFT + L_focus training step on a 7B-wide model, with gradient
checkpointing on / off and answer-only logits on / off.

The model is the real-shape fixture of `vlens.testing.real_vocab` (Qwen2.5-VL-7B's exact widths:
d_model 3584, 28 heads / 4 KV heads, d_mlp 18944, the 151,643-token vocabulary + specials,
untied 152,064-row embedding and unembedding), cut to `--layers` decoder layers and one vision
block, random weights in `--dtype`. One row: an image of `--image-px` pixels a side (real Qwen
processor settings) and a question, so the sequence is ~1,000 tokens as on the real model; or
a small image and a long question (`--extra-text`), where the vision tower's own transient
memory (eager attention over all patches of a large image) does not hide the decoder's.

Each configuration runs in a fresh process; the process's peak resident memory is reset
(``/proc/self/clear_refs``) after the model and the batch are built, and read back
(``VmHWM``) after one forward + backward, so the number is what the step itself adds
(activations, logits, gradients, autograd buffers) over the weights. Linux only.

    python benchmarks/bench_sft_memory.py [--layers 1] [--dtype float32] [--image-px 868] [--extra-text 0]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

CONFIGS = [  # (gradient checkpointing, answer-only logits)
    (False, False),
    (False, True),
    (True, False),
    (True, True),
]


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def _log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def one(args) -> dict:
    import torch
    from PIL import Image

    from vlens.testing.real_vocab import real_vocab_model
    from vlens.training.data import SFTExample, collate
    from vlens.training.lora import add_lora
    from vlens.training.memory import gradient_checkpointing
    from vlens.training.sft import SFTConfig, micro_batch

    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    model = real_vocab_model("qwen2.5-vl-7b", tiny=False, n_layers=args.layers, vision_depth=1, dtype=dtype,
                             max_pixels=args.image_px**2)
    _log("model built")
    add_lora(model, rank=64)
    side = args.image_px
    question = "How many dots are there?" + " Look at the picture carefully." * args.extra_text
    example = SFTExample([Image.new("RGB", (side, side), "white")], question, "3",
                         [([(side / 3, side / 2), (2 * side / 3, side / 2), (side / 2, side / 4)], (side, side))])
    batch = collate(model, [example])
    _log(f"batch of {batch.inputs.seq_len} tokens")
    config = SFTConfig(gradient_checkpointing=args.checkpointing, answer_only_logits=args.answer_only,
                       focus_layers=list(range(args.layers)))
    model.train()
    Path("/proc/self/clear_refs").write_text("5")  # reset the peak (VmHWM) to the current RSS
    before = _status_kb("VmRSS")
    with gradient_checkpointing(model, args.checkpointing), \
            micro_batch(model, batch, config, config.focus_layers) as (sft, focus):
        (sft + focus).backward()
    peak = _status_kb("VmHWM")
    _log("step done")
    return {"checkpointing": args.checkpointing, "answer_only_logits": args.answer_only,
            "seq_len": int(batch.inputs.seq_len), "n_image_tokens": len(batch.inputs.regions.image[0]),
            "step_peak_mib": round((peak - before) / 1024, 1), "weights_rss_mib": round(before / 1024, 1),
            "loss": float(sft.detach()), "focus": float(focus.detach())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=1)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                        help="weights dtype (bf16 matmuls are very slow on CPUs without bf16 units)")
    parser.add_argument("--image-px", type=int, default=868, help="868 px -> 31 x 31 = 961 image tokens")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--extra-text", type=int, default=0,
                        help="repeat a 6-token sentence this many times in the question (long text, small image)")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--checkpointing", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--answer-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args)))
        return
    rows = []
    for checkpointing, answer_only in CONFIGS:
        command = [sys.executable, __file__, "--one", "--layers", str(args.layers), "--dtype", args.dtype,
                   "--image-px", str(args.image_px), "--threads", str(args.threads), "--extra-text",
                   str(args.extra_text)]
        command += ["--checkpointing"] * checkpointing + ["--answer-only"] * answer_only
        out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
        rows.append(json.loads(out.strip().splitlines()[-1]))
        print(json.dumps(rows[-1]), flush=True)
    base = rows[0]["step_peak_mib"]
    print(f"\n7B-wide Qwen2.5-VL, {args.layers} decoder layer(s), {args.dtype}, seq {rows[0]['seq_len']} "
          f"({rows[0]['n_image_tokens']} image tokens), weights + LoRA {rows[0]['weights_rss_mib']:.0f} MiB")
    print("| checkpointing | answer-only logits | step peak (MiB) | vs neither |")
    print("|---|---|---|---|")
    for row in rows:
        print(f"| {'on' if row['checkpointing'] else 'off'} | {'on' if row['answer_only_logits'] else 'off'} | "
              f"{row['step_peak_mib']:.0f} | {row['step_peak_mib'] / base:.2f}x |")


if __name__ == "__main__":
    main()
