#!/bin/bash
# DAgger rounds for the mini policy (docs/mini_vla.md, "DAgger"): roll the policy out at init states
# 0-19 with the expert labelling every visited state, aggregate the labels with the demonstrations,
# fine-tune the VLA and refit the state prior on them, then screen the result (ar, 10 tasks x init
# states 30-33: 40 episodes; never the evaluation's 40-49 or the operating point's 20-29).
#   ROUND=1 bash scripts/mini_dagger.sh           round 1 starts from START (models/mini_libero/vla),
#                                                 round N from $A/vla_r<N-1>
#   A=artifacts/dagger  DEMOS=artifacts/demos_db   where rounds write, where the demonstrations are
#   STAGE=screen0|rollout|train|screen ROUND=N    one stage (default: all of round N, in order)
# Every stage is resumable: rerun the same command after an interruption. Needs the demonstrations
# of scripts/mini_pipeline.sh's demos stage ($DEMOS/{a,b}).
set -euo pipefail
H=".venv/bin/python -m heisd_ros.tools.cli"  # heisd: the node's commands
W=".venv/bin/python -m heisd_libero"  # heisd-libero: the LIBERO workbench's
A=${A:-artifacts/dagger}
DEMOS=${DEMOS:-artifacts/demos_db}
R=${ROUND:-1}
export MUJOCO_GL=${MUJOCO_GL:-egl} PYOPENGL_PLATFORM=${PYOPENGL_PLATFORM:-egl} OMP_NUM_THREADS=1
START=${START:-models/mini_libero/vla}
[ "$R" -gt 1 ] && START=$A/vla_r$((R - 1))
stage() { [ "${STAGE:-all}" = all ] || [ "${STAGE}" = "$1" ]; }

screen() { bash scripts/mini_screen.sh "$@"; }  # ar, 10 tasks x init 30-33

mkdir -p $A
if stage screen0 && [ "$R" = 1 ]; then
    screen $START $A/screen_r0
fi

if stage rollout; then
    for part in a:0-4 b:5-9; do  # one output directory a shard: each keeps its own summary
        $W dagger --model $START --tasks "${part#*:}" --init-states 0-19 --out $A/r$R/${part%%:*} --beta "${BETA:-0.5}" \
            --episode-offset $((400 + 100 * R)) --seed "$R" --threads 1 --no-progress \
            > $A/rollout_r${R}_${part%%:*}.out 2>&1 &
    done
    wait
fi

if stage train; then
    D=$A/train_r$R  # the demonstrations and every round's labelled states so far
    mkdir -p $D
    for f in $DEMOS/{a,b}/libero_object/*.hdf5; do ln -sfn "$(realpath "$f")" $D/"$(basename "$f")"; done
    for r in $(seq 1 "$R"); do
        for f in $A/r$r/{a,b}/libero_object/*_dagger.hdf5; do ln -sfn "$(realpath "$f")" $D/"r${r}_$(basename "$f")"; done
    done
    [ -f $A/vla_r${R}_noprior/model.safetensors ] || \
        $W train-vla --init-from $START --demos $D --out $A/vla_r${R}_noprior --cache-dir $A/features \
            --steps "${STEPS:-1500}" --seed "$R" --tasks 0-9 --threads 2 --eval-every 500 --no-progress
    [ -f $A/vla_r$R/state_prior.safetensors ] || \
        $H train-prior --model $A/vla_r${R}_noprior --demos $D --out $A/vla_r$R --tasks 0-9 --steps 10000 \
            --seed "$R" --threads 2 --no-progress
fi

if stage screen; then
    screen $A/vla_r$R $A/screen_r$R
fi
