# Sourced by training/v6/*.sh: the language mix every v6 stage starts from (v5 stage 5's, training/v5/run.sh):
# the balanced mix plus counting beside a larger group.
BALANCED_MIX=counting/syndot=0.05,counting/synpoly=0.18,counting/synreal=0.03,colour=0.08,shape=0.16,spatial=0.18,arithmetic=0.14,existence=0.18
GROUPS_MIX=$BALANCED_MIX,counting/groups=0.15
