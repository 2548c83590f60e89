"""Message conversions: images, poses and outputs; malformed input only ever raises InvalidObservationError."""

from __future__ import annotations

import io
import math

import numpy as np
import pytest
from geometry_msgs.msg import PoseStamped
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sensor_msgs.msg import CompressedImage, Image

from heisd_ros.core import image_codec
from heisd_ros.core.errors import InvalidObservationError
from heisd_ros.core.types import StepStats
from heisd_ros.ros import conversions as conv

RNG = np.random.default_rng(0)
RGB = RNG.integers(0, 256, size=(6, 5, 3), dtype=np.uint8)


def _raw(encoding: str, rgb: np.ndarray, pad: int = 0) -> Image:
    msg = conv.rgb_to_image(rgb, 1.5, "cam", encoding)
    if pad:
        rows = np.frombuffer(bytes(msg.data), np.uint8).reshape(msg.height, msg.step)
        padded = np.concatenate([rows, np.full((msg.height, pad), 7, np.uint8)], axis=1)
        msg.step += pad
        msg.data = padded.tobytes()
    return msg


@pytest.mark.parametrize("encoding", ["rgb8", "bgr8", "rgba8", "bgra8"])
@pytest.mark.parametrize("pad", [0, 3])
def test_colour_encodings_round_trip(encoding, pad):
    out = conv.image_to_rgb(_raw(encoding, RGB, pad))
    assert out.dtype == np.uint8 and out.shape == (6, 5, 3) and out.flags.c_contiguous
    np.testing.assert_array_equal(out, RGB)


def test_bgr_bytes_are_swapped():
    msg = Image(height=1, width=1, encoding="bgr8", step=3, data=bytes([10, 20, 30]))
    assert conv.image_to_rgb(msg).tolist() == [[[30, 20, 10]]]


def test_mono8_replicated_and_padded():
    data = bytes([1, 2, 99, 3, 4, 99])  # 2 rows of 2 pixels, one padding byte per row
    msg = Image(height=2, width=2, encoding="mono8", step=3, data=data)
    out = conv.image_to_rgb(msg)
    assert out.shape == (2, 2, 3)
    assert out[:, :, 0].tolist() == [[1, 2], [3, 4]] and (out[..., 0] == out[..., 2]).all()


def test_output_does_not_alias_message_buffer():
    msg = _raw("rgb8", RGB)
    out = conv.image_to_rgb(msg)
    msg.data = bytes(len(msg.data))
    np.testing.assert_array_equal(out, RGB)


@pytest.mark.parametrize(
    "mutate, words",
    [
        (lambda m: setattr(m, "encoding", "16UC1"), "unsupported image encoding"),
        (lambda m: setattr(m, "encoding", "yuv422"), "unsupported image encoding"),
        (lambda m: setattr(m, "data", bytes(m.data)[:-1]), "truncated"),
        (lambda m: setattr(m, "data", bytes(m.data) + b"x"), "oversized"),
        (lambda m: setattr(m, "step", 2), "row step"),
        (lambda m: setattr(m, "height", 0), "empty image"),
    ],
)
def test_bad_raw_images(mutate, words):
    msg = _raw("rgb8", RGB)
    mutate(msg)
    with pytest.raises(InvalidObservationError, match=words):
        conv.image_to_rgb(msg)


def test_expected_size_enforced():
    with pytest.raises(InvalidObservationError, match="wrong image size 6x5, expected 224x224"):
        conv.image_to_rgb(_raw("rgb8", RGB), expected_hw=(224, 224))
    assert conv.image_to_rgb(_raw("rgb8", RGB), expected_hw=(6, 5)).shape == (6, 5, 3)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    data=st.binary(max_size=400),
    height=st.integers(-2, 20),
    width=st.integers(-2, 20),
    step=st.integers(-2, 90),
    encoding=st.sampled_from(conv.SUPPORTED_ENCODINGS + ("8UC3", "", "rgb16")),
)
def test_random_raw_buffers_never_crash(data, height, width, step, encoding):
    try:
        out = conv.raw_to_rgb(data, height, width, encoding, step)
    except InvalidObservationError:
        return
    assert out.shape == (height, width, 3) and out.dtype == np.uint8


@settings(max_examples=100, deadline=None)
@given(frac=st.floats(0.0, 0.999), encoding=st.sampled_from(conv.SUPPORTED_ENCODINGS))
def test_truncated_buffers_rejected(frac, encoding):
    msg = _raw(encoding, RGB)
    msg.data = bytes(msg.data)[: int(frac * len(msg.data))]
    with pytest.raises(InvalidObservationError):
        conv.image_to_rgb(msg)


# --- compressed -------------------------------------------------------------------------------


def _compressed(fmt: str, rgb: np.ndarray) -> CompressedImage:
    from PIL import Image as PILImage

    buf = io.BytesIO()
    PILImage.fromarray(rgb).save(buf, format="PNG" if fmt == "png" else "JPEG", quality=95)
    msg = CompressedImage(format=f"rgb8; {fmt} compressed bgr8")
    msg.data = buf.getvalue()
    return msg


def test_png_decodes_exactly():
    pytest.importorskip("PIL")
    np.testing.assert_array_equal(conv.compressed_to_rgb(_compressed("png", RGB)), RGB)


def test_jpeg_decodes_approximately():
    pytest.importorskip("PIL")
    smooth = np.tile(np.linspace(0, 255, 32, dtype=np.uint8)[None, :, None], (16, 1, 3))
    out = conv.compressed_to_rgb(_compressed("jpeg", smooth), expected_hw=(16, 32))
    assert out.shape == (16, 32, 3) and np.abs(out.astype(int) - smooth).mean() < 6


def test_compressed_wrong_size_and_format():
    pytest.importorskip("PIL")
    with pytest.raises(InvalidObservationError, match="wrong image size"):
        conv.compressed_to_rgb(_compressed("png", RGB), expected_hw=(5, 5))
    msg = _compressed("png", RGB)
    msg.format = "tiff"
    with pytest.raises(InvalidObservationError, match="unsupported compressed format"):
        conv.compressed_to_rgb(msg)


def test_no_decoder_installed_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(image_codec, "COMPRESSED_DECODERS", {"none": (lambda: False, None)})
    msg = CompressedImage(format="jpeg", data=b"\xff\xd8\xff")
    with pytest.raises(InvalidObservationError, match="no compressed-image decoder is installed"):
        conv.compressed_to_rgb(msg)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.binary(max_size=300), fmt=st.sampled_from(["jpeg", "png"]))
def test_random_compressed_never_crash(data, fmt):
    pytest.importorskip("PIL")
    try:
        out = conv.compressed_to_rgb(CompressedImage(format=fmt, data=data))
    except InvalidObservationError:
        return
    assert out.ndim == 3 and out.shape[2] == 3


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cut=st.integers(0, 400), fmt=st.sampled_from(["jpeg", "png"]))
def test_truncated_compressed_rejected_or_decoded(cut, fmt):
    pytest.importorskip("PIL")
    msg = _compressed(fmt, RGB)
    full = bytes(msg.data)
    msg.data = full[: min(cut, len(full) - 1)]
    try:
        out = conv.compressed_to_rgb(msg)
    except InvalidObservationError:
        return
    assert out.shape == (6, 5, 3)  # some decoders fill a truncated tail; the shape must hold


# --- pose ---------------------------------------------------------------------------------------


def test_pose_position():
    msg = conv.position_to_pose([0.1, -0.2, 0.3], 2.0)
    np.testing.assert_array_equal(conv.pose_to_position(msg), [0.1, -0.2, 0.3])
    assert conv.stamp_to_s(msg.header.stamp) == pytest.approx(2.0)


@pytest.mark.parametrize(
    "field, value, words",
    [
        ("position.x", math.nan, "position is not finite"),
        ("position.z", math.inf, "position is not finite"),
        ("orientation.w", math.nan, "orientation is not finite"),
        ("orientation.w", 0.0, "quaternion norm"),
        ("orientation.w", 1.2, "quaternion norm"),
    ],
)
def test_bad_poses(field, value, words):
    msg = conv.position_to_pose([0.1, 0.2, 0.3], 1.0)
    part, attr = field.split(".")
    setattr(getattr(msg.pose, part), attr, value)
    with pytest.raises(InvalidObservationError, match=words):
        conv.pose_to_position(msg)


def test_pose_in_another_frame_is_refused():
    msg = conv.position_to_pose((0.1, 0.2, 0.3), 1.0, "world")
    with pytest.raises(InvalidObservationError, match="frame 'world', but commands are in command_frame_id 'base_link'"):
        conv.pose_to_position(msg, frame_id="base_link")
    np.testing.assert_array_equal(conv.pose_to_position(msg, frame_id="/world"), [0.1, 0.2, 0.3])  # tf2 drops the '/'
    np.testing.assert_array_equal(conv.pose_to_position(msg), [0.1, 0.2, 0.3])  # no frame given: not checked
    np.testing.assert_array_equal(conv.pose_to_position(msg.pose, frame_id="base_link"), [0.1, 0.2, 0.3])  # a Pose has none


def test_zero_quaternion_is_invalid():
    msg = PoseStamped()
    msg.pose.orientation.w = 0.0  # all-zero quaternion: a publisher that never filled it
    with pytest.raises(InvalidObservationError, match="quaternion"):
        conv.pose_to_position(msg)


# --- time and outputs ---------------------------------------------------------------------------


@given(st.floats(0, 2e9, allow_nan=False))
def test_stamp_round_trip(t):
    assert conv.stamp_to_s(conv.s_to_stamp(t)) == pytest.approx(t, abs=1e-6)


def test_action_checks_and_clipping():
    with pytest.raises(InvalidObservationError, match="shape"):
        conv.check_action(np.zeros(6))
    with pytest.raises(InvalidObservationError, match="non-finite"):
        conv.check_action(np.array([0, 0, 0, 0, 0, np.nan, 1.0]))
    out = conv.clip_action(np.array([2.0, -2.0, 0.5, 0, 0, 0, 1.0]), [1.0] * 6 + [1.0])
    assert out.tolist() == [1.0, -1.0, 0.5, 0, 0, 0, 1.0]


def test_arm_command_and_stats():
    msg_mod = pytest.importorskip("heisd_ros.msg")
    stats = StepStats(mode="retrieval", method="heisd", llm_forwards=1, tokens_per_forward=[7],
                      latency_ms={"total": 12.5, "vision": 3.0}, retrieval_score=0.9, tokens=tuple(range(7)))
    a = np.arange(7, dtype=float) / 10
    cmd = conv.to_arm_command(a, stats, 4.5, "base_link", 3)
    assert isinstance(cmd, msg_mod.ArmCommand)
    assert cmd.step_id == 3 and cmd.decode_mode == "retrieval" and cmd.method == "heisd"
    assert list(cmd.delta_position) == pytest.approx([0, 0.1, 0.2]) and cmd.gripper == pytest.approx(0.6)
    ds = conv.to_decode_stats(stats, 4.5, "base_link", 3)
    assert ds.total_ms == pytest.approx(12.5) and list(ds.tokens_per_forward) == [7]
    assert ds.accept_length == pytest.approx(7.0) and math.isnan(ds.fused_metric)
    assert math.isnan(ds.cpu_ms)  # not measured: NaN, never a made-up 0
    stats.latency_ms["cpu"] = 11.0  # what the node measures around the decoder's step
    assert conv.to_decode_stats(stats, 4.5, "base_link", 3).cpu_ms == pytest.approx(11.0)


# --- fuzzing: poses, whole messages, actions ------------------------------------------------------

_any_float = st.floats(allow_nan=True, allow_infinity=True, width=64)


@settings(max_examples=300, deadline=None)
@given(position=st.tuples(_any_float, _any_float, _any_float), quat=st.tuples(_any_float, _any_float, _any_float, _any_float),
       tol=st.floats(0.001, 0.999))  # fmt: skip
def test_random_poses_give_a_finite_position_or_a_clear_error(position, quat, tol):
    msg = PoseStamped()
    p, q = msg.pose.position, msg.pose.orientation
    p.x, p.y, p.z = position
    q.x, q.y, q.z, q.w = quat
    try:
        out = conv.pose_to_position(msg, tol)
    except InvalidObservationError:
        return
    assert out.shape == (3,) and np.all(np.isfinite(out)) and out.tolist() == list(position)
    assert abs(math.sqrt(sum(v * v for v in quat)) - 1.0) <= tol + 1e-12


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    height=st.integers(0, 12), width=st.integers(0, 12), step=st.integers(0, 60),
    encoding=st.sampled_from(conv.SUPPORTED_ENCODINGS + ("bayer_rggb8", "RGB8", "rgb8 ", "32FC1")),
    data=st.binary(max_size=500), bigendian=st.integers(0, 1),
    expected=st.one_of(st.none(), st.tuples(st.integers(1, 12), st.integers(1, 12))),
)  # fmt: skip
def test_random_image_messages_never_crash(height, width, step, encoding, data, bigendian, expected):
    msg = Image(height=height, width=width, step=step, encoding=encoding, is_bigendian=bigendian, data=data)
    try:
        out = conv.msg_to_rgb(msg, expected)
    except InvalidObservationError:
        return
    assert out.shape == (height, width, 3) and out.dtype == np.uint8 and out.flags.c_contiguous
    assert expected is None or out.shape[:2] == expected


@settings(max_examples=300, deadline=None)
@given(action=st.lists(_any_float, min_size=0, max_size=9), bound=st.lists(st.floats(1e-6, 1e6), min_size=7, max_size=7))
def test_random_actions_are_rejected_or_clipped_within_bounds(action, bound):
    try:
        a = conv.check_action(np.array(action, dtype=np.float64))
    except InvalidObservationError:
        return
    clipped = conv.clip_action(a, bound)
    assert np.all(np.isfinite(clipped)) and np.all(np.abs(clipped) <= np.array(bound))
