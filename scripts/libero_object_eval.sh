#!/bin/bash
# The LIBERO-Object evaluation of benchmarks/libero_object.{json,md} (docs/eval_libero.md, "The
# current results"): the shipped mini policy, a database of the demonstrations at init states 0-19,
# an operating point chosen on closed-loop runs at init states 20-21, then every method on all 10
# tasks x init states 40-49 (retrieval and the ablations on 40-42), as two shards on two cores.
# Every stage is resumable: rerun the script after an interruption and it continues where it stopped.
#   STAGE=db|point|eval|report bash scripts/libero_object_eval.sh   (default: all, in order)
set -euo pipefail
# `python -m` from the checkout, not the .venv/bin/heisd entry point: the code that runs is the code
# of the checkout the script runs in (a git worktree pinned at one revision runs that revision).
H=".venv/bin/python -m heisd_ros.tools.cli"
E=artifacts/eval_object
export MUJOCO_GL=${MUJOCO_GL:-egl} PYOPENGL_PLATFORM=${PYOPENGL_PLATFORM:-egl} OMP_NUM_THREADS=1
# Candidates of the calibration run (heisd itself is the offline-fitted point) and the ablations.
CANDIDATES="skip98n6=heisd:verify_skip.min_similarity=0.98,verify_skip.max_consecutive_skips=6;\
skip99n6=heisd:verify_skip.min_similarity=0.99,verify_skip.max_consecutive_skips=6"
ABLATIONS="heisd_tau0=heisd:fused_metric.tau=0;heisd_noskip=heisd:verify_skip.enabled=false"
COMMON=(--model $E/vla --drafter models/mini_libero/drafter --position-pool 20 --suite libero_object
        --max-steps 280 --seed 0 --threads 1 --no-progress --plots '')

stage() { [ "${STAGE:-all}" = all ] || [ "${STAGE}" = "$1" ]; }

if stage db; then
    # Demonstrations at init states 0-19 (docs/libero.md, "The mini policy's demonstrations").
    for part in a:0-4 b:5-9; do
        nice $H gen-demos --suite libero_object --tasks "${part#*:}" --init-states 0-19 \
            --out artifacts/demos_db/"${part%%:*}" --no-bags &
    done
    wait
    mkdir -p $E/demos && for f in artifacts/demos_db/{a,b}/libero_object/*.hdf5; do
        ln -sfn "$(realpath "$f")" $E/demos/"$(basename "$f")"; done
    # A copy of the shipped policy, so feature caches land under artifacts/ (not models/).
    [ -d $E/vla ] || cp -r models/mini_libero/vla $E/vla
    $H build-db --model $E/vla --demos $E/demos --out $E/db --tasks 0-9 --threads 2 --query-views 1 --no-progress
    $H calibrate --model $E/vla --db $E/db --demos $E/demos --tasks 0-9 --threads 2 --no-progress \
        --out $E/calibration_fitted.json --plots $E/calibration_plots
fi

if stage point; then
    # Closed-loop candidates on init states 20-21 (neither demonstrations nor evaluation), two shards.
    [ -d $E/db_b ] || cp -r $E/db $E/db_b  # an embedded database is open in one process only
    for part in a:0-4:db b:5-9:db_b; do
        IFS=: read -r name tasks db <<< "$part"
        $H eval-libero "${COMMON[@]}" --db $E/$db --calibration $E/calibration_fitted.json --purpose calibration \
            --tasks "$tasks" --init-states 20-21 --methods ar,heisd,skip98n6,skip99n6 --variants "$CANDIDATES" \
            --out $E/point_$name.json > $E/point_$name.out 2>&1 &
    done
    wait
    (head -n 1 $E/point_a.jsonl; tail -q -n +2 $E/point_a.jsonl $E/point_b.jsonl) > $E/point.jsonl
    $H eval-libero --report-from $E/point.jsonl --tasks 0-9 --init-states 20-21 --purpose calibration \
        --methods ar,heisd,skip98n6,skip99n6 --out $E/point.json --plots ''
    $H choose-point --run $E/point.json --calibration $E/calibration_fitted.json --out $E/calibration.json
fi

if stage eval; then
    # One process per task, appending to its shard's log: MuJoCo does not give back all the memory
    # of a task's closed envs (about 0.5-1 GB per task), which grew each process to 10 GB.
    for part in a:0-4:db b:5-9:db_b; do
        IFS=: read -r name tasks db <<< "$part"
        for task in $(seq "${tasks%-*}" "${tasks#*-}"); do
            $H eval-libero "${COMMON[@]}" --db $E/$db --calibration $E/calibration.json --tasks "$task" \
                --init-states 40-49 --methods ar,drafter,specvla,heisd --variants "$ABLATIONS" \
                --subset-methods retrieval,heisd_tau0,heisd_noskip --subset-init-states 40-42 \
                --out $E/eval_$name.json >> $E/eval_$name.out 2>&1
        done &
    done
    wait
fi

if stage report; then
    (head -n 1 $E/eval_a.jsonl; tail -q -n +2 $E/eval_a.jsonl $E/eval_b.jsonl) > $E/eval.jsonl
    gzip -9 -n -c $E/eval.jsonl > benchmarks/libero_object.jsonl.gz
    $H eval-libero --report-from benchmarks/libero_object.jsonl.gz --tasks 0-9 --init-states 40-49 \
        --methods ar,drafter,specvla,heisd --subset-methods retrieval,heisd_tau0,heisd_noskip \
        --subset-init-states 40-42 --out benchmarks/libero_object.json --plots benchmarks/libero_object_plots
fi
