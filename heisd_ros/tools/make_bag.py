"""Write a short synthetic rosbag2 on the policy node's input topics (tests, `heisd demo`).

Usage:
    python -m heisd_ros.tools.make_bag OUT_BAG [--episodes 1] [--steps 20] [--seed 1] [--rate-hz 10]
                                       [--image-size 64] [--storage mcap|sqlite3] [--encoding rgb8]
                                       [--compressed none|png|jpeg] [--jitter-s 0.005]

Per episode: the instruction (std_msgs/String), then per step the end-effector pose
(geometry_msgs/PoseStamped) and one image per view (sensor_msgs/Image or CompressedImage) whose
stamps differ by at most `jitter_s`, and at the end the episode result (std_msgs/Bool). The scenes
come from `heisd_ros.sim.synthetic` (the tiny model's world) with their own seed, so a bag is
held-out data for the tiny database. Deterministic for a given configuration.
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from heisd_ros.core.errors import ConfigError

VIEWS = ("agentview", "wrist")
TOPICS = {
    "agentview": "/agentview/image_raw",
    "wrist": "/wrist/image_raw",
    "pose": "/ee_pose",
    "instruction": "/instruction",
    "episode_result": "/episode_result",
}
"""The node's default topics (config/policy.yaml) in the root namespace."""


@dataclass(frozen=True)
class MakeBagConfig:
    """What the synthetic bag contains."""

    episodes: int = 1
    """Episodes per task."""
    steps: int = 20
    """Control steps per episode."""
    seed: int = 1
    """Scene seed (the tiny database is built from seed 0)."""
    rate_hz: float = 10.0
    """Step rate of the recorded stamps."""
    image_size: int = 64
    """Square image side, pixels."""
    storage: str = "mcap"
    """rosbag2 storage plugin: mcap or sqlite3."""
    encoding: str = "rgb8"
    """Raw image encoding: rgb8, bgr8, rgba8, bgra8 or mono8."""
    compressed: str = "none"
    """none, png or jpeg (sensor_msgs/CompressedImage; needs Pillow)."""
    jitter_s: float = 0.005
    """Largest stamp offset between the views of one step (within the node's sync slop)."""
    tasks: int = 1
    """How many synthetic tasks (instructions) to include, in order."""
    start_time_s: float = 1_700_000_000.0
    """Stamp of the first message (seconds since the epoch)."""
    instruction: str = ""
    """Replaces the instruction of every episode ('' = the synthetic task's own; tests use it for unknown tasks)."""

    def __post_init__(self) -> None:
        from heisd_ros.ros.conversions import SUPPORTED_ENCODINGS
        from heisd_ros.sim.synthetic import TASKS

        if self.episodes < 1 or self.steps < 1:
            raise ConfigError("episodes and steps must be >= 1")
        if not (math.isfinite(self.rate_hz) and self.rate_hz > 0):
            raise ConfigError("rate_hz must be > 0")
        if not 8 <= self.image_size <= 1024:
            raise ConfigError("image_size must be in [8, 1024]")
        if self.storage not in ("mcap", "sqlite3"):
            raise ConfigError(f"storage must be mcap or sqlite3, got {self.storage!r}")
        if self.encoding not in SUPPORTED_ENCODINGS:
            raise ConfigError(f"encoding must be one of {SUPPORTED_ENCODINGS}")
        if self.compressed not in ("none", "png", "jpeg"):
            raise ConfigError("compressed must be none, png or jpeg")
        if not 0 <= self.jitter_s < 0.5 / self.rate_hz:
            raise ConfigError("jitter_s must be in [0, half a step)")
        if not 1 <= self.tasks <= len(TASKS):
            raise ConfigError(f"tasks must be in [1, {len(TASKS)}]")


def _stamp(ts: Any, t_s: float) -> Any:
    ns = int(round(t_s * 1e9))
    return ts.types["builtin_interfaces/msg/Time"](sec=ns // 1_000_000_000, nanosec=ns % 1_000_000_000)


def _image(ts: Any, rgb: np.ndarray, t_s: float, frame: str, cfg: MakeBagConfig) -> tuple[str, Any]:
    header = ts.types["std_msgs/msg/Header"](stamp=_stamp(ts, t_s), frame_id=frame)
    if cfg.compressed != "none":
        from PIL import Image as PILImage

        buf = io.BytesIO()
        PILImage.fromarray(rgb).save(buf, format=cfg.compressed.upper())
        data = np.frombuffer(buf.getvalue(), dtype=np.uint8)
        return "sensor_msgs/msg/CompressedImage", ts.types["sensor_msgs/msg/CompressedImage"](
            header=header, format=f"rgb8; {cfg.compressed} compressed rgb8", data=data)
    from heisd_ros.ros.conversions import _RAW_ENCODINGS

    channels, order = _RAW_ENCODINGS[cfg.encoding]
    if order is None:
        pixels = rgb.mean(axis=2).round().astype(np.uint8)[:, :, None]
    else:
        pixels = np.full(rgb.shape[:2] + (channels,), 255, dtype=np.uint8)
        pixels[:, :, list(order)] = rgb
    h, w = rgb.shape[:2]
    return "sensor_msgs/msg/Image", ts.types["sensor_msgs/msg/Image"](
        header=header, height=h, width=w, encoding=cfg.encoding, is_bigendian=0, step=w * channels,
        data=np.ascontiguousarray(pixels).reshape(-1))


def _pose(ts: Any, p: np.ndarray, t_s: float) -> Any:
    g = ts.types
    header = g["std_msgs/msg/Header"](stamp=_stamp(ts, t_s), frame_id="base_link")
    pose = g["geometry_msgs/msg/Pose"](position=g["geometry_msgs/msg/Point"](x=float(p[0]), y=float(p[1]), z=float(p[2])),
                                       orientation=g["geometry_msgs/msg/Quaternion"](x=0.0, y=0.0, z=0.0, w=1.0))
    return g["geometry_msgs/msg/PoseStamped"](header=header, pose=pose)


def make_bag(path: str | Path, cfg: MakeBagConfig = MakeBagConfig()) -> dict:
    """Write the bag at `path` (must not exist). Returns a summary (steps, topics, messages)."""
    from rosbags.rosbag2 import StoragePlugin, Writer
    from rosbags.typesys import Stores, get_typestore

    from heisd_ros.sim import synthetic

    path = Path(path)
    if path.exists():
        raise ConfigError(f"{path} exists; choose a new bag path")
    ts = get_typestore(Stores.ROS2_KILTED)
    plugin = StoragePlugin.MCAP if cfg.storage == "mcap" else StoragePlugin.SQLITE3
    img_type = "sensor_msgs/msg/CompressedImage" if cfg.compressed != "none" else "sensor_msgs/msg/Image"
    rng = np.random.default_rng(cfg.seed)
    dt = 1.0 / cfg.rate_hz
    counts = {k: 0 for k in TOPICS}
    steps, t = 0, cfg.start_time_s
    with Writer(path, version=9, storage_plugin=plugin) as writer:
        conns = {
            "agentview": writer.add_connection(TOPICS["agentview"], img_type, typestore=ts),
            "wrist": writer.add_connection(TOPICS["wrist"], img_type, typestore=ts),
            "pose": writer.add_connection(TOPICS["pose"], "geometry_msgs/msg/PoseStamped", typestore=ts),
            "instruction": writer.add_connection(TOPICS["instruction"], "std_msgs/msg/String", typestore=ts),
            "episode_result": writer.add_connection(TOPICS["episode_result"], "std_msgs/msg/Bool", typestore=ts),
        }

        def put(key: str, msg: Any, msgtype: str, t_s: float) -> None:
            writer.write(conns[key], int(round(t_s * 1e9)), ts.serialize_cdr(msg, msgtype))
            counts[key] += 1

        tasks = synthetic.TASKS[: cfg.tasks]
        episode_key = None
        for s in synthetic.episodes(cfg.seed, cfg.episodes, cfg.steps, cfg.image_size, tasks=tasks):
            if (s.instruction, s.episode) != episode_key:
                if episode_key is not None:
                    put("episode_result", ts.types["std_msgs/msg/Bool"](data=True), "std_msgs/msg/Bool", t)
                    t += dt
                episode_key = (s.instruction, s.episode)
                text = cfg.instruction or s.instruction
                put("instruction", ts.types["std_msgs/msg/String"](data=text), "std_msgs/msg/String", t)
                t += dt
            put("pose", _pose(ts, s.ee_pos, t), "geometry_msgs/msg/PoseStamped", t)
            for view in VIEWS:
                ti = t + float(rng.uniform(0.0, cfg.jitter_s))
                msgtype, msg = _image(ts, s.images[view], ti, view, cfg)
                put(view, msg, msgtype, ti + 1e-4)
            steps += 1
            t += dt
        put("episode_result", ts.types["std_msgs/msg/Bool"](data=True), "std_msgs/msg/Bool", t)
    return {"path": str(path), "steps": steps, "messages": counts, "config": dataclasses.asdict(cfg)}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="make_bag", description=__doc__.split("\n\n")[0])
    parser.add_argument("out", help="bag directory to create")
    for f in dataclasses.fields(MakeBagConfig):
        flag = "--" + f.name.replace("_", "-")
        parser.add_argument(flag, type=type(f.default), default=f.default, help=f"(default {f.default})")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(MakeBagConfig)}
    try:
        summary = make_bag(args.out, MakeBagConfig(**values))
    except ConfigError as err:
        print(f"make_bag: {err}", file=sys.stderr)
        return 2
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
