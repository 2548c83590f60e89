#!/bin/bash
# Rebuild the LIBERO-Object mini policy (docs/mini_vla.md) from the deadbanded-expert demos
# (docs/libero.md, "Second data set"): demos -> mini VLA -> drafter + database -> calibration.
# Run from the repository root after `make setup`. About 45 min on 2 cores. STEPS=3000 by default;
# PUBLISH=1 also replaces the committed models/mini_libero.
set -euo pipefail
H=.venv/bin/heisd
export MUJOCO_GL=${MUJOCO_GL:-egl} PYOPENGL_PLATFORM=${PYOPENGL_PLATFORM:-egl}
# 1. demos: two simulator processes on disjoint tasks (resumable; a finished run is skipped)
OMP_NUM_THREADS=1 nice $H gen-demos --suite libero_object --tasks 0-4 --init-states 0-19 --out artifacts/demos_db/a --no-bags &
OMP_NUM_THREADS=1 nice $H gen-demos --suite libero_object --tasks 5-9 --init-states 0-19 --out artifacts/demos_db/b --no-bags &
wait
D=artifacts/demos_db/libero_object
mkdir -p $D
for f in artifacts/demos_db/{a,b}/libero_object/*.hdf5; do ln -sfn ../${f#artifacts/demos_db/} $D/$(basename "$f"); done
# 2. mini VLA (2 torch threads), 3. drafter and database side by side, 4. calibration
$H train-vla --demos $D --out artifacts/mini_vla --image-size 128 --steps "${STEPS:-3000}" --seed 0 --tasks 0-9 --threads 2 --eval-every 1000
$H train-drafter --model artifacts/mini_vla --demos $D --out artifacts/mini_drafter --steps 600 --seed 0 --tasks 0-9 --threads 1 &
$H build-db --model artifacts/mini_vla --demos $D --out artifacts/mini_db --tasks 0-9 --fresh --threads 1
wait
$H calibrate --model artifacts/mini_vla --db artifacts/mini_db --demos $D --tasks 0-9 --threads 2 \
    --out artifacts/mini_calibration.json --plots artifacts/mini_calibration_plots
# 5. the compact copy that `make demo` runs on a fresh clone (models/mini_libero, committed;
#    docs/mini_vla.md, "The demo on a fresh clone"), only with PUBLISH=1: a rebuild is not bit-identical
#    (training is not deterministic across machines), so it would silently replace the shipped policy. Commit a new copy
#    only for a policy worth shipping: each adds about 35 MB to the git history.
if [ "${PUBLISH:-0}" = 1 ]; then
    $H publish-mini --model artifacts/mini_vla --drafter artifacts/mini_drafter \
        --calibration artifacts/mini_calibration.json --out models/mini_libero
fi
