# Shell functions of the LIBERO evaluation scripts (scripts/libero_object_eval.sh,
# scripts/libero_spatial_eval.sh); sourced, never run. The sourcing script sets
#   W       the workbench's command (`.venv/bin/python -m heisd_libero`),
#   E       the run's artifact directory (its database in $E/db),
#   COMMON  the eval-libero flags of every run (model, drafter, suite, max steps, seed, threads).

# Per-task processes appending to a shard's log (MuJoCo keeps 0.5-1 GB of every closed env), two
# shards on two cores with their own copy of the database (an embedded database is open in one
# process only), then one log; a task that fails ends its shard and fails the stage. $1 stem, $2 init states, $3 calibration, $4 methods, $5 variants,
# then extra eval-libero flags.
shards() {
    local stem=$1 inits=$2 calib=$3 methods=$4 variants=$5
    shift 5
    [ -d $E/db_b ] || cp -r $E/db $E/db_b
    local pids=()
    for part in a:0-4:db b:5-9:db_b; do
        IFS=: read -r name tasks db <<< "$part"
        for task in $(seq "${tasks%-*}" "${tasks#*-}"); do
            $W eval-libero "${COMMON[@]}" --db $E/$db --calibration "$calib" --tasks "$task" --init-states "$inits" \
                --methods "$methods" --variants "$variants" "$@" --out ${stem}_$name.json >> ${stem}_$name.out 2>&1
        done &
        pids+=($!)
    done
    for pid in "${pids[@]}"; do wait "$pid"; done  # a failed task (or a strict step unlike ar's: exit 3) fails the stage
    (head -n 1 ${stem}_a.jsonl; tail -q -n +2 ${stem}_a.jsonl ${stem}_b.jsonl) > $stem.jsonl
}

# A candidate point as an eval-libero variant of heisd: $1 name, $2 tau, $3 min_S, $4 N_max (no skip
# where the demonstration switches the gripper within 3 actions).
point() { printf %s "$1=heisd:fused_metric.tau=$2,verify_skip.enabled=true,verify_skip.min_similarity=$3,\
verify_skip.max_consecutive_skips=$4,verify_skip.gripper_lookahead_steps=3;"; }

# The balanced-fit tau of the closed loop (stage fit's $E/calibration_fitted.json), or $TAU_FIT where
# a fresh machine evaluates a committed point without rerunning the loop and the fit.
tau_fit() {
    if [ -n "${TAU_FIT:-}" ]; then echo "$TAU_FIT"; return; fi
    [ -f $E/calibration_fitted.json ] || { echo "no $E/calibration_fitted.json: run STAGE=fit or set TAU_FIT" >&2; exit 2; }
    .venv/bin/python -c "import json; print(json.load(open('$E/calibration_fitted.json'))['fused_metric']['tau'])"
}

# tau at the 25th, 50th and 75th percentiles of the closed loop's positive F (stage fit).
f_quantiles() {
    .venv/bin/python -c "import json; f = json.load(open('$E/calibration_fitted.json'))['meta']['f_closed_loop']
print(' '.join(str(f['positive_quantiles'][k]) for k in ('0.25', '0.5', '0.75')))"
}

# A run longer than a working session, on a machine that keeps nothing but commits: the shard logs
# so far ($1 the shards' stem) xz-compressed into $2 (commit it); `restore_shards` puts them back on a
# fresh machine (after the database stage: its digest is in the run key) for the stage to resume.
checkpoint_shards() {
    local stem=$1 dir=$2 name
    name=$(basename "$stem")
    mkdir -p "$dir"
    for s in a b; do xz -9 -T1 -c "${stem}_$s.jsonl" > "$dir/${name}_$s.jsonl.xz"; done
    echo "$(grep -c '"kind":"episode"' "${stem}_a.jsonl" "${stem}_b.jsonl" | tr '\n' ' ')-> $dir (commit it)"
}

restore_shards() {
    local stem=$1 dir=$2 name
    name=$(basename "$stem")
    for s in a b; do
        if [ -f "${stem}_$s.jsonl" ]; then echo "${stem}_$s.jsonl exists: not overwritten" >&2; exit 2; fi
    done
    mkdir -p "$(dirname "$stem")"
    for s in a b; do xz -dc "$dir/${name}_$s.jsonl.xz" > "${stem}_$s.jsonl"; done
}
