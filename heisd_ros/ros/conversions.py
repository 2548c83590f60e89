"""Conversions between ROS messages and the decoding core's plain data.

The only module of the package that touches message types on the way in and out of the policy.
Every input conversion validates what it reads and raises `InvalidObservationError` with the
reason; nothing else escapes (a malformed frame must never crash the node).

Images become RGB uint8 arrays [H, W, 3]; poses become positions [3] in metres. Raw images are
converted with numpy (rows are read with the message's `step`, so padded rows are fine);
compressed images are decoded by the first installed decoder of `COMPRESSED_DECODERS`. A frame's
size is checked from its header before a single pixel is decoded or copied (raw: height, width
and the data length; compressed: the image header), against `max_pixels` and an optional
`check(height, width)` of the caller (the node's input limits), so an 8000x8000 PNG of a few KB
costs a header parse, not a gigabyte.
"""

from __future__ import annotations

import io
import math
import struct
from typing import Any, Callable, Sequence

import numpy as np

from heisd_ros.core.errors import InputLimitError, InvalidObservationError
from heisd_ros.core.types import ACTION_DIM, GRIPPER_INDEX, StepStats

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

# ---------------------------------------------------------------------------------------------
# time


def stamp_to_s(stamp: Any) -> float:
    """builtin_interfaces/Time -> seconds (float)."""
    return float(stamp.sec) + 1e-9 * float(stamp.nanosec)


def s_to_stamp(t_s: float) -> Any:
    """Seconds -> builtin_interfaces/Time (non-negative; nanoseconds rounded)."""
    from builtin_interfaces.msg import Time

    ns = max(0, int(round(t_s * 1e9)))
    return Time(sec=ns // 1_000_000_000, nanosec=ns % 1_000_000_000)


# ---------------------------------------------------------------------------------------------
# images


def _buffer(data: Any) -> np.ndarray:
    """A message's uint8[] field (array.array, bytes, memoryview or list) as a flat uint8 array."""
    try:
        return np.frombuffer(memoryview(data).cast("B"), dtype=np.uint8)
    except TypeError:
        try:
            return np.asarray(data, dtype=np.uint8).reshape(-1)
        except (TypeError, ValueError, OverflowError) as err:
            raise InvalidObservationError(f"image data is not a byte buffer: {err}") from err


def _check_size(height: int, width: int, expected_hw: tuple[int, int] | None, max_pixels: int = MAX_IMAGE_PIXELS,
                check: SizeCheck | None = None) -> None:  # fmt: skip
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
            f"unsupported image encoding {_short(encoding)}; supported: {', '.join(SUPPORTED_ENCODINGS)}"
        )
    _check_size(height, width, expected_hw, max_pixels, check)
    channels, order = RAW_ENCODINGS[encoding]
    if step < width * channels:
        raise InvalidObservationError(f"row step {step} < width {width} x {channels} channels ({encoding})")
    if step > 4 * width + 64:  # padding aligns rows; more than this is a malformed header
        raise InvalidObservationError(f"row step {step} is implausible for width {width} ({encoding})")
    buf = _buffer(data)
    if buf.size != step * height:
        kind = "truncated" if buf.size < step * height else "oversized"
        raise InvalidObservationError(
            f"{kind} image data: {buf.size} bytes, expected step {step} x height {height} = {step * height}"
        )
    pixels = buf.reshape(height, step)[:, : width * channels].reshape(height, width, channels)
    if order is None:
        return np.repeat(pixels, 3, axis=2)
    return np.ascontiguousarray(pixels[:, :, list(order)])


def image_to_rgb(msg: Any, expected_hw: tuple[int, int] | None = None, max_pixels: int = MAX_IMAGE_PIXELS,
                 check: SizeCheck | None = None) -> np.ndarray:  # fmt: skip
    """sensor_msgs/Image -> RGB uint8 [H, W, 3]."""
    return raw_to_rgb(msg.data, msg.height, msg.width, msg.encoding, msg.step, expected_hw, max_pixels, check)


def _short(text: str, limit: int = 40) -> str:
    """repr() of at most `limit` characters of a message's string field."""
    return repr(text[:limit]) + ("..." if len(text) > limit else "")


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
        raise InvalidObservationError(f"unsupported compressed format {_short(msg.format)}: expected jpeg or png")
    found = compressed_decoder()
    if found is None:
        raise InvalidObservationError(
            "no compressed-image decoder is installed (install Pillow, or publish raw sensor_msgs/Image)"
        )
    raw = _buffer(msg.data)
    if not raw.size:
        raise InvalidObservationError("empty compressed image")
    limit = 4 * min(max_pixels, MAX_IMAGE_PIXELS)
    if raw.size > limit:
        raise InvalidObservationError(f"compressed image of {raw.size} bytes exceeds {limit} bytes")
    rgb = found[1](raw.tobytes(), lambda h, w: _check_size(h, w, expected_hw, max_pixels, check))
    if rgb.ndim != 3 or rgb.shape[2] != 3:
        raise InvalidObservationError(f"decoder returned shape {rgb.shape}, expected [H, W, 3]")
    _check_size(rgb.shape[0], rgb.shape[1], expected_hw, max_pixels)
    return rgb


def msg_to_rgb(msg: Any, expected_hw: tuple[int, int] | None = None, max_pixels: int = MAX_IMAGE_PIXELS,
               check: SizeCheck | None = None) -> np.ndarray:  # fmt: skip
    """Image or CompressedImage -> RGB uint8 [H, W, 3]; the size (checked against `expected_hw`,
    `max_pixels` and `check`) is read from the header before any pixel is decoded."""
    if hasattr(msg, "encoding"):
        return image_to_rgb(msg, expected_hw, max_pixels, check)
    return compressed_to_rgb(msg, expected_hw, max_pixels, check)


def rgb_to_image(rgb: np.ndarray, stamp_s: float, frame_id: str = "", encoding: str = "rgb8") -> Any:
    """RGB uint8 [H, W, 3] -> sensor_msgs/Image in `encoding` (rgb8, bgr8, rgba8, bgra8 or mono8)."""
    from sensor_msgs.msg import Image

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
    msg = Image()
    msg.header.stamp = s_to_stamp(stamp_s)
    msg.header.frame_id = frame_id
    msg.height, msg.width = int(rgb.shape[0]), int(rgb.shape[1])
    msg.encoding = encoding
    msg.is_bigendian = 0
    msg.step = int(rgb.shape[1] * channels)
    msg.data = np.ascontiguousarray(pixels).tobytes()
    return msg


# ---------------------------------------------------------------------------------------------
# strings


CDR_ENCAPSULATIONS = {b"\x00\x00": ">", b"\x00\x01": "<", b"\x00\x06": ">", b"\x00\x07": "<"}
"""Encapsulation ids of a serialised message (CDR and plain CDR2, big/little endian) -> byte order."""


def string_from_cdr(raw: bytes, max_bytes: int) -> str:
    """The text of a serialised std_msgs/String, read from the bytes themselves.

    rclpy's own conversion stops at the first NUL, silently cutting the text; here a NUL inside the
    string is refused instead (InputLimitError), as is a text of more than `max_bytes` bytes, before
    anything is decoded. InvalidObservationError for a malformed message or text that is not UTF-8.
    """
    order = CDR_ENCAPSULATIONS.get(bytes(raw[:2]))
    if order is None or len(raw) < 8:
        raise InvalidObservationError(f"not a serialised string message ({len(raw)} bytes)")
    (length,) = struct.unpack(f"{order}I", raw[4:8])  # counts the terminating NUL
    if length > len(raw) - 8 or length == 0:
        raise InvalidObservationError(f"string length {length} does not fit a message of {len(raw)} bytes")
    if length - 1 > max_bytes:
        raise InputLimitError(f"instruction of {length - 1} bytes exceeds max_instruction_bytes {max_bytes}: "
                              f"{bytes(raw[8 : 8 + 60])!r}...")  # fmt: skip
    data = bytes(raw[8 : 8 + length - 1])
    nul = data.find(b"\x00")
    if nul >= 0:
        raise InputLimitError(f"instruction holds control character '\\x00' at byte {nul}: {data[:80]!r}")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise InvalidObservationError(f"instruction is not UTF-8: {err}") from err


# ---------------------------------------------------------------------------------------------
# pose


def pose_to_position(msg: Any, quat_norm_tol: float = 0.05, frame_id: str | None = None) -> np.ndarray:
    """geometry_msgs/PoseStamped (or Pose) -> end-effector position [3] float64, metres.

    The orientation is not used by the policy but is validated: a NaN or non-unit quaternion
    means the publisher is broken, and its position is not trusted either. With `frame_id`, a
    PoseStamped in another frame is refused too (a leading '/' is ignored, as tf2 ignores it): the
    policy's deltas and every output are expressed in that frame.
    """
    header = getattr(msg, "header", None)
    if frame_id is not None and header is not None and header.frame_id.lstrip("/") != frame_id.lstrip("/"):
        raise InvalidObservationError(f"end-effector pose in frame {_short(header.frame_id)}, but commands are "
                                      f"in command_frame_id {frame_id!r}: publish the pose in that frame or set "
                                      "command_frame_id to the pose's frame")  # fmt: skip
    pose = msg.pose if hasattr(msg, "pose") else msg
    p, q = pose.position, pose.orientation
    position = np.array([p.x, p.y, p.z], dtype=np.float64)
    if not np.all(np.isfinite(position)):
        raise InvalidObservationError(f"end-effector position is not finite: {position.tolist()}")
    quat = np.array([q.x, q.y, q.z, q.w], dtype=np.float64)
    if not np.all(np.isfinite(quat)):
        raise InvalidObservationError(f"end-effector orientation is not finite: {quat.tolist()}")
    with np.errstate(over="ignore"):  # a huge component gives an infinite norm, rejected below
        norm = float(np.linalg.norm(quat))
    if abs(norm - 1.0) > quat_norm_tol:
        raise InvalidObservationError(f"end-effector quaternion norm {norm:.4f} is not 1 (tolerance {quat_norm_tol})")
    return position


def position_to_pose(position: Sequence[float], stamp_s: float, frame_id: str = "base_link") -> Any:
    """Position [3] -> geometry_msgs/PoseStamped with identity orientation (tests, tools)."""
    from geometry_msgs.msg import PoseStamped

    msg = PoseStamped()
    msg.header.stamp = s_to_stamp(stamp_s)
    msg.header.frame_id = frame_id
    msg.pose.position.x, msg.pose.position.y, msg.pose.position.z = (float(v) for v in position)
    msg.pose.orientation.w = 1.0
    return msg


# ---------------------------------------------------------------------------------------------
# outputs


def check_action(action: np.ndarray) -> np.ndarray:
    """Validate a policy action [7]: finite, the right shape. Returns it as float64."""
    a = np.asarray(action, dtype=np.float64).reshape(-1)
    if a.shape != (ACTION_DIM,):
        raise InvalidObservationError(f"policy returned an action of shape {a.shape}, expected ({ACTION_DIM},)")
    if not np.all(np.isfinite(a)):
        raise InvalidObservationError(f"policy returned a non-finite action {a.tolist()}")
    return a


def clip_action(action: np.ndarray, max_abs: Sequence[float]) -> np.ndarray:
    """Clip each dimension to [-max_abs[i], max_abs[i]]."""
    bound = np.asarray(max_abs, dtype=np.float64)
    return np.clip(np.asarray(action, dtype=np.float64), -bound, bound)


def header_msg(stamp_s: float, frame_id: str) -> Any:
    """std_msgs/Header stamped `stamp_s` (seconds) in `frame_id`."""
    from std_msgs.msg import Header

    return Header(stamp=s_to_stamp(stamp_s), frame_id=frame_id)


def to_arm_command(
    action: np.ndarray, stats: StepStats, stamp_s: float, frame_id: str, step_id: int
) -> Any:
    """Action [7] + StepStats -> heisd_ros/ArmCommand."""
    from heisd_ros.msg import ArmCommand

    a = check_action(action)
    msg = ArmCommand()
    msg.header = header_msg(stamp_s, frame_id)
    msg.step_id = int(step_id)
    msg.delta_position = [float(v) for v in a[0:3]]
    msg.delta_rotation = [float(v) for v in a[3:6]]
    msg.gripper = float(a[GRIPPER_INDEX])
    msg.decode_mode = stats.mode
    msg.method = stats.method
    return msg


def _f32(value: float) -> float:
    """A float that a float32 message field accepts (NaN kept, out-of-range values clamped)."""
    v = float(value)
    return v if math.isnan(v) else max(-3.4e38, min(3.4e38, v))


def to_decode_stats(stats: StepStats, stamp_s: float, frame_id: str, step_id: int) -> Any:
    """StepStats -> heisd_ros/DecodeStats."""
    from heisd_ros.msg import DecodeStats

    lat = stats.latency_ms
    msg = DecodeStats()
    msg.header = header_msg(stamp_s, frame_id)
    msg.step_id = int(step_id)
    msg.method = stats.method
    msg.mode = stats.mode
    msg.skipped = bool(stats.skipped)
    msg.llm_forwards = max(0, int(stats.llm_forwards))
    msg.tokens_per_forward = [max(0, int(t)) for t in stats.tokens_per_forward]
    msg.accept_length = _f32(stats.accept_length)
    msg.vision_ms = _f32(lat.get("vision", 0.0))
    msg.retrieval_ms = _f32(lat.get("retrieval", 0.0))
    msg.draft_ms = _f32(lat.get("draft", 0.0))
    msg.verify_ms = _f32(lat.get("verify", 0.0))
    msg.total_ms = _f32(lat.get("total", 0.0))
    msg.fused_metric = _f32(stats.fused_metric)
    msg.retrieval_score = _f32(stats.retrieval_score)
    msg.fallback = stats.fallback
    return msg


