#!/bin/bash
# The LIBERO-Spatial evaluation of benchmarks/libero_spatial.{json,md,jsonl.xz} (the LIBERO path's
# candidates in benchmarks/libero_spatial_point.{json,md}, the node in libero_spatial_node.json; docs/eval_libero.md,
# "LIBERO-Spatial"): the suite's mini policy (SUITE=libero_spatial bash scripts/mini_pipeline.sh, published
# to models/mini_libero_spatial), a database of its demonstrations at init states 0-19, the kinematic
# boundary normalised on the policy's own closed loop, the operating point chosen two ways by rules fixed
# before any run, then every method at the shipped point on 10 tasks x init states 40-49 in the sealed
# scene set, with the boundary ablations and the other path's point on init states 40-42.
#   STAGE=db|loop|fit|shadow|choose|point|choose_libero|publish|eval|node|report bash scripts/libero_spatial_eval.sh
#   (default: all, in order; publish writes the point into models/mini_libero_spatial: commit it, then
#   run STAGE=eval from a worktree at that commit whose artifacts/ links to this checkout's). Every stage
#   is resumable: rerun after an interruption. Episodes end at 280 steps, as on LIBERO-Object (LIBERO's
#   usual Spatial limit is 220).
#   STAGE=checkpoint writes the eval's shard logs so far under $CKPT (commit them) where a machine keeps
#   nothing but commits; STAGE=restore puts them back on a fresh one (after STAGE=db) for STAGE=eval to
#   resume; STAGE=report deletes them.
#
# The rule, fixed before any Spatial run:
# - The user's path ships: the node runs ar on the simulated arm with the shadow (lockstep), 10 tasks x
#   init states 20-29 in their own scene set, and `heisd choose-point --shadow` picks, from the fitted
#   point file (stage fit), the fastest candidate whose skip steps keep within their bounds.
# - The LIBERO path, for comparison: the Object run's candidates (tau 0 and at the closed loop's F
#   quartiles, min_S 0.98 / 0.99 / 0.995, N_max 6 / 3) on 10 tasks x init states 20-24 with greedy ar's
#   shadow, `heisd choose-point --run` (success within 5 points of ar, skip bounds, lowest mean step).
#   Where it picks another point, that point runs on the subset beside the shipped one.
# - The shipped point keeps the fitted file's tau (the closed loop's balanced fit: choose-point --shadow
#   varies verify-skip only), so heisd is the boundary at its fit; the subset (init states 40-42) runs
#   the boundary ablations beside it: tau 0 (the boundary off) and the boundary alone (strict
#   acceptance, no skip). Where the fit leaves verify-skip off (calibrate: not qualified), every shadow
#   candidate skips nothing, and the choice is the fit itself.
set -euo pipefail
H=".venv/bin/python -m heisd_ros.tools.cli"  # `python -m` from the checkout: the checkout's code runs
W=".venv/bin/python -m heisd_libero"
SUITE=libero_spatial
MODELS=models/mini_libero_spatial
E=artifacts/eval_spatial
DEMOS=${DEMOS:-artifacts/libero_spatial/demos_db/libero_spatial}  # mini_pipeline.sh's, stage demos
export MUJOCO_GL=${MUJOCO_GL:-egl} PYOPENGL_PLATFORM=${PYOPENGL_PLATFORM:-egl} OMP_NUM_THREADS=1
# Scene sets (docs/eval_libero.md, "Sealed scenes"), written down before any Spatial run.
DEV=(--scene-shift-m 0.02 --scene-seed 86774)     # closed loop, LIBERO-path candidates
SHADOW=(--scene-shift-m 0.02 --scene-seed 11454)  # the user's path: shadow episodes
SEALED=(--scene-shift-m 0.02 --scene-seed 31049)  # the evaluation
COMMON=(--model $E/vla --drafter $MODELS/drafter --suite $SUITE --max-steps 280 --seed 0 --threads 1
        --no-progress --plots '')
METHODS=ar,drafter,specvla,retrieval,heisd
# shellcheck source=scripts/libero_eval_lib.sh
. scripts/libero_eval_lib.sh  # shards, point, tau_fit, f_quantiles, checkpoint_shards, restore_shards
CKPT=benchmarks/libero_spatial_partial  # the eval's shard logs while it runs, xz-compressed
stage() { [ "${STAGE:-all}" = all ] || [ "${STAGE}" = "$1" ]; }
only() { [ "${STAGE:-all}" = "$1" ]; }  # stages that never run as part of "all"
mkdir -p $E

if only checkpoint; then checkpoint_shards $E/eval $CKPT; fi
if only restore; then restore_shards $E/eval $CKPT; fi

if stage db; then
    # A copy of the published policy, so feature caches land under artifacts/ (not models/).
    [ -d $E/vla ] || { cp -r $MODELS/vla $E/vla.part && mv $E/vla.part $E/vla; }
    # build-db resumes an interrupted database by itself
    $H build-db --model $E/vla --demos "$DEMOS" --out $E/db --tasks 0-9 --threads 2 --query-views 1 \
        --no-progress
fi

if stage loop; then  # the policy's own motion: ar at init states 25-29
    shards $E/loop 25-29 "" ar "" --purpose calibration --no-shadow-ar "${DEV[@]}"
fi

if stage fit; then  # F normalised on that closed loop; tau candidates at quantiles of its F
    $H calibrate --model $E/vla --db $E/db --demos "$DEMOS" --tasks 0-9 --threads 2 --no-progress \
        --base-point $MODELS/calibration.json --closed-loop $E/loop.jsonl --out $E/calibration_fitted.json \
        --plots $E/calibration_plots
fi

if stage shadow; then  # ar through the node with the shadow, resumable by halves
    for part in a:20-24 b:25-29; do
        IFS=: read -r name inits <<< "$part"
        [ -f $E/shadow_$name.json ] && continue
        rm -rf $E/shadow_$name
        $W sim-episodes --suite $SUITE --policy $MODELS --point $E/calibration_fitted.json --methods ar \
            --tasks 0-9 --init-states "$inits" "${SHADOW[@]}" --time-mode lockstep --max-steps 280 --db-path $E/db \
            --shadow-bags $E/shadow_$name --log-dir $E/shadow_logs_$name --out $E/shadow_$name.json
    done
fi

if stage choose; then  # the user's path: the point that ships
    $H choose-point --shadow $E/shadow_a/ar $E/shadow_b/ar --calibration $E/calibration_fitted.json \
        --out $E/point_shadow.json
fi

candidates() {
    read -r q25 q50 q75 <<< "$(f_quantiles)"
    point g 0 0.98 6; point g25 "$q25" 0.98 6; point g50 "$q50" 0.98 6; point g75 "$q75" 0.98 6
    point gs99 0 0.99 6; point gs995 0 0.995 6; point gn3 0 0.98 3; point gs99n3 0 0.99 3
}
POINT_METHODS=ar,g,g25,g50,g75,gs99,gs995,gn3,gs99n3

if stage point; then  # the LIBERO path's candidates
    shards $E/point 20-24 $E/calibration_fitted.json $POINT_METHODS "$(candidates)" --purpose calibration "${DEV[@]}"
    $W eval-libero --report-from $E/point.jsonl --suite $SUITE --tasks 0-9 --init-states 20-24 \
        --purpose calibration --methods $POINT_METHODS --out $E/point.json --plots ''
fi

if stage choose_libero; then
    $H choose-point --run $E/point.json --calibration $E/calibration_fitted.json --out $E/point_libero.json
fi

if stage publish; then
    $W publish-mini --calibration-only --calibration $E/point_shadow.json --out $MODELS
    echo "commit $MODELS, then run STAGE=eval from a worktree at that commit"
fi

if stage eval; then
    # The committed point is what runs; where STAGE=choose ran here, it must be what choose wrote.
    if { [ -f $E/point_shadow.json ] && ! cmp -s $E/point_shadow.json $MODELS/calibration.json; } \
        || [ -n "$(git status --porcelain -uno)" ]; then
        echo "the evaluation runs the committed point: $MODELS/calibration.json must equal $E/point_shadow.json" \
             "and the checkout be clean (commit after STAGE=publish)" >&2
        exit 2
    fi
    ablations='heisd_tau0=heisd:fused_metric.tau=0;heisd_boundary=heisd:acceptance.retrieval_rule="strict",'
    ablations+='verify_skip.enabled=false'
    subset=heisd_tau0,heisd_boundary
    # the LIBERO path's point beside it where it differs (POINT_LIBERO: its file on a fresh machine)
    libero_point=${POINT_LIBERO:-$E/point_libero.json}
    [ -f "$libero_point" ] || { echo "no $libero_point: run STAGE=point and STAGE=choose_libero" >&2; exit 2; }
    read -r _ other < <(.venv/bin/python -m heisd_libero.shadow_point_report --variants $MODELS/calibration.json \
        heisd_libero_point="$libero_point")
    if [ -n "$other" ]; then ablations+=";$other"; subset+=,heisd_libero_point; fi
    echo "$subset" > $E/eval_subset.txt
    shards $E/eval 40-49 $MODELS/calibration.json $METHODS "$ablations" --subset-methods "$subset" \
        --subset-init-states 40-42 "${SEALED[@]}"
fi

if stage node; then  # where the arm feels it: ar and heisd through the node, arm time at 20 Hz, 20 sealed scenes
    $W sim-episodes --suite $SUITE --policy $MODELS --methods ar,heisd --tasks 0-9 --init-states 40-41 "${SEALED[@]}" \
        --time-mode arm_time --latency-scale 1 --max-steps 280 --db-path $E/db --log-dir $E/node_logs \
        --out benchmarks/libero_spatial_node.json
fi

if stage report; then
    xz -9 -T1 -c $E/eval.jsonl > benchmarks/libero_spatial.jsonl.xz
    rm -rf $CKPT  # the run is whole: its partial logs are superseded
    # the LIBERO path's candidates, where STAGE=point has run here (it may run after the evaluation)
    if [ -f $E/point.json ]; then
        cp $E/point.json benchmarks/libero_spatial_point.json && cp $E/point.md benchmarks/libero_spatial_point.md
    fi
    $W eval-libero --report-from benchmarks/libero_spatial.jsonl.xz --suite $SUITE --tasks 0-9 --init-states 40-49 \
        --methods $METHODS --subset-methods "$(cat $E/eval_subset.txt)" --subset-init-states 40-42 \
        --out benchmarks/libero_spatial.json --plots benchmarks/libero_spatial_plots
fi
