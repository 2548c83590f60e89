"""Write a rosbag2 shaped like a robot's own recording (benchmarks and tests of `heisd replay`).

Usage:
    python -m heisd_ros.tools.make_recording OUT_BAG [--seconds 10] [--rate-hz 30] [--width 640]
                                             [--height 480] [--no-extras] [--storage mcap|sqlite3]

Unlike `heisd_ros.tools.make_bag` (the node's own topic names, the tiny policy's world), this is
what a recorder on a real arm writes: cameras under their driver's names (`/cam_high/image_raw`,
`/cam_wrist/image_raw`, rgb8 at the camera rate), the end-effector pose on `/ee` and the finger
joints on `/joint_states` logged after the images of the same instant, the instruction once, the
demonstrated action on `/arm_command`, and topics the policy does not read: a depth camera
(16UC1, at a fifth of the rate), `/robot_description` (latched) and `/diagnostics` (1 Hz). Frames
are a moving pattern (no renderer), so minutes of 640x480 video take seconds to write: two cameras
at 30 Hz are about 3.3 GB a minute. Deterministic for a given configuration.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from heisd_ros.core.errors import ConfigError, HeisdError
from heisd_ros.core.gripper import PANDA_FINGER_JOINTS
from heisd_ros.pipeline import bags

CAMERAS = ("/cam_high/image_raw", "/cam_wrist/image_raw")
DEPTH = "/cam_high/depth/image_raw"
POSE = "/ee"
JOINT_STATES = "/joint_states"
INSTRUCTION = "/instruction"
COMMAND = "/arm_command"
EXTRAS = {DEPTH: bags.IMAGE, "/robot_description": bags.STRING, "/diagnostics": "diagnostic_msgs/msg/DiagnosticArray"}
"""Topics a recording carries that the policy node does not read."""


@dataclass(frozen=True)
class RecordingConfig:
    """What the recording contains."""

    seconds: float = 10.0
    rate_hz: float = 30.0
    """Camera (and pose) rate."""
    width: int = 640
    height: int = 480
    extras: bool = True
    """Also write the depth camera, /robot_description and /diagnostics."""
    instruction: str = "pick up the red bowl"
    storage: str = "mcap"
    start_time_s: float = 1_700_000_000.0

    def __post_init__(self) -> None:
        if not (self.seconds > 0 and self.rate_hz > 0):
            raise ConfigError("seconds and rate_hz must be > 0")
        if not (8 <= self.width <= 4096 and 8 <= self.height <= 4096):
            raise ConfigError("width and height must be in [8, 4096]")
        if self.storage not in bags.STORAGES:
            raise ConfigError(f"storage must be one of {bags.STORAGES}")


def _frames(cfg: RecordingConfig) -> list[np.ndarray]:
    """Two base patterns (one per camera) that frames are shifted copies of."""
    y, x = np.mgrid[0 : cfg.height, 0 : cfg.width]
    return [np.stack([(x * (1 + k)) % 256, (y * 2) % 256, ((x + y) * (3 - k)) % 256], axis=2).astype(np.uint8)
            for k in range(len(CAMERAS))]  # fmt: skip


def _pose(t: float) -> np.ndarray:
    return np.array([0.4 + 0.1 * np.sin(0.5 * t), 0.1 * np.cos(0.5 * t), 0.3 + 0.05 * np.sin(t)])


def _declare(bag: bags.BagWriter, cfg: RecordingConfig) -> None:
    for cam in CAMERAS:
        bag.add(cam, bags.IMAGE)
    for topic, msgtype in ((POSE, bags.POSE), (JOINT_STATES, bags.JOINT_STATE), (COMMAND, bags.ARM_COMMAND)):
        bag.add(topic, msgtype)
    bag.add(INSTRUCTION, bags.STRING, latched=True)
    if cfg.extras:
        for topic, msgtype in EXTRAS.items():
            bag.add(topic, msgtype, latched=topic == "/robot_description")


def _extras(bag: bags.BagWriter, cfg: RecordingConfig, k: int, t_ns: int, depth: np.ndarray) -> None:
    T = bag.ts.types
    if k == 0:
        bag.write("/robot_description", t_ns, T[bags.STRING](data="<robot name='arm'/>"))
    if k % 5 == 0:
        hdr = bags.header(t_ns, "cam_high_depth")
        bag.write(DEPTH, t_ns + 300_000, T[bags.IMAGE](header=hdr, height=cfg.height, width=cfg.width,
                                                      encoding="16UC1", is_bigendian=0, step=cfg.width * 2,
                                                      data=np.roll(depth, k, axis=1).view(np.uint8).reshape(-1)))  # fmt: skip
    if k % max(1, int(round(cfg.rate_hz))) == 0:
        status = T["diagnostic_msgs/msg/DiagnosticStatus"](level=0, name="arm: driver", message="ok",
                                                           hardware_id="arm", values=[])  # fmt: skip
        bag.write("/diagnostics", t_ns + 400_000, T["diagnostic_msgs/msg/DiagnosticArray"](
            header=bags.header(t_ns, ""), status=[status]))


def make_recording(path: str | Path, cfg: RecordingConfig = RecordingConfig()) -> dict:
    """Write the recording at `path` (must not exist). Returns a summary."""
    path = Path(path)
    if path.exists():
        raise ConfigError(f"{path} exists; choose a new bag path")
    frames = _frames(cfg)
    depth = (frames[0][:, :, 0].astype(np.uint16) * 8).copy()
    n = int(round(cfg.seconds * cfg.rate_hz))
    dt_ns = int(round(1e9 / cfg.rate_hz))
    t0 = int(cfg.start_time_s * 1e9)
    with bags.BagWriter(path, cfg.storage) as bag:
        _declare(bag, cfg)
        bag.write(INSTRUCTION, t0, bag.ts.types[bags.STRING](data=cfg.instruction))
        for k in range(n):
            t_ns = t0 + (k + 1) * dt_ns
            for c, cam in enumerate(CAMERAS):
                frame = np.roll(frames[c], 3 * k, axis=1)
                bag.write(cam, t_ns + 1000 * c, bags.image_msg(bags.header(t_ns, cam.split("/")[1]), frame))
            # a recorder logs the arm's state after the images of the same instant
            pos, nxt = _pose(t_ns * 1e-9 - cfg.start_time_s), _pose((t_ns + dt_ns) * 1e-9 - cfg.start_time_s)
            bag.write(POSE, t_ns + 100_000, bags.pose_msg(bags.header(t_ns, "base_link"), pos))
            gap = 0.02 + 0.015 * np.sin(0.3 * k / cfg.rate_hz)
            bag.write(JOINT_STATES, t_ns + 150_000,
                      bags.joint_state_msg(bags.header(t_ns, ""), PANDA_FINGER_JOINTS, [gap / 2, gap / 2]))  # fmt: skip
            action = np.concatenate([(nxt - pos) * cfg.rate_hz, np.zeros(3), [-1.0]])
            bag.write(COMMAND, t_ns + 200_000, bags.arm_command_msg(bags.header(t_ns, "base_link"), k + 1, action,
                                                                    "demo", "demo"))  # fmt: skip
            if cfg.extras:
                _extras(bag, cfg, k, t_ns, depth)
    size = sum(f.stat().st_size for f in path.iterdir())
    return {"path": str(path), "steps": n, "bytes": size, "messages": dict(bag.counts),
            "config": dataclasses.asdict(cfg)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="make_recording", description=__doc__.split("\n\n")[0])
    p.add_argument("out", help="bag directory to create")
    d = RecordingConfig()
    for f in dataclasses.fields(RecordingConfig):
        if f.name == "extras":
            p.add_argument("--no-extras", dest="extras", action="store_false", help="cameras, pose, joints only")
        else:
            p.add_argument("--" + f.name.replace("_", "-"), type=type(getattr(d, f.name)), default=getattr(d, f.name))
    args = p.parse_args(argv)
    try:
        summary = make_recording(args.out, RecordingConfig(**{f.name: getattr(args, f.name)
                                                              for f in dataclasses.fields(RecordingConfig)}))  # fmt: skip
    except HeisdError as err:
        print(f"make_recording: {err}", file=sys.stderr)
        return 2
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
