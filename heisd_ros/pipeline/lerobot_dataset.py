"""LeRobot datasets (layouts v2.x and v3) as demonstration episodes, read with pyarrow and PyAV.

The `lerobot` package pins an older torch than heisd_ros runs, so the format is read directly:

- `meta/info.json`: `codebase_version`, `fps`, `features` (per key: dtype, shape, names), the path
  templates `data_path` / `video_path` and `chunks_size`;
- v2.x: `meta/episodes.jsonl` (episode_index, tasks, length), `meta/tasks.jsonl` (task_index,
  task), one parquet file per episode, one mp4 per episode and camera (episode time = video time);
- v3: `meta/episodes/chunk-*/file-*.parquet` (episode_index, tasks, length, data/chunk_index,
  data/file_index, videos/<key>/{chunk_index, file_index, from_timestamp, to_timestamp}),
  `meta/tasks.parquet` (task_index, the task as index), parquet and mp4 files shared by several
  episodes (an episode's frame at time t is at from_timestamp + t in its video).

Frame rows carry the feature columns plus `timestamp`, `frame_index`, `episode_index` and
`task_index`. A camera is a feature of dtype `video` (decoded from the mp4, the frame nearest each
row's timestamp, within half a frame period) or `image` (PNG/JPEG bytes in the parquet column).

A column map names what the policy reads, `SOURCE=ROLE` pairs (`heisd build-db --map`), where a
source is a feature key, optionally with columns: `observation.state[0:3]` (a slice) or
`observation.state[6,7]` (indices):

| role | what |
|---|---|
| agentview, wrist | camera features (video or image), primary first |
| pose | 3 columns: end-effector position, m |
| action | 7 columns (delta xyz, delta rpy, gripper), or 6 with a separate gripper; default `action` |
| gripper | 1 column, the commanded gripper (with a 6-column action) |
| fingers | 2 columns: finger joint positions, m (optional) |

The actions then go through the action convention (`heisd_ros.pipeline.action_convention`).
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from heisd_ros.core.files import parse_json, read_capped_text, read_json
from heisd_ros.pipeline.action_convention import ActionConvention, DemoDataError
from heisd_ros.pipeline.demo_episode import VIEWS, DemoEpisode, EpisodeRef

ROLES = (*VIEWS, "pose", "action", "gripper", "fingers")
_COLUMN = re.compile(r"^(?P<key>[^\[\]]+?)(?:\[(?P<a>\d*):(?P<b>\d*)\]|\[(?P<idx>\d+(?:\s*,\s*\d+)*)\])?$")


@dataclass(frozen=True)
class Column:
    """A feature key and the columns of it to read (None = all)."""

    key: str
    columns: tuple[int, ...] | None = None

    @staticmethod
    def parse(text: str) -> Column:
        m = _COLUMN.match(text.strip())
        if not m:
            raise DemoDataError(f"bad column {text!r}: expected KEY, KEY[a:b] or KEY[i,j,...]")
        if m.group("idx"):
            return Column(m.group("key"), tuple(int(i) for i in m.group("idx").split(",")))
        if m.group("a") is not None or m.group("b") is not None:
            a, b = int(m.group("a") or 0), m.group("b")
            if not b:
                raise DemoDataError(f"bad column {text!r}: a slice needs its end, e.g. KEY[0:3]")
            return Column(m.group("key"), tuple(range(a, int(b))))
        return Column(m.group("key"))

    def __str__(self) -> str:
        return self.key if self.columns is None else f"{self.key}[{','.join(map(str, self.columns))}]"


@dataclass(frozen=True)
class LeRobotReading:
    """How a LeRobot dataset is read: the column map and the action convention."""

    views: tuple[tuple[str, str], ...] = ()
    """(view, camera feature key) pairs, in `VIEWS` order."""
    pose: Column | None = None
    action: Column = Column("action")
    gripper: Column | None = None
    fingers: Column | None = None
    convention: ActionConvention = field(default_factory=ActionConvention)

    @staticmethod
    def parse(text: str, convention: ActionConvention | None = None) -> LeRobotReading:
        """'SOURCE=ROLE,...' -> LeRobotReading (see the module docstring)."""
        convention = convention or ActionConvention()
        roles: dict[str, str] = {}
        for item in filter(None, (s.strip() for s in _split_map(text))):
            source, sep, role = item.rpartition("=")
            if not sep or not source or role not in ROLES:
                raise DemoDataError(f"bad map entry {item!r}: expected SOURCE=ROLE with ROLE one of {list(ROLES)}")
            if role in roles:
                raise DemoDataError(f"role {role!r} is mapped twice ({roles[role]}, {source})")
            roles[role] = source
        cols = {r: Column.parse(roles[r]) for r in ("pose", "action", "gripper", "fingers") if r in roles}
        return LeRobotReading(views=tuple((v, roles[v]) for v in VIEWS if v in roles), convention=convention, **cols)

    def digest(self) -> str:
        """Short hash of these options (part of the cache key of an episode read with them)."""
        return hashlib.sha1(repr(self).encode()).hexdigest()[:8]


def _split_map(text: str) -> list[str]:
    """Split at commas outside brackets (`observation.state[6,7]` holds one)."""
    out, depth, cur = [], 0, ""
    for ch in text:
        depth += (ch == "[") - (ch == "]")
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    return out + [cur]


class LeRobotLayout:
    """The metadata of one LeRobot dataset directory: features, episodes, tasks and file paths."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        info_path = self.root / "meta" / "info.json"
        try:
            info = read_json(info_path, DemoDataError)
        except (OSError, json.JSONDecodeError) as err:
            raise DemoDataError(f"{info_path}: not a LeRobot dataset ({err})") from err
        self.version = str(info.get("codebase_version", ""))
        if not re.match(r"v[23]\.", self.version):
            raise DemoDataError(f"{info_path}: codebase_version {self.version!r}; LeRobot layouts v2.x and v3 are read")
        try:
            self.fps = float(info["fps"])
            self.features: dict[str, dict] = dict(info["features"])
            self.data_path = str(info["data_path"])
        except (KeyError, TypeError, ValueError) as err:
            raise DemoDataError(f"{info_path}: missing or bad {err}") from err
        self.video_path = str(info.get("video_path") or "")
        self.chunks_size = int(info.get("chunks_size", 1000))
        self.v3 = self.version.startswith("v3")
        self.tasks = self._read_tasks()
        self.episodes = self._read_episodes()

    def _read_tasks(self) -> dict[int, str]:
        if not self.v3:
            return {int(r["task_index"]): str(r["task"]) for r in _jsonl(self.root / "meta" / "tasks.jsonl")}
        table = _read_parquet(self.root / "meta" / "tasks.parquet").to_pydict()
        names = table.get("task") or table.get("__index_level_0__")
        if names is None or "task_index" not in table:
            raise DemoDataError(f"{self.root}/meta/tasks.parquet has no task / task_index columns")
        return {int(i): str(t) for i, t in zip(table["task_index"], names)}

    def _read_episodes(self) -> dict[int, dict]:
        if not self.v3:
            rows = _jsonl(self.root / "meta" / "episodes.jsonl")
        else:
            files = sorted((self.root / "meta" / "episodes").glob("chunk-*/file-*.parquet"))
            if not files:
                raise DemoDataError(f"{self.root}/meta/episodes/ holds no chunk-*/file-*.parquet")
            rows = []
            for f in files:
                table = _read_parquet(f)
                keep = [c for c in table.column_names if not c.startswith("stats/")]
                rows += table.select(keep).to_pylist()
        try:
            return {int(r["episode_index"]): r for r in rows}
        except (KeyError, TypeError, ValueError) as err:
            raise DemoDataError(f"{self.root}: episode metadata without episode_index ({err})") from err

    def task(self, episode: int) -> str:
        tasks = self.episodes[episode].get("tasks") or []
        if not tasks:
            raise DemoDataError(f"{self.root}: episode {episode} names no task")
        return str(tasks[0])

    def data_file(self, episode: int) -> Path:
        row = self.episodes[episode]
        if self.v3:
            rel = self.data_path.format(chunk_index=int(row["data/chunk_index"]),
                                        file_index=int(row["data/file_index"]))
        else:
            rel = self.data_path.format(episode_chunk=episode // self.chunks_size, episode_index=episode)
        return self.root / rel

    def video(self, episode: int, key: str) -> tuple[Path, float]:
        """(mp4 file, the episode's start time in it, s) of camera `key`."""
        if not self.video_path:
            raise DemoDataError(f"{self.root}: info.json has no video_path for the video feature {key}")
        row = self.episodes[episode]
        if not self.v3:
            rel = self.video_path.format(episode_chunk=episode // self.chunks_size, video_key=key,
                                         episode_index=episode)
            return self.root / rel, 0.0
        try:
            rel = self.video_path.format(video_key=key, chunk_index=int(row[f"videos/{key}/chunk_index"]),
                                         file_index=int(row[f"videos/{key}/file_index"]))
            return self.root / rel, float(row[f"videos/{key}/from_timestamp"])
        except (KeyError, TypeError) as err:
            raise DemoDataError(f"{self.root}: episode {episode} has no video metadata for {key} ({err})") from err

    def describe(self) -> str:
        """The features, for error messages: 'key (dtype, shape)'."""
        return ", ".join(f"{k} ({v.get('dtype')}, {v.get('shape')})" for k, v in self.features.items())


def _layout(root: str) -> LeRobotLayout:
    """The layout of `root`, read once per run of episodes (kept while meta/info.json is unchanged)."""
    info = Path(root) / "meta" / "info.json"
    stamp = info.stat().st_mtime_ns if info.is_file() else 0
    return _cached_layout(str(root), stamp)


@functools.lru_cache(maxsize=4)
def _cached_layout(root: str, info_mtime_ns: int) -> LeRobotLayout:
    return LeRobotLayout(root)


def _jsonl(path: Path) -> list[dict]:
    try:
        return [parse_json(line) for line in read_capped_text(path, DemoDataError).splitlines() if line.strip()]
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise DemoDataError(f"cannot read {path}: {err}") from err


def _read_parquet(path: Path, columns: Sequence[str] | None = None, filters: Any = None):
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        return pq.read_table(path, columns=list(columns) if columns else None, filters=filters)
    except (OSError, pa.ArrowException, ValueError) as err:
        raise DemoDataError(f"cannot read {path}: {err}") from err


def _check_reading(layout: LeRobotLayout, reading: LeRobotReading) -> None:
    """Refuse a column map that does not fit the dataset's features, naming what it has."""
    if not reading.views or reading.views[0][0] != VIEWS[0] or reading.pose is None:
        raise DemoDataError(f"map the primary camera and the end-effector position, e.g. "
                            f"--map observation.images.front={VIEWS[0]},observation.state[0:3]=pose; "
                            f"{layout.root} has {layout.describe()}")
    for view, key in reading.views:
        if layout.features.get(key, {}).get("dtype") not in ("video", "image"):
            raise DemoDataError(f"{key} ({view}) is not a video or image feature of {layout.root}: {layout.describe()}")
    width = {"pose": 3, "gripper": 1, "fingers": 2, "action": 6 if reading.gripper else 7}
    for role, n in width.items():
        col = getattr(reading, role)
        if col is None:
            continue
        feat = layout.features.get(col.key)
        if feat is None:
            raise DemoDataError(f"{col.key} ({role}) is not a feature of {layout.root}: {layout.describe()}")
        size = int(np.prod(feat.get("shape") or [1]))
        picked = col.columns if col.columns is not None else tuple(range(size))
        if any(i >= size for i in picked) or len(picked) != n:
            raise DemoDataError(f"{col} ({role}) selects {len(picked)} of the {size} values of {col.key}; "
                                f"{role} needs {n} (names: {feat.get('names')})")


def scan_lerobot(root: str | Path, dataset: str, reading: LeRobotReading,
                 tasks: Sequence[int] | None = None) -> list[EpisodeRef]:
    """EpisodeRefs of the dataset's episodes (optionally only those of the given task indices)."""
    layout = LeRobotLayout(root)
    _check_reading(layout, reading)
    index = {t: i for i, t in layout.tasks.items()}
    refs = []
    for ep in sorted(layout.episodes):
        task = layout.task(ep)
        if tasks is not None and index.get(task) not in set(tasks):
            continue
        refs.append(EpisodeRef("lerobot", str(layout.root), f"episode_{ep:06d}", dataset, task, ep,
                               int(layout.episodes[ep].get("length", -1)), reader=reading))
    if not refs:
        raise DemoDataError(f"no episodes in {root}" + (f" for tasks {list(tasks)}" if tasks is not None else ""))
    return refs


def _matrix(table: Any, col: Column, where: str) -> np.ndarray:
    """[N, k] float64 of a (list or scalar) column, the selected columns only."""
    import pyarrow as pa

    arr = table.column(col.key).combine_chunks()
    n = len(arr)
    if pa.types.is_list(arr.type) or pa.types.is_fixed_size_list(arr.type) or pa.types.is_large_list(arr.type):
        values = arr.flatten().to_numpy(zero_copy_only=False).astype(np.float64)
        if n and values.size % n:
            raise DemoDataError(f"{where}: {col.key} rows have different lengths")
        m = values.reshape(n, -1) if n else values.reshape(0, 0)
    else:
        m = arr.to_numpy(zero_copy_only=False).astype(np.float64).reshape(n, 1)
    return m if col.columns is None else m[:, list(col.columns)]


def _decode_video(path: Path, times_s: np.ndarray, tolerance_s: float) -> np.ndarray:
    """RGB frames [N, H, W, 3] uint8 of `path` nearest each time (s), each within `tolerance_s`."""
    import av

    start, end = float(times_s.min()), float(times_s.max())
    frames, stamps = [], []
    try:
        with av.open(str(path)) as container:
            stream = container.streams.video[0]
            if start > tolerance_s:
                container.seek(int((start - tolerance_s) / stream.time_base), stream=stream, backward=True)
            for frame in container.decode(stream):
                t = float(frame.pts * frame.time_base)
                if t < start - tolerance_s:
                    continue
                if t > end + tolerance_s:
                    break
                frames.append(frame.to_ndarray(format="rgb24"))
                stamps.append(t)
    except (OSError, av.FFmpegError, IndexError) as err:
        raise DemoDataError(f"cannot decode {path}: {err}") from err
    if not frames:
        raise DemoDataError(f"{path}: no frame between {start:.3f} and {end:.3f} s")
    stamps_arr = np.asarray(stamps)
    pick = np.abs(stamps_arr[None, :] - times_s[:, None]).argmin(1)
    worst = float(np.abs(stamps_arr[pick] - times_s).max())
    if worst > tolerance_s:
        raise DemoDataError(f"{path}: a frame is {worst:.3f} s from its row's timestamp (> {tolerance_s:.3f} s)")
    return np.stack([frames[i] for i in pick])


def _decode_images(table: Any, key: str, root: Path) -> np.ndarray:
    """RGB frames [N, H, W, 3] uint8 of an `image` feature (PNG/JPEG bytes, or a path below root)."""
    import io

    from PIL import Image, UnidentifiedImageError

    out = []
    for cell in table.column(key).to_pylist():
        try:
            data = cell.get("bytes") if isinstance(cell, dict) else cell
            src = io.BytesIO(data) if data else root / str(cell["path"])
            with Image.open(src) as img:
                out.append(np.asarray(img.convert("RGB"), dtype=np.uint8))
        except (OSError, UnidentifiedImageError, KeyError, TypeError) as err:
            raise DemoDataError(f"{root}: cannot read an image of {key}: {err}") from err
    return np.stack(out)


def load_lerobot_episode(ref: EpisodeRef, with_images: bool = True) -> DemoEpisode:
    """One episode of a LeRobot dataset as a DemoEpisode in the policy's action convention
    (`with_images` False: no frame is decoded, `images` stays empty)."""
    reading: LeRobotReading = ref.reader
    layout = _layout(ref.path)
    if ref.episode not in layout.episodes:
        raise DemoDataError(f"{ref.path}: no episode {ref.episode}")
    where = f"{ref.path} episode {ref.episode}"
    path = layout.data_file(ref.episode)
    table = _read_parquet(path, filters=[("episode_index", "=", ref.episode)])
    if table.num_rows == 0:
        raise DemoDataError(f"{path}: no rows of episode {ref.episode}")
    if "frame_index" in table.column_names:
        table = table.sort_by("frame_index")
    raw = _matrix(table, reading.action, where)
    if reading.gripper is not None:
        raw = np.concatenate([raw, _matrix(table, reading.gripper, where)], axis=1)
    actions = reading.convention.to_policy(raw, where)
    ee_pos = _matrix(table, reading.pose, where)
    fingers = _matrix(table, reading.fingers, where) if reading.fingers is not None else None
    images = {}
    if with_images:
        times = _matrix(table, Column("timestamp"), where)[:, 0]
        for view, key in reading.views:
            if layout.features[key]["dtype"] == "image":
                images[view] = _decode_images(table, key, layout.root)
            else:
                video, start = layout.video(ref.episode, key)
                images[view] = _decode_video(video, start + times, 0.5 / layout.fps)
    return DemoEpisode(ref.dataset, ref.task, ref.task, ref.episode, where, actions, ee_pos, images,
                       gripper_qpos=fingers)
