#!/usr/bin/env bash
# Controlled runs for issue 40: does the shipped decoder (v5 stage 5, training/v5/lang5) read the v6 tower
# (training/v6/vision: a linear per-cell centre probe counts held-out SynPoly 92.3% on it, 86.1% on the v5 tower)?
#   swap-S: stage 5's decoder continued on the v6 tower and merger (--vision-from training/v6/vision), seed S.
#   same-S: the same schedule on its own v5 tower, seed S (the same images and batches as swap-S): what more
#           training alone gives.
# Both: stage 5's mix and settings (tower frozen, minimal pairs, 196 px), 1,500 steps at lr 5e-4 (100 warm-up) on
# 8,000 fresh examples. Compare each pair with benchmarks/compare_checkpoints.py (held-out, paired).
#   seed-S: a second training seed of the shipped v6 stage (training/v6/run.sh stage 2, seed 46), the same command
#           with seed S, written to training/v6/lang1-seedS (so an unfinished run's state can be committed); pair it
#           against training/v5/lang5 as v6 was.
#
#   nice -n 5 bash training/v6/controlled_decoder.sh [RUN ...]    # RUN: swap-1 same-1 swap-2 same-2 (default: these), seed-47
set -euo pipefail
cd "$(dirname "$0")/../.."
. training/stage.sh
. training/v6/mixes.sh  # GROUPS_MIX

runs=("$@")
[ ${#runs[@]} -eq 0 ] && runs=(swap-1 same-1 swap-2 same-2)
for name in "${runs[@]}"; do
  tower=()
  case $name in
    seed-*) THREADS=2 run_stage "training/v6/lang1-seed${name#seed-}" --init-from training/v5/lang5 \
      --vision-from training/v6/vision --minimal-pairs --freeze-vision --seed "${name#seed-}" --steps 6000 \
      --batch-size 48 --lr 5e-4 --warmup 100 --examples 24000 --mix "$GROUPS_MIX" --checkpoint-every 250 --held-out 300
      continue ;;
    swap-*) tower=(--vision-from training/v6/vision) ;;
    same-*) ;;
    *) echo "unknown run $name" >&2; exit 2 ;;
  esac
  run_stage "runs/ctl6d/$name" --init-from training/v5/lang5 "${tower[@]}" --minimal-pairs --freeze-vision \
    --seed "${name#*-}" --steps 1500 --batch-size 48 --lr 5e-4 --warmup 100 --examples 8000 --mix "$GROUPS_MIX" \
    --checkpoint-every 250 --held-out 300
done
