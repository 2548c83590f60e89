"""Conversions between ROS messages and the decoding core's plain data.

The only module of the package that touches message types on the way in and out of the policy.
Every input conversion validates what it reads and raises `InvalidObservationError` with the
reason; nothing else escapes (a malformed frame must never crash the node).

Images become RGB uint8 arrays [H, W, 3]; poses become positions [3] in metres. The pixels are
converted by `heisd_ros.core.image_codec` (ROS-free, shared with the bag pipeline), which checks a
frame's size from its header before a single pixel is decoded or copied; its image functions are
the node's (`msg_to_rgb`, `image_to_rgb`, `compressed_to_rgb`, `raw_to_rgb`) and are named here too.
"""

from __future__ import annotations

import math
import struct
from typing import Any, Sequence

import numpy as np

from heisd_ros.core.errors import InputLimitError, InvalidObservationError
from heisd_ros.core.image_codec import field_repr, rgb_to_raw
from heisd_ros.core.image_codec import (  # noqa: F401 - re-exported: the node's image inputs are conv.*_to_rgb
    SUPPORTED_ENCODINGS,
    compressed_to_rgb,
    image_to_rgb,
    msg_to_rgb,
    raw_to_rgb,
)
from heisd_ros.core.types import ACTION_DIM, GRIPPER_INDEX, StepStats

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


def rgb_to_image(rgb: np.ndarray, stamp_s: float, frame_id: str = "", encoding: str = "rgb8") -> Any:
    """RGB uint8 [H, W, 3] -> sensor_msgs/Image in `encoding` (rgb8, bgr8, rgba8, bgra8 or mono8)."""
    from sensor_msgs.msg import Image

    data, step = rgb_to_raw(rgb, encoding)
    msg = Image()
    msg.header.stamp = s_to_stamp(stamp_s)
    msg.header.frame_id = frame_id
    msg.height, msg.width = int(np.shape(rgb)[0]), int(np.shape(rgb)[1])
    msg.encoding = encoding
    msg.is_bigendian = 0
    msg.step = step
    msg.data = data.tobytes()
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
        raise InvalidObservationError(f"end-effector pose in frame {field_repr(header.frame_id)}, but commands are "
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
    msg.cpu_ms = _f32(lat.get("cpu", math.nan))
    msg.fused_metric = _f32(stats.fused_metric)
    msg.retrieval_score = _f32(stats.retrieval_score)
    msg.fallback = stats.fallback
    return msg


