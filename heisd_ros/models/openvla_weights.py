"""Filling a model built on the meta device from a checkpoint's safetensors, one tensor at a time.

A checkpoint's tensors are listed by `model.safetensors.index.json` (sharded checkpoints, as
published) or are all in `model.safetensors`. Every tensor must be a parameter of the model the
config describes, with that parameter's shape, and every parameter must be in the checkpoint: a
missing, unexpected or wrongly shaped tensor is a ModelLoadError naming the tensor and its file,
raised from the files' headers before any weight is read.

Memory: the model is built on the meta device (no storage), then each parameter is read from its
file, converted to the wanted dtype and device, and set in place. Each read opens the file for
that tensor alone, so the file's mapped pages are released after every tensor: the process holds
the model plus at most one tensor's worth of file pages, never a second copy of the model.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from heisd_ros.core.errors import ModelLoadError
from heisd_ros.core.files import read_json

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
FLOAT_DTYPES = ("BF16", "F16", "F32", "F64")


@dataclass(frozen=True)
class TensorEntry:
    """Where a checkpoint tensor is and what its header says."""

    file: str
    shape: tuple[int, ...]
    dtype: str


@dataclass(frozen=True)
class Layout:
    """Every tensor of a checkpoint by name, and the file that lists them (index or single file)."""

    tensors: dict[str, TensorEntry]
    listing: Path


def empty_model(build):
    """`build()` with every parameter and buffer on the meta device (shapes only, no memory)."""
    with torch.device("meta"):
        return build()


def _read_index(path: Path) -> dict[str, str]:
    try:
        data = read_json(path, ModelLoadError)
        weight_map = data["weight_map"]
    except (OSError, json.JSONDecodeError, KeyError, TypeError) as err:
        raise ModelLoadError(f"corrupt {path}: {err}") from err
    if not isinstance(weight_map, dict):
        raise ModelLoadError(f"{path}: weight_map must map tensor names to file names")
    for key, name in weight_map.items():
        # The index comes with a download: its file names must stay inside the checkpoint folder.
        if not isinstance(name, str) or Path(name).name != name or name.startswith(".") \
                or not name.endswith(".safetensors"):
            raise ModelLoadError(f"{path}: tensor {key} points at {name!r}, not a .safetensors file in the folder")
    return weight_map


def _header(path: Path) -> list[tuple[str, tuple[int, ...], str]]:
    """(name, shape, dtype) of every tensor in a safetensors file, from its header alone."""
    from safetensors import SafetensorError, safe_open

    if not path.is_file():
        raise ModelLoadError(f"missing weights file {path}")
    try:
        with safe_open(str(path), framework="pt") as f:
            out = []
            for key in f.keys():  # noqa: SIM118 - a safetensors file, not a dict
                sl = f.get_slice(key)
                out.append((key, tuple(int(n) for n in sl.get_shape()), str(sl.get_dtype())))
            return out
    except (SafetensorError, OSError, ValueError) as err:
        raise ModelLoadError(f"corrupt weights file {path}: {err}") from err


def read_layout(directory: Path) -> Layout:
    """The checkpoint's tensors, from the index (or the single file) and the files' headers."""
    index = directory / INDEX_FILE
    if index.is_file():
        weight_map: dict[str, str] | None = _read_index(index)
        files, listing = sorted(set(weight_map.values())), index
    elif (directory / SINGLE_FILE).is_file():
        weight_map, files, listing = None, [SINGLE_FILE], directory / SINGLE_FILE
    else:
        raise ModelLoadError(f"{directory} has neither {INDEX_FILE} nor {SINGLE_FILE}")
    tensors: dict[str, TensorEntry] = {}
    for name in files:
        for key, shape, dtype in _header(directory / name):
            if key in tensors:
                raise ModelLoadError(f"{directory / name}: tensor {key} is also in {tensors[key].file}")
            if weight_map is not None and weight_map.get(key) != name:
                raise ModelLoadError(f"{directory / name}: tensor {key} is not listed for this file in {index}")
            tensors[key] = TensorEntry(name, shape, dtype)
    if weight_map is not None:
        for key, name in weight_map.items():
            if key not in tensors:
                raise ModelLoadError(f"{index} lists tensor {key} in {name}, which does not hold it")
    return Layout(tensors, listing)


def check_layout(model: nn.Module, layout: Layout, directory: Path) -> None:
    """ModelLoadError unless the checkpoint holds exactly the model's parameters, shape for shape."""
    expected = {name: tuple(p.shape) for name, p in model.named_parameters()}
    for key, entry in sorted(layout.tensors.items()):
        where = directory / entry.file
        if key not in expected:
            raise ModelLoadError(f"{where}: unexpected tensor {key} (the config describes no such parameter)")
        if entry.shape != expected[key]:
            raise ModelLoadError(f"{where}: tensor {key} has shape {list(entry.shape)}, the config implies "
                                 f"{list(expected[key])}")
        if entry.dtype not in FLOAT_DTYPES:
            raise ModelLoadError(f"{where}: tensor {key} is {entry.dtype}, expected one of {list(FLOAT_DTYPES)}")
    missing = sorted(set(expected) - set(layout.tensors))
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise ModelLoadError(f"{layout.listing}: missing tensor {missing[0]}{more}")


def _read(path: Path, key: str, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            # A private copy in the target dtype and device; the file mapping closes on return.
            return f.get_tensor(key).to(device=device, dtype=dtype, copy=True)
    except (SafetensorError, OSError, ValueError, RuntimeError) as err:
        raise ModelLoadError(f"cannot read tensor {key} from {path}: {err}") from err


def load_tensors(model: nn.Module, layout: Layout, directory: Path, dtype: torch.dtype,
                 device: torch.device) -> None:
    """Set every parameter of `model` (built on meta, checked by `check_layout`) from the files,
    file by file, as `dtype` on `device` (parameters are frozen: this is an inference model)."""
    for key, entry in sorted(layout.tensors.items(), key=lambda kv: (kv[1].file, kv[0])):
        owner_name, _, leaf = key.rpartition(".")
        owner = model.get_submodule(owner_name)
        setattr(owner, leaf, nn.Parameter(_read(directory / entry.file, key, dtype, device), requires_grad=False))


def assert_materialised(model: nn.Module) -> None:
    """ModelLoadError naming any parameter or buffer still on the meta device."""
    left = [n for n, t in list(model.named_parameters()) + list(model.named_buffers()) if t.is_meta]
    if left:
        raise ModelLoadError(f"tensors without values after loading: {left[:5]}")
