"""The Markdown form of a `heisd-libero eval-libero` report (`eval_report.build_report`): what ran, the
per-method, per-task and per-mode tables, retrieval latency and the targets. Means come first,
medians and tails after them under their own names (the figures: `heisd_ros.pipeline.figures`)."""

from __future__ import annotations

import math
from typing import Any

from heisd_ros.pipeline.figures import interval_text
from heisd_libero.eval_anchors import md_anchors


def _f(x: Any, fmt: str = ".2f") -> str:
    return "n/a" if x is None or (isinstance(x, float) and not math.isfinite(x)) else format(x, fmt)


FOOTNOTE = [
    "", "Definitions:", "",
    "- Step latency: the wall time of `HybridDecoder.step` (vision, retrieval, drafting, verification,",
    "  detokenisation); the simulator is not included. pN: numpy's linear-interpolation percentile over all steps.",
    "- Speedup vs ar = mean ar step / mean step (a ratio of means); its 95 % interval is a percentile bootstrap",
    "  over episodes (the (task, init state) pairs drawn with replacement, one draw for ar and the method).",
    "  Median speedup = median ar step / median step. CPU speedup: the same ratio of means on the thread CPU",
    "  time of the call (immune to preemption by other processes).",
    "- Time per task vs ar = the sum of ar's episode decode times / the sum of the method's, over the (task, init",
    "  state) pairs both ran (it counts the steps each needed); 95 % interval: percentile bootstrap over the pairs.",
    "- Accept length (the paper's): tokens per decoding cycle, a cycle being one verification forward or one",
    "  skipped step (a skip fixes all 7 tokens in one cycle) = 7 x steps / (LLM forwards + skipped steps).",
    "- Tokens/forward (verified) = 7 x verified (not skipped) steps / LLM forwards on those steps.",
    "- Success interval: 95 % Wilson score interval.", ""]


def markdown(report: dict[str, Any]) -> str:
    """The report as Markdown: what ran, the per-method and per-task tables, latency and targets."""
    meta = report["_meta"]
    methods = [m for m in report if not m.startswith("_")]
    out = _md_header(meta) + md_anchors(report) + _md_evidence(report, methods, meta.get("evidence"))
    out += _md_methods(report, methods, meta.get("bootstrap", {})) + _md_paired(report, methods)
    out += _md_shadow(report, methods) + _md_tasks(report, methods) + _md_modes(report, methods)
    out += _md_stages(report, methods) + _md_boundary(report, methods)
    out += _md_latency(meta["retrieval_latency_ms"])
    out += _md_targets(meta["acceptance"]) + FOOTNOTE
    return "\n".join(out)


def _md_header(meta: dict[str, Any]) -> list[str]:
    out = [f"# LIBERO closed-loop evaluation: {meta.get('suite', '')}", ""]
    out += [f"Command: `{meta.get('command', '')}`", ""]
    runs = [x for x in meta.get("invocations", []) if x.get("episodes_run")]
    if runs:  # the invocations that ran the episodes (one per shard), in log order
        out += ["Episodes run by:", ""] + [f"- `{x['command']}` ({x['episodes_run']} episodes, git "
                                          f"`{str(x.get('git_rev', ''))[:10]}`{_kernels(x)})" for x in runs] + [""]
    stopped = meta.get("stopped_invocations", [])
    if stopped:  # processes stopped before their end line; their finished episodes are in the log
        out += ["Stopped before their end (their finished episodes are in the log):", ""] + [
            f"- `{x.get('command', '')}` ({x.get('episodes_logged', 0)} episodes, git `{str(x.get('git_rev', ''))[:10]}`, "
            f"started {x.get('time_utc', '?')})" for x in stopped] + [""]
    machines = meta.get("machines", [])
    if len(machines) == 1:
        out += [f"Machine: {machines[0]}.", ""]
    elif machines:  # a run resumed elsewhere: each pair's methods still ran side by side on one machine
        out += [(f"**Machines: {len(machines)}** ({'; '.join(machines)}): step times of different machines are "
                 "mixed in the means; each (task, init state) pair's methods ran side by side on one of them."), ""]
    out += [(f"Subset: tasks {meta.get('tasks')}, init states {meta.get('init_states')} "
             f"({meta.get('pairs', '?')} (task, init state) pairs per method), max {meta.get('max_steps')} steps, "
             f"seed {meta.get('seed')}, {meta.get('threads')} torch thread(s), "
             f"git `{str(meta.get('git_rev', ''))[:10]}`."), ""]
    out += [(f"Scenes: shift D = {meta.get('scene_shift_m') or 0.0:g} m (every movable object moved by U(-D, D) in x "
             f"and y; 0 = LIBERO's init states as shipped), scene seed S = {meta.get('scene_seed') or 0}."), ""]
    return out


def _kernels(invocation: dict[str, Any]) -> str:
    """What `llm_linear` 'auto' chose in a process: per weight set (LLM layer, drafter), the row
    count from which it ran packed on oneDNN, or torch's kernel."""
    made = invocation.get("linear_kernels")
    if not made:
        return ""
    return "; linear kernels: " + ", ".join(f"oneDNN from {d['min_rows']} rows" if d.get("min_rows") else "torch's"
                                            for d in made)


def _md_evidence(report: dict[str, Any], methods: list[str], ev: dict[str, Any] | None) -> list[str]:
    """Whether the run holds as evidence: strict steps agree with ar, same first inputs, quiet time."""
    if not ev:
        return []
    out = ["## Evidence", ""]
    for m in methods:
        a = report[m].get("strict_agreement")
        if not a:
            continue
        if not a["logged"]:
            out.append(f"- {m}: strict-step agreement with ar: not logged (no input digests)")
            continue
        how = (f" ({a['checked_by_digest']} by input digest, {a['checked_by_shadow']} by shadow)"
               if "checked_by_shadow" in a else "")
        out.append(f"- {m}: strict-step agreement with ar: {a['agree']} / {a['checked']}{how}; first observation "
                   f"equal to ar's in {a['same_start']} / {a['pairs']} pairs; contended steps "
                   f"{_f(report[m]['contended_share'], '.1%')}")
    share = ev["contended_share"]
    out += [f"- ar: contended steps {_f(report['ar']['contended_share'], '.1%')}" if "ar" in report else None,
            (f"- the run: {ev['contended_steps']} contended steps ({_f(share, '.2%')}; limit "
             f"{ev['contended_share_limit']:.0%}): " + ("quiet" if ev["quiet"] else "**NOT QUIET: wall-time figures "
                                                       "are contended; read the CPU-time speedups**")),
            f"- {ev['definition']}"]
    out += [f"- **broken: {b}**" for b in ev["broken"]] + [""]
    return [line for line in out if line is not None]


def _md_paired(report: dict[str, Any], methods: list[str]) -> list[str]:
    rows = [(m, report[m]["paired_vs_ar"]) for m in methods if report[m].get("paired_vs_ar")]
    if not rows:
        return []
    out = ["", ("Success paired against ar (the same (task, init state) pairs): discordant pairs, the difference "
                "method - ar with its 95 % interval (Newcombe's hybrid score), exact McNemar p; speed on the pairs "
                "both solved:"), "",
           "| method | pairs | both / method only / ar only / neither | difference (95 % CI) | McNemar p "
           "| both solved | speedup on both solved (95 % CI) |", "|---|---|---|---|---|---|---|"]
    for m, p in rows:
        t = p["table"]
        lo, hi = p["difference_ci95"]
        out.append(f"| {m} | {p['pairs']} | {t['both']} / {t['method_only']} / {t['ar_only']} / {t['neither']} | "
                   f"{p['difference'] * 100:+.0f} points ({_f(lo * 100, '+.0f')} to {_f(hi * 100, '+.0f')}) | "
                   f"{_f(p['mcnemar_p'], '.3f')} | {p['both_solved_pairs']} | {_f(p['speedup_vs_ar_both_solved'])}x "
                   f"({interval_text(p.get('speedup_vs_ar_both_solved_ci95'))}) |")
    return out


SHADOW_ROWS = (("skip", "skip"), ("relaxed", "relaxed"), ("token_relaxed", "token-relaxed"))


def _md_shadow(report: dict[str, Any], methods: list[str]) -> list[str]:
    """Deviation from greedy ar per lossy class over its shadowed steps, all lossy steps, and all steps
    with strict ones as 0 (the figure a strict share dilutes)."""
    rows = [(m, report[m]["shadow"]) for m in methods if report[m].get("shadow")]
    if not rows:
        return []
    out = ["", ("Shadow of ar: each lossy step's tokens against greedy ar's on the same observation, per kind of "
                "lossy step over its shadowed steps (skip: a demonstration's action unverified; relaxed: a retrieved "
                "draft accepted by a relaxed rule; token-relaxed: a drafted step accepted token by token); the last "
                "row counts strict steps as equal. |delta bin| of a group = the sum over its tokens; the sequence-wise "
                "bound is 30, and skip steps are held to p95 <= 30 and gripper disagreement <= 0.5 %:"), "",
           "| method | which steps | steps | equal to ar | position mean / p95 bins | rotation mean / p95 bins "
           "| gripper disagreement |", "|---|---|---|---|---|---|---|"]
    for m, sh in rows:
        if "by_class" not in sh:  # a report written before the per-class figures
            continue
        named = [(label, sh["by_class"].get(c)) for c, label in SHADOW_ROWS]
        if len(sh["by_class"]) > 1:  # with one class the row would repeat it
            named.append(("all lossy", sh["lossy"]))
        if sh.get("strict_steps"):
            named.append(("all steps (strict as 0)", sh["all_steps_strict_as_zero"]))
        for label, d in named:
            if not d or not d.get("steps"):
                continue
            out.append(f"| {m} | {label} | {d['steps']} | {_f(d['share_equal_to_ar'], '.1%')} | "
                       f"{_f(d['position_mean_bins'], '.1f')} / {_f(d['position_p95_bins'], '.0f')} | "
                       f"{_f(d['rotation_mean_bins'], '.1f')} / {_f(d['rotation_p95_bins'], '.0f')} | "
                       f"{_f(d['gripper_disagreement'], '.2%')} |")
    missing = [f"{m} {sh['unshadowed_lossy_steps']}" for m, sh in rows if sh.get("unshadowed_lossy_steps")]
    return out + ([f"Lossy steps without a shadow (not counted above): {', '.join(missing)}."] if missing else [])


def _md_stages(report: dict[str, Any], methods: list[str]) -> list[str]:
    """Mean ms per stage and mode: where a step's time goes."""
    from heisd_libero.eval_report import MODE_STAGES

    shown = [k for k in MODE_STAGES if any(p.get("stage_mean_ms", {}).get(k, 0.0) > 0
                                          for m in methods for p in report[m].get("modes", {}).values())]
    out = ["", "Where the time goes (mean ms per step of each mode; first forward = the prefill, fused with the "
           "retrieval tree's verification in retrieval mode):", "",
           "| method | mode | steps | mean step | CPU | " + " | ".join(shown) + " |", "|---" * (5 + len(shown)) + "|"]
    for m in methods:
        for mode, p in report[m].get("modes", {}).items():
            stages = p.get("stage_mean_ms", {})
            out.append(f"| {m} | {mode} | {p['steps']} | {_f(p['mean_step_ms'], '.1f')} | "
                       f"{_f(p.get('mean_step_cpu_ms'), '.1f')} | " + " | ".join(_f(stages.get(k), '.2f') for k in shown) + " |")
    return out


def _success(r: dict[str, Any]) -> str:
    lo, hi = r["success_rate_ci95"]
    return f"{_f(r['success_rate'], '.0%')} ({r['successes']}/{r['episodes']}; {_f(lo, '.0%')}-{_f(hi, '.0%')})"


def _md_methods(report: dict[str, Any], methods: list[str], boot: dict[str, Any]) -> list[str]:
    n = boot.get("episodes")
    out = [f"Speedup interval: 95 % bootstrap over {n} episodes, {boot.get('resamples')} resamples, seed "
           f"{boot.get('seed')}" + ("" if boot.get("paired", True) else " (unpaired)") + ".", ""] if n else []
    out += [("| method | success (95 % CI) | mean step ms | speedup vs ar (mean) | speedup 95 % CI | median ms "
             "| median speedup | p95 ms | p99 ms | CPU speedup | time per task vs ar (95 % CI) | LLM fwd/step "
             "| accept length | tokens/forward (verified) | modes |"), "|---" * 15 + "|"]
    for m in methods:
        r = report[m]
        modes = ", ".join(f"{k} {v:.0%}" for k, v in r["mode_mix"].items())
        label = f"{m} (subset, {r['episodes']} ep.)" if "ar_on_same_episodes" in r else m
        out.append(f"| {label} | {_success(r)} | {_f(r['mean_step_ms'], '.1f')} | {_f(r['speedup_vs_ar'])}x | "
                   f"{interval_text(r.get('speedup_vs_ar_ci95'), n_episodes=n)} | {_f(r['median_step_ms'], '.1f')} | "
                   f"{_f(r['median_speedup_vs_ar'])}x | {_f(r['p95_step_ms'], '.1f')} | {_f(r['p99_step_ms'], '.1f')} | "
                   f"{_f(r['speedup_vs_ar_cpu'])}x | {_time_per_task(r)} | {_f(r['forwards_per_step'])} | {_f(r['accept_length'])} | "
                   f"{_f(r['tokens_per_forward_verified'])} | {modes} |")
    subset = [m for m in methods if "ar_on_same_episodes" in report[m]]
    if subset:
        out += ["", "Subset rows are compared with `ar` on the same episodes:", ""]
        for m in subset:
            a = report[m]["ar_on_same_episodes"]
            out.append(f"- {m}: ar on its {a['episodes']} episodes: success {_success(a)}, mean step "
                       f"{_f(a['mean_step_ms'], '.1f')} ms, p95 {_f(a['p95_step_ms'], '.1f')} ms")
    return out


def _time_per_task(r: dict[str, Any]) -> str:
    """The episode time ratio against ar with its interval ('n/a' in a report without it)."""
    if r.get("episode_time_ratio") is None:
        return "n/a"
    return f"{_f(r['episode_time_ratio'])}x ({interval_text(r.get('episode_time_ratio_ci95'))})"


def _md_tasks(report: dict[str, Any], methods: list[str]) -> list[str]:
    tasks = sorted({t for m in methods for t in report[m]["per_task_success"]}, key=int)
    out = ["", "Success per task:", "", "| task | instruction | " + " | ".join(methods) + " |",
           "|---|---|" + "---|" * len(methods)]
    for t in tasks:
        instr = next(report[m]["per_task_success"][t]["instruction"] for m in methods
                     if t in report[m]["per_task_success"])
        cells = []
        for m in methods:
            c = report[m]["per_task_success"].get(t)
            cells.append(f"{c['successes']}/{c['episodes']}" if c else "-")
        out.append(f"| {t} | {instr} | " + " | ".join(cells) + " |")
    return out


def _md_modes(report: dict[str, Any], methods: list[str]) -> list[str]:
    """Step time per mode against its floor, and the verify-skip verdicts."""
    out = ["", ("Step time per mode against its floor (vision + projector + retrieval + first LLM forward); "
                "mean ratio = mean step / mean floor:"), "",
           ("| method | mode | steps | mean ms | mean floor ms | mean ratio to floor | median ms | median floor ms "
            "| median ratio to floor |"), "|---|---|---|---|---|---|---|---|---|"]
    for m in methods:
        for mode, p in report[m].get("modes", {}).items():
            out.append(f"| {m} | {mode} | {p['steps']} | {_f(p.get('mean_step_ms'), '.1f')} | "
                       f"{_f(p.get('mean_floor_ms'), '.1f')} | {_f(p.get('mean_ratio_to_floor'))} | "
                       f"{_f(p['median_step_ms'], '.1f')} | {_f(p['median_floor_ms'], '.1f')} | "
                       f"{_f(p['median_ratio_to_floor'])} |")
    checks = {m: report[m].get("skip_checks") for m in methods if report[m].get("skip_checks")}
    if checks:
        out += ["", "Verify-skip verdicts of the best hit on retrieval steps (why a step was, or was not, skipped):", ""]
        for m, c in checks.items():
            total = sum(c.values())
            out.append(f"- `{m}`: " + ", ".join(f"{k} {v / total:.0%}" for k, v in c.items()) + f" ({total} steps)")
    return out


def _md_boundary(report: dict[str, Any], methods: list[str]) -> list[str]:
    """Where the steps of the methods that compute the fused metric F went, by side of the run's boundary."""
    rows = {m: report[m]["boundary"] for m in methods if report[m].get("boundary")}
    if not rows:
        return []
    tau = next(iter(rows.values()))["tau"]
    out = ["", (f"Steps by side of the run's kinematic boundary tau = {tau:.4g} (F below it drafts; at or above it "
                "retrieves unless the source choice routes the step away; a variant that sets its own tau is "
                "still split at this one):"), "",
           "| method | steps | no window | F < tau: drafter / retrieval / skip | F >= tau: drafter / retrieval / skip |",
           "|---|---|---|---|---|"]

    def cell(counts: dict[str, int], n: int) -> str:
        return " / ".join(f"{counts.get(m, 0) / n:.0%}" for m in ("drafter", "retrieval", "skip"))

    for m, b in rows.items():
        n = b["steps"] or 1
        out.append(f"| {m} | {b['steps']} | {sum(b['no_window'].values()) / n:.0%} | {cell(b['below_tau'], n)} | "
                   f"{cell(b['at_or_above_tau'], n)} |")
    return out


def _dist(v: dict[str, Any]) -> str:
    return (f"mean {_f(v.get('mean'), '.2f')} ms, median {_f(v.get('median'), '.2f')} ms, "
            f"p95 {_f(v.get('p95'), '.2f')} ms, p99 {_f(v.get('p99'), '.2f')} ms")


def _md_latency(lat: dict[str, Any]) -> list[str]:
    out = ["", f"Retrieval latency (Top-5, task-filtered, {lat['n']} queries): {_dist(lat)} ({lat['what']})."]
    inrun = lat.get("in_run_top5", {})
    if lat.get("probe_top5", {}).get("n") and inrun.get("n"):
        out.append(f"heisd's own Top-5 queries during the episodes: {inrun['n']}, {_dist(inrun)}.")
    for m, v in lat.get("by_method", {}).items():
        out.append(f"- `{m}` store.search (Top-{v['top_k']}) inside its steps: {v['n']} queries, {_dist(v)}")
    return out


def _md_targets(acc: dict[str, Any]) -> list[str]:
    if not acc.get("evaluated"):
        return []
    yes = {True: "met", False: "missed"}
    ci = acc.get("heisd_speedup_vs_ar_ci95")

    def rate(name: str) -> str:
        lo, hi = acc.get(f"{name}_success_rate_ci95") or (None, None)
        return f"{name} {_f(acc[f'{name}_success_rate'], '.0%')} ({_f(lo, '.0%')}-{_f(hi, '.0%')})"

    out = ["", "Targets (heisd vs ar, same run):", "",
            (f"- success within 5 points of ar: {yes[acc['success_within_5_points']]} ({rate('ar')}, {rate('heisd')})"
             + ("" if acc.get("success_comparison_meaningful", True) else
                " -- vacuous: neither method solved an episode")),
            (f"- mean step >= 2.5x faster than ar: {yes[acc['speedup_at_least_2.5x']]} "
             f"({_f(acc['heisd_speedup_vs_ar'])}x, 95 % CI {interval_text(ci)}); time per task (ar's episode decode "
             f"time / heisd's, same pairs; reported, not a target): {_f(acc.get('heisd_episode_time_ratio'))}x, "
             f"95 % CI {interval_text(acc.get('heisd_episode_time_ratio_ci95'))}"),
            *([] if acc.get("paper_heisd_speedup") is None else [
                f"- mean step and time per task >= the HeiSD paper's speedup on this suite "
                f"({_f(acc['paper_heisd_speedup'])}x, OpenVLA-7B on an A100): {yes[acc['speedup_at_least_paper']]} "
                f"({_f(acc['heisd_speedup_vs_ar'])}x by mean step, {_f(acc.get('heisd_episode_time_ratio'))}x per task)"]),
            (f"- mean thread CPU time >= 2.5x less than ar's: {yes[acc.get('cpu_speedup_at_least_2.5x', False)]} "
             f"({_f(acc.get('heisd_cpu_speedup_vs_ar'))}x)"),
            (f"- p95 step >= 1.5x faster than ar: {yes[acc['p95_speedup_at_least_1.5x']]} "
             f"({_f(acc['heisd_p95_speedup_vs_ar'])}x)"),
            (f"- accept length (the paper's) >= 4.5 tokens per cycle: {yes[acc['accept_length_at_least_4.5']]} "
             f"({_f(acc['heisd_accept_length'])})")] + _md_skip_bound(acc)
    if acc.get("drafter_speedup_vs_ar") is not None:
        out.append(f"- drafter mean step >= 1.15x faster than ar: {yes[acc['drafter_at_least_1.15x']]} "
                   f"({_f(acc['drafter_speedup_vs_ar'])}x)")
    if acc.get("paired_difference_ci95"):
        lo, hi = acc["paired_difference_ci95"]
        out.append(f"- success paired against ar (heisd - ar): 95 % CI {100 * lo:+.0f} to {100 * hi:+.0f} points, "
                   f"McNemar exact p {_f(acc['mcnemar_p'], '.3f')}")
    if (d := acc.get("discordant_pairs")) and d["only_ar_solved"] + d["only_heisd_solved"]:
        out.append(_md_discordant(d))
    w = acc.get("heisd_steps_by_source")
    if w and not (acc["speedup_at_least_2.5x"] and acc["p95_speedup_at_least_1.5x"]):
        out.append(f"- where heisd's steps went (the speed follows the mode mix and the per-mode costs above): drafter "
                   f"{w['drafter_below_tau']:.0%} below tau, {w['drafter_at_or_above_tau']:.0%} at or above it "
                   f"(routed away by the source choice), {w['drafter_no_window']:.0%} before a full window; "
                   f"retrieval {w['retrieval']:.0%}, skip {w['skip']:.0%}")
    return out + _md_shortfall(acc.get("shortfall") or {})


def _md_skip_bound(acc: dict[str, Any]) -> list[str]:
    """heisd's skip steps against greedy ar (the shadow), with the relaxed steps' figures beside them."""
    if "skip_position_p95_within_30_bins" not in acc:
        return []
    verdict = {True: "met", False: "missed", None: "not measured"}
    n, within = acc["heisd_skip_steps_shadowed"], acc["skip_position_p95_within_30_bins"]
    text = (f"- skip steps against greedy ar: position p95 |delta bin| <= 30: {verdict[within]}; gripper "
            f"disagreement <= 0.5 %: {verdict[acc['skip_gripper_disagreement_within_0.5%']]} (")
    text += (f"p95 {_f(acc['heisd_skip_position_p95_bins'], '.0f')} bins, gripper "
             f"{_f(acc['heisd_skip_gripper_disagreement'], '.2%')} of {n} shadowed skip steps" if n else
             "no skip step" if within else "no skip step shadowed: run with --shadow-ar")
    if acc.get("heisd_relaxed_steps_shadowed"):
        text += (f"; relaxed steps, reported: p95 {_f(acc['heisd_relaxed_position_p95_bins'], '.0f')} bins, gripper "
                 f"{_f(acc['heisd_relaxed_gripper_disagreement'], '.2%')} of {acc['heisd_relaxed_steps_shadowed']}")
    return [text + ")"]


def _md_discordant(d: dict[str, Any]) -> str:
    """How the pairs only one of heisd and ar solved ended (`discordant_pairs`)."""
    def endings(counts: dict[str, int]) -> str:
        names = {"still": "stood still", "in_place": "moved in place", "moving": "kept moving",
                 "unknown": "no pose logged", "ended_early": "ended early"}
        return ", ".join(f"{names.get(k, k)} {v}" for k, v in sorted(counts.items(), key=lambda kv: -kv[1])) or "none"
    text = (f"- pairs only one solved: heisd's {d['only_ar_solved']} losses over their last {d['window_steps']} steps "
            f"({endings(d['heisd_endings'])}; still: a path under {100 * d['still_path_m']:.0f} cm, in place: under "
            f"{100 * d['in_place_net_m']:.0f} cm from where the window began)")
    if (share := d["policy_token_share"]) is not None:
        text += (f" output the policy's own tokens (strict, or greedy ar's on the same observation) in {share:.1%} "
                 f"of their {d['steps_known']} shadowed steps, {d['policy_endings']} of them in at least 95 %")
    return text + f"; ar's {d['only_heisd_solved']} losses: {endings(d['ar_endings'])}"


def _md_shortfall(short: dict[str, Any]) -> list[str]:
    """By how much each missed target is missed, and what this run's log says about why or would close it."""
    out = []
    if f := short.get("success"):
        out.append(f"- success {f['gap_points']:.0f} points below ar's (at most 5 may be); how the pairs only one "
                   "solved ended is above")
    if m := short.get("mean"):
        need = m["skip_share_needed"]
        out.append(f"- mean step short by {m['short_ms']:.1f} ms ({m['mean_ms']:.1f} ms against the "
                   f"{m['goal_ms']:.1f} ms of 2.5x). At this run's costs (skip {m['skip_mean_ms']:.1f} ms, verified "
                   f"{m['verified_mean_ms']:.1f} ms mean) it takes a skip share of "
                   + (f"{need:.0%}" if need is not None else "more than 100 %") + f" (now {m['skip_share']:.0%}), "
                   f"or verified steps {m['verified_cost_cut_needed']:.0%} cheaper at this skip share")
    if p := short.get("p95"):
        modes = ", ".join(f"{k} {v:.1%}" for k, v in p["share_slower_by_mode"].items())
        out.append(f"- p95 step {p['p95_ms']:.1f} ms against the {p['goal_ms']:.1f} ms of 1.5x: "
                   f"{p['share_slower']:.1%} of steps are slower than that (at most 5 % may be): {modes}")
    if a := short.get("accept_length"):
        need = a["skip_share_needed"]
        out.append(f"- accept length {a['accept_length']:.2f}: at {a['forwards_per_verified_step']:.2f} forwards per "
                   f"verified step 4.5 takes a skip share of " + (f"{need:.0%}" if need is not None else "n/a")
                   + f" (now {a['skip_share']:.0%}), or {a['forwards_per_verified_step_needed']:.2f} forwards per "
                   "verified step at this skip share")
    return out
