#!/usr/bin/env bash
# Controlled runs for issue 40's arithmetic target (RESULTS.md "Embedded model v5"): does counting a named
# colour or shape among other objects, trained as a source of its own with minimal pairs (the same image
# asked about another colour / shape present), lift the sub-counts that arithmetic needs
# (benchmarks/bench_arithmetic_limits.py: both sub-counts right on 6% of arithmetic images at v5 stage 2)?
# Both arms continue v5 stage 4 (training/v5/lang4) for 1,500 steps with stage 4's settings; two seeds each:
#   base-S:   stage 4's balanced mix;
#   subset-S: the same mix plus counting/subset=0.15 (the other shares shrink by the normalisation);
#   hires-S:  base-S read at 224 px (8 x 8 = 64 image tokens instead of 7 x 7 = 49; the tower was pretrained at
#             224 px): counting among distractors fails mostly by one, and more often where one merged token holds
#             two objects (RESULTS "What limits arithmetic"), so a finer token grid is the other candidate;
#   grow-S:   base-S with the decoder first grown from 4 to 6 layers (new layers interleaved, starting as the
#             identity): more depth for the count, which leaves the image tokens over layers 0-2 (patching);
#   tune-S:   base-S with the tower and merger trained too (answer loss only): SynPoly's misses are mostly one too few
#             and twice as common where two objects nearly touch (bbox gap <= 6 px: 72% against 86% held out), so
#             does the frozen tower merge neighbours that a tuned one would keep apart?
#   tuneaux-S: tune-S plus the tower's dense shape / colour / centre loss (weight 1) that pretrained it, so
#             tuning cannot trade away the per-cell object centres;
#   groups-S: base-S plus counting/groups=0.15 (a named colour / shape beside one group of another, which often
#             outnumbers it; its minimal pair asks the other group's count): asked for a rare colour, stage 4 counts
#             the dominant colour's objects (benchmarks/bench_count_selection.py), the shortcut SynPoly's own
#             counting data leave open (there the asked colour is nearly always the largest group);
#   s5base-S / arith-S: from stage 5 (training/v5/lang5) with stage 5's mix, without / with --arithmetic-pairs (each
#             arithmetic question also asked with the other operation about the same colours): stage 5 gets both
#             sub-counts right on 55% of arithmetic images but answers 67% of those, differences 41% in all, so does
#             making the operation word matter within a batch teach the combination?
#   stage5-S: training/v5/run.sh's stage 5 (groups' mix at stage 4's full length: 6,000 steps, 24,000 images, warm-up
#             100) with another seed, to check that its result is not one seed's.
#
#   nice -n 5 bash training/v5/controlled_subset.sh [RUN ...]
#   RUN: base-60 subset-60 base-61 subset-61 hires-60 hires-61 grow-60 grow-61 tune-60 tuneaux-60 tune-61 tuneaux-61
#        groups-60 groups-61 stage5-45 s5base-60 arith-60 s5base-61 arith-61 (default: all, in this order)
# then: python benchmarks/compare_checkpoints.py runs/ctl5s/base-60 runs/ctl5s/subset-60 --n 300
set -euo pipefail
cd "$(dirname "$0")/../.."
. training/stage.sh
BALANCED_MIX=counting/syndot=0.05,counting/synpoly=0.18,counting/synreal=0.03,colour=0.08,shape=0.16,spatial=0.18,arithmetic=0.14,existence=0.18

train() {  # NAME SEED MIX [FLAGS...]
  local name=$1 seed=$2 mix=$3
  shift 3
  local freeze=--freeze-vision
  case $name in tune*) freeze=() ;; esac
  local from=training/v5/lang4
  case $name in s5base-* | arith-*) from=training/v5/lang5 ;; esac
  run_stage "runs/ctl5s/$name" --init-from "$from" --minimal-pairs ${freeze[@]+"${freeze[@]}"} --seed "$seed" \
    --steps 1500 --batch-size 48 --lr 5e-4 --warmup 50 --examples 8000 --mix "$mix" --checkpoint-every 250 \
    --held-out 300 "$@"
}

runs=("$@")
[ ${#runs[@]} -eq 0 ] && runs=(base-60 subset-60 base-61 subset-61 hires-60 hires-61 grow-60 grow-61 tune-60 tuneaux-60 tune-61 tuneaux-61 groups-60 groups-61 stage5-45 s5base-60 arith-60 s5base-61 arith-61)
for name in "${runs[@]}"; do
  case $name in
    base-*) train "$name" "${name#base-}" "$BALANCED_MIX" ;;
    subset-*) train "$name" "${name#subset-}" "$BALANCED_MIX,counting/subset=0.15" ;;
    hires-*) train "$name" "${name#hires-}" "$BALANCED_MIX" --image-size 224 ;;
    grow-*) train "$name" "${name#grow-}" "$BALANCED_MIX" --grow-text-layers 6 ;;
    tune-*) train "$name" "${name#tune-}" "$BALANCED_MIX" ;;
    groups-*) train "$name" "${name#groups-}" "$BALANCED_MIX,counting/groups=0.15" ;;
    s5base-*) train "$name" "${name#s5base-}" "$BALANCED_MIX,counting/groups=0.15" ;;
    arith-*) train "$name" "${name#arith-}" "$BALANCED_MIX,counting/groups=0.15" --arithmetic-pairs ;;
    stage5-*) train "$name" "${name#stage5-}" "$BALANCED_MIX,counting/groups=0.15" --steps 6000 --examples 24000 \
      --warmup 100 ;;
    tuneaux-*) train "$name" "${name#tuneaux-}" "$BALANCED_MIX" --vision-aux-weight 1.0 ;;
    *) echo "unknown run $name" >&2; exit 2 ;;
  esac
done
