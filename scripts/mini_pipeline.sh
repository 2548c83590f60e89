#!/bin/bash
# Rebuild a LIBERO suite's mini policy (docs/mini_vla.md): expert demos -> mini VLA -> state prior
# -> screen, then drafter + database -> calibration. Run from the repository root after `make setup`.
# About 2 h on 2 cores. Every stage is resumable or cached: rerun the same command after an
# interruption. STAGE=demos|vla|prior|screen|drafter|calibrate runs one stage (default: all).
# SUITE=libero_object (default; OUT=artifacts, published to models/mini_libero) or libero_spatial
# (OUT=artifacts/libero_spatial, models/mini_libero_spatial); STEPS overrides the VLA steps (3000
# Object, 6000 Spatial); PUBLISH=1 also replaces the committed copy (STAGE=publish PUBLISH=1: that
# alone); STAGE=published screens it.
set -euo pipefail
H=".venv/bin/python -m heisd_ros.tools.cli"  # heisd: the node's commands
W=".venv/bin/python -m heisd_libero"  # heisd-libero: the LIBERO workbench's
SUITE=${SUITE:-libero_object}
case $SUITE in
    libero_object) O=${OUT:-artifacts}; MODELS=models/mini_libero; SCREEN=benchmarks/mini_vla_screen
        VARIANTS=(); VLA_STEPS=3000 ;;
    # Spatial's demonstrations add one shifted scene per init state (every movable object by
    # U(-2, 2) cm, the evaluation's shift): Object's policy, trained on LIBERO's scenes as shipped,
    # lost a third of its success to that shift (docs/history.md). Twice the demonstrations, twice
    # the VLA steps: the same passes over the data (Object's policy is under-fitted at 3000).
    libero_spatial) O=${OUT:-artifacts/libero_spatial}; MODELS=models/mini_libero_spatial
        SCREEN=benchmarks/mini_vla_screen_spatial; VARIANTS=(--perturbations 1 --perturb-xy-m 0.02)
        VLA_STEPS=6000 ;;
    *) echo "SUITE must be libero_object or libero_spatial, not $SUITE" >&2; exit 2 ;;
esac
export SUITE  # scripts/mini_screen.sh screens the same suite
mkdir -p "$O"
export MUJOCO_GL=${MUJOCO_GL:-egl} PYOPENGL_PLATFORM=${PYOPENGL_PLATFORM:-egl}
stage() { [ "${STAGE:-all}" = all ] || [ "${STAGE}" = "$1" ]; }
D=$O/demos_db/$SUITE
if stage demos; then  # two simulator processes on disjoint tasks, 20 init states per task (0-19)
    pids=()
    for part in a:0-4 b:5-9; do
        OMP_NUM_THREADS=1 nice $W gen-demos --suite $SUITE --tasks "${part#*:}" --init-states 0-19 \
            "${VARIANTS[@]}" --out $O/demos_db/"${part%%:*}" --no-bags > $O/gen_demos_"${part%%:*}".out 2>&1 &
        pids+=($!)
    done
    for pid in "${pids[@]}"; do wait "$pid"; done  # a failed shard fails the stage
    mkdir -p $D
    for f in $O/demos_db/{a,b}/$SUITE/*.hdf5; do
        [ -f "$f" ] || { echo "no demonstrations under $O/demos_db/{a,b}/$SUITE" >&2; exit 2; }
        ln -sfn ../${f#"$O"/demos_db/} $D/"$(basename "$f")"
    done
fi
if stage vla; then  # projector + LLM on cached backbone features (2 torch threads)
    [ -f $O/mini_vla/model.safetensors ] || \
        $W train-vla --demos $D --out $O/mini_vla --image-size 128 --steps "${STEPS:-$VLA_STEPS}" --seed 0 --tasks 0-9 \
            --threads 2 --eval-every 1000 --no-progress
fi
if stage prior; then  # the per-task state prior: a copy of the VLA directory that carries it
    [ -f $O/mini_vla_prior/state_prior.safetensors ] || \
        $H train-prior --model $O/mini_vla --demos $D --out $O/mini_vla_prior --tasks 0-9 --steps 10000 --seed 0 \
            --threads 2 --no-progress
fi
if stage screen; then  # ar, 10 tasks x init 30-33: $O/screen.{json,md}
    bash scripts/mini_screen.sh $O/mini_vla_prior $O/screen
    # Spatial is evaluated on shifted scenes: the same init states in its development scene set too
    if [ "$SUITE" = libero_spatial ]; then
        SCENES="--scene-shift-m 0.02 --scene-seed 86774" bash scripts/mini_screen.sh $O/mini_vla_prior $O/screen_shifted
    fi
fi
if stage drafter; then  # drafter (on the policy's own greedy tokens, prior included) and a one-view database
    $H train-drafter --model $O/mini_vla_prior --demos $D --out $O/mini_drafter --steps 600 --seed 0 --tasks 0-9 \
        --cache-dir $O/mini_vla_features --threads 1 --no-progress &
    $H build-db --model $O/mini_vla --demos $D --out $O/mini_db_1v --tasks 0-9 --fresh --threads 1 --query-views 1
    wait
fi
if stage calibrate; then  # the fitted point; PIN="--pin-tau T ..." writes a chosen one (docs/eval_libero.md)
    # shellcheck disable=SC2086
    $H calibrate --model $O/mini_vla_prior --db $O/mini_db_1v --demos $D --tasks 0-9 --threads 2 \
        --cache-dir $O/mini_vla_features --out $O/mini_calibration.json --plots $O/mini_calibration_plots ${PIN:-}
fi
# The compact copy that `make demo` runs on a fresh clone ($MODELS, committed), only with
# PUBLISH=1: a rebuild is not bit-identical (training is not deterministic across machines), so it
# would silently replace the shipped policy. Each published copy adds about 30 MB to the git history.
if [ "${PUBLISH:-0}" = 1 ]; then
    $W publish-mini --model $O/mini_vla_prior --drafter $O/mini_drafter \
        --calibration $O/mini_calibration.json --out $MODELS
fi
# The published copy's weights are rounded to bfloat16, so it is screened again, only when named
# (STAGE=published) and after $MODELS is committed, so that the screen's log names a
# revision that holds the policy it ran: $SCREEN.{jsonl.gz,json,md}.
if [ "${STAGE:-all}" = published ]; then
    bash scripts/mini_screen.sh $MODELS/vla $O/published_screen
    gzip -9 -n -c $O/published_screen.jsonl > $SCREEN.jsonl.gz
    $W eval-libero --report-from $SCREEN.jsonl.gz --purpose calibration --suite $SUITE --tasks 0-9 \
        --init-states 30-33 --methods ar --out $SCREEN.json --plots ''
fi
