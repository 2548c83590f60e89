"""Input limits of the policy node (ROS-free parts): instruction, frame shape, pose plausibility,
the model's own limits, header-first image checks, memory release and the Fast DDS reader profile."""

from __future__ import annotations

import io
import math
import time

import numpy as np
import pytest
from sensor_msgs.msg import CompressedImage, Image

from heisd_ros.core.errors import ConfigError, InputLimitError, InvalidObservationError
from heisd_ros.ros import conversions as conv
from heisd_ros.ros.input_limits import (QUOTE_CHARS, InputLimits, ModelInput, PoseGate, check_frame_shape,
                                        check_instruction, model_input, quote, release_memory)  # fmt: skip
from heisd_ros.ros.transport import PROFILE_XML, fastdds_reader_memory

LIM = InputLimits()


@pytest.mark.parametrize("field, value", [
    ("max_instruction_bytes", 0), ("max_instruction_tokens", 0), ("max_image_pixels", 0),
    ("max_aspect_ratio_change", 0.5), ("max_aspect_ratio_change", math.inf), ("workspace_min_m", (0.0, 0.0)),
    ("workspace_min_m", (3.0, -2.0, -2.0)), ("workspace_max_m", (math.nan, 2.0, 2.0)), ("max_pose_jump_m", 0.0),
    ("max_ee_speed_m_s", -1.0),
])  # fmt: skip
def test_invalid_limits_are_config_errors(field, value):
    with pytest.raises(ConfigError):
        InputLimits(**{field: value})


def test_quote_keeps_a_short_prefix():
    assert quote("pick it up") == "'pick it up'"
    long = "x" * 10_000
    q = quote(long)
    assert len(q) < QUOTE_CHARS + 40 and "10000 characters" in q
    assert quote("a\x00b") == "'a\\x00b'"  # control characters escaped, never written raw to a log


# --- instruction -------------------------------------------------------------------------------------


def test_a_valid_instruction_is_stripped():
    assert check_instruction("  pick up the red bowl \n", LIM) == "pick up the red bowl"
    assert check_instruction("", LIM) == ""
    assert check_instruction("prends le bol rouge à gauche", LIM) == "prends le bol rouge à gauche"


@pytest.mark.parametrize("char", ["\u202e", "\u202a", "\u2066", "\u2069"])
def test_bidirectional_overrides_are_refused(char):
    """A right-to-left override makes a logged instruction read other than it is."""
    with pytest.raises(InputLimitError, match="control character"):
        check_instruction(f"pick up the {char}lwob der", LIM)


def test_a_megabyte_instruction_is_refused_cheaply_and_quoted_briefly():
    text = "pick up the alphabet soup " * 40_000  # ~1 MB of words
    t = time.perf_counter()
    with pytest.raises(InputLimitError, match="exceeds max_instruction_bytes 1024") as info:
        check_instruction(text, LIM)
    assert time.perf_counter() - t < 0.01
    assert len(str(info.value)) < 250


def test_the_byte_limit_counts_utf8_bytes():
    with pytest.raises(InputLimitError, match="1200 bytes"):
        check_instruction("€" * 400, LIM)  # 400 characters, 1200 bytes


@pytest.mark.parametrize("text, char", [("pick up the alphabet\x00 soup", "\\x00"), ("pick\nup", "\\n"),
                                        ("pick\tup", "\\t"), ("pick\x1bup", "\\x1b"), ("pick\x85up", "\\x85"),
                                        ("pick\u2028up", "\\u2028")])  # fmt: skip
def test_control_characters_are_refused_never_truncated(text, char):
    with pytest.raises(InputLimitError, match="control character") as info:
        check_instruction(text, LIM)
    assert char in str(info.value)


# --- frames ------------------------------------------------------------------------------------------


def test_frame_shapes_against_the_model_input():
    check_frame_shape(480, 640, (224, 224), LIM)  # 4:3, larger: resized
    check_frame_shape(64, 64, (64, 64), LIM)
    with pytest.raises(InputLimitError, match="max_image_pixels"):
        check_frame_shape(3000, 4000, (224, 224), LIM)
    with pytest.raises(InputLimitError, match="smaller than the model's input 64x64"):
        check_frame_shape(32, 32, (64, 64), LIM)
    with pytest.raises(InputLimitError, match="aspect ratio 4.00x"):
        check_frame_shape(64, 256, (64, 64), LIM)
    check_frame_shape(32, 32, (64, 64), InputLimits(allow_small_frames=True))
    check_frame_shape(64, 256, (64, 64), InputLimits(max_aspect_ratio_change=4.0))
    check_frame_shape(8, 8, None, LIM)  # the model's input unknown: only the size is bounded


# --- pose --------------------------------------------------------------------------------------------


def test_pose_gate_box_jump_and_reset():
    gate = PoseGate()
    gate.check(10.0, np.array([0.1, 0.2, 0.3]), LIM)
    for bad in ([1e30, 0.0, 0.0], [0.0, -2.5, 0.0], [math.nan, 0.0, 0.0], [0.0, 0.0, math.inf]):
        with pytest.raises(InputLimitError, match="outside the workspace box"):
            gate.check(10.1, np.array(bad), LIM)
    gate.check(10.1, np.array([0.15, 0.2, 0.3]), LIM)  # 5 cm in 0.1 s
    with pytest.raises(InputLimitError, match="jumped 1.000 m in 0.100 s"):
        gate.check(10.2, np.array([1.15, 0.2, 0.3]), LIM)  # a glitch...
    gate.check(10.3, np.array([0.16, 0.2, 0.3]), LIM)  # ...and the next true pose is accepted at once
    with pytest.raises(InputLimitError, match="jumped"):
        gate.check(10.4, np.array([1.16, 0.2, 0.3]), LIM)  # 1 m after 0.1 s: still refused
    gate.check(10.8, np.array([1.16, 0.2, 0.3]), LIM)  # 1 m after 0.5 s (0.2 + 2 x 0.5 allowed): it moved
    gate.check(20.0, np.array([-1.5, 0.2, 0.3]), LIM)  # 2.66 m in 9.2 s: plausible
    gate.check(5.0, np.array([1.5, 0.2, 0.3]), LIM)  # an earlier stamp: a new timeline, nothing to compare
    gate.reset()
    gate.check(5.01, np.array([-1.5, -1.5, 0.3]), LIM)  # a new episode may start anywhere


# --- the model's own limits ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def vla():
    from heisd_ros.models.loader import tiny_vla

    return tiny_vla(seed=0)


def test_model_input_reads_the_model(vla):
    from heisd_ros.core.config import DecoderConfig
    from heisd_ros.core.engine import HybridDecoder

    mi = model_input(HybridDecoder(vla, DecoderConfig(method="ar")))
    assert mi.image_hw == (64, 64) and mi.max_positions == 1024
    assert mi.instruction_problem("pick up the red bowl", LIM) == ""
    many = " ".join(["word"] * 300)
    assert "300 tokens exceeds input_limits.max_instruction_tokens 256" in mi.instruction_problem(many, LIM)
    # within the token limit, but the prompt (16 patch tokens + template + text + 7 actions) does not fit 1024
    assert "exceeds the model's 1024" in mi.instruction_problem(" ".join(["w"] * 1000),
                                                                InputLimits(max_instruction_tokens=2000))


def test_a_decoder_without_a_model_gets_no_model_checks():
    from fake_decoder import FakeDecoder

    mi = model_input(FakeDecoder())
    assert mi == ModelInput() and mi.instruction_problem("x " * 5000, LIM) == ""


# --- conversions: sizes from the header, before decoding ----------------------------------------------


def _png(img) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def test_a_compressed_bomb_is_refused_from_its_header(monkeypatch):
    from PIL import Image as PILImage
    from PIL import ImageFile

    data = _png(PILImage.new("1", (8000, 8000)))
    assert len(data) < 10_000

    def no_load(self):
        raise AssertionError("pixels decoded")

    monkeypatch.setattr(ImageFile.ImageFile, "load", no_load)
    msg = CompressedImage(format="png", data=data)
    seen = []

    def check(h, w):
        seen.append((h, w))
        check_frame_shape(h, w, (64, 64), LIM)

    with pytest.raises(InputLimitError, match="frame 8000x8000 exceeds max_image_pixels"):
        conv.compressed_to_rgb(msg, check=check)
    assert seen == [(8000, 8000)]
    with pytest.raises(InvalidObservationError, match="exceeds 100000 pixels"):
        conv.compressed_to_rgb(msg, max_pixels=100_000)


def test_compressed_bytes_beyond_any_frame_are_refused_unread():
    msg = CompressedImage(format="jpeg", data=bytes(4 * 100 + 1))
    with pytest.raises(InvalidObservationError, match="401 bytes exceeds 400 bytes"):
        conv.compressed_to_rgb(msg, max_pixels=100)


def test_other_formats_are_not_parsed():
    from PIL import Image as PILImage

    buf = io.BytesIO()
    PILImage.new("RGB", (8, 8)).save(buf, format="BMP")
    with pytest.raises(InvalidObservationError, match="cannot decode"):
        conv.compressed_to_rgb(CompressedImage(format="png", data=buf.getvalue()))


def test_raw_header_checked_before_the_data():
    msg = Image(height=3000, width=4000, encoding="rgb8", step=12000, data=b"")
    with pytest.raises(InputLimitError, match="max_image_pixels"):
        conv.image_to_rgb(msg, check=lambda h, w: check_frame_shape(h, w, None, LIM))
    ok = conv.rgb_to_image(np.zeros((4, 5, 3), np.uint8), 1.0)
    ok.step = 4 * 5 + 200
    ok.data = bytes(ok.step * 4)
    with pytest.raises(InvalidObservationError, match="row step 220 is implausible"):
        conv.image_to_rgb(ok)


# --- memory and transport ------------------------------------------------------------------------------


def test_release_memory_runs():
    assert release_memory() in (True, False)


def test_fastdds_reader_profile_is_set_only_where_the_user_has_not(tmp_path):
    env: dict[str, str] = {}
    path = fastdds_reader_memory(env)
    assert path is not None and path.read_text() == PROFILE_XML
    assert env == {"FASTDDS_DEFAULT_PROFILES_FILE": str(path), "RMW_FASTRTPS_USE_QOS_FROM_XML": "1"}
    assert "<historyMemoryPolicy>DYNAMIC</historyMemoryPolicy>" in PROFILE_XML
    path.unlink()
    for user in ({"FASTDDS_DEFAULT_PROFILES_FILE": "mine.xml"}, {"RMW_FASTRTPS_USE_QOS_FROM_XML": "0"},
                 {"RMW_IMPLEMENTATION": "rmw_cyclonedds_cpp"}):  # fmt: skip
        env = dict(user)
        assert fastdds_reader_memory(env) is None and env == user
