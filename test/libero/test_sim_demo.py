"""`heisd-libero sim-demo` (make demo): a short closed-loop episode per method through policy_node and the
simulated arm writes the side-by-side MP4 (one frame per simulator step), the figures, result.json
and the per-method table."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from libero_policy import require_libero

pytestmark = pytest.mark.slow  # LIBERO and two policy_node processes

pytest.importorskip("heisd_ros.msg", reason="interfaces not built (make setup)")
require_libero()

REPO = Path(__file__).resolve().parents[2]
MINI = REPO / "models" / "mini_libero"
T = 8


@pytest.fixture(scope="module")
def task_db(tmp_path_factory) -> Path:
    """A database of task 0 for the committed mini policy from two short recorded episodes
    (the demo's own is built from 10 expert episodes, minutes of CPU)."""
    from heisd_libero.sim.recorder import Episode, Hdf5DemoWriter
    from heisd_ros.core.config import DecoderConfig
    from heisd_ros.pipeline.calibration import apply_calibration
    from heisd_ros.tools import build_db

    root = tmp_path_factory.mktemp("loop_demo")
    attrs = {"instruction": "pick up the alphabet soup and place it in the basket", "suite": "libero_object",
             "task_index": 0, "task_name": "pick_up_the_alphabet_soup_and_place_it_in_the_basket", "problem_info": {}}
    with Hdf5DemoWriter(root / "demos" / f"{attrs['task_name']}_demo.hdf5", attrs) as writer:
        for seed in range(2):
            rng = np.random.default_rng(seed)
            t = np.arange(T)[:, None]
            writer.write(Episode(
                actions=np.concatenate([rng.uniform(-0.9, 0.9, (T, 3)), rng.uniform(-0.05, 0.0, (T, 3)), np.where(t < 4, -1.0, 1.0)], axis=1),
                ee_pos=np.array([0.1, 0.0, 1.0]) + 0.02 * t, ee_quat=np.tile([0.0, 0.0, 0.0, 1.0], (T, 1)),
                ee_rot=np.tile(np.eye(3), (T, 1, 1)), gripper_qpos=np.zeros((T, 2)), joint_pos=np.zeros((T, 7)),
                states=rng.normal(size=(T, 5)),
                images={v: rng.integers(0, 256, (T, 128, 128, 3), dtype=np.uint8) for v in ("agentview", "wrist")},
                instruction=attrs["instruction"], success=True, init_state_index=seed, seed=seed))  # fmt: skip
    db = root / "db"
    query_views = apply_calibration(DecoderConfig(), MINI / "calibration.json").retrieval.query_views  # the point's
    assert build_db.main(["--model", str(MINI / "vla"), "--demos", str(root / "demos"), "--out", str(db),
                          "--tasks", "0", "--query-views", str(query_views), "--no-progress"]) == 0  # fmt: skip
    return db


def test_the_demo_runs_each_method_closed_loop_and_writes_the_video_and_table(task_db, tmp_path, monkeypatch, capsys):
    import av

    from heisd_libero import sim_demo as demo

    monkeypatch.chdir(REPO)  # the node's parameter file and the shipped policy are the checkout's
    cfg = demo.LoopDemoConfig(max_steps=T, db_path=str(task_db), out=str(tmp_path), domain_id=63)
    result = demo.run(cfg)
    out = capsys.readouterr().out
    rows = {r["method"]: r for r in result["methods"]}
    assert list(rows) == ["ar", "heisd"]
    for r in rows.values():
        assert r["steps_mean"] == T and r["node_exit_code"] == 0 and r["decoded_frames"] >= 1
        assert r["frame_to_command_ms"]["p50"] > 0 and r["decode_ms"]["mean"] > 0
        assert sum(r["mode_mix"].values()) == r["decoded_frames"]  # a DecodeStats per decoded frame
        assert 0 <= r["contended_share"] <= 1
    assert set(rows["ar"]["mode_mix"]) == {"ar"}
    assert "frame-to-command age" in out and "decode step" in out and "heisd against ar" in out
    assert out.count(" steps ") >= 2  # a progress line per method, not one per step
    (run_dir,) = tmp_path.iterdir()
    with av.open(str(run_dir / "episode.mp4")) as video:
        frames = [f.to_ndarray(format="rgb24") for f in video.decode(video=0)]
    assert len(frames) == T + 1  # the reset and every simulator step
    assert frames[0].shape[1] == 2 * 2 * 128  # the two methods side by side, each view at twice its size
    assert (run_dir / "modes.png").stat().st_size > 0 and (run_dir / "ages.png").stat().st_size > 0
    assert json.loads((run_dir / "result.json").read_text())["methods"][1]["method"] == "heisd"
