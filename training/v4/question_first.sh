#!/usr/bin/env bash
# Controlled runs (issue 40): does training with the question before the image as well help? From the shipped
# model (v4 stage 5), 1,500 steps of batch 32 on 8,000 fresh images, v4's stage-4 mix, tower frozen, minimal
# pairs; the same command with --question-first 0 and 0.5, seeds 60 and 61; then held-out accuracy in both orders
# (100 per source).
#
#   nice -n 5 bash training/v4/question_first.sh [RUN ...]   # RUN: qf0-60 qf5-60 qf0-61 qf5-61 (default all)
set -euo pipefail
cd "$(dirname "$0")/../.."
. training/stage.sh
MIX=counting/syndot=0.05,counting/synpoly=0.18,counting/synreal=0.03,colour=0.08,shape=0.16,spatial=0.18,arithmetic=0.14,existence=0.18

run() {  # NAME P SEED
  local out=runs/qf/$1
  run_stage "$out" --init-from vlens/zoo/weights/tiny-qwen2.5-vl --minimal-pairs --freeze-vision \
    --question-first "$2" --seed "$3" --steps 1500 --batch-size 32 --lr 5e-4 --warmup 50 --examples 8000 \
    --mix "$MIX" --checkpoint-every 500 --held-out 100
  [ -f "$out/question_first.json" ] || "$PYTHON" -m vlens zoo evaluate --model "$out" --held-out 100 --question-first \
    --quiet > "$out/question_first.json"
}

runs=("$@")
[ ${#runs[@]} -eq 0 ] && runs=(qf0-60 qf5-60 qf0-61 qf5-61)
for name in "${runs[@]}"; do
  case $name in
    qf0-*) run "$name" 0 "${name#qf0-}" ;;
    qf5-*) run "$name" 0.5 "${name#qf5-}" ;;
    *) echo "unknown run $name" >&2; exit 2 ;;
  esac
done
