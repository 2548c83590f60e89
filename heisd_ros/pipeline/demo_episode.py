"""The records every demonstration source gives (docs/design.md §4): `DemoEpisode`, one episode's
actions, poses, pixels and instruction, and `EpisodeRef`, where an episode lives without its pixels.

HDF5 files (`pipeline.episodes`), rosbag2 recordings (`pipeline.teleop_bags`) and LeRobot datasets
(`pipeline.lerobot_dataset`) all build these, so the readers share no code but this module.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from heisd_ros.core.gripper import finger_gap
from heisd_ros.pipeline.action_convention import DemoDataError

VIEWS = ("agentview", "wrist")
"""View names, primary (prompt) view first; the retrieval query uses all of them (docs/design.md §4)."""
HDF5_KEYS = {"agentview": "agentview_rgb", "wrist": "eye_in_hand_rgb"}
EPISODES_PER_TASK = 1000


@dataclass
class DemoEpisode:
    """One demonstration: per control step t the observation before action t."""

    dataset: str
    task: str
    """Partition key in the database: the instruction."""
    instruction: str
    episode: int
    source: str
    actions: np.ndarray  # [T, 7] unnormalised, in the policy's convention
    ee_pos: np.ndarray  # [T, 3] m
    images: dict[str, np.ndarray] = field(default_factory=dict)  # view -> [T, H, W, 3] uint8
    success: bool = True
    gripper_qpos: np.ndarray | None = None
    """[T, 2] finger joint positions (m) where the recording has them (HDF5 `obs/gripper_states`)."""

    @property
    def length(self) -> int:
        return int(self.actions.shape[0])

    def views(self, t: int, views: Sequence[str] = VIEWS) -> list[np.ndarray]:
        missing = [v for v in views if v not in self.images]
        if missing:
            raise DemoDataError(f"{self.source} has no {missing} view (it has {sorted(self.images)}): map a camera "
                                "to it, or pool fewer views (heisd build-db --query-views 1)")
        return [self.images[v][t] for v in views]

    def finger_gap(self, t: int) -> float | None:
        """The opening between the fingers before action t (m), or None where the recording has no
        finger positions (a bag): a model that reads the gap then rejects the step with a clear error."""
        return None if self.gripper_qpos is None else finger_gap(self.gripper_qpos[t])


@dataclass(frozen=True)
class EpisodeRef:
    """Where an episode lives, without its pixels: `kind` 'hdf5' (path + demo group), 'bag' (a
    rosbag2 directory) or 'lerobot' (a dataset directory + episode index)."""

    kind: str
    path: str
    demo: str
    dataset: str
    task: str
    episode: int
    length: int
    init_state_index: int = -1
    reader: Any = None
    """How a bag or LeRobot episode is read (`BagReading`, `LeRobotReading`); None = the defaults."""

    @property
    def source(self) -> str:
        """'<file name>:<demo group>': how train-vla's log names its held-out episodes."""
        return f"{Path(self.path).name}:{self.demo}"

    @property
    def key(self) -> str:
        """Stable cache key of the episode's pixels (and of what else the reading options change)."""
        if self.kind == "hdf5":
            return f"{Path(self.path).stem}__{self.demo}"
        options = "" if self.reader is None else f"__{self.reader.digest()}"
        return f"{self.kind}__{self.dataset}__{self.episode}{options}"
