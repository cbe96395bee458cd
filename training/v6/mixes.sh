# Sourced by training/v6/*.sh: the language mix every v6 stage starts from (v5 stage 5's, training/v5/run.sh):
# the balanced mix plus counting beside a larger group.
BALANCED_MIX=counting/syndot=0.05,counting/synpoly=0.18,counting/synreal=0.03,colour=0.08,shape=0.16,spatial=0.18,arithmetic=0.14,existence=0.18
GROUPS_MIX=$BALANCED_MIX,counting/groups=0.15
# v6 stage 4's (training/v6/controlled_arithmetic.sh, run.sh stage 4): arithmetic 0.35 of the whole, the other sources
# keeping their GROUPS_MIX ratios to each other (each x 0.65 / 1.01, the sum of the other shares).
ARITH_MIX=counting/syndot=0.032,counting/synpoly=0.116,counting/synreal=0.019,colour=0.051,shape=0.103,spatial=0.116,arithmetic=0.35,existence=0.116,counting/groups=0.097
