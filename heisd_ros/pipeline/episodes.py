"""Demonstration episodes for the heisd tools: LIBERO-layout HDF5 files here; rosbag2 recordings
(`heisd_ros.pipeline.teleop_bags`) and LeRobot datasets (`heisd_ros.pipeline.lerobot_dataset`)
give the same records.

Every source gives `DemoEpisode`s (7-D actions in the policy's convention,
`heisd_ros.pipeline.action_convention`; end-effector positions; one uint8 image stream per view;
the instruction). Episodes are listed first (`EpisodeRef`, no pixels) and loaded one at a time, so
a whole suite never has to sit in memory.

Episode numbers are stable, so database point ids (dataset/episode/step) stay the same when a
source grows: HDF5 demo i of task index k is episode k * 1000 + i; a LeRobot episode keeps its
episode_index; bags are numbered by `teleop_bags.episode_number`.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from heisd_ros.core.errors import DataFileError
from heisd_ros.pipeline.action_convention import DemoDataError
from heisd_ros.pipeline.data_checks import check_demo_hdf5, read_dataset
from heisd_ros.pipeline.demo_episode import EPISODES_PER_TASK, HDF5_KEYS, VIEWS, DemoEpisode, EpisodeRef
from heisd_ros.pipeline.optional import optional_dependency

__all__ = ["EPISODES_PER_TASK", "HDF5_KEYS", "VIEWS", "DemoEpisode", "EpisodeRef", "load_episode", "scan_hdf5",
           "split_episodes"]

log = logging.getLogger(__name__)

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
    with optional_dependency("reading HDF5 demonstrations"):
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
    """The episode `ref` names, every dataset's declared size checked as it is read."""
    with optional_dependency("reading HDF5 demonstrations"):
        import h5py

    try:
        with h5py.File(ref.path, "r") as f:
            g = f["data"][ref.demo]

            def read(key: str) -> np.ndarray:
                return read_dataset(ref.path, g, key)

            images = {v: read(f"obs/{k}") for v, k in HDF5_KEYS.items()} if with_images else {}
            success = bool(read("dones")[-1]) if "dones" in g else True
            fingers = read("obs/gripper_states").astype(np.float64) if "obs/gripper_states" in g else None
            return DemoEpisode(ref.dataset, ref.task, ref.task, ref.episode, f"{ref.path}:{ref.demo}",
                               read("actions").astype(np.float64), read("obs/ee_pos").astype(np.float64),
                               images, success, fingers)
    except DataFileError as err:
        raise DemoDataError(str(err)) from err
    except (OSError, KeyError) as err:
        raise DemoDataError(f"cannot read {ref.path}:{ref.demo}: {err}") from err


# -- rosbag2 and LeRobot (heisd_ros.pipeline.teleop_bags, heisd_ros.pipeline.lerobot_dataset) ------


def load_episode(ref: EpisodeRef, with_images: bool = True) -> DemoEpisode:
    """The episode `ref` names, from whichever source it lives in, actions in the policy's convention."""
    if ref.kind == "hdf5":
        return load_hdf5_episode(ref, with_images)
    if ref.kind == "lerobot":
        from heisd_ros.pipeline.lerobot_dataset import load_lerobot_episode

        return load_lerobot_episode(ref, with_images)
    if ref.kind == "bag":
        from heisd_ros.pipeline.teleop_bags import load_bag_episode

        return load_bag_episode(ref.path, ref.dataset, ref.reader, with_images, episode=ref.episode)
    raise DemoDataError(f"unknown episode source {ref.kind!r}")


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
