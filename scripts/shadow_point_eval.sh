#!/bin/bash
# The operating point chosen the way a user would, from shadow runs, validated where a closed loop
# exists (benchmarks/shadow_point.{md,json}; docs/your_data.md §6):
#   shadow: the node runs ar on the simulated arm (lockstep) with shadow.method heisd, 10 tasks x
#           calibration init states 20-29 in their own scene set (shift 0.02 m, seed 73560, written
#           into docs/eval_libero.md before the run), recording shadow_steps;
#   choose: heisd choose-point --shadow over those recordings, from the shipped point's file (and over
#           the first half alone: how the choice depends on the recording's length);
#   eval:   ar, heisd at the shipped (LIBERO-chosen) point and heisd at each shadow-chosen point that
#           differs from it, in one
#           eval-libero run on the sealed scenes of the check run (init 40-41, shift 0.02 m, seed 4912),
#           every lossy step shadowed by greedy ar: the skip steps' deviation under heisd's own execution;
#   expert: the scripted expert's episodes at init states 30-31 as bags, replayed through the node with
#           ar and the shadow, a point chosen from them, then heisd at both points on the same bags;
#   report: benchmarks/shadow_point.{md,json}.
#   STAGE=shadow|choose|eval|expert|report bash scripts/shadow_point_eval.sh   (default: all, in order)
set -euo pipefail
H=".venv/bin/python -m heisd_ros.tools.cli"  # `python -m` from the checkout: the checkout's code runs
W=".venv/bin/python -m heisd_libero"
E=artifacts/eval_object
S=artifacts/shadow_point
SHIPPED=models/mini_libero/calibration.json
export MUJOCO_GL=${MUJOCO_GL:-egl} PYOPENGL_PLATFORM=${PYOPENGL_PLATFORM:-egl} OMP_NUM_THREADS=1
mkdir -p $S
stage() { [ -z "${STAGE:-}" ] || [ "$STAGE" = "$1" ]; }

if stage shadow; then
    for part in a:20-24 b:25-29; do
        IFS=: read -r name inits <<< "$part"
        [ -f $S/shadow_$name.json ] && continue  # resumable by halves
        rm -rf $S/shadow_$name
        $W sim-episodes --methods ar --tasks 0-9 --init-states "$inits" --scene-shift-m 0.02 --scene-seed 73560 \
            --time-mode lockstep --db-path $E/db --shadow-bags $S/shadow_$name --log-dir $S/logs_$name \
            --out $S/shadow_$name.json
    done
fi

if stage choose; then
    $H choose-point --shadow $S/shadow_a/ar $S/shadow_b/ar --calibration $SHIPPED --out $S/point_shadow.json
    # how the choice depends on the recording's length: the first half alone (50 episodes)
    $H choose-point --shadow $S/shadow_a/ar --calibration $SHIPPED --out $S/point_shadow_a.json
fi

if stage eval; then
    [ -d $E/db_b ] || cp -r $E/db $E/db_b
    # the shadow-chosen points as variants of heisd, each left out where it is the shipped point
    read -r methods variants < <(.venv/bin/python -m heisd_libero.shadow_point_report --variants $SHIPPED \
        heisd_shadow=$S/point_shadow.json heisd_shadow_a=$S/point_shadow_a.json)
    echo "eval: methods $methods"
    pids=()
    for part in a:0-4:db b:5-9:db_b; do
        IFS=: read -r name tasks db <<< "$part"
        for task in $(seq "${tasks%-*}" "${tasks#*-}"); do
            $W eval-libero --model $E/vla --drafter models/mini_libero/drafter --suite libero_object --max-steps 280 \
                --seed 0 --threads 1 --no-progress --plots '' --db $E/$db --calibration $SHIPPED --tasks "$task" \
                --init-states 40-41 --scene-shift-m 0.02 --scene-seed 4912 --shadow-strict-every 1 \
                --methods "$methods" --variants "$variants" --out $S/eval_$name.json >> $S/eval_$name.out 2>&1
        done &
        pids+=($!)
    done
    for pid in "${pids[@]}"; do wait "$pid"; done  # a failed shard fails the stage
    (head -n 1 $S/eval_a.jsonl; tail -q -n +2 $S/eval_a.jsonl $S/eval_b.jsonl) > $S/eval.jsonl
    $W eval-libero --report-from $S/eval.jsonl --tasks 0-9 --init-states 40-41 --methods "$methods" \
        --variants "$variants" --out $S/eval.json --plots ''
fi

if stage expert; then
    # 20 expert episodes the database never saw (init states 30-31), as rosbag2 MCAP
    [ -d $S/expert/libero_object/bags ] || $W gen-demos --tasks 0-9 --init-states 30-31 --perturbations 0 \
        --out $S/expert
    node=(--start-node --fast --params-file config/policy.yaml -p model_dir:=models/mini_libero/vla
          -p drafter_dir:=models/mini_libero/drafter -p db_path:=$E/db -p image_staleness_s:=5.0 -p pose_staleness_s:=5.0)
    # $1 bag, $2 output name, then replay flags; kept when it finished (a rerun continues)
    replay() {
        local bag=$1 out=$S/expert_runs/$(basename "$(dirname "$1")")_$(basename "$1")/$2
        shift 2
        [ -f $out/metadata.yaml ] || { rm -rf $out; $H replay "$bag" "${node[@]}" --quiet --out $out "$@"; }
    }
    # ar executing with the shadow: the recording the point is chosen from, and ar's commands and step
    # times on each bag (the shadow runs after a step and changes no command: test/ros/test_node_shadow.py)
    for bag in $S/expert/libero_object/bags/*/*; do
        replay "$bag" ar --method ar -p calibration_path:=$SHIPPED -p shadow.method:=heisd -p shadow.when:=always
    done
    $H choose-point --shadow $S/expert_runs/*/ar --calibration $SHIPPED --out $S/point_expert.json
    expert_differs=$(.venv/bin/python -m heisd_libero.shadow_point_report --variants $SHIPPED x=$S/point_expert.json)
    for bag in $S/expert/libero_object/bags/*/*; do
        replay "$bag" heisd_shipped --method heisd -p calibration_path:=$SHIPPED
        case $expert_differs in *x=heisd*) replay "$bag" heisd_expert --method heisd -p calibration_path:=$S/point_expert.json ;; esac
    done
fi

if stage report; then
    .venv/bin/python -m heisd_libero.shadow_point_report --dir $S --out benchmarks/shadow_point
fi
