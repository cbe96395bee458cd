#!/usr/bin/env bash
# Controlled runs behind v5 (issue 40; RESULTS.md "Embedded model v5"): is a better-pretrained tower read by
# a fresh v4-style decoder? The same decoder recipe (4 layers, M-RoPE theta 30 sections [2,2,4], minimal
# pairs, tower frozen) for 1,500 steps on shape-heavy batches, two seeds each, on
#   - the shipped model's tower (168 px, 36 image tokens; tower shape probe 77.9%), and
#   - training/v5/vision (224 px, 64 image tokens; the v2 recipe's vision pretraining), and
#   - the same tower at 196 px (49 image tokens: v196-50);
# then runs continued for 1,500 more steps (seed 52, lr 1e-3, fresh images): shipped-50c, v196-50c, and the
# second seed's shipped-51c and v196-51c.
# What differs is the tower and its input size together: the candidate v5 against what ships.
#
#   nice -n 5 bash training/v5/controlled.sh [RUN ...]
#   RUN: shipped-50 shipped-51 v5-50 v5-51 v196-50 shipped-50c v196-50c v196-51 shipped-51c v196-51c
#   (default: all, in this order)
set -euo pipefail
cd "$(dirname "$0")/../.."
. training/stage.sh
MIX=shape=0.5,counting/synpoly=0.3,colour=0.1,existence=0.1

train() {  # NAME, then the run's own flags
  local out=runs/ctl5/$1
  shift
  run_stage "$out" --minimal-pairs --freeze-vision --steps 1500 --batch-size 32 --examples 8000 --mix "$MIX" \
    --checkpoint-every 250 --held-out 100 "$@"
}

run() {  # a fresh decoder on TOWER: NAME TOWER SEED [--image-size PX]
  local name=$1 tower=$2 seed=$3
  shift 3
  train "$name" --init-from "$tower" --fresh-decoder --text-layers 4 --rope-theta 30 --mrope-section 2,2,4 \
    --seed "$seed" --lr 2e-3 --warmup 100 "$@"
}

continued() {  # 1,500 more steps of a finished run: NAME (continues runs/ctl5/NAME without its trailing c)
  train "$1" --init-from "runs/ctl5/${1%c}" --seed 52 --lr 1e-3 --warmup 50
}

runs=("$@")
[ ${#runs[@]} -eq 0 ] && runs=(shipped-50 shipped-51 v5-50 v5-51 v196-50 shipped-50c v196-50c v196-51 shipped-51c
  v196-51c)
for name in "${runs[@]}"; do
  case $name in
    *c) continued "$name" ;;
    shipped-*) run "$name" vlens/zoo/weights/tiny-qwen2.5-vl "${name#shipped-}" ;;
    v5-*) run "$name" training/v5/vision "${name#v5-}" ;;
    v196-*) run "$name" training/v5/vision "${name#v196-}" --image-size 196 ;;
    *) echo "unknown run $name" >&2; exit 2 ;;
  esac
done
