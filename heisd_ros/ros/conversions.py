"""Conversions between ROS messages and the decoding core's plain data.

The only module of the package that touches message types on the way in and out of the policy.
Every input conversion validates what it reads and raises `InvalidObservationError` with the
reason; nothing else escapes (a malformed frame must never crash the node).

Images become RGB uint8 arrays [H, W, 3]; poses become positions [3] in metres. Raw images are
converted with numpy (rows are read with the message's `step`, so padded rows are fine);
compressed images are decoded by the first installed decoder of `COMPRESSED_DECODERS`.
"""

from __future__ import annotations

import io
import math
import struct
from typing import Any, Callable, Sequence

import numpy as np

from heisd_ros.core.errors import InvalidObservationError
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
"""Frames larger than this are rejected before any allocation."""

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


def _check_size(height: int, width: int, expected_hw: tuple[int, int] | None) -> None:
    if height <= 0 or width <= 0:
        raise InvalidObservationError(f"empty image {height}x{width}")
    if height * width > MAX_IMAGE_PIXELS:
        raise InvalidObservationError(f"image {height}x{width} exceeds {MAX_IMAGE_PIXELS} pixels")
    if expected_hw is not None and (height, width) != tuple(expected_hw):
        raise InvalidObservationError(
            f"wrong image size {height}x{width}, expected {expected_hw[0]}x{expected_hw[1]} (HxW)"
        )


def raw_to_rgb(
    data: Any, height: int, width: int, encoding: str, step: int, expected_hw: tuple[int, int] | None = None
) -> np.ndarray:
    """Raw pixel rows -> RGB uint8 [H, W, 3] (a fresh, contiguous array).

    `step` is the row length in bytes (>= width * channels; extra bytes are padding).
    """
    height, width, step = int(height), int(width), int(step)
    if encoding not in RAW_ENCODINGS:
        raise InvalidObservationError(
            f"unsupported image encoding {encoding!r}; supported: {', '.join(SUPPORTED_ENCODINGS)}"
        )
    _check_size(height, width, expected_hw)
    channels, order = RAW_ENCODINGS[encoding]
    if step < width * channels:
        raise InvalidObservationError(f"row step {step} < width {width} x {channels} channels ({encoding})")
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


def image_to_rgb(msg: Any, expected_hw: tuple[int, int] | None = None) -> np.ndarray:
    """sensor_msgs/Image -> RGB uint8 [H, W, 3]."""
    return raw_to_rgb(msg.data, msg.height, msg.width, msg.encoding, msg.step, expected_hw)


def _decode_pil(data: bytes) -> np.ndarray:
    from PIL import Image as PILImage

    try:
        with PILImage.open(io.BytesIO(data)) as img:
            img.load()
            if img.width * img.height > MAX_IMAGE_PIXELS:
                raise InvalidObservationError(f"compressed image {img.width}x{img.height} too large")
            return np.asarray(img.convert("RGB"), dtype=np.uint8).copy()
    # Pillow reports corrupt input through several exception types, none of them a common base.
    except (OSError, ValueError, SyntaxError, EOFError, IndexError, struct.error,
            PILImage.DecompressionBombError) as err:  # fmt: skip
        raise InvalidObservationError(f"cannot decode compressed image: {err}") from err


def _has_module(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


COMPRESSED_DECODERS: dict[str, tuple[Callable[[], bool], Callable[[bytes], np.ndarray]]] = {
    "pillow": (lambda: _has_module("PIL"), _decode_pil),
}
"""name -> (is installed?, decode(bytes) -> RGB uint8 [H, W, 3]); the first installed one is used."""


def compressed_decoder() -> tuple[str, Callable[[bytes], np.ndarray]] | None:
    """The first installed compressed-image decoder, or None."""
    for name, (available, decode) in COMPRESSED_DECODERS.items():
        if available():
            return name, decode
    return None


def compressed_to_rgb(msg: Any, expected_hw: tuple[int, int] | None = None) -> np.ndarray:
    """sensor_msgs/CompressedImage (jpeg or png, as image_transport writes it) -> RGB uint8 [H, W, 3].

    The decoder reads the format from the bytes; `msg.format` is only checked to name the codec.
    """
    fmt = str(msg.format).lower()
    if "jpeg" not in fmt and "jpg" not in fmt and "png" not in fmt:
        raise InvalidObservationError(f"unsupported compressed format {msg.format!r}: expected jpeg or png")
    found = compressed_decoder()
    if found is None:
        raise InvalidObservationError(
            "no compressed-image decoder is installed (install Pillow, or publish raw sensor_msgs/Image)"
        )
    data = _buffer(msg.data).tobytes()
    if not data:
        raise InvalidObservationError("empty compressed image")
    rgb = found[1](data)
    if rgb.ndim != 3 or rgb.shape[2] != 3:
        raise InvalidObservationError(f"decoder returned shape {rgb.shape}, expected [H, W, 3]")
    _check_size(rgb.shape[0], rgb.shape[1], expected_hw)
    return rgb


def msg_to_rgb(msg: Any, expected_hw: tuple[int, int] | None = None) -> np.ndarray:
    """Image or CompressedImage -> RGB uint8 [H, W, 3]."""
    if hasattr(msg, "encoding"):
        return image_to_rgb(msg, expected_hw)
    return compressed_to_rgb(msg, expected_hw)


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
# pose


def pose_to_position(msg: Any, quat_norm_tol: float = 0.05) -> np.ndarray:
    """geometry_msgs/PoseStamped (or Pose) -> end-effector position [3] float64, metres.

    The orientation is not used by the policy but is validated: a NaN or non-unit quaternion
    means the publisher is broken, and its position is not trusted either.
    """
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


def _header(stamp_s: float, frame_id: str) -> Any:
    from std_msgs.msg import Header

    return Header(stamp=s_to_stamp(stamp_s), frame_id=frame_id)


def to_arm_command(
    action: np.ndarray, stats: StepStats, stamp_s: float, frame_id: str, step_id: int
) -> Any:
    """Action [7] + StepStats -> heisd_ros/ArmCommand."""
    from heisd_ros.msg import ArmCommand

    a = check_action(action)
    msg = ArmCommand()
    msg.header = _header(stamp_s, frame_id)
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
    msg.header = _header(stamp_s, frame_id)
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


def to_twist(action: np.ndarray, stamp_s: float, frame_id: str, linear_scale: float, angular_scale: float) -> Any:
    """Action [7] -> geometry_msgs/TwistStamped (delta position/rotation times the scales)."""
    from geometry_msgs.msg import TwistStamped

    a = check_action(action)
    msg = TwistStamped()
    msg.header = _header(stamp_s, frame_id)
    msg.twist.linear.x, msg.twist.linear.y, msg.twist.linear.z = (float(v) * linear_scale for v in a[0:3])
    msg.twist.angular.x, msg.twist.angular.y, msg.twist.angular.z = (float(v) * angular_scale for v in a[3:6])
    return msg


def to_gripper(action: np.ndarray) -> Any:
    """Action [7] -> std_msgs/Float64 holding the gripper command (-1 open, +1 close)."""
    from std_msgs.msg import Float64

    return Float64(data=float(check_action(action)[GRIPPER_INDEX]))
