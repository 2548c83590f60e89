"""Tiny generated demonstrations in the two user formats, for the reader and tutorial tests.

- `write_teleop_bag`: a rosbag2 (MCAP) teleoperation recording written with the project's bag
  writer: two cameras, an end-effector pose, finger joints, a TwistStamped command (m/s, rad/s)
  and a Float64 gripper command 1 = open / 0 = closed, published only when it changes.
- `write_lerobot_dataset`: a LeRobot dataset (v3: shared parquet and mp4 files, or v2.1: one file
  per episode) with two PyAV-encoded cameras, `observation.state` = [x, y, z, ax, ay, az, f1, f2]
  and a 7-D `action` in the policy's own convention.

Both return the episodes' actions in the policy's convention (delta m / rad per step, gripper -1
open / +1 close) and their end-effector positions, to check what a reader gives back.

Not a test module: the tests `import recordings` (pytest.ini puts test/pipeline on sys.path; its
importlib mode puts no test folder there by itself).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import numpy as np

RATE_HZ = 10.0
TOPICS = {"agentview": "/cam_high/image_raw", "wrist": "/cam_wrist/image_raw", "pose": "/ee_pose",
          "action": "/teleop/cmd", "gripper": "/gripper", "fingers": "/joint_states"}


@dataclass
class Demo:
    """One generated episode: policy-convention actions [T, 7], positions [T, 3], frames per view."""

    actions: np.ndarray
    ee_pos: np.ndarray
    frames: dict[str, np.ndarray]
    fingers: np.ndarray


def make_demo(seed: int, steps: int, size: int = 32) -> Demo:
    """A reach-and-grasp: small random deltas (m, rad), gripper open for the first half, then closed."""
    rng = np.random.default_rng(seed)
    delta = np.array([0.01, 0.004, -0.006]) + 0.003 * rng.normal(size=(steps, 3))
    rot = 0.02 * rng.normal(size=(steps, 3))
    grip = np.where(np.arange(steps) < steps // 2, -1.0, 1.0)[:, None]
    actions = np.concatenate([delta, rot, grip], axis=1)
    ee_pos = np.array([0.45, -0.1, 0.3]) + np.cumsum(np.vstack([np.zeros((1, 3)), delta[:-1]]), axis=0)
    yy, xx = np.mgrid[0:size, 0:size]
    frames = {}
    for k, view in enumerate(("agentview", "wrist")):
        f = np.zeros((steps, size, size, 3), np.uint8)
        for t in range(steps):  # a square that moves with the arm over a per-view gradient, a per-step blue
            cx, cy = int(size * 0.3 + 40 * (ee_pos[t, 0] - 0.45)), int(size * 0.5 + 40 * ee_pos[t, 1])
            f[t, ..., 0] = (xx * 7 + 40 * k) % 256
            f[t, ..., 1] = (yy * 5 + 30 * seed) % 256
            f[t, ..., 2] = 18 * t % 220
            f[t, max(cy - 4, 0):cy + 4, max(cx - 4, 0):cx + 4, 2] = 255
        frames[view] = f
    gap = np.where(grip[:, 0] < 0, 0.04, 0.01)
    return Demo(actions, ee_pos, frames, np.stack([gap / 2, gap / 2], axis=1))


def write_teleop_bag(path: Path, demo: Demo, start_ns: int = 1_000_000_000, jitter_ns: int = 4_000_000) -> None:
    """`demo` as a teleoperation recording on TOPICS (a new directory `path`)."""
    from heisd_ros.pipeline.bags import (
        BagWriter,
        header,
        image_msg,
        joint_state_msg,
        pose_msg,
    )

    dt = int(1e9 / RATE_HZ)
    rng = np.random.default_rng(0)
    with BagWriter(path) as bag:
        T = bag.ts.types
        bag.add(TOPICS["agentview"], "sensor_msgs/msg/Image")
        bag.add(TOPICS["wrist"], "sensor_msgs/msg/Image")
        bag.add(TOPICS["pose"], "geometry_msgs/msg/PoseStamped")
        bag.add(TOPICS["fingers"], "sensor_msgs/msg/JointState")
        bag.add(TOPICS["action"], "geometry_msgs/msg/TwistStamped")
        bag.add(TOPICS["gripper"], "std_msgs/msg/Float64")
        last_grip = None
        for t, a in enumerate(demo.actions):
            stamp = start_ns + t * dt
            for view, enc in (("agentview", "rgb8"), ("wrist", "bgr8")):
                s = stamp + int(rng.integers(-jitter_ns, jitter_ns))
                bag.write(TOPICS[view], s, image_msg(header(s, "cam"), demo.frames[view][t], enc))
            bag.write(TOPICS["pose"], stamp, pose_msg(header(stamp, "base_link"), demo.ee_pos[t]))
            bag.write(TOPICS["fingers"], stamp, joint_state_msg(header(stamp, "base_link"),
                                                                ("panda_finger_joint1", "panda_finger_joint2"),
                                                                demo.fingers[t]))
            open_value = 1.0 if a[6] < 0 else 0.0  # the source's own convention: 1 open, 0 closed
            if open_value != last_grip:
                bag.write(TOPICS["gripper"], stamp, T["std_msgs/msg/Float64"](data=open_value))
                last_grip = open_value
            cmd_stamp = stamp + 2_000_000
            vec = T["geometry_msgs/msg/Vector3"]
            twist = T["geometry_msgs/msg/Twist"](linear=vec(*(a[:3] * RATE_HZ)), angular=vec(*(a[3:6] * RATE_HZ)))
            bag.write(TOPICS["action"], cmd_stamp,
                      T["geometry_msgs/msg/TwistStamped"](header=header(cmd_stamp, "base_link"), twist=twist))


def _encode_mp4(path: Path, frames: np.ndarray, fps: float) -> None:
    import av

    path.parent.mkdir(parents=True, exist_ok=True)
    with av.open(str(path), "w") as out:
        stream = out.add_stream("libx264", rate=Fraction(int(fps), 1))
        stream.width, stream.height = frames.shape[2], frames.shape[1]
        stream.pix_fmt = "yuv420p"
        stream.options = {"crf": "10", "g": "4"}
        for i, rgb in enumerate(frames):
            frame = av.VideoFrame.from_ndarray(rgb, format="rgb24")
            frame.pts = i
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)


def _features(size: int, fps: float) -> dict:
    video = {"dtype": "video", "shape": [size, size, 3], "names": ["height", "width", "channels"],
             "info": {"video.fps": fps, "video.codec": "h264", "video.pix_fmt": "yuv420p"}}
    scalar = {"shape": [1], "names": None}
    return {
        "observation.images.front": video, "observation.images.wrist": video,
        "observation.state": {"dtype": "float32", "shape": [8], "names": ["x", "y", "z", "ax", "ay", "az", "f1", "f2"]},
        "action": {"dtype": "float32", "shape": [7], "names": ["dx", "dy", "dz", "drx", "dry", "drz", "gripper"]},
        "timestamp": {"dtype": "float32", **scalar}, "frame_index": {"dtype": "int64", **scalar},
        "episode_index": {"dtype": "int64", **scalar}, "index": {"dtype": "int64", **scalar},
        "task_index": {"dtype": "int64", **scalar},
    }


def _rows(demos: list[Demo], fps: float, task_index: list[int]) -> list[dict]:
    rows, index = [], 0
    for e, demo in enumerate(demos):
        for t in range(len(demo.actions)):
            state = np.concatenate([demo.ee_pos[t], np.zeros(3), demo.fingers[t]])
            rows.append({"observation.state": state.astype(np.float32).tolist(),
                         "action": demo.actions[t].astype(np.float32).tolist(), "timestamp": np.float32(t / fps).item(),
                         "frame_index": t, "episode_index": e, "index": index, "task_index": task_index[e]})
            index += 1
    return rows


def write_lerobot_dataset(root: Path, demos: list[Demo], tasks: list[str], version: str = "v3.0",
                          fps: float = RATE_HZ) -> None:
    """`demos` as a LeRobot dataset at `root`, episode e doing tasks[e] (one task per episode)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    names = sorted(set(tasks))
    task_index = [names.index(t) for t in tasks]
    cams = {"observation.images.front": "agentview", "observation.images.wrist": "wrist"}
    size = demos[0].frames["agentview"].shape[1]
    info = {"codebase_version": version, "robot_type": "panda", "fps": fps, "chunks_size": 1000,
            "total_episodes": len(demos), "features": _features(size, fps)}
    (root / "meta").mkdir(parents=True, exist_ok=True)
    rows = _rows(demos, fps, task_index)
    if version.startswith("v3"):
        info["data_path"] = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
        info["video_path"] = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
        (root / "data/chunk-000").mkdir(parents=True)
        pq.write_table(pa.Table.from_pylist(rows), root / "data/chunk-000/file-000.parquet")
        starts = np.cumsum([0] + [len(d.actions) for d in demos])
        for key, view in cams.items():
            _encode_mp4(root / f"videos/{key}/chunk-000/file-000.mp4",
                        np.concatenate([d.frames[view] for d in demos]), fps)
        episodes = []
        for e, d in enumerate(demos):
            row = {"episode_index": e, "tasks": [tasks[e]], "length": len(d.actions), "data/chunk_index": 0,
                   "data/file_index": 0, "dataset_from_index": int(starts[e]), "dataset_to_index": int(starts[e + 1])}
            for key in cams:
                row.update({f"videos/{key}/chunk_index": 0, f"videos/{key}/file_index": 0,
                            f"videos/{key}/from_timestamp": starts[e] / fps,
                            f"videos/{key}/to_timestamp": starts[e + 1] / fps})
            episodes.append(row)
        (root / "meta/episodes/chunk-000").mkdir(parents=True)
        pq.write_table(pa.Table.from_pylist(episodes), root / "meta/episodes/chunk-000/file-000.parquet")
        pq.write_table(pa.table({"task_index": list(range(len(names))), "task": names}), root / "meta/tasks.parquet")
    else:
        info["data_path"] = "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet"
        info["video_path"] = "videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4"
        for e, d in enumerate(demos):
            mine = [r for r in rows if r["episode_index"] == e]
            (root / "data/chunk-000").mkdir(parents=True, exist_ok=True)
            pq.write_table(pa.Table.from_pylist(mine), root / f"data/chunk-000/episode_{e:06d}.parquet")
            for key, view in cams.items():
                _encode_mp4(root / f"videos/chunk-000/{key}/episode_{e:06d}.mp4", d.frames[view], fps)
        (root / "meta/episodes.jsonl").write_text("".join(
            json.dumps({"episode_index": e, "tasks": [tasks[e]], "length": len(d.actions)}) + "\n"
            for e, d in enumerate(demos)))
        (root / "meta/tasks.jsonl").write_text("".join(
            json.dumps({"task_index": i, "task": t}) + "\n" for i, t in enumerate(names)))
    (root / "meta/info.json").write_text(json.dumps(info, indent=2))
