"""LeRobot datasets (v3 and v2.1 layouts) read with pyarrow + PyAV: frames in order, columns, maps, errors."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest

from heisd_ros.pipeline.action_convention import DemoDataError
from heisd_ros.pipeline.episodes import load_episode
from heisd_ros.pipeline.lerobot_dataset import Column, LeRobotLayout, LeRobotReading, scan_lerobot

pa = pytest.importorskip("pyarrow")
pytest.importorskip("av")

import recordings  # noqa: E402  test/pipeline/recordings.py (pytest.ini: pythonpath)
T = 7
MAP = ("observation.images.front=agentview,observation.images.wrist=wrist,observation.state[0:3]=pose,"
       "observation.state[6,7]=fingers")


@pytest.fixture(scope="module", params=["v3.0", "v2.1"])
def dataset(request, tmp_path_factory):
    rec = recordings
    demos = [rec.make_demo(s, T + s) for s in range(3)]  # episodes of different lengths
    root = tmp_path_factory.mktemp("lerobot") / f"ds_{request.param}"
    rec.write_lerobot_dataset(root, demos, ["open the drawer", "close the drawer", "open the drawer"], request.param)
    return root, demos


def test_column_syntax() -> None:
    assert Column.parse("observation.state[0:3]") == Column("observation.state", (0, 1, 2))
    assert Column.parse("observation.state[6, 7]") == Column("observation.state", (6, 7))
    assert Column.parse("action") == Column("action")
    for bad in ("state[0:]", "state[a]", "[0:3]"):
        with pytest.raises(DemoDataError, match="bad column"):
            Column.parse(bad)


def test_episodes_read_back_actions_positions_fingers_and_frames_in_order(dataset) -> None:
    root, demos = dataset
    refs = scan_lerobot(root, "ds", LeRobotReading.parse(MAP))
    assert [(r.episode, r.length, r.task) for r in refs] == [
        (0, T, "open the drawer"), (1, T + 1, "close the drawer"), (2, T + 2, "open the drawer")]
    for ref, demo in zip(refs, demos):
        ep = load_episode(ref)
        np.testing.assert_allclose(ep.actions, demo.actions, atol=1e-6)  # float32 columns
        np.testing.assert_allclose(ep.ee_pos, demo.ee_pos, atol=1e-6)
        np.testing.assert_allclose(ep.gripper_qpos, demo.fingers, atol=1e-6)
        for view in ("agentview", "wrist"):
            got, want = ep.images[view].astype(float), demo.frames[view].astype(float)
            assert got.shape == want.shape
            err = np.abs(got[:, None] - want[None]).mean(axis=(2, 3, 4))  # [decoded, recorded]
            assert (err.argmin(axis=1) == np.arange(len(want))).all()  # each frame is its own step's
            assert err.diagonal().max() < 8  # lossy h264, nothing more


def test_task_filter_uses_the_task_indices(dataset) -> None:
    root, _ = dataset
    layout = LeRobotLayout(root)
    opening = {i for i, t in layout.tasks.items() if t == "open the drawer"}
    refs = scan_lerobot(root, "ds", LeRobotReading.parse(MAP), tasks=sorted(opening))
    assert [r.episode for r in refs] == [0, 2]


@pytest.mark.parametrize("mapping, match", [
    ("observation.images.front=agentview",
     r"map the primary camera and the end-effector position.*observation.state \(float32, \[8\]\)"),
    ("observation.state=agentview,observation.state[0:3]=pose", "not a video or image feature"),
    ("observation.images.front=agentview,observation.state[0:2]=pose", r"selects 2 of the 8 values.*pose needs 3"),
    ("observation.images.front=agentview,observation.state[0:3]=pose,observation.velocity=gripper",
     "observation.velocity .gripper. is not a feature"),
    ("observation.images.front=agentview,observation.state[0:3]=pose,observation.state[7]=gripper",
     r"action\[0,1,2,3,4,5,6\]|selects 7 of the 7 values of action; action needs 6"),
])
def test_map_errors_name_the_datasets_features(dataset, mapping, match) -> None:
    root, _ = dataset
    with pytest.raises(DemoDataError, match=match):
        scan_lerobot(root, "ds", LeRobotReading.parse(mapping))


def test_a_six_column_action_takes_a_separate_gripper(dataset) -> None:
    root, demos = dataset
    reading = LeRobotReading.parse("observation.images.front=agentview,observation.state[0:3]=pose,"
                                   "action[0:6]=action,action[6]=gripper")
    ep = load_episode(scan_lerobot(root, "ds", reading)[0], with_images=False)
    np.testing.assert_allclose(ep.actions, demos[0].actions, atol=1e-6)
    assert ep.images == {}


def test_image_features_and_unsupported_versions(tmp_path) -> None:
    """`image` dtype: PNG bytes in the parquet column; a codebase_version other than v2/v3 is refused."""
    import pyarrow.parquet as pq
    from PIL import Image

    root = tmp_path / "imgs"
    (root / "meta").mkdir(parents=True)
    (root / "data/chunk-000").mkdir(parents=True)
    frames = [np.full((6, 6, 3), 40 * t, np.uint8) for t in range(3)]

    def png(a):
        buf = io.BytesIO()
        Image.fromarray(a).save(buf, format="PNG")
        return {"bytes": buf.getvalue(), "path": None}

    rows = [{"observation.image": png(f), "observation.state": [0.1 * t, 0.0, 0.3], "action": [0.0] * 6 + [-1.0],
             "timestamp": t / 5, "frame_index": t, "episode_index": 0, "task_index": 0} for t, f in enumerate(frames)]
    pq.write_table(pa.Table.from_pylist(rows), root / "data/chunk-000/episode_000000.parquet")
    info = {"codebase_version": "v2.0", "fps": 5, "chunks_size": 1000,
            "data_path": "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet",
            "features": {"observation.image": {"dtype": "image", "shape": [6, 6, 3]},
                         "observation.state": {"dtype": "float32", "shape": [3]},
                         "action": {"dtype": "float32", "shape": [7]}}}
    (root / "meta/info.json").write_text(json.dumps(info))
    (root / "meta/episodes.jsonl").write_text(json.dumps({"episode_index": 0, "tasks": ["wave"], "length": 3}) + "\n")
    (root / "meta/tasks.jsonl").write_text(json.dumps({"task_index": 0, "task": "wave"}) + "\n")
    reading = LeRobotReading.parse("observation.image=agentview,observation.state=pose")
    ep = load_episode(scan_lerobot(root, "imgs", reading)[0])
    assert ep.images["agentview"][:, 0, 0, 0].tolist() == [0, 40, 80] and ep.instruction == "wave"
    info["codebase_version"] = "v1.6"
    (root / "meta/info.json").write_text(json.dumps(info))
    with pytest.raises(DemoDataError, match="codebase_version 'v1.6'"):
        LeRobotLayout(root)
