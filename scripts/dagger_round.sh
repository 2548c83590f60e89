#!/bin/bash
# One DAgger round on the mini policy (docs/mini_vla.md, "DAgger round"; benchmarks/NOTES.md 25):
# roll the shipped VLA out on init states it was not trained on, label every visited state with
# the expert, fine-tune on demos + labels, then retrain the drafter, rebuild the database and
# recalibrate for the new VLA. Needs the demos of scripts/mini_pipeline.sh step 1
# (artifacts/demos_db/libero_object). Run from the repository root after `make setup`.
# About 70 min on 2 cores. START (default models/mini_libero/vla) is the VLA rolled out and tuned.
set -euo pipefail
H=.venv/bin/heisd
START=${START:-models/mini_libero/vla}
export MUJOCO_GL=${MUJOCO_GL:-egl} PYOPENGL_PLATFORM=${PYOPENGL_PLATFORM:-egl}
D=artifacts/demos_db/libero_object
[ -d $D ] || { echo "dagger_round: no demos in $D (run step 1 of scripts/mini_pipeline.sh)" >&2; exit 1; }
# 1. rollouts with expert labels: two simulator processes on disjoint tasks (resumable)
OMP_NUM_THREADS=1 nice $H dagger --model "$START" --tasks 0-4 --init-states 20-25 --beta 0.5 --max-steps 250 --out artifacts/dagger/a &
OMP_NUM_THREADS=1 nice $H dagger --model "$START" --tasks 5-9 --init-states 20-25 --beta 0.5 --max-steps 250 --out artifacts/dagger/b &
wait
# 2. one training directory: the demos and the labelled rollouts side by side
M=artifacts/demos_dagger/libero_object
mkdir -p $M
for f in $D/*.hdf5 artifacts/dagger/{a,b}/libero_object/*.hdf5; do ln -sfn "$(realpath "$f")" $M/$(basename "$f"); done
# 3. fine-tune (norm stats kept), 4. drafter and database (demos only) side by side, 5. calibration
$H train-vla --demos $M --init-from "$START" --out artifacts/dagger_vla --steps "${STEPS:-1500}" --lr 3e-4 \
    --seed 0 --tasks 0-9 --threads 2 --eval-every 500
$H train-drafter --model artifacts/dagger_vla --demos $D --out artifacts/dagger_drafter --steps 600 --seed 0 --tasks 0-9 --threads 1 &
$H build-db --model artifacts/dagger_vla --demos $D --out artifacts/dagger_db --tasks 0-9 --fresh --threads 1
wait
$H calibrate --model artifacts/dagger_vla --db artifacts/dagger_db --demos $D --tasks 0-9 --threads 2 \
    --out artifacts/dagger_calibration.json --plots artifacts/dagger_calibration_plots
