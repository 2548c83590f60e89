"""Camera frames as message bytes <-> RGB uint8 arrays [H, W, 3], without ROS.

The pixel side of sensor_msgs/Image and sensor_msgs/CompressedImage, shared by the node's
conversions (`heisd_ros.ros.conversions`) and the bag pipeline (`heisd_ros.pipeline.bags`, which
reads the same messages through rosbags). The message-level functions read fields only (`data`,
`height`, `width`, `encoding`, `step`; `format`), so an rclpy message and a rosbags one both work.

Raw images are converted with numpy (rows are read with the message's `step`, so padded rows are
fine); compressed images are decoded by the first installed decoder of `COMPRESSED_DECODERS`. A
frame's size is checked from its header before a single pixel is decoded or copied (raw: height,
width and the data length; compressed: the image header), against `max_pixels` and an optional
`check(height, width)` of the caller (the node's input limits), so an 8000x8000 PNG of a few KB
costs a header parse, not a gigabyte. A frame that cannot be read raises InvalidObservationError
with the reason; nothing else escapes (a malformed frame must never crash the node).
"""

from __future__ import annotations

import io
import struct
from typing import Any, Callable

import numpy as np

from heisd_ros.core.errors import InvalidObservationError

# encoding -> (channels, index of R, G, B within a pixel; None for mono)
RAW_ENCODINGS: dict[str, tuple[int, tuple[int, int, int] | None]] = {
    "rgb8": (3, (0, 1, 2)),
    "bgr8": (3, (2, 1, 0)),
    "rgba8": (4, (0, 1, 2)),
    "bgra8": (4, (2, 1, 0)),
    "mono8": (1, None),
}
SUPPORTED_ENCODINGS = tuple(RAW_ENCODINGS)
MAX_IMAGE_PIXELS = 8192 * 8192
"""Frames larger than this are rejected before any allocation, whatever the caller allows."""
COMPRESSED_FORMATS = ("PNG", "JPEG")
"""The only image formats the compressed decoder parses (image_transport writes nothing else)."""
SizeCheck = Callable[[int, int], None]
"""(height, width) -> None, or InvalidObservationError: called before any pixel is decoded."""


def field_repr(text: str, limit: int = 40) -> str:
    """repr() of at most `limit` characters of a message's string field (an encoding, a frame id)."""
    return repr(text[:limit]) + ("..." if len(text) > limit else "")


def byte_buffer(data: Any) -> np.ndarray:
    """A message's uint8[] field (array.array, bytes, memoryview, ndarray or list) as a flat uint8 array."""
    try:
        return np.frombuffer(memoryview(data).cast("B"), dtype=np.uint8)
    except TypeError:
        try:
            return np.asarray(data, dtype=np.uint8).reshape(-1)
        except (TypeError, ValueError, OverflowError) as err:
            raise InvalidObservationError(f"image data is not a byte buffer: {err}") from err


def check_image_size(height: int, width: int, expected_hw: tuple[int, int] | None,
                     max_pixels: int = MAX_IMAGE_PIXELS, check: SizeCheck | None = None) -> None:  # fmt: skip
    if height <= 0 or width <= 0:
        raise InvalidObservationError(f"empty image {height}x{width}")
    if check is not None:  # first: the caller's limits name themselves in the reason
        check(height, width)
    if height * width > min(max_pixels, MAX_IMAGE_PIXELS):
        raise InvalidObservationError(f"image {height}x{width} exceeds {min(max_pixels, MAX_IMAGE_PIXELS)} pixels")
    if expected_hw is not None and (height, width) != tuple(expected_hw):
        raise InvalidObservationError(
            f"wrong image size {height}x{width}, expected {expected_hw[0]}x{expected_hw[1]} (HxW)"
        )


# ---------------------------------------------------------------------------------------------
# raw


def raw_to_rgb(
    data: Any, height: int, width: int, encoding: str, step: int, expected_hw: tuple[int, int] | None = None,
    max_pixels: int = MAX_IMAGE_PIXELS, check: SizeCheck | None = None,
) -> np.ndarray:
    """Raw pixel rows -> RGB uint8 [H, W, 3] (a fresh, contiguous array).

    `step` is the row length in bytes (>= width * channels; extra bytes are padding, at most 4
    bytes per pixel in all). The size is checked before the data is touched.
    """
    height, width, step = int(height), int(width), int(step)
    if encoding not in RAW_ENCODINGS:
        raise InvalidObservationError(
            f"unsupported image encoding {field_repr(encoding)}; supported: {', '.join(SUPPORTED_ENCODINGS)}"
        )
    check_image_size(height, width, expected_hw, max_pixels, check)
    channels, order = RAW_ENCODINGS[encoding]
    if step < width * channels:
        raise InvalidObservationError(f"row step {step} < width {width} x {channels} channels ({encoding})")
    if step > 4 * width + 64:  # padding aligns rows; more than this is a malformed header
        raise InvalidObservationError(f"row step {step} is implausible for width {width} ({encoding})")
    buf = byte_buffer(data)
    if buf.size != step * height:
        kind = "truncated" if buf.size < step * height else "oversized"
        raise InvalidObservationError(
            f"{kind} image data: {buf.size} bytes, expected step {step} x height {height} = {step * height}"
        )
    pixels = buf.reshape(height, step)[:, : width * channels].reshape(height, width, channels)
    if order is None:
        return np.repeat(pixels, 3, axis=2)
    return np.ascontiguousarray(pixels[:, :, list(order)])


def rgb_to_raw(rgb: np.ndarray, encoding: str = "rgb8") -> tuple[np.ndarray, int]:
    """RGB uint8 [H, W, 3] -> (pixel rows in `encoding`, flat and contiguous; row step in bytes).
    Alpha is 255, mono the channel mean."""
    rgb = np.asarray(rgb, dtype=np.uint8)
    if rgb.ndim != 3 or rgb.shape[2] != 3:
        raise InvalidObservationError(f"expected RGB [H, W, 3], got {rgb.shape}")
    if encoding not in RAW_ENCODINGS:
        raise InvalidObservationError(f"unsupported image encoding {encoding!r}")
    channels, order = RAW_ENCODINGS[encoding]
    if order is None:
        pixels = rgb.mean(axis=2).round().astype(np.uint8)[:, :, None]
    else:
        pixels = np.full(rgb.shape[:2] + (channels,), 255, dtype=np.uint8)
        pixels[:, :, list(order)] = rgb
    return np.ascontiguousarray(pixels).reshape(-1), int(rgb.shape[1] * channels)


def image_to_rgb(msg: Any, expected_hw: tuple[int, int] | None = None, max_pixels: int = MAX_IMAGE_PIXELS,
                 check: SizeCheck | None = None) -> np.ndarray:  # fmt: skip
    """sensor_msgs/Image -> RGB uint8 [H, W, 3]."""
    return raw_to_rgb(msg.data, msg.height, msg.width, msg.encoding, msg.step, expected_hw, max_pixels, check)


# ---------------------------------------------------------------------------------------------
# compressed


def _decode_pil(data: bytes, check: SizeCheck) -> np.ndarray:
    from PIL import Image as PILImage

    try:
        # open() parses the header only; the pixels are decoded by load(), after the size check.
        with PILImage.open(io.BytesIO(data), formats=COMPRESSED_FORMATS) as img:
            check(img.height, img.width)
            img.load()
            return np.asarray(img.convert("RGB"), dtype=np.uint8).copy()
    except InvalidObservationError:  # the size check's own verdict (a ValueError too)
        raise
    # Pillow reports corrupt input through several exception types, none of them a common base.
    except (OSError, ValueError, SyntaxError, EOFError, IndexError, struct.error,
            PILImage.DecompressionBombError) as err:  # fmt: skip
        raise InvalidObservationError(f"cannot decode compressed image: {err}") from err


def _has_module(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


COMPRESSED_DECODERS: dict[str, tuple[Callable[[], bool], Callable[[bytes, SizeCheck], np.ndarray]]] = {
    "pillow": (lambda: _has_module("PIL"), _decode_pil),
}
"""name -> (is installed?, decode(bytes, check) -> RGB uint8 [H, W, 3]); the first installed one is
used. A decoder calls check(height, width) with the header's size before decoding any pixel."""


def compressed_decoder() -> tuple[str, Callable[[bytes, SizeCheck], np.ndarray]] | None:
    """The first installed compressed-image decoder, or None."""
    for name, (available, decode) in COMPRESSED_DECODERS.items():
        if available():
            return name, decode
    return None


def compressed_to_rgb(msg: Any, expected_hw: tuple[int, int] | None = None, max_pixels: int = MAX_IMAGE_PIXELS,
                      check: SizeCheck | None = None) -> np.ndarray:  # fmt: skip
    """sensor_msgs/CompressedImage (jpeg or png, as image_transport writes it) -> RGB uint8 [H, W, 3].

    The decoder reads the format from the bytes; `msg.format` is only checked to name the codec.
    More compressed bytes than the largest raw frame could hold are refused unread.
    """
    fmt = str(msg.format).lower()
    if "jpeg" not in fmt and "jpg" not in fmt and "png" not in fmt:
        raise InvalidObservationError(f"unsupported compressed format {field_repr(msg.format)}: expected jpeg or png")
    found = compressed_decoder()
    if found is None:
        raise InvalidObservationError(
            "no compressed-image decoder is installed (install Pillow, or publish raw sensor_msgs/Image)"
        )
    raw = byte_buffer(msg.data)
    if not raw.size:
        raise InvalidObservationError("empty compressed image")
    limit = 4 * min(max_pixels, MAX_IMAGE_PIXELS)
    if raw.size > limit:
        raise InvalidObservationError(f"compressed image of {raw.size} bytes exceeds {limit} bytes")
    rgb = found[1](raw.tobytes(), lambda h, w: check_image_size(h, w, expected_hw, max_pixels, check))
    if rgb.ndim != 3 or rgb.shape[2] != 3:
        raise InvalidObservationError(f"decoder returned shape {rgb.shape}, expected [H, W, 3]")
    check_image_size(rgb.shape[0], rgb.shape[1], expected_hw, max_pixels)
    return rgb


def rgb_to_compressed(rgb: np.ndarray, codec: str) -> bytes:
    """RGB uint8 [H, W, 3] -> the bytes of a `codec` ('png' or 'jpeg') file (needs Pillow)."""
    from PIL import Image as PILImage

    buf = io.BytesIO()
    PILImage.fromarray(np.asarray(rgb, dtype=np.uint8)).save(buf, format=codec.upper())
    return buf.getvalue()


def msg_to_rgb(msg: Any, expected_hw: tuple[int, int] | None = None, max_pixels: int = MAX_IMAGE_PIXELS,
               check: SizeCheck | None = None) -> np.ndarray:  # fmt: skip
    """Image or CompressedImage -> RGB uint8 [H, W, 3]; the size (checked against `expected_hw`,
    `max_pixels` and `check`) is read from the header before any pixel is decoded."""
    if hasattr(msg, "encoding"):
        return image_to_rgb(msg, expected_hw, max_pixels, check)
    return compressed_to_rgb(msg, expected_hw, max_pixels, check)
