"""eval-libero's report, log and plots on made-up episodes (no simulator, no model)."""

from __future__ import annotations

import gzip
import json
import lzma
import math
from pathlib import Path

import pytest

from heisd_ros.core.errors import ConfigError
from heisd_ros.pipeline.figures import wilson_interval
from heisd_libero.eval_libero import EvalLiberoConfig, main
from heisd_libero.eval_markdown import markdown
from heisd_libero.eval_plots import write_plots
from heisd_libero.eval_policies import TimedStore
from heisd_libero.eval_report import ResultLog, build_report, summarise_method


def _step(t: int, mode: str, ms: float, tpf: list[int], skipped: bool = False, tokens=(1,) * 7) -> dict:
    return {"t": t, "mode": mode, "skipped": skipped, "forwards": len(tpf), "tpf": tpf,
            "ms": {"total": ms, "verify": ms * 0.8}, "cpu_ms": ms * 0.9, "sim_ms": 150.0, "F": 0.6,
            "score": 0.9, "ee": [0.01 * t, 0.0, 0.2], "tokens": list(tokens)}


def _episode(method: str, task: int, init: int, success: bool, steps: list[dict], search=()) -> dict:
    rec = {"kind": "episode", "task": task, "init_state": init, "method": method, "instruction": f"task {task}",
           "success": success, "length": len(steps), "wall_s": 10.0, "steps": steps}
    if search:
        rec.update(search_ms=list(search), search_k=5)
    return rec


def _run() -> list[dict]:
    ar = [_step(t, "ar", 40.0, [1] * 7) for t in range(4)]
    heisd = [_step(0, "drafter", 20.0, [4, 3]), _step(1, "retrieval", 10.0, [7]),
             _step(2, "skip", 4.0, [], skipped=True), _step(3, "retrieval", 12.0, [3, 4], tokens=(2,) * 7)]
    heisd[1]["skip_check"], heisd[2]["skip_check"], heisd[3]["skip_check"] = "no_live_feature", "skip", "too_far"
    return [_episode("ar", 0, 40, True, ar), _episode("heisd", 0, 40, True, heisd, search=[1.0, 2.0, 3.0]),
            _episode("ar", 1, 40, False, ar), _episode("heisd", 1, 40, False, ar[:2] + heisd[2:], search=[4.0])]


def test_summary_figures() -> None:
    report = build_report(_run(), ["ar", "heisd"], {"suite": "libero_object"})
    ar, h = report["ar"], report["heisd"]
    assert ar["success_rate"] == 0.5 and ar["forwards_per_step"] == 7 and ar["accept_length"] == 1
    assert ar["mean_step_ms"] == ar["median_step_ms"] == ar["p99_step_ms"] == 40.0 and ar["speedup_vs_ar"] == 1.0
    assert ar["speedup_vs_ar_ci95"] == [1.0, 1.0] and ar["tokens_per_forward_verified"] == 1.0
    # heisd cycles: 4,3 | 7 | skip=7 | 3,4 | (1 x 7) x 2 | skip=7 | 3,4: 23 cycles fixing 56 tokens,
    # i.e. 7 x 8 steps / (21 forwards + 2 skips); on the 6 verified steps 7 x 6 / 21 forwards
    cycles = [4, 3, 7, 7, 3, 4] + [1] * 14 + [7, 3, 4]
    assert h["accept_length"] == pytest.approx(sum(cycles) / len(cycles)) == pytest.approx(56 / 23)
    assert h["tokens_per_forward_verified"] == pytest.approx(2.0)
    assert h["accept_length_hist"]["7"] == 3 and h["skip_rate"] == pytest.approx(2 / 8)
    assert h["forwards_per_step"] == pytest.approx((2 + 1 + 0 + 2 + 7 + 7 + 0 + 2) / 8)
    # heisd steps 20, 10, 4, 12 | 40, 40, 4, 12: mean 17.75, median 12; ar 40 throughout
    assert h["mean_step_ms"] == 17.75 and h["speedup_vs_ar"] == pytest.approx(40.0 / 17.75)
    assert h["median_speedup_vs_ar"] == pytest.approx(40.0 / 12.0)
    lo, hi = h["speedup_vs_ar_ci95"]  # two paired episodes: 40/24 (episode 1 twice) .. 40/11.5 (episode 0 twice)
    assert lo == pytest.approx(40 / 24) and hi == pytest.approx(40 / 11.5)
    assert report["_meta"]["bootstrap"]["paired"] and report["_meta"]["bootstrap"]["episodes"] == 2
    assert h["per_task_success"]["0"]["success_rate"] == 1.0 and h["per_task_success"]["1"]["success_rate"] == 0.0
    assert h["episodes_identical_to_ar"] == 0.0 and not h["lossless"] and ar["lossless"]
    lat = report["_meta"]["retrieval_latency_ms"]
    assert lat["n"] == 4 and lat["median"] == 2.5 and lat["by_method"]["heisd"]["top_k"] == 5
    probed = build_report(_run(), ["ar", "heisd"], {}, probe_ms=[1.0] * 9 + [11.0])["_meta"]["retrieval_latency_ms"]
    assert probed["n"] == 10 and probed["median"] == 1.0 and probed["in_run_top5"]["n"] == 4
    assert "probe" in probed["what"]
    acc = report["_meta"]["acceptance"]
    assert acc["evaluated"] and acc["success_within_5_points"] and acc["success_gap_points"] == 0.0
    assert h["skip_checks"] == {"skip": 2, "no_live_feature": 1, "too_far": 2} and not ar["skip_checks"]
    text = markdown(report)
    assert "- `heisd`: skip 40%, too_far 40%, no_live_feature 20% (5 steps)" in text
    assert "| heisd | 50% (1/2; 9%-91%) | 17.8 | 2.25x | [1.67, 3.48] | 12.0 | 3.33x |" in text
    assert "Retrieval latency" in text and "mean step >= 2.5x faster than ar: missed (2.25x" in text
    assert "p95 step >= 1.5x faster than ar" in text and "Accept length (the paper's)" in text
    # the published LIBERO-Object rows beside this run's, with the hardware difference said
    assert "| HeiSD paper (OpenVLA-7B, A100) | heisd | 71.0% | 2.45x | 4.94 |" in text
    assert "- mean thread CPU time >= 2.5x less than ar's: " in text and "McNemar exact p" in text
    assert "| this run | heisd | 50.0% (2 ep.) | 2.25x | 2.43 |" in text and "not step times" in text
    # the paper's own speedup on the suite, by mean step and per task (2.25x against Object's 2.45x)
    assert acc["paper_heisd_speedup"] == 2.45 and acc["speedup_at_least_paper"] is False
    assert "the HeiSD paper's speedup on this suite (2.45x, OpenVLA-7B on an A100): missed (2.25x by mean" in text
    other = build_report(_run(), ["ar", "heisd"], {"suite": "libero_90"})
    assert "published" not in markdown(other) and "the HeiSD paper's speedup" not in markdown(other)
    assert other["_meta"]["acceptance"]["speedup_at_least_paper"] is None
    slow = build_report(_run(), ["ar", "heisd"], {"suite": "libero_10"})  # the paper's Long suite: 1.79x
    assert slow["_meta"]["acceptance"]["speedup_at_least_paper"] is True  # 2.25x by mean step and per task
    json.dumps(report, allow_nan=False)  # strict JSON (NaN written as null)


def test_empty_method_and_wilson() -> None:
    r = summarise_method("drafter", [])
    assert r["episodes"] == 0 and math.isnan(r["success_rate"])
    lo, hi = wilson_interval(0, 10)
    assert lo == 0.0 and 0.2 < hi < 0.35
    report = build_report(_run(), ["heisd"], {})
    assert report["_meta"]["acceptance"]["evaluated"] is False and report["heisd"]["speedup_vs_ar"] is None
    assert report["heisd"]["speedup_vs_ar_ci95"] is None and "note" in report["_meta"]["bootstrap"]
    one = build_report(_run()[:2], ["ar", "heisd"], {})  # one (task, init state) episode: no interval
    assert one["heisd"]["speedup_vs_ar_ci95"] is None and "no interval (1 episode)" in markdown(one)


def test_plots(tmp_path: Path) -> None:
    episodes = _run()
    report = build_report(episodes, ["ar", "heisd"], {"model": {"decoder_config": {"fused_metric": {"tau": 0.5}}}})
    files = write_plots(report, episodes, tmp_path)
    assert {Path(f).name for f in files} == {"step_latency.png", "accept_length.png", "mode_timeline.png"}
    assert all(Path(f).stat().st_size > 1000 for f in files)


def test_log_resume_cut_line_and_key(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    log = ResultLog(path, {"max_steps": 5})
    for e in _run()[:2]:
        log.append(e)
    path.write_text(path.read_text() + '{"kind":"episode","ta')  # killed mid-write
    again = ResultLog(path, {"max_steps": 5})
    assert again.done() == {(0, 40, "ar"), (0, 40, "heisd")}
    again.append(_run()[2])
    assert len(ResultLog(path, {"max_steps": 5}).episodes) == 3
    with pytest.raises(ConfigError, match="max_steps"):
        ResultLog(path, {"max_steps": 6})
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"kind":"run","key":{}}\n{oops\n{"kind":"session"}\n')
    with pytest.raises(ConfigError, match="corrupt line 2"):
        ResultLog(bad, {})


@pytest.mark.parametrize("states", [(39,), (40, 50), (0,)])
def test_demo_init_states_are_refused(states) -> None:
    with pytest.raises(ConfigError, match="refused"):
        EvalLiberoConfig(init_states=states)


def test_cli_refuses_demo_init_states(capsys) -> None:
    assert main(["--init-states", "38-41", "--out", "/nonexistent/x.json"]) == 2
    assert "refused" in capsys.readouterr().err


def test_report_from_log_rebuilds_a_subset_without_running(tmp_path: Path, capsys) -> None:
    log_path = tmp_path / "run.jsonl"
    key = {"suite": "libero_object", "max_steps": 7, "camera_size_px": 64, "dtype": "float32", "seed": 3}
    log = ResultLog(log_path, key)
    for e in _run():
        log.append(e)
    log.append({"kind": "session", "command": "heisd-libero eval-libero --methods ar,heisd", "episodes_run": 4,
                "git_rev": "abc"})
    log.append({"kind": "session", "command": "heisd-libero eval-libero (resumed, nothing left)", "episodes_run": 0})
    out = tmp_path / "sub.json"
    # task 1 only, ar and heisd: the report holds exactly those episodes and takes the settings from the key
    assert main(["--report-from", str(log_path), "--tasks", "1", "--init-states", "40", "--methods", "ar,heisd",
                 "--out", str(out)]) == 0
    rep = json.loads(out.read_text())
    assert rep["ar"]["episodes"] == 1 and rep["ar"]["successes"] == 0
    assert rep["heisd"]["steps"] == 4 and rep["_meta"]["max_steps"] == 7 and rep["_meta"]["seed"] == 3
    assert rep["_meta"]["log"] == str(log_path) and rep["_meta"]["model"] == key
    md = out.with_suffix(".md").read_text()
    assert "`heisd-libero eval-libero --methods ar,heisd` (4 episodes" in md and "resumed" not in md  # who ran them
    assert not out.with_suffix(".jsonl").exists()
    assert len(ResultLog(log_path, key).episodes) == 4  # the log is read, never written
    gz = tmp_path / "run.jsonl.gz"  # the older committed form of a log
    gz.write_bytes(gzip.compress(log_path.read_bytes()))
    xz = tmp_path / "run.jsonl.xz"  # the current one
    xz.write_bytes(lzma.compress(log_path.read_bytes()))
    for committed in (gz, xz):
        assert main(["--report-from", str(committed), "--tasks", "0-1", "--init-states", "40", "--methods", "heisd",
                     "--out", str(out)]) == 0
        assert json.loads(out.read_text())["heisd"]["episodes"] == 2
    with pytest.raises(ConfigError, match="read only"):  # a committed log is never appended to
        ResultLog.read(gz).append({"kind": "session"})
    # an episode the log does not hold is an error, not a silently smaller report
    assert main(["--report-from", str(log_path), "--tasks", "0-2", "--init-states", "40", "--methods", "ar",
                 "--out", str(out)]) == 2
    assert "not in the log" in capsys.readouterr().err
    assert main(["--report-from", str(tmp_path / "none.jsonl"), "--out", str(out)]) == 2


def test_config_validation() -> None:
    with pytest.raises(ConfigError):
        EvalLiberoConfig(methods=("ar", "ar"))
    with pytest.raises(ConfigError):
        EvalLiberoConfig(methods=("fast",))
    with pytest.raises(ConfigError):
        EvalLiberoConfig(out="x.yaml")
    assert EvalLiberoConfig(out="b/x.json").log_path == Path("b/x.jsonl")


def test_timed_store_records_searches() -> None:
    class Store:
        def search(self, q, task, k):
            return [k]

        def has_task(self, task):
            return True

        def close(self):
            raise AssertionError("the shared store is closed by the evaluator, not by a decoder")

    ts = TimedStore(Store())
    assert ts.search(None, "t", 5) == [5] and ts.has_task("t")
    ts.close()
    assert len(ts.search_ms) == 1 and ts.last_k == 5


def test_heisd_steps_split_by_the_runs_boundary() -> None:
    """The report says where heisd's (and its variants') steps went against the run's tau, and the
    targets section points there when a speed target is missed; baselines get no such row."""
    eps = _run()
    h0 = eps[1]["steps"]
    h0[0]["F"] = 0.1  # drafter below tau
    eps[3]["steps"][0]["F"] = None  # an ar-like step copied into heisd: no window yet
    variant = [dict(s, F=0.7) for s in h0]
    eps.append(_episode("heisd_tau0", 0, 40, True, variant))
    meta = {"model": {"decoder_config": {"fused_metric": {"tau": 0.5}},
                      "variants": ["heisd_tau0=heisd:fused_metric.tau=0"]}}
    report = build_report(eps, ["ar", "heisd", "heisd_tau0"], meta)
    b = report["heisd"]["boundary"]
    # heisd: drafter(0.1) retrieval skip retrieval | ar(None) ar(0.6) skip retrieval
    assert b["steps"] == 8 and b["below_tau"] == {"drafter": 1} and b["no_window"] == {"ar": 1}
    assert b["at_or_above_tau"] == {"ar": 1, "retrieval": 3, "skip": 2}
    assert report["heisd_tau0"]["boundary"]["at_or_above_tau"] == {"drafter": 1, "retrieval": 2, "skip": 1}
    assert "boundary" not in report["ar"]
    where = report["_meta"]["acceptance"]["heisd_steps_by_source"]
    assert where["drafter_below_tau"] == pytest.approx(1 / 8) and where["skip"] == pytest.approx(2 / 8)
    text = markdown(report)
    assert "| heisd | 8 | 12% | 12% / 0% / 0% | 0% / 38% / 25% |" in text
    assert "- where heisd's steps went" in text and "drafter 12% below tau" in text
    assert "boundary" not in build_report(_run(), ["ar", "heisd"], {})["heisd"]  # no tau in the run key


def test_a_process_stopped_before_its_end_line_still_names_its_revision(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    log = ResultLog(path, {"max_steps": 5})
    run = _run()
    log.append({"kind": "session_start", "command": "shard a", "git_rev": "aaaa"})
    log.append(run[0])
    log.append(run[1])  # killed here: no session line
    log.append({"kind": "session_start", "command": "shard a, resumed", "git_rev": "bbbb"})
    log.append(run[2])
    log.append({"kind": "session", "command": "shard a, resumed", "git_rev": "bbbb", "episodes_run": 1})
    log.append({"kind": "session_start", "command": "shard a, again", "git_rev": "cccc"})  # killed at once
    stopped = ResultLog.read(path).stopped
    assert [(x["git_rev"], x["episodes_logged"]) for x in stopped] == [("aaaa", 2), ("cccc", 0)]
    meta = {"stopped_invocations": stopped, "invocations": ResultLog.read(path).sessions}
    text = markdown(build_report(run[:3], ["ar", "heisd"], meta))
    assert "- `shard a` (2 episodes, git `aaaa`" in text and "Stopped before their end" in text
    assert "- `shard a, resumed` (1 episodes, git `bbbb`)" in text


def test_a_session_names_the_revision_it_started_at_not_one_committed_during_it(tmp_path: Path) -> None:
    """A commit made while a process runs moves HEAD, not the code the process loaded: the report
    names a session by its start line's revision (older logs wrote HEAD at the end)."""
    path = tmp_path / "r.jsonl"
    log = ResultLog(path, {"max_steps": 5})
    run = _run()
    log.append({"kind": "session_start", "command": "shard a", "git_rev": "aaaa"})
    log.append(run[0])
    log.append({"kind": "session", "command": "shard a", "git_rev": "bbbb", "episodes_run": 1})
    sessions = ResultLog.read(path).sessions
    assert [(x["command"], x["git_rev"]) for x in sessions] == [("shard a", "aaaa")]
    text = markdown(build_report(run[:1], ["ar", "heisd"], {"invocations": sessions}))
    assert "git `aaaa`" in text and "bbbb" not in text


def test_the_report_names_the_machines_its_processes_ran_on(tmp_path: Path) -> None:
    """Step times compare within one machine: a run resumed on another CPU says so in its header."""
    path = tmp_path / "r.jsonl"
    log = ResultLog(path, {"max_steps": 5})
    run = _run()
    kernels = [{"weights": 7, "min_rows": None}, {"weights": 5, "min_rows": 8}]
    log.append({"kind": "session_start", "command": "shard a", "git_rev": "aaaa", "cpu": "CPU One",
                "linear_kernels": kernels})
    log.append(run[0])
    log.append({"kind": "session", "command": "shard a", "git_rev": "aaaa", "episodes_run": 1})
    sessions = ResultLog.read(path).sessions
    assert sessions[0]["cpu"] == "CPU One" and sessions[0]["linear_kernels"] == kernels
    text = markdown(build_report(run[:1], ["ar", "heisd"], {"invocations": sessions}))
    assert "(1 episodes, git `aaaa`; linear kernels: torch's, oneDNN from 8 rows)" in text
    one = markdown(build_report(run[:1], ["ar", "heisd"], {"machines": ["CPU One"]}))
    assert "Machine: CPU One." in one and "**Machines" not in one
    two = markdown(build_report(run[:1], ["ar", "heisd"], {"machines": ["CPU One", "CPU Two"]}))
    assert "**Machines: 2** (CPU One; CPU Two)" in two


def test_a_missed_speed_target_says_by_how_much_and_what_would_close_it() -> None:
    """heisd at 17.75 ms against ar's 40 (2.25x): the mean, the p95 and the accept length all miss;
    the report derives from the run's own mode mix what would reach each target."""
    report = build_report(_run(), ["ar", "heisd"], {})
    short = report["_meta"]["acceptance"]["shortfall"]
    m = short["mean"]  # goal 40 / 2.5 = 16 ms; skips 4 ms (2 of 8 steps), verified steps 134 / 6 ms
    assert m["goal_ms"] == pytest.approx(16.0) and m["short_ms"] == pytest.approx(1.75)
    assert m["verified_mean_ms"] == pytest.approx(134 / 6) and m["skip_share"] == pytest.approx(0.25)
    assert m["skip_share_needed"] == pytest.approx(0.25 + 1.75 / (134 / 6 - 4))
    assert m["verified_cost_cut_needed"] == pytest.approx(1.75 / (134 / 6 * 0.75))
    p = short["p95"]  # goal 40 / 1.5 ms: the two ar-like steps are slower
    assert p["share_slower"] == pytest.approx(0.25) and p["share_slower_by_mode"] == {"ar": 0.25}
    a = short["accept_length"]  # 21 forwards on 6 verified steps; 4.5 needs 7 / 4.5 cycles per step
    assert a["forwards_per_verified_step"] == pytest.approx(3.5)
    assert a["skip_share_needed"] == pytest.approx((3.5 - 7 / 4.5) / 2.5)
    assert a["forwards_per_verified_step_needed"] == pytest.approx((7 / 4.5 - 0.25) / 0.75)
    text = markdown(report)
    assert "- mean step short by 1.8 ms (17.8 ms against the 16.0 ms of 2.5x)" in text
    assert "it takes a skip share of 35% (now 25%), or verified steps 10% cheaper" in text
    assert "25.0% of steps are slower than that (at most 5 % may be): ar 25.0%" in text
    # a run that meets them has no shortfall
    fast = _run()
    for e in fast:
        if e["method"] == "heisd":
            e["steps"] = [_step(t, "skip", 2.0, [], skipped=True) for t in range(4)]
    assert build_report(fast, ["ar", "heisd"], {})["_meta"]["acceptance"]["shortfall"] == {}


def _failed_heisd(ee_of, shadow=True, strict_every=0, n=60) -> dict:
    """A failed heisd episode of `n` skipped steps at poses `ee_of(t)`; its tokens are not ar's (shadow)."""
    steps = [_step(t, "skip", 8.0, [], skipped=True, tokens=(3,) * 7) for t in range(n)]
    for s in steps:
        s["ee"] = ee_of(s["t"])
        if shadow:
            s["shadow"] = [4] * 7
        if strict_every and s["t"] % strict_every == 0:
            s["strict"] = True
    return _episode("heisd", 0, 40, False, steps)


def test_the_report_says_how_the_pairs_only_one_method_solved_ended() -> None:
    """heisd solves 1 of 3 pairs against ar's 2: the report sorts each loser's last 50 steps into
    still / in place / moving and says how many of heisd's were the policy's own tokens."""
    still = _failed_heisd(lambda t: [0.1, 0.0, 0.2])
    for s in still["steps"][-40:]:
        s["shadow"] = [3] * 7  # 40 of its last 50 steps are what ar would output
    swinging = _failed_heisd(lambda t: [0.1 + 0.02 * (t % 2), 0.0, 0.2], strict_every=1)
    swinging["task"] = 1
    moving = [_step(t, "ar", 40.0, [1] * 7) for t in range(60)]  # ee travels 1 cm a step
    ar_still = [dict(s, ee=[0.3, 0.0, 0.2]) for s in moving]
    log = [_episode("ar", 0, 40, True, moving), still, _episode("ar", 1, 40, True, moving), swinging,
           _episode("ar", 2, 40, False, ar_still), _episode("heisd", 2, 40, True, moving)]
    report = build_report(log, ["ar", "heisd"], {})
    assert report["_meta"]["acceptance"]["shortfall"]["success"]["gap_points"] == pytest.approx(100 / 3)
    f = report["_meta"]["acceptance"]["discordant_pairs"]
    assert (f["only_ar_solved"], f["heisd_endings"]) == (2, {"still": 1, "in_place": 1})
    assert f["steps_known"] == 100 and f["policy_token_share"] == pytest.approx(90 / 100)
    assert f["policy_endings"] == 1  # the swinging one (all strict); the still one is at 80 %
    assert (f["only_heisd_solved"], f["ar_endings"]) == (1, {"still": 1})
    text = markdown(report)
    assert "heisd's 2 losses over their last 50 steps (stood still 1, moved in place 1;" in text
    assert "in 90.0% of their 100 shadowed steps, 1 of them in at least 95 %; ar's 1 losses: stood still 1" in text
    assert "- success 33 points below ar's" in text
    assert "success" not in build_report(_run(), ["ar", "heisd"], {})["_meta"]["acceptance"]["shortfall"]


def test_an_ending_is_read_from_the_path_and_tokens_count_only_where_known() -> None:
    """An arm that swings back and forth ends where it began but did not stand still; one that
    travels is moving; a log without poses says so; a short failure ended early; a strict step is the
    policy's own, a relaxed one without ar's shadow is unknown."""
    from heisd_libero.eval_targets import ending, failure_anatomy

    swinging = _failed_heisd(lambda t: [0.1 + 0.02 * (t % 2), 0.0, 0.2])
    assert swinging["steps"][-50]["ee"] == swinging["steps"][-2]["ee"] and ending(swinging) == "in_place"
    assert ending(_failed_heisd(lambda t: [0.01 * t, 0.0, 0.2])) == "moving"
    assert ending(_failed_heisd(lambda t: [0.1, 0.0, 0.2], n=30)) is None
    no_pose = _failed_heisd(lambda t: [0.1, 0.0, 0.2])
    for s in no_pose["steps"][-5:]:
        del s["ee"]
    assert ending(no_pose) == "unknown"
    unshadowed = _failed_heisd(lambda t: [0.1, 0.0, 0.2], shadow=False, strict_every=5)  # 10 strict, 40 unknown
    ar = [_episode("ar", 0, 40, True, [_step(t, "ar", 40.0, [1] * 7) for t in range(60)])]
    f = failure_anatomy([unshadowed], ar)
    assert (f["heisd_endings"], f["steps_known"], f["policy_token_share"]) == ({"still": 1}, 10, 1.0)
