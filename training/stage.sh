# Sourced by training/vN/*.sh: one training stage that a rerun of the same script continues.
#
#   run_stage OUT FLAGS...   # vlens zoo train --out OUT FLAGS ($THREADS torch threads, default 1, on $DEVICE, quiet)
#
# A stage whose folder OUT holds model.safetensors is done and skipped; one with a saved state in
# OUT.checkpoint resumes from it (vlens zoo train --resume); else it starts.
PYTHON=${PYTHON:-python}
DEVICE=${DEVICE:-cpu}
THREADS=${THREADS:-1}  # 2 on an otherwise idle 2-core machine

run_stage() {
  local out=$1
  shift
  if [ -f "$out/model.safetensors" ]; then
    echo "$out: done"
    return
  fi
  local resume=()
  if ls "$out.checkpoint"/state* >/dev/null 2>&1; then
    resume=(--resume)
  fi
  "$PYTHON" -m vlens zoo train --out "$out" "${resume[@]}" --threads "$THREADS" --device "$DEVICE" --quiet "$@"
}
