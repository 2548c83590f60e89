"""`heisd-libero sim-episodes`: its options and the per-method summary of the episodes it ran."""

from __future__ import annotations

from heisd_libero.sim_episodes import build_parser, node_command, summary


def test_the_summary_counts_what_the_episodes_did() -> None:
    episodes = [
        {"success": True, "steps": 10, "sim_time_s": 0.5, "frame_to_command_s": [0.02, 0.04], "decode_ms": [10.0, 30.0],
         "modes": ["skip", "retrieval"], "cpu_ms": [9.5, 12.0]},
        {"success": False, "steps": 30, "sim_time_s": 1.5, "frame_to_command_s": [0.06], "decode_ms": [20.0],
         "modes": ["skip"], "cpu_ms": [19.0]},
    ]  # fmt: skip
    s = summary(episodes)
    assert s["episodes"] == 2 and s["successes"] == 1
    assert s["task_time_s_mean"] == 1.0 and s["steps_mean"] == 20.0
    assert s["frame_to_command_ms"]["p50"] == 40.0
    assert s["decode_ms"]["mean"] == 20.0
    assert s["mode_mix"] == {"skip": 2, "retrieval": 1}
    assert s["contended_share"] == round(1 / 3, 4)  # 30 ms of wall for 12 ms of CPU: it waited
    assert summary([])["episodes"] == 0


def test_arm_time_at_20_hz_is_the_default() -> None:
    args = build_parser().parse_args([])
    assert args.time_mode == "arm_time" and args.control_rate_hz == 20.0 and args.latency_scale == 1.0


def test_the_node_runs_the_named_policy_and_a_point_file_overrides_its_own() -> None:
    def params(cmd: list[str]) -> dict[str, str]:
        return dict(cmd[i + 1].split(":=", 1) for i, a in enumerate(cmd) if a == "-p")

    args = build_parser().parse_args(["--suite", "libero_spatial", "--policy", "models/mini_libero_spatial"])
    p = params(node_command("heisd", "db", 20.0, args.policy))
    assert p["model_dir"] == "models/mini_libero_spatial/vla" and p["drafter_dir"] == "models/mini_libero_spatial/drafter"
    assert p["calibration_path"] == "models/mini_libero_spatial/calibration.json" and p["decoder.method"] == "heisd"
    assert params(node_command("ar", "db", 20.0, calibration_path="x.json"))["calibration_path"] == "x.json"
    assert params(node_command("ar", "db", 20.0))["model_dir"] == "models/mini_libero/vla"  # the default: Object's
