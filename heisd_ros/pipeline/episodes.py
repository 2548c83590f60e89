"""Demonstration episodes for the mini VLA tools: LIBERO-layout HDF5 files and rosbag2 recordings.

Both sources give `DemoEpisode`s (raw 7-D actions, end-effector positions, one uint8 image
stream per view, the instruction). Episodes are listed first (`EpisodeRef`, no pixels) and loaded
one at a time, so a whole suite never has to sit in memory.

Episode numbers are stable, so database point ids (dataset/episode/step) stay the same when a
file grows: HDF5 demo i of task index k is episode k * 1000 + i; a bag `<task>/demo_i` is episode
(crc32(task) mod 100000) * 1000 + i.
"""

from __future__ import annotations

import logging
import re
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from heisd_ros.core.errors import DataFileError, HeisdError
from heisd_ros.core.gripper import finger_gap
from heisd_ros.pipeline.bags import BagError, BagTopics, image_rgb, read_messages
from heisd_ros.pipeline.data_checks import check_demo_hdf5

log = logging.getLogger(__name__)

VIEWS = ("agentview", "wrist")
"""View names, primary (prompt) view first; the retrieval query uses all of them (docs/design.md §4)."""
HDF5_KEYS = {"agentview": "agentview_rgb", "wrist": "eye_in_hand_rgb"}
EPISODES_PER_TASK = 1000


class DemoDataError(HeisdError):
    """Demonstrations cannot be found or read."""


@dataclass
class DemoEpisode:
    """One demonstration: per control step t the observation before action t."""

    dataset: str
    task: str
    """Partition key in the database: the instruction."""
    instruction: str
    episode: int
    source: str
    actions: np.ndarray  # [T, 7] raw (unnormalised)
    ee_pos: np.ndarray  # [T, 3] m
    images: dict[str, np.ndarray] = field(default_factory=dict)  # view -> [T, H, W, 3] uint8
    success: bool = True
    gripper_qpos: np.ndarray | None = None
    """[T, 2] finger joint positions (m) where the recording has them (HDF5 `obs/gripper_states`)."""

    @property
    def length(self) -> int:
        return int(self.actions.shape[0])

    def views(self, t: int, views: Sequence[str] = VIEWS) -> list[np.ndarray]:
        return [self.images[v][t] for v in views]

    def finger_gap(self, t: int) -> float | None:
        """The opening between the fingers before action t (m), or None where the recording has no
        finger positions (a bag): a model that reads the gap then rejects the step with a clear error."""
        return None if self.gripper_qpos is None else finger_gap(self.gripper_qpos[t])


@dataclass(frozen=True)
class EpisodeRef:
    """Where an episode lives, without its pixels: `kind` 'hdf5' (path + demo group) or 'bag' (path)."""

    kind: str
    path: str
    demo: str
    dataset: str
    task: str
    episode: int
    length: int
    init_state_index: int = -1

    @property
    def source(self) -> str:
        """'<file name>:<demo group>': how train-vla's log names its held-out episodes."""
        return f"{Path(self.path).name}:{self.demo}"

    @property
    def key(self) -> str:
        """Stable cache key of the episode's pixels."""
        return f"{Path(self.path).stem}__{self.demo}" if self.kind == "hdf5" else f"bag__{self.dataset}__{self.episode}"


def _demo_index(name: str) -> int:
    m = re.fullmatch(r"demo_(\d+)", name)
    if not m:
        raise DemoDataError(f"unexpected demo name {name!r} (expected demo_<i>)")
    return int(m.group(1))


# -- HDF5 ----------------------------------------------------------------------------------------


def hdf5_files(demos: str | Path) -> list[Path]:
    """The *.hdf5 files of a directory (sorted), or the file itself."""
    p = Path(demos)
    files = [p] if p.is_file() else sorted(p.glob("*.hdf5"))
    if not files:
        raise DemoDataError(f"no LIBERO HDF5 demonstrations (*.hdf5) in {p}")
    return files


def _attr(attrs: Any, key: str, default: Any = None) -> Any:
    v = attrs.get(key, default)
    return v.decode() if isinstance(v, bytes) else v


def scan_hdf5(demos: str | Path, tasks: Iterable[int] | None = None) -> list[EpisodeRef]:
    """Episodes of the LIBERO-layout files under `demos` (optionally only the given task indices).

    With `tasks`, a file that cannot be opened (e.g. one a running `gen-demos` is writing) is
    skipped with a warning; without, it is an error."""
    import h5py

    wanted = set(tasks) if tasks is not None else None
    refs = []
    for k, path in enumerate(hdf5_files(demos)):
        try:
            check_demo_hdf5(path)  # structure, dtypes, finite actions, no external links, before any read
        except DataFileError as err:
            if wanted is None:
                raise DemoDataError(str(err)) from err
            log.warning("skipping %s", err)
            continue
        try:
            with h5py.File(path, "r") as f:
                data = f["data"]
                task_index = int(_attr(data.attrs, "task_index", k))
                if wanted is not None and task_index not in wanted:
                    continue
                instruction = str(_attr(data.attrs, "instruction", "")).strip()
                if not instruction:
                    raise DemoDataError(f"{path}: data has no 'instruction' attribute")
                dataset = str(_attr(data.attrs, "suite", "") or Path(demos).name)
                # a second file of the same task numbers its episodes after an offset
                offset = int(_attr(data.attrs, "episode_offset", 0))
                for name in sorted(data.keys(), key=_demo_index):
                    g = data[name]
                    missing = [key for key in ("actions", "obs/ee_pos", *(f"obs/{v}" for v in HDF5_KEYS.values())) if key not in g]
                    if missing:
                        raise DemoDataError(f"{path}:{name} lacks {missing}")
                    refs.append(EpisodeRef(
                        "hdf5", str(path), name, dataset, instruction,
                        task_index * EPISODES_PER_TASK + offset + _demo_index(name), int(g["actions"].shape[0]),
                        int(g.attrs.get("init_state_index", -1)),
                    ))
        except (OSError, KeyError) as err:
            if wanted is None:
                raise DemoDataError(f"cannot read {path}: {err}") from err
            log.warning("skipping unreadable %s: %s", path, err)
    return refs


def load_hdf5_episode(ref: EpisodeRef, with_images: bool = True) -> DemoEpisode:
    import h5py

    try:
        with h5py.File(ref.path, "r") as f:
            g = f["data"][ref.demo]
            images = {v: g[f"obs/{k}"][()] for v, k in HDF5_KEYS.items()} if with_images else {}
            success = bool(g["dones"][-1]) if "dones" in g else True
            fingers = g["obs/gripper_states"][()].astype(np.float64) if "obs/gripper_states" in g else None
            return DemoEpisode(ref.dataset, ref.task, ref.task, ref.episode, f"{ref.path}:{ref.demo}",
                               g["actions"][()].astype(np.float64), g["obs/ee_pos"][()].astype(np.float64),
                               images, success, fingers)
    except (OSError, KeyError) as err:
        raise DemoDataError(f"cannot read {ref.path}:{ref.demo}: {err}") from err


# -- rosbag2 -------------------------------------------------------------------------------------

MAX_SKEW_S = 0.025
"""Largest |stamp difference| between a command and the image/pose it is paired with (s)."""


def bag_dirs(bags: str | Path) -> list[Path]:
    """rosbag2 directories (those holding metadata.yaml) under `bags`, sorted."""
    root = Path(bags)
    found = sorted({p.parent for p in root.rglob("metadata.yaml")})
    if not found:
        raise DemoDataError(f"no rosbag2 recordings (metadata.yaml) under {root}")
    return found


def _bag_episode_number(bag: Path) -> int:
    m = re.search(r"(\d+)$", bag.name)
    idx = int(m.group(1)) if m else zlib.crc32(bag.name.encode()) % EPISODES_PER_TASK
    return (zlib.crc32(bag.parent.name.encode()) % 100000) * EPISODES_PER_TASK + idx % EPISODES_PER_TASK


def _nearest(stamps: np.ndarray, t: int) -> int:
    i = int(np.searchsorted(stamps, t))
    cands = [j for j in (i - 1, i) if 0 <= j < len(stamps)]
    return min(cands, key=lambda j: abs(int(stamps[j]) - t))


def _bag_streams(bag: Path, topics: BagTopics) -> dict[str, list[tuple[int, Any]]]:
    """topic -> [(header stamp ns, or log time without a header, message)] of the topics an episode reads."""
    wanted = {t for _, t in topics.images} | {topics.ee_pose, topics.instruction, topics.command, topics.joint_states}
    streams: dict[str, list[tuple[int, Any]]] = {t: [] for t in wanted}
    try:
        for r in read_messages(bag, wanted):
            streams[r.topic].append((r.t_ns if r.stamp_ns is None else r.stamp_ns, r.msg))
    except BagError as err:
        raise DemoDataError(str(err)) from err
    return streams


def _rgb(bag: Path, msg: Any) -> np.ndarray:
    try:
        return image_rgb(msg)
    except BagError as err:
        raise DemoDataError(f"{bag}: {err}") from err


def load_bag_episode(bag: str | Path, dataset: str, topics: BagTopics = BagTopics(),
                     max_skew_s: float = MAX_SKEW_S) -> DemoEpisode:  # fmt: skip
    """Read one recording on the node's topics (as `heisd gen-demos` exports them): each command is
    paired with the image of every view and the pose nearest to it in header stamp (within
    `max_skew_s`); commands without a match are dropped. The finger joints are optional."""
    bag = Path(bag)
    streams = _bag_streams(bag, topics)
    if not streams[topics.instruction]:
        raise DemoDataError(f"{bag}: no message on {topics.instruction}")
    instruction = str(streams[topics.instruction][0][1].data).strip()
    commands = sorted(streams[topics.command], key=lambda x: x[0])
    if not commands:
        raise DemoDataError(f"{bag}: no message on {topics.command}")
    skew = int(max_skew_s * 1e9)
    series = {t: sorted(streams[t], key=lambda x: x[0]) for t in [v for _, v in topics.images] + [topics.ee_pose]}
    for t, s in series.items():
        if not s:
            raise DemoDataError(f"{bag}: no message on {t}")
    stamp_arrays = {t: np.array([x[0] for x in s], dtype=np.int64) for t, s in series.items()}
    fingers = _finger_series(streams[topics.joint_states], topics.finger_joints)
    finger_stamps = np.array([s for s, _ in fingers], dtype=np.int64)
    actions, poses, frames, finger_rows = [], [], {v: [] for v, _ in topics.images}, []
    for stamp, cmd in commands:
        picks = {t: _nearest(stamp_arrays[t], stamp) for t in series}
        if any(abs(int(stamp_arrays[t][i]) - stamp) > skew for t, i in picks.items()):
            continue
        actions.append(np.concatenate([np.asarray(cmd.delta_position, float), np.asarray(cmd.delta_rotation, float), [float(cmd.gripper)]]))
        p = series[topics.ee_pose][picks[topics.ee_pose]][1].pose.position
        poses.append([p.x, p.y, p.z])
        for view, topic in topics.images:
            frames[view].append(_rgb(bag, series[topic][picks[topic]][1]))
        j = _nearest(finger_stamps, stamp) if len(fingers) else -1
        finger_rows.append(fingers[j][1] if j >= 0 and abs(int(finger_stamps[j]) - stamp) <= skew else None)
    if not actions:
        raise DemoDataError(f"{bag}: no command could be paired with images and a pose within {max_skew_s} s")
    # the finger positions only where every kept step has them: a partial series would silently
    # mix measured and missing gaps
    qpos = np.asarray(finger_rows, float) if all(r is not None for r in finger_rows) else None
    return DemoEpisode(dataset, instruction, instruction, _bag_episode_number(bag), str(bag),
                       np.stack(actions), np.asarray(poses, float), {v: np.stack(f) for v, f in frames.items()},
                       gripper_qpos=qpos)


def _finger_series(messages: list[tuple[int, Any]], names: tuple[str, str]) -> list[tuple[int, np.ndarray]]:
    """(stamp, [q1, q2]) of the JointState messages that name both finger joints, by stamp."""
    out = []
    for stamp, msg in messages:
        listed = list(msg.name)
        if all(n in listed for n in names) and len(msg.position) == len(listed):
            out.append((stamp, np.array([float(msg.position[listed.index(n)]) for n in names])))
    return sorted(out, key=lambda x: x[0])


def scan_bags(bags: str | Path, dataset: str) -> list[EpisodeRef]:
    """EpisodeRefs of the recordings under `bags` (the task is read from the bag when loaded)."""
    return [EpisodeRef("bag", str(b), b.name, dataset, b.parent.name, _bag_episode_number(b), -1) for b in bag_dirs(bags)]


def load_episode(ref: EpisodeRef, with_images: bool = True) -> DemoEpisode:
    if ref.kind == "hdf5":
        return load_hdf5_episode(ref, with_images)
    return load_bag_episode(ref.path, ref.dataset)


# -- splits --------------------------------------------------------------------------------------


def split_episodes(refs: Sequence[EpisodeRef], val_fraction: float, seed: int) -> tuple[list[EpisodeRef], list[EpisodeRef]]:
    """(train, held-out) by whole episodes: `val_fraction` of each task's episodes, seeded, at
    least one per task when val_fraction > 0 and the task has two or more."""
    if not 0.0 <= val_fraction < 1.0:
        raise ValueError("val_fraction must be in [0, 1)")
    by_task: dict[str, list[EpisodeRef]] = {}
    for r in refs:
        by_task.setdefault(r.task, []).append(r)
    rng = np.random.default_rng(seed)
    train, val = [], []
    for task in sorted(by_task):
        group = by_task[task]
        n_val = 0 if val_fraction == 0 or len(group) < 2 else max(1, int(round(val_fraction * len(group))))
        chosen = set(rng.choice(len(group), n_val, replace=False).tolist()) if n_val else set()
        for i, r in enumerate(group):
            (val if i in chosen else train).append(r)
    return train, val
