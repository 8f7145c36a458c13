#!/usr/bin/env bash
# The longer-budget study (issue: does SaPE²'s gap over no encoding open with training?).
# Same recipe as the shipped checkpoints (scripts/train_checkpoints.sh); only --epochs or --seed change.
#   bash scripts/train_study.sh [DATA_DIR] [JOB ...]
# JOB is KIND:ENCODING with KIND `long` (50 epochs -> checkpoints/long/ENC) or `seed1`
# (15 epochs, seed 1 -> checkpoints/seeds/ENC-seed1). Default: every job below, in this order.
# Resumable: rerun after an interruption; each run continues from its runs/ folder's state.pt,
# finished checkpoints are skipped.
# TRAIN_ARGS adds options that change how a run executes, not what it learns (e.g. --compile,
# --threads 1); the recipe itself is fixed here.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
DATA_DIR=${1:-data}
if [ $# -gt 1 ]; then JOBS="${*:2}"; else
  JOBS="seed1:none seed1:sape2 long:sape2 long:none long:sape2+ape long:ape"
fi
for job in $JOBS; do
  kind=${job%%:*}; enc=${job#*:}
  case $kind in
    long)  epochs=50; seed=0; out=runs/long/$enc;        ckpt=checkpoints/long/$enc.safetensors ;;
    seed1) epochs=15; seed=1; out=runs/seeds/$enc-seed1; ckpt=checkpoints/seeds/$enc-seed1.safetensors ;;
    *) echo "unknown job kind in $job (expected long:ENC or seed1:ENC)" >&2; exit 2 ;;
  esac
  if [ -f "$ckpt" ]; then echo "== $job: done ($ckpt)"; continue; fi
  echo "== $job: training ($epochs epochs, seed $seed)"
  mkdir -p "$(dirname "$ckpt")"
  "$PY" -m vitpe_core train --encoding "$enc" --dataset cifar10 --preset compact --epochs "$epochs" \
    --seed "$seed" --data-dir "$DATA_DIR" --out "$out" --resume --checkpoint "$ckpt" ${TRAIN_ARGS:-}
  # the app lists checkpoints/long/: its compare page reads this position analysis beside each one
  if [ "$kind" = long ]; then "$PY" -m vitpe_core analyze "$ckpt"; fi
done
