#!/bin/bash
# Screen a mini policy: ar on 10 tasks x init states 30-33 (40 episodes; never the evaluation's
# 40-49 or the operating point's 20-29), two simulator shards, one report STEM.{json,md,jsonl}.
#   bash scripts/mini_screen.sh MODEL_DIR STEM      e.g. artifacts/mini_vla_prior artifacts/screen
# SUITE=libero_object (default) or libero_spatial. SCENES="--scene-shift-m 0.02 --scene-seed S" screens
# shifted scenes (the evaluation's shift, a seed of the screen's own).
# Resumable: eval-libero continues a shard's log.
set -euo pipefail
[ $# = 2 ] || { echo "usage: $0 MODEL_DIR STEM" >&2; exit 2; }
W=".venv/bin/python -m heisd_libero"  # heisd-libero: the LIBERO workbench's
SUITE=${SUITE:-libero_object}
export MUJOCO_GL=${MUJOCO_GL:-egl} PYOPENGL_PLATFORM=${PYOPENGL_PLATFORM:-egl} OMP_NUM_THREADS=1
for part in a:0-4 b:5-9; do
    $W eval-libero --model "$1" --drafter '' --db '' --calibration '' --purpose calibration \
        --suite "$SUITE" --tasks "${part#*:}" --init-states 30-33 --methods ar --no-shadow-ar --max-steps 280 --seed 0 \
        ${SCENES:-} --threads 1 --no-progress --plots '' --out "$2_${part%%:*}.json" > "$2_${part%%:*}.out" 2>&1 &
done
wait
(head -n 1 "$2_a.jsonl"; tail -q -n +2 "$2_a.jsonl" "$2_b.jsonl") > "$2.jsonl"
$W eval-libero --report-from "$2.jsonl" --purpose calibration --suite "$SUITE" --tasks 0-9 --init-states 30-33 \
    --methods ar --out "$2.json" --plots ''
