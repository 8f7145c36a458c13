#!/usr/bin/env bash
# Train the ten shipped checkpoints with one identical recipe, in priority order.
# Resumable: rerun it after an interruption and each run continues from runs/<name>/state.pt;
# finished checkpoints are skipped.
#   bash scripts/train_checkpoints.sh [DATA_DIR] [EPOCHS] [NAME ...]
# NAMEs (default: all ten) pick encodings; CHECKPOINT_DIR (default checkpoints) is where they go,
# e.g. retrain one shipped checkpoint beside the original and compare:
#   CHECKPOINT_DIR=retrained bash scripts/train_checkpoints.sh data 15 ape
# Recipe: compact preset, CIFAR-10, seed 0, AdamW lr 1e-3 wd 0.05, one-cycle (15 % warm-up),
# label smoothing 0.1, crop+flip, batch 128 (the TrainConfig defaults), EPOCHS epochs.
# PYTHON (default: python on PATH) is the interpreter, e.g. PYTHON=.venv/bin/python without activating it.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
DATA_DIR=${1:-data}
EPOCHS=${2:-15}
OUT_DIR=${CHECKPOINT_DIR:-checkpoints}
# The shipped set and its order: vitpe_core.report.ORDER (the README table reads the same list).
if [ $# -gt 2 ]; then
  ENCODINGS="${*:3}"
else
  ENCODINGS=$("$PY" -c "from vitpe_core.report import ORDER; print(' '.join(ORDER))")
fi
for enc in $ENCODINGS; do
  if [ -f "$OUT_DIR/$enc.safetensors" ]; then echo "== $enc: done"; continue; fi
  echo "== $enc: training ($EPOCHS epochs)"
  "$PY" -m vitpe_core train --encoding "$enc" --dataset cifar10 --preset compact --epochs "$EPOCHS" \
    --seed 0 --data-dir "$DATA_DIR" --out "runs/$enc" --resume --checkpoint "$OUT_DIR/$enc.safetensors"
done
