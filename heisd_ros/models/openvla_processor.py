"""OpenVLA's image transform: a camera frame -> the pixels its vision backbone reads (docs/design.md §3).

The steps of the published Prismatic image processor: the config's resize strategy
(`resize-naive`: straight to S x S; `resize-crop`: shorter side to S, then the centre S x S;
`letterbox`: pad to a square with the mean colour, then as resize-crop), PIL resampling as the
checkpoint's preprocessor config names it (bicubic for every published tower), scaling to [0, 1]
and each tower's mean / std. A fused backbone reads both towers' results stacked on channels
([6, S, S], DINOv2's ImageNet normalisation first, SigLIP's 0.5 / 0.5 second).

`center_crop`: OpenVLA's LIBERO fine-tunes were trained on random crops of 90 % of the image area;
their evaluation, and this transform when asked, takes the centre crop of that area (sqrt(0.9) of
each side) and resizes it back to the frame's size with TensorFlow's crop_and_resize sampling
(bilinear, corners aligned), then back to uint8, before the steps above.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from heisd_ros.core.errors import InvalidObservationError, ModelLoadError
from heisd_ros.core.files import read_json
from heisd_ros.models.openvla_config import OpenVLAArch

PREPROCESSOR_FILE = "preprocessor_config.json"
CENTER_CROP_AREA = 0.9
MIN_SIDE = 2
"""Smallest frame side the transform takes (the crop's bilinear sampling needs two rows)."""
RESAMPLING = ("nearest", "bilinear", "bicubic", "lanczos", "box", "hamming")


@dataclass(frozen=True)
class TowerInput:
    """How one tower's input is made: S x S, PIL resampling, per-channel mean and std."""

    size: int
    interpolation: str
    mean: tuple[float, ...]
    std: tuple[float, ...]


def _listed(data: dict, key: str, n: int, path: Path) -> list | None:
    value = data.get(key)
    if value is None:
        return None
    if not isinstance(value, list) or len(value) != n:
        raise ModelLoadError(f"{path}: {key} must list {n} entries (one per tower), got {value!r}")
    return value


def read_tower_inputs(directory: Path, arch: OpenVLAArch) -> list[TowerInput]:
    """Each tower's input, from the checkpoint's preprocessor config where it has one, else from
    the towers' own data config (their pretrained weights' normalisation, bicubic)."""
    towers = [TowerInput(t.image_size, "bicubic", tuple(t.mean), tuple(t.std)) for t in arch.towers]
    path = directory / PREPROCESSOR_FILE
    if not path.is_file():
        return towers
    try:
        data = read_json(path, ModelLoadError)
    except (OSError, json.JSONDecodeError) as err:
        raise ModelLoadError(f"corrupt {path}: {err}") from err
    n = len(towers)
    strategy = data.get("image_resize_strategy", arch.resize_strategy)
    if strategy != arch.resize_strategy:
        raise ModelLoadError(f"{path}: image_resize_strategy {strategy!r} differs from config.json's "
                             f"{arch.resize_strategy!r}")
    sizes = _listed(data, "input_sizes", n, path) or [[3, t.size, t.size] for t in towers]
    interps = _listed(data, "interpolations", n, path) or [t.interpolation for t in towers]
    means = _listed(data, "means", n, path) or [t.mean for t in towers]
    stds = _listed(data, "stds", n, path) or [t.std for t in towers]
    out = []
    for tower, size, interp, mean, std in zip(towers, sizes, interps, means, stds):
        if list(size) != [3, tower.size, tower.size]:
            raise ModelLoadError(f"{path}: input size {size} differs from the config's image size {tower.size}")
        if interp not in RESAMPLING:
            raise ModelLoadError(f"{path}: interpolation {interp!r} is not one of {list(RESAMPLING)}")
        if len(mean) != 3 or len(std) != 3 or min(std) <= 0:
            raise ModelLoadError(f"{path}: means / stds must be 3 numbers each (stds > 0), got {mean}, {std}")
        out.append(TowerInput(tower.size, interp, tuple(map(float, mean)), tuple(map(float, std))))
    return out


def center_crop_resize(image: np.ndarray, area: float = CENTER_CROP_AREA) -> np.ndarray:
    """uint8 [H, W, 3] -> its centre crop of `area` of the pixels, bilinearly resized back to
    [H, W, 3] uint8 (TensorFlow's crop_and_resize and convert_image_dtype arithmetic, float32)."""
    h, w = image.shape[:2]
    side = math.sqrt(area)
    lo, hi = (1.0 - side) / 2.0, (1.0 - side) / 2.0 + side
    img = image.astype(np.float32) * np.float32(1.0 / 255.0)
    # Output pixel i samples the frame at lo * (n - 1) + i * (hi - lo) * (n - 1) / (out - 1), out = n.
    ys = np.float32(lo * (h - 1)) + np.arange(h, dtype=np.float32) * np.float32(hi - lo)
    xs = np.float32(lo * (w - 1)) + np.arange(w, dtype=np.float32) * np.float32(hi - lo)
    y0, x0 = np.floor(ys).astype(np.int64), np.floor(xs).astype(np.int64)
    y1, x1 = np.minimum(y0 + 1, h - 1), np.minimum(x0 + 1, w - 1)
    fy, fx = (ys - y0)[:, None, None], (xs - x0)[None, :, None]
    top = img[y0][:, x0] + (img[y0][:, x1] - img[y0][:, x0]) * fx
    bottom = img[y1][:, x0] + (img[y1][:, x1] - img[y1][:, x0]) * fx
    out = np.clip(top + (bottom - top) * fy, 0.0, 1.0)
    return np.minimum(out * np.float32(255.5), 255).astype(np.uint8)


def _letterbox(img, fill: tuple[int, int, int]):
    """Pad a PIL image to a square with `fill`, the same margin on opposite sides."""
    from PIL import Image

    (w, h), side = img.size, max(img.size)
    dx, dy = int((side - w) / 2), int((side - h) / 2)
    if not dx and not dy:
        return img
    out = Image.new("RGB", (w + 2 * dx, h + 2 * dy), fill)
    out.paste(img, (dx, dy))
    return out


def _resize_crop(img, size: int, resample):
    """Shorter side to `size` (the longer one scaled and truncated), then the centre size x size."""
    w, h = img.size
    short, long = (w, h) if w <= h else (h, w)
    new_short, new_long = size, int(size * long / short)
    new_w, new_h = (new_short, new_long) if w <= h else (new_long, new_short)
    if (new_w, new_h) != (w, h):
        img = img.resize((new_w, new_h), resample)
    top, left = round((new_h - size) / 2.0), round((new_w - size) / 2.0)
    return img.crop((left, top, left + size, top + size))


class ImageTransform:
    """uint8 [H, W, 3] -> float32 pixels [3 * towers, S, S] (see the module docstring)."""

    def __init__(self, towers: list[TowerInput], strategy: str, center_crop: bool = False) -> None:
        self.towers = towers
        self.strategy = strategy
        self.center_crop = center_crop
        # The published processor pads with the mean colour of the last tower it configured.
        self.fill = tuple(int(m * 255) for m in towers[-1].mean)

    @property
    def size(self) -> int:
        return self.towers[0].size

    def _resized(self, img, tower: TowerInput):
        from PIL import Image

        resample = getattr(Image.Resampling, tower.interpolation.upper())
        if self.strategy == "resize-naive":
            return img if img.size == (tower.size, tower.size) else img.resize((tower.size, tower.size), resample)
        return _resize_crop(img, tower.size, resample)

    def __call__(self, image: np.ndarray) -> torch.Tensor:
        from PIL import Image

        if image.shape[0] < MIN_SIDE or image.shape[1] < MIN_SIDE:
            raise InvalidObservationError(f"image {image.shape[:2]} too small")
        if self.center_crop:
            image = center_crop_resize(image)
        img = Image.fromarray(np.ascontiguousarray(image))
        if self.strategy == "letterbox":
            img = _letterbox(img, self.fill)
        done: dict[tuple, np.ndarray] = {}  # towers that resize alike share the resized frame
        planes = []
        for tower in self.towers:
            key = (tower.size, tower.interpolation)
            if key not in done:
                done[key] = np.asarray(self._resized(img, tower), dtype=np.float32) / np.float32(255.0)
            mean, std = np.asarray(tower.mean, np.float32), np.asarray(tower.std, np.float32)
            planes.append(torch.from_numpy((done[key] - mean) / std).permute(2, 0, 1))
        return torch.cat(planes)
