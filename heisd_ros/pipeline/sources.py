"""The demonstration sources of one tool run, shared by `heisd build-db`, `train-drafter` and
`calibrate`: LIBERO-layout HDF5 files, rosbag2 recordings and a LeRobot dataset, with the options
that say how to read the latter two.

`EpisodeSources.refs` lists every episode (`EpisodeRef`, loaded later with `load_episode`);
`EpisodeSources.check` reads every episode's actions once, without images, and refuses sources
that break the action convention or do not fit the model's action statistics
(`heisd_ros.pipeline.action_convention`), before anything is embedded.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from heisd_ros.core.errors import ConfigError
from heisd_ros.core.gripper import PANDA_FINGER_JOINTS
from heisd_ros.pipeline.action_convention import ACTION_NAMES, ActionConvention, DemoDataError
from heisd_ros.pipeline.episodes import EpisodeRef, load_episode, scan_hdf5


@dataclass(frozen=True)
class SourceOptions:
    """How recordings and LeRobot datasets are read (the tools' source flags)."""

    source_map: str = ""
    """`--map`: TOPIC=ROLE pairs for bags (default: the node's own topics), SOURCE=ROLE pairs for a
    LeRobot dataset (required: its cameras and end-effector position)."""
    instruction: str = ""
    """The task of bags without an instruction topic."""
    finger_joints: tuple[str, str] = PANDA_FINGER_JOINTS
    """Finger joint names in a bag's `fingers` JointState topic."""
    twist_linear_scale: float = 1.0
    """A TwistStamped action's linear velocity = delta position * this."""
    twist_angular_scale: float = 1.0
    gripper_open_positive: bool = False
    gripper_range: tuple[float, float] = (-1.0, 1.0)
    trust_actions: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "gripper_range", tuple(float(x) for x in self.gripper_range))
        object.__setattr__(self, "finger_joints", tuple(self.finger_joints))
        if len(self.finger_joints) != 2:
            raise ConfigError(f"finger_joints names two joints, got {list(self.finger_joints)}")
        ActionConvention(self.gripper_open_positive, self.gripper_range, self.trust_actions)  # its range check

    @property
    def convention(self) -> ActionConvention:
        return ActionConvention(self.gripper_open_positive, self.gripper_range, self.trust_actions)


@dataclass(frozen=True)
class EpisodeSources:
    """Where a tool's episodes come from."""

    demos: str = ""
    """LIBERO-layout *.hdf5 files (a directory or one file)."""
    bags: str = ""
    """A directory with rosbag2 recordings below it."""
    lerobot: str = ""
    """A LeRobot dataset directory (meta/info.json)."""
    dataset: str = ""
    """Dataset name in point ids ('' = the HDF5 'suite' attribute, '<parent of bags>_bags', the
    LeRobot directory's name)."""
    tasks: tuple[int, ...] | None = None
    """HDF5 task indices, or LeRobot task indices, to keep (None = all)."""
    options: SourceOptions = field(default_factory=SourceOptions)

    def __post_init__(self) -> None:
        if not (self.demos or self.bags or self.lerobot):
            raise ConfigError("give --demos (LIBERO HDF5), --bags (rosbag2 recordings) and/or --lerobot "
                              "(a LeRobot dataset)")
        if self.options.source_map and self.bags and self.lerobot:
            raise ConfigError("--map names the topics of --bags or the features of --lerobot: give one of them per run")
        if self.lerobot and not self.options.source_map:
            raise ConfigError("--lerobot needs --map naming its cameras and end-effector position, e.g. "
                              "--map observation.images.front=agentview,observation.state[0:3]=pose")
        if self.options.instruction and not self.bags:
            raise ConfigError("--instruction gives the task of bags (LeRobot datasets name their tasks)")

    @staticmethod
    def of(cfg) -> EpisodeSources:
        """The sources a tool's config names (fields demos, bags, lerobot, dataset, tasks, source_options)."""
        return EpisodeSources(cfg.demos, cfg.bags, cfg.lerobot, cfg.dataset, cfg.tasks, cfg.source_options)

    def bag_reading(self):
        """The BagReading of `bags`, or None for the defaults (the node's topics, LIBERO convention)."""
        from heisd_ros.pipeline.teleop_bags import BagReading, TopicMap

        o = self.options
        topics = TopicMap.parse(o.source_map) if o.source_map else TopicMap.node_topics()
        reading = BagReading(topics, o.instruction, o.finger_joints, o.twist_linear_scale,
                             o.twist_angular_scale, convention=o.convention)
        return None if reading == BagReading() else reading

    def refs(self) -> list[EpisodeRef]:
        """Every episode of the sources; (dataset, episode) is unique."""
        from heisd_ros.pipeline.lerobot_dataset import LeRobotReading, scan_lerobot
        from heisd_ros.pipeline.teleop_bags import scan_bags

        refs: list[EpisodeRef] = []
        if self.demos:
            refs += [dataclasses.replace(r, dataset=self.dataset) if self.dataset else r
                     for r in scan_hdf5(self.demos, self.tasks)]
        if self.bags:
            refs += scan_bags(self.bags, self.dataset or f"{Path(self.bags).resolve().parent.name}_bags",
                              self.bag_reading())
        if self.lerobot:
            reading = LeRobotReading.parse(self.options.source_map, self.options.convention)
            refs += scan_lerobot(self.lerobot, self.dataset or Path(self.lerobot).resolve().name, reading, self.tasks)
        clash = [k for k, n in Counter((r.dataset, r.episode) for r in refs).items() if n > 1]
        if clash:
            raise DemoDataError(f"episodes {clash[:3]} come from two sources under one dataset name: give each "
                                "source its own run with its own --dataset")
        return refs

    def check(self, refs: Sequence[EpisodeRef], stats=None) -> dict:
        """Read every episode's actions (no images) and apply the action checks: the convention's
        heuristics per bag / LeRobot source, the fit to `stats` (the model's NormStats) over all.
        Returns a summary for the tool's report; raises DemoDataError."""
        by_kind: dict[str, list] = {}
        for ref in refs:
            ep = load_episode(ref, with_images=False)
            by_kind.setdefault(ref.kind, []).append((ep.source, ep.actions, ep.ee_pos))
        convention = self.options.convention
        for kind, episodes in by_kind.items():
            if kind != "hdf5":  # LIBERO's own files define the convention
                convention.check_dataset(episodes)
        actions = np.concatenate([a for eps in by_kind.values() for _, a, _ in eps]) if by_kind else np.zeros((0, 7))
        if stats is not None:
            convention.check_fits_model(actions, stats.q01, stats.q99, stats.mask, "the demonstrations")
        lo, hi = (np.percentile(actions, q, axis=0).tolist() if len(actions) else [] for q in (1, 99))
        return {"episodes": len(refs), "steps": len(actions), "trusted": convention.trust_actions,
                "p01": dict(zip(ACTION_NAMES, lo)), "p99": dict(zip(ACTION_NAMES, hi)),
                "episodes_starting_closed": sum(int(a[0, 6] > 0) for eps in by_kind.values() for _, a, _ in eps
                                                if len(a))}
