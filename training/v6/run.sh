#!/usr/bin/env bash
# The embedded model, version 6 (issue 40): a tower that carries SynPoly's count, then the shipped v5 decoder continued
# on it (stage 2, shipped in commit ebcfb6c), then continued on fresh images (stage 3, shipped in commit 9a0f0d7), then
# on an arithmetic-heavy mix (stage 4, the shipped model).
#
#   nice -n 5 bash training/v6/run.sh            # from the repository root; CPU (each stage's thread count is set)
#   DEVICE=cuda bash training/v6/run.sh          # on a GPU when one is lent
#
# Why (RESULTS.md "Embedded model v5", "How much of SynPoly's count the frozen tower carries" and "Controlled runs:
# more vision pretraining"): a linear per-cell centre probe on the v5 tower counts held-out SynPoly 86.1% (74.8% at
# 8-10 objects), so no decoder reading that frozen tower reaches the 90% target (v5 stage 5 answers 81.4%).
# Continuing the v5 vision stage for 4,500 steps (training/v5/controlled_tower.sh vlong-3) raised the probe to 92.3%
# (87.8% at 8-10 objects; paired against the v5 tower p 6e-8) and the shape probe to 99.9% at 224 px; 1,500 steps
# gave 87.8-88.0% on two seeds. This stage is that run (threads 2: a thread count is part of a deterministic rerun).
# A second seed (vlong-4) agrees: 92.2%. Stage 2 (below) puts v5 stage 5's decoder on this tower (shipped in commit
# ebcfb6c; RESULTS.md "Embedded model v6": against v5 stage 5, better on shape and on counting among others, worse on none).
#
# Rerun the same command to continue: a stage whose folder training/v6/STAGE holds model.safetensors is done and
# skipped; a stage with a saved state in training/v6/STAGE.checkpoint resumes from it.
set -euo pipefail
cd "$(dirname "$0")/../.."
. training/stage.sh
. training/v6/mixes.sh  # GROUPS_MIX, ARITH_MIX

# 1: the v5 vision stage (training/v5/vision: 3,000 steps, dense cell labels, 224 px) continued on fresh images.
THREADS=2 run_stage training/v6/vision --stage vision --init-from training/v5/vision --image-size 224 --seed 3 \
  --steps 4500 --batch-size 32 --lr 1e-3 --warmup 100 --examples 18000 --checkpoint-every 100

# 2: the shipped decoder (v5 stage 5, training/v5/lang5) on this tower and merger (--vision-from), stage 5's mix and
# settings at stage 5's length. Controlled runs (training/v6/controlled_decoder.sh, 1,500 steps, two seeds; RESULTS
# "Embedded model v6") left SynPoly level after 1,500 steps: shape up, counting by shape up, counting everything down,
# the decoder still adapting, as the group-counting source did before stage 5's full length recovered it.
THREADS=2 run_stage training/v6/lang1 --init-from training/v5/lang5 --vision-from training/v6/vision --minimal-pairs \
  --freeze-vision --seed 46 --steps 6000 --batch-size 48 --lr 5e-4 --warmup 100 --examples 24000 --mix "$GROUPS_MIX" \
  --checkpoint-every 250 --held-out 300

# 3: stage 2 continued on 24,000 fresh images (three passes instead of stage 2's 7.5) at lr 2e-4 for 1,500 steps, stage
# 2's mix and settings (shipped in commit 9a0f0d7). Why (RESULTS.md "Embedded model v6", benchmarks/bench_fit_gap.py): stage 2
# answered 87% of its own SynPoly training images and 78% of fresh ones of that distribution. This is controlled run
# cont-1 of training/v6/controlled_counting.sh (one thread: a thread count is part of a deterministic rerun), which
# raised SynPoly from 85.7% to 91.0% (paired p 0.0025) and was worse on no source; its second seed (cont-2) gained less
# (88.3%, p 0.17). A counting-heavy mix reached 90.7% on both seeds but lost dot_variants (count-1) or spatial (count-2).
THREADS=1 run_stage training/v6/lang2 --init-from training/v6/lang1 --minimal-pairs --freeze-vision --seed 1 \
  --steps 1500 --batch-size 48 --lr 2e-4 --warmup 100 --examples 24000 --mix "$GROUPS_MIX" --checkpoint-every 250 \
  --held-out 300

# 4: stage 3 continued 3,000 steps on 24,000 fresh images with arithmetic 0.35 of the mix (ARITH_MIX; stage 3's 0.14),
# lr 2e-4, two threads: the shipped model. Why (RESULTS.md "Embedded model v6"): on stage 3 arithmetic (64.3%, target
# 70%) is limited by combining two sub-counts; neither fresh data nor a counting-heavy mix moved it past 65%. This is
# controlled run long-3 of training/v6/controlled_arithmetic.sh: arithmetic 73.7% on the card's images (paired against
# stage 3 p 0.0005; 69.3% against 63.7% on 900, p 0.00016), worse on no source. Its second seed (long-4) agrees in sign
# (68.3% on 900, p 0.0013); 1,500 steps of the mix gave 66.2% and 68.3% on 900 on two seeds.
THREADS=2 run_stage training/v6/lang3 --init-from training/v6/lang2 --minimal-pairs --freeze-vision --seed 3 \
  --steps 3000 --batch-size 48 --lr 2e-4 --warmup 100 --examples 24000 --mix "$ARITH_MIX" --checkpoint-every 250 \
  --held-out 300
