"""Validation of untrusted demonstration files before anything reads their contents.

A LIBERO-layout HDF5 file (data/demo_<i>/{actions, obs/ee_pos, obs/<view>_rgb, ...}) comes from
another machine or person: `check_demo_hdf5` opens it read-only and checks its structure before a
reader loads arrays from it:

- it is an HDF5 file with a `data` group and (by default) an `instruction` attribute;
- demo groups are named demo_<i>; every required dataset is present, of a numeric dtype and the
  expected shape (actions [T, 7], obs/ee_pos [T, 3], images [T, H, W, 3] uint8), with one T per demo;
- actions and end-effector positions are finite;
- nothing points outside the file (external links, virtual datasets) and only the built-in
  filters are used (gzip, lzf, shuffle, fletcher32; no plugin is loaded to read it);
- sizes stay within stated limits (steps per demo, image pixels);
- no dataset anywhere in the file declares more than `MAX_DATASET_BYTES` (its shape times its item
  size, and its chunk shape times its item size): HDF5 lets a file of kilobytes declare a dataset
  of terabytes (chunks never written read as the fill value), and reading it allocates what it
  declares, so a damaged or hostile file would end in MemoryError, or swap, instead of an error.

Raises DataFileError naming the file and the offending group or dataset. `scan_hdf5`
(heisd_ros.pipeline.episodes) calls it once per file; the readers (`load_hdf5_episode`,
heisd_libero.sim.recorder's `read_hdf5_demos`) read every dataset through `read_dataset`, which checks
its declared size again (the file may have changed since it was scanned).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from heisd_ros.core.errors import DataFileError
from heisd_ros.core.types import ACTION_DIM
from heisd_ros.pipeline.optional import optional_dependency

HDF5_IMAGE_KEYS = ("agentview_rgb", "eye_in_hand_rgb")
"""LIBERO's image datasets under obs/ (views agentview and wrist)."""
MAX_STEPS_PER_DEMO = 100_000
MAX_IMAGE_PIXELS = 4096 * 4096
SAFE_FILTERS = {None, "gzip", "lzf"}
MAX_DATASET_BYTES = 2 << 30
"""Largest dataset (and chunk) accepted, by declared shape times item size: 2 GiB. A demo's image
stream is the largest dataset: LIBERO's are about 15 MB (300 frames of 128x128 RGB); 2 GiB holds
10,900 frames of 256x256 RGB (9 minutes at 20 Hz). An episode's read holds one dataset per view
and a few small ones, so a few times this at most."""


@dataclass(frozen=True)
class Hdf5Summary:
    path: str
    instruction: str
    demos: int
    steps: int
    image_hw: tuple[int, int] | None


def _fail(path: Path, where: str, why: str) -> DataFileError:
    return DataFileError(f"{path}:{where}: {why}" if where else f"{path}: {why}")


def declared_bytes(ds: Any) -> int:
    """What reading `ds` allocates by its own declaration: its shape, or one chunk (read and
    decompressed whole even for one element), whichever is larger, times its item size."""
    chunk = math.prod(ds.chunks) if ds.chunks else 0
    return ds.dtype.itemsize * max(math.prod(ds.shape or ()), chunk)


def check_dataset_size(path: Path, ds: Any, where: str) -> None:
    """DataFileError naming the file and dataset when `ds` declares more than MAX_DATASET_BYTES."""
    size = declared_bytes(ds)
    if size > MAX_DATASET_BYTES:
        raise _fail(path, where, f"declares {size} bytes (shape {ds.shape}, chunks {ds.chunks}, {ds.dtype}), more "
                                 f"than the {MAX_DATASET_BYTES} a dataset may have (a damaged file)")


def read_dataset(path: str | Path, group: Any, key: str) -> np.ndarray:
    """The whole dataset `group[key]`, its declared size checked first (`check_dataset_size`).
    KeyError where there is no such dataset, as `group[key]` raises it."""
    ds = group[key]
    check_dataset_size(Path(path), ds, f"{group.name}/{key}")
    return ds[()]


def _walk(path: Path, group: Any, prefix: str) -> None:
    """Reject external and soft links anywhere in the file (they can point at other files), and
    datasets that declare more than MAX_DATASET_BYTES."""
    import h5py

    for name in group:
        link = group.get(name, getlink=True)
        where = f"{prefix}/{name}"
        if isinstance(link, (h5py.ExternalLink, h5py.SoftLink)):
            raise _fail(path, where, f"{type(link).__name__} (only plain datasets and groups are accepted)")
        item = group.get(name)
        if isinstance(item, h5py.Group):
            _walk(path, item, where)
        elif isinstance(item, h5py.Dataset):
            check_dataset_size(path, item, where)


def _dataset(path: Path, group: Any, key: str, where: str, ndim: int, tail: tuple, kind: str) -> Any:
    import h5py

    ds = group.get(key)
    if not isinstance(ds, h5py.Dataset):
        raise _fail(path, f"{where}/{key}", "missing" if ds is None else "not a dataset")
    if ds.is_virtual:
        raise _fail(path, f"{where}/{key}", "virtual dataset (reads other files)")
    if ds.compression not in SAFE_FILTERS:
        raise _fail(path, f"{where}/{key}", f"compression filter {ds.compression!r} is not one of {sorted(map(str, SAFE_FILTERS))}")
    dtype_ok = ds.dtype == np.uint8 if kind == "u" else ds.dtype.kind in "fiu"
    if not dtype_ok:
        raise _fail(path, f"{where}/{key}", f"dtype {ds.dtype} (expected {'uint8' if kind == 'u' else 'numeric'})")
    if ds.ndim != ndim or any(t is not None and s != t for s, t in zip(ds.shape[1:], tail)):
        want = "[T, " + ", ".join("*" if t is None else str(t) for t in tail) + "]"
        raise _fail(path, f"{where}/{key}", f"shape {ds.shape}, expected {want}")
    return ds


def _finite(path: Path, ds: Any, where: str) -> None:
    values = np.asarray(ds[()], dtype=np.float64)
    if not np.all(np.isfinite(values)):
        raise _fail(path, where, "contains NaN or Inf")


def check_demo_hdf5(path: str | Path, require_instruction: bool = True,
                    image_keys: tuple[str, ...] = HDF5_IMAGE_KEYS) -> Hdf5Summary:  # fmt: skip
    """Validate a LIBERO-layout demonstration file (see the module docstring); returns a summary."""
    with optional_dependency("reading HDF5 demonstrations"):
        import h5py

    path = Path(path)
    if not path.is_file():
        raise _fail(path, "", "not found")
    try:
        f = h5py.File(path, "r")
    except OSError as err:
        raise _fail(path, "", f"not a readable HDF5 file ({err})") from err
    try:
        with f:
            return _check_open(path, f, require_instruction, image_keys)
    except (OSError, ValueError, KeyError, TypeError, RuntimeError) as err:  # h5py's errors for damaged content
        raise _fail(path, "", f"unreadable ({type(err).__name__}: {err})") from err


def _check_open(path: Path, f: Any, require_instruction: bool, image_keys: tuple[str, ...]) -> Hdf5Summary:
    import h5py

    data = f.get("data")
    if not isinstance(data, h5py.Group):
        raise _fail(path, "", "no 'data' group (not a LIBERO-layout demonstration file)")
    _walk(path, f, "")
    instruction = data.attrs.get("instruction", "")
    instruction = instruction.decode(errors="replace") if isinstance(instruction, bytes) else str(instruction)
    if require_instruction and not instruction.strip():
        raise _fail(path, "data", "no 'instruction' attribute")
    steps, hw = 0, None
    names = list(data.keys())
    if not names:
        raise _fail(path, "data", "holds no demonstrations")
    for name in names:
        where = f"data/{name}"
        if not re.fullmatch(r"demo_\d+", name):
            raise _fail(path, where, "unexpected group name (expected demo_<i>)")
        g = data[name]
        if not isinstance(g, h5py.Group):
            raise _fail(path, where, "not a group")
        actions = _dataset(path, g, "actions", where, 2, (ACTION_DIM,), "f")
        ee_pos = _dataset(path, g, "obs/ee_pos", where, 2, (3,), "f")
        images = [_dataset(path, g, f"obs/{k}", where, 4, (None, None, 3), "u") for k in image_keys]
        t = actions.shape[0]
        if not 1 <= t <= MAX_STEPS_PER_DEMO:
            raise _fail(path, where, f"{t} steps (expected 1..{MAX_STEPS_PER_DEMO})")
        lengths = {"actions": t, "obs/ee_pos": ee_pos.shape[0], **{f"obs/{k}": im.shape[0] for k, im in zip(image_keys, images)}}
        if len(set(lengths.values())) != 1:
            raise _fail(path, where, f"datasets disagree on the number of steps: {lengths}")
        for k, im in zip(image_keys, images):
            h, w = im.shape[1:3]
            if not (1 <= h and 1 <= w and h * w <= MAX_IMAGE_PIXELS):
                raise _fail(path, f"{where}/obs/{k}", f"image size {h}x{w} outside 1..{MAX_IMAGE_PIXELS} pixels")
            if hw is not None and (h, w) != hw:
                raise _fail(path, f"{where}/obs/{k}", f"image size {h}x{w} differs from {hw[0]}x{hw[1]} elsewhere")
            hw = (h, w)
        _finite(path, actions, f"{where}/actions")
        _finite(path, ee_pos, f"{where}/obs/ee_pos")
        steps += t
    return Hdf5Summary(str(path), instruction, len(names), steps, hw)
