#!/usr/bin/env bash
# Controlled runs for issue 40: does more arithmetic in the mix move the shipped model's arithmetic (64.3%, target 70%)?
# benchmarks/bench_arithmetic_limits.py on v6 stage 3: both sub-counts right on 72.0% of the images, sums 74.5%,
# differences 52.5%: combining two counts is the limit (RESULTS.md "Embedded model v5", "The same two benchmarks").
#   arith-S: v6 stage 3 (training/v6/lang2) continued on an arithmetic-heavy mix (arithmetic 0.14 -> 0.35, the other
#            sources scaled down alike), seed S;
#   base-S:  the same schedule on stage 3's own mix (GROUPS_MIX), seed S: what more training alone gives.
#   long-S:  arith-S's mix for 3,000 steps, two threads, written to training/v6/arith-long-S. long-3 is v6 stage 4, the
#            shipped model (training/v6/run.sh stage 4 rebuilds it as training/v6/lang3); long-4 is its second seed.
# All: 24,000 fresh examples, batch 48, lr 2e-4 (100 warm-up), tower frozen, minimal pairs, 196 px; arith and base
# 1,500 steps, one thread unless THREADS says otherwise.
# Compare with benchmarks/compare_checkpoints.py (held-out, paired).
#
#   nice -n 5 bash training/v6/controlled_arithmetic.sh [RUN ...]   # RUN: arith-1 base-1 arith-2 (default), long-3
set -euo pipefail
cd "$(dirname "$0")/../.."
. training/stage.sh
. training/v6/mixes.sh  # GROUPS_MIX, ARITH_MIX

runs=("$@")
[ ${#runs[@]} -eq 0 ] && runs=(arith-1 base-1 arith-2)
for name in "${runs[@]}"; do
  case $name in
    arith-*) mix=$ARITH_MIX ;;
    base-*) mix=$GROUPS_MIX ;;
    long-*) THREADS=2 run_stage "training/v6/arith-long-${name#long-}" --init-from training/v6/lang2 --minimal-pairs \
      --freeze-vision --seed "${name#long-}" --steps 3000 --batch-size 48 --lr 2e-4 --warmup 100 --examples 24000 \
      --mix "$ARITH_MIX" --checkpoint-every 250 --held-out 300
      continue ;;
    *) echo "unknown run $name" >&2; exit 2 ;;
  esac
  run_stage "runs/ctl6a/$name" --init-from training/v6/lang2 --minimal-pairs --freeze-vision --seed "${name#*-}" \
    --steps 1500 --batch-size 48 --lr 2e-4 --warmup 100 --examples 24000 --mix "$mix" --checkpoint-every 250 \
    --held-out 300
done
