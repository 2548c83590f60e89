"""Write a short synthetic rosbag2 on the policy node's input topics (tests, `heisd demo`).

Usage:
    python -m heisd_ros.tools.make_bag OUT_BAG [--episodes 1] [--steps 20] [--seed 1] [--rate-hz 10]
                                       [--image-size 64] [--storage mcap|sqlite3] [--encoding rgb8]
                                       [--compressed none|png|jpeg] [--jitter-s 0.005]

Per episode: the instruction (std_msgs/String), then per step the end-effector pose
(geometry_msgs/PoseStamped) and one image per view (sensor_msgs/Image or CompressedImage) whose
stamps differ by at most `jitter_s`, and at the end the episode result (std_msgs/Bool). The scenes
come from `heisd_ros.pipeline.synthetic_demos` (the tiny model's world) with their own seed, so a
bag is held-out data for the tiny database. Each step also records its demonstrated action on /arm_command
(heisd_ros/ArmCommand, the tiny policy's action definition), which `heisd replay --plots` draws the
node's commands against; the replay never publishes it. Deterministic for a given configuration.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from heisd_ros.core.errors import ConfigError, HeisdError
from heisd_ros.pipeline.bags import (
    ARM_COMMAND,
    BOOL,
    COMPRESSED_IMAGE,
    IMAGE,
    POSE,
    STORAGES,
    STRING,
    BagTopics,
    BagWriter,
    arm_command_msg,
    compressed_image_msg,
    header,
    image_msg,
    pose_msg,
)

VIEWS = ("agentview", "wrist")
_NODE_TOPICS = BagTopics()
TOPICS = {**dict(_NODE_TOPICS.images), "pose": _NODE_TOPICS.ee_pose, "instruction": _NODE_TOPICS.instruction,
          "episode_result": _NODE_TOPICS.episode_result, "command": _NODE_TOPICS.command}  # fmt: skip
"""Summary key -> topic: the node's default topics (config/policy.yaml) in the root namespace; `command`
carries the demonstrated action of each step (heisd_ros/ArmCommand, as recorded from a teleoperated arm)."""


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
        from heisd_ros.core.image_codec import SUPPORTED_ENCODINGS
        from heisd_ros.pipeline.synthetic_demos import TASKS

        if self.episodes < 1 or self.steps < 1:
            raise ConfigError("episodes and steps must be >= 1")
        if not (math.isfinite(self.rate_hz) and self.rate_hz > 0):
            raise ConfigError("rate_hz must be > 0")
        if not 8 <= self.image_size <= 1024:
            raise ConfigError("image_size must be in [8, 1024]")
        if self.storage not in STORAGES:
            raise ConfigError(f"storage must be mcap or sqlite3, got {self.storage!r}")
        if self.encoding not in SUPPORTED_ENCODINGS:
            raise ConfigError(f"encoding must be one of {SUPPORTED_ENCODINGS}")
        if self.compressed not in ("none", "png", "jpeg"):
            raise ConfigError("compressed must be none, png or jpeg")
        if not 0 <= self.jitter_s < 0.5 / self.rate_hz:
            raise ConfigError("jitter_s must be in [0, half a step)")
        if not 1 <= self.tasks <= len(TASKS):
            raise ConfigError(f"tasks must be in [1, {len(TASKS)}]")


def _ns(t_s: float) -> int:
    return int(round(t_s * 1e9))


def _image(rgb: np.ndarray, t_s: float, frame: str, cfg: MakeBagConfig) -> Any:
    hdr = header(_ns(t_s), frame)
    if cfg.compressed != "none":
        return compressed_image_msg(hdr, rgb, cfg.compressed)
    return image_msg(hdr, rgb, cfg.encoding)


def _episodes(cfg: MakeBagConfig):
    """Each episode's steps and its demonstrated actions [T, 7] (the tiny policy's action definition)."""
    from heisd_ros.pipeline import synthetic_demos
    from heisd_ros.pipeline.tiny_artifacts import synthetic_actions

    steps: list = []
    tasks = synthetic_demos.TASKS[: cfg.tasks]
    for s in synthetic_demos.episodes(cfg.seed, cfg.episodes, cfg.steps, cfg.image_size, tasks=tasks):
        if steps and (s.instruction, s.episode) != (steps[0].instruction, steps[0].episode):
            yield steps, synthetic_actions(np.stack([x.ee_pos for x in steps]))
            steps = []
        steps.append(s)
    if steps:
        yield steps, synthetic_actions(np.stack([x.ee_pos for x in steps]))


def make_bag(path: str | Path, cfg: MakeBagConfig = MakeBagConfig()) -> dict:
    """Write the bag at `path` (must not exist). Returns a summary (steps, topics, messages)."""
    path = Path(path)
    if path.exists():
        raise ConfigError(f"{path} exists; choose a new bag path")
    img_type = COMPRESSED_IMAGE if cfg.compressed != "none" else IMAGE
    # image_transport's names: a compressed stream is <camera>/image_raw/compressed, as the node reads it
    names = {**TOPICS, **{v: TOPICS[v] + "/compressed" for v in VIEWS if cfg.compressed != "none"}}
    rng = np.random.default_rng(cfg.seed)
    dt = 1.0 / cfg.rate_hz
    steps, t = 0, cfg.start_time_s
    with BagWriter(path, cfg.storage) as bag:
        for key, msgtype in (("agentview", img_type), ("wrist", img_type), ("pose", POSE), ("instruction", STRING),
                             ("episode_result", BOOL), ("command", ARM_COMMAND)):  # fmt: skip
            bag.add(names[key], msgtype)
        done = bag.ts.types[BOOL](data=True)
        for e, (episode, actions) in enumerate(_episodes(cfg)):
            if e:
                bag.write(TOPICS["episode_result"], _ns(t), done)
                t += dt
            text = cfg.instruction or episode[0].instruction
            bag.write(TOPICS["instruction"], _ns(t), bag.ts.types[STRING](data=text))
            t += dt
            for k, s in enumerate(episode):
                bag.write(TOPICS["pose"], _ns(t), pose_msg(header(_ns(t), "base_link"), s.ee_pos))
                for view in VIEWS:
                    ti = t + float(rng.uniform(0.0, cfg.jitter_s))
                    bag.write(names[view], _ns(ti + 1e-4), _image(s.images[view], ti, view, cfg))
                # the demonstrated action of this step, as a recording of a teleoperated arm carries it
                cmd = arm_command_msg(header(_ns(t), "base_link"), k + 1, actions[k], "demo", "demo")
                bag.write(TOPICS["command"], _ns(t + 2e-4), cmd)
                steps += 1
                t += dt
        bag.write(TOPICS["episode_result"], _ns(t), done)
    counts = {key: bag.counts[topic] for key, topic in names.items()}
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
    except HeisdError as err:
        print(f"make_bag: {err}", file=sys.stderr)
        return 2
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
