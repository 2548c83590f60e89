"""The kinematic boundary normalised on the policy's own closed-loop motion (`heisd calibrate --closed-loop`)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from heisd_ros.core.config import FusedMetricConfig
from heisd_ros.core.errors import ConfigError
from heisd_ros.pipeline.calibration import calibrate
from heisd_ros.pipeline.closed_loop import f_summary, fused_values, read_trajectories
from heisd_ros.store.schema import DemoPoint


def _arc(n: int, radius: float, step: float, seed: int) -> np.ndarray:
    """A planar arc walked at `step` metres a step, with a little noise."""
    rng = np.random.default_rng(seed)
    angle = np.arange(n) * step / radius
    return np.stack([radius * np.cos(angle), radius * np.sin(angle), 0.1 + 0.0 * angle], axis=1) + rng.normal(
        0, 1e-4, (n, 3))


def _points(paths: list[np.ndarray]) -> list[DemoPoint]:
    rng = np.random.default_rng(0)
    out = []
    for e, path in enumerate(paths):
        for t, pos in enumerate(path):
            feat = rng.normal(size=8).astype(np.float32)
            out.append(DemoPoint("d", "task", "pick it", e, t, obs=rng.normal(size=4), feat=feat, feat_prev=feat,
                                 action=np.zeros(7), action_tokens=(128,) * 7, ee_pos=pos))
    return out


def _log(tmp_path, paths: list[np.ndarray], method: str = "ar"):
    path = tmp_path / "run.jsonl"
    lines = [{"kind": "run", "key": {}}]
    lines += [{"kind": "episode", "method": method, "task": 0, "init_state": 20 + i,
               "steps": [{"t": t, "ee": [float(x) for x in p]} for t, p in enumerate(traj)]} for i, traj in enumerate(paths)]
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    return path


def test_trajectories_read_back_from_an_eval_log(tmp_path) -> None:
    paths = [_arc(30, 0.2, 0.01, s) for s in range(3)]
    log = _log(tmp_path, paths)
    got = read_trajectories(log)
    assert len(got) == 3 and all(np.allclose(a, b) for a, b in zip(got, paths))
    with pytest.raises(ConfigError, match="no heisd episodes"):
        read_trajectories(log, "heisd")
    (tmp_path / "bad.jsonl").write_text("{not json\n")
    with pytest.raises(ConfigError, match="not a readable"):
        read_trajectories(tmp_path / "bad.jsonl")


def test_a_slow_policy_normalised_on_its_own_motion_spans_the_boundary() -> None:
    demos = [_arc(40, 0.2, 0.01, s) for s in range(4)]        # 1 cm a step
    policy = [_arc(40, 0.2, 0.002, 10 + s) for s in range(4)]  # the policy creeps at 2 mm a step
    on_demos = calibrate(_points(demos), FusedMetricConfig(), neighbours=2)
    on_policy = calibrate(_points(demos), FusedMetricConfig(), neighbours=2, closed_loop=policy)
    assert on_demos["meta"]["normalisation_from"] == "demonstrations" and "f_closed_loop" not in on_demos["meta"]
    assert on_policy["meta"]["normalisation_from"] == "closed_loop"
    # D's scale follows the motion it was fitted on: five times less displacement per window
    assert on_policy["fused_metric"]["d_p95_m"] < 0.3 * on_demos["fused_metric"]["d_p95_m"]
    # with the demos' scale the creeping policy's F sits at the bottom; with its own it spans the range
    cfg = FusedMetricConfig()
    f_demo_scale = fused_values(policy, FusedMetricConfig(**{**cfg.__dict__, **{
        k: v for k, v in on_demos["fused_metric"].items() if k != "tau"}}))
    f_own = on_policy["meta"]["f_closed_loop"]
    assert f_summary(f_demo_scale)["quantiles"]["0.5"] < 0.5 * f_own["quantiles"]["0.5"]
    assert f_own["steps"] == len(f_demo_scale) and list(f_own["quantiles"]) == ["0.25", "0.5", "0.75", "0.9"]


def test_f_summary_counts_exact_zeros() -> None:
    s = f_summary(np.array([0.0, 0.0, 0.5, 1.0]))
    assert s["zero_share"] == 0.5 and s["steps"] == 4 and s["quantiles"]["0.5"] == pytest.approx(0.25)
    assert s["positive_quantiles"]["0.5"] == pytest.approx(0.75)
    assert f_summary(np.array([])) == {"steps": 0}
