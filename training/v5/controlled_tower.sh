#!/usr/bin/env bash
# Controlled runs for issue 40's SynPoly target (RESULTS.md "Embedded model v5", "How much of SynPoly's count the
# frozen tower carries"): a linear per-cell centre probe on the v5 tower counts held-out SynPoly 86.1% (74.8% at 8-10
# objects), below the 90% target, so no decoder on this tower can reach it by reading it. The vision stage's own
# held-out shape and count were still rising when its 3,000 steps' cosine schedule ended. Does more vision
# pretraining raise what the tower carries?
#   vcont-S: the vision stage continued for 1,500 steps (same dense loss, 224 px, the vision stage's default mix,
#            lr 1e-3, 50 warm-up steps, 8,000 fresh images), seed S.
#   vlong-S: the same, 4,500 steps on 18,000 fresh images (100 warm-up steps): vcont raised the count probe by
#            1.7-1.9 points (p 0.11-0.16), still rising; how far does three times as long go? Written to
#            training/v6/vlong-S so that an unfinished run's state can be committed and resumed (vlong-3 ran into
#            runs/ctl5t and is kept as training/v6/vision).
# Measure each with `python benchmarks/bench_vision_shape.py count-probe FOLDER --n 900` (the folder's
# processor reads 224 px; add --image-size 196 for the decoder's input size) against training/v5/vision.
#
#   nice -n 5 bash training/v5/controlled_tower.sh [RUN ...]    # RUN: vcont-1 vcont-2 vlong-3 (default: all, in order)
set -euo pipefail
cd "$(dirname "$0")/../.."
. training/stage.sh

runs=("$@")
[ ${#runs[@]} -eq 0 ] && runs=(vcont-1 vcont-2 vlong-3)
for name in "${runs[@]}"; do
  case $name in
    vcont-*) run_stage "runs/ctl5t/$name" --stage vision --init-from training/v5/vision --image-size 224 \
      --seed "${name#vcont-}" --steps 1500 --batch-size 32 --lr 1e-3 --warmup 50 --examples 8000 \
      --checkpoint-every 100 ;;
    vlong-*) run_stage "training/v6/$name" --stage vision --init-from training/v5/vision --image-size 224 \
      --seed "${name#vlong-}" --steps 4500 --batch-size 32 --lr 1e-3 --warmup 100 --examples 18000 \
      --checkpoint-every 100 ;;
    *) echo "unknown run $name" >&2; exit 2 ;;
  esac
done
