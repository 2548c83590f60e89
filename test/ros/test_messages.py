"""The generated heisd_ros interfaces: fields, rclpy CDR round trips, agreement with rosbags.

rosbags (which writes and reads our bags) parses the same msg/*.msg text on its own; its CDR
must be what rclpy puts on the wire. rclpy (FastCDR) leaves alignment padding bytes
uninitialised, so the byte comparison checks every data byte and the padding positions
computed from the CDR alignment rules, where rosbags writes zeros.
"""

from __future__ import annotations

import json
import math
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rclpy.serialization import deserialize_message, serialize_message
from rosbags.interfaces import Nodetype
from rosbags.typesys import Stores, get_types_from_msg, get_typestore

from builtin_interfaces.msg import Time
from heisd_ros.msg import ArmCommand, DecodeStats
from std_msgs.msg import Header

REPO = Path(__file__).resolve().parents[2]
ARM = "heisd_ros/msg/ArmCommand"
STATS = "heisd_ros/msg/DecodeStats"

ARM_FIELDS = {
    "header": "std_msgs/Header",
    "step_id": "uint64",
    "delta_position": "double[3]",
    "delta_rotation": "double[3]",
    "gripper": "double",
    "decode_mode": "string",
    "method": "string",
}
STATS_FIELDS = {
    "header": "std_msgs/Header",
    "step_id": "uint64",
    "method": "string",
    "mode": "string",
    "skipped": "boolean",
    "llm_forwards": "uint32",
    "tokens_per_forward": "sequence<uint32>",
    "accept_length": "float",
    "vision_ms": "float",
    "retrieval_ms": "float",
    "draft_ms": "float",
    "verify_ms": "float",
    "total_ms": "float",
    "cpu_ms": "float",
    "fused_metric": "float",
    "retrieval_score": "float",
    "fallback": "string",
}
STATS_FLOAT32 = (
    "accept_length", "vision_ms", "retrieval_ms", "draft_ms", "verify_ms", "total_ms", "cpu_ms",
    "fused_metric", "retrieval_score",
)


@pytest.fixture(scope="module")
def typestore():
    """rosbags' Kilted store plus our two types, parsed from the .msg files."""
    store = get_typestore(Stores.ROS2_KILTED)
    types: dict[str, Any] = {}
    for name in (ARM, STATS):
        text = (REPO / "msg" / f"{name.rsplit('/', 1)[1]}.msg").read_text()
        types.update(get_types_from_msg(text, name))
    store.register(types)
    return store


# --- one message as plain values, built both ways ---------------------------------------------


@dataclass
class Stamp:
    sec: int = 0
    nanosec: int = 0
    frame_id: str = ""


@dataclass
class Arm:
    stamp: Stamp = field(default_factory=Stamp)
    step_id: int = 0
    delta_position: tuple[float, float, float] = (0.0, 0.0, 0.0)
    delta_rotation: tuple[float, float, float] = (0.0, 0.0, 0.0)
    gripper: float = 0.0
    decode_mode: str = ""
    method: str = ""


@dataclass
class Stats:
    stamp: Stamp = field(default_factory=Stamp)
    step_id: int = 0
    method: str = ""
    mode: str = ""
    skipped: bool = False
    llm_forwards: int = 0
    tokens_per_forward: list[int] = field(default_factory=list)
    floats: dict[str, float] = field(default_factory=lambda: dict.fromkeys(STATS_FLOAT32, 0.0))
    fallback: str = ""


def _rclpy_header(s: Stamp) -> Header:
    return Header(stamp=Time(sec=s.sec, nanosec=s.nanosec), frame_id=s.frame_id)


def _rosbags_header(store, s: Stamp):
    time = store.types["builtin_interfaces/msg/Time"](sec=s.sec, nanosec=s.nanosec)
    return store.types["std_msgs/msg/Header"](stamp=time, frame_id=s.frame_id)


def arm_rclpy(v: Arm) -> ArmCommand:
    return ArmCommand(
        header=_rclpy_header(v.stamp), step_id=v.step_id, delta_position=list(v.delta_position),
        delta_rotation=list(v.delta_rotation), gripper=v.gripper, decode_mode=v.decode_mode,
        method=v.method)


def arm_rosbags(store, v: Arm):
    return store.types[ARM](
        header=_rosbags_header(store, v.stamp), step_id=v.step_id,
        delta_position=np.array(v.delta_position, dtype=np.float64),
        delta_rotation=np.array(v.delta_rotation, dtype=np.float64), gripper=v.gripper,
        decode_mode=v.decode_mode, method=v.method)


def stats_rclpy(v: Stats) -> DecodeStats:
    return DecodeStats(
        header=_rclpy_header(v.stamp), step_id=v.step_id, method=v.method, mode=v.mode,
        skipped=v.skipped, llm_forwards=v.llm_forwards,
        tokens_per_forward=list(v.tokens_per_forward), fallback=v.fallback, **v.floats)


def stats_rosbags(store, v: Stats):
    return store.types[STATS](
        header=_rosbags_header(store, v.stamp), step_id=v.step_id, method=v.method, mode=v.mode,
        skipped=v.skipped, llm_forwards=v.llm_forwards,
        tokens_per_forward=np.array(v.tokens_per_forward, dtype=np.uint32),
        fallback=v.fallback, **v.floats)


def plain(msg: Any) -> Any:
    """Nested plain Python values of an rclpy or a rosbags message (NaN-aware compare: repr)."""
    if hasattr(msg, "get_fields_and_field_types"):
        names = list(msg.get_fields_and_field_types())
    elif hasattr(msg, "__dataclass_fields__"):
        names = [n for n in msg.__dataclass_fields__ if n != "__msgtype__"]
    else:
        if isinstance(msg, (np.ndarray, list, tuple)) or type(msg).__name__ == "array":
            return [plain(x) for x in msg]
        if isinstance(msg, (bool, np.bool_)):
            return bool(msg)
        if isinstance(msg, (int, np.integer)):
            return int(msg)
        if isinstance(msg, (float, np.floating)):
            return repr(float(msg))
        return msg
    return {n: plain(getattr(msg, n)) for n in names}


# --- CDR alignment padding ---------------------------------------------------------------------

_PRIMITIVE_BYTES = {
    "bool": 1, "byte": 1, "char": 1, "int8": 1, "uint8": 1, "int16": 2, "uint16": 2,
    "int32": 4, "uint32": 4, "float32": 4, "int64": 8, "uint64": 8, "float64": 8,
}


def cdr_padding(store, typename: str, msg: Any) -> tuple[set[int], int]:
    """Byte positions of alignment padding in the little-endian CDR of `msg`, and its length.

    Alignment is relative to the end of the 4-byte encapsulation header (XCDR1/plain CDR:
    a primitive of n bytes is aligned to n; string and sequence lengths are uint32).
    """
    padding: set[int] = set()
    pos = 4

    def align(n: int) -> None:
        nonlocal pos
        while (pos - 4) % n:
            padding.add(pos)
            pos += 1

    def visit(desc: tuple, value: Any) -> None:
        nonlocal pos
        kind, arg = desc
        if kind == Nodetype.BASE:
            name = arg[0]
            if name == "string":
                align(4)
                pos += 4 + len(value.encode()) + 1
            else:
                align(_PRIMITIVE_BYTES[name])
                pos += _PRIMITIVE_BYTES[name]
        elif kind == Nodetype.NAME:
            visit_message(arg, value)
        elif kind == Nodetype.ARRAY:
            for item in value:
                visit(arg[0], item)
        elif kind == Nodetype.SEQUENCE:
            align(4)
            pos += 4
            for item in value:
                visit(arg[0], item)
        else:
            raise AssertionError(f"unexpected node {desc}")

    def visit_message(name: str, value: Any) -> None:
        for fname, desc in store.fielddefs[name][1]:
            visit(desc, getattr(value, fname))

    visit_message(typename, msg)
    return padding, pos


def assert_same_cdr(store, typename: str, rclpy_msg: Any, rosbags_msg: Any) -> None:
    """rclpy and rosbags serialise to the same CDR, and each reads the other's bytes."""
    ours = serialize_message(rclpy_msg)
    theirs = bytes(store.serialize_cdr(rosbags_msg, typename))
    padding, length = cdr_padding(store, typename, rosbags_msg)
    assert len(ours) == len(theirs) == length
    assert ours[:4] == theirs[:4] == b"\x00\x01\x00\x00"  # CDR_LE encapsulation
    data = [i for i in range(length) if i not in padding]
    assert bytes(ours[i] for i in data) == bytes(theirs[i] for i in data)
    assert all(theirs[i] == 0 for i in padding)

    back = deserialize_message(theirs, type(rclpy_msg))
    assert plain(back) == plain(rclpy_msg)
    assert plain(store.deserialize_cdr(ours, typename)) == plain(rosbags_msg)


# --- tests -------------------------------------------------------------------------------------


def test_generated_fields_and_types() -> None:
    assert ArmCommand.get_fields_and_field_types() == ARM_FIELDS
    assert DecodeStats.get_fields_and_field_types() == STATS_FIELDS


def test_rosbags_parses_the_same_fields(typestore) -> None:
    for cls, name in ((ArmCommand, ARM), (DecodeStats, STATS)):
        assert [n for n, _ in typestore.fielddefs[name][1]] == list(cls.get_fields_and_field_types())


def test_fixed_arrays_and_sequences() -> None:
    msg = ArmCommand()
    assert isinstance(msg.delta_position, np.ndarray)
    assert msg.delta_position.dtype == np.float64 and msg.delta_position.shape == (3,)
    assert msg.delta_rotation.dtype == np.float64 and msg.delta_rotation.shape == (3,)
    msg.delta_position = [0.1, -0.2, 0.3]
    np.testing.assert_array_equal(msg.delta_position, [0.1, -0.2, 0.3])

    # Kilted checks field values only with check_fields=True (or ROS_PYTHON_CHECK_FIELDS=1);
    # without it a wrong length or type is only caught (or not) when serialising.
    checked = ArmCommand(check_fields=True)
    with pytest.raises(AssertionError, match="length 3"):
        checked.delta_position = [0.1, 0.2]
    with pytest.raises(AssertionError):
        checked.step_id = -1  # uint64
    with pytest.raises(AssertionError):
        checked.gripper = 1  # an int in a float64 field

    stats = DecodeStats(tokens_per_forward=[3, 1, 7])
    assert list(stats.tokens_per_forward) == [3, 1, 7]
    assert stats.tokens_per_forward.typecode == "I"  # uint32


def test_rclpy_round_trip() -> None:
    cmd = arm_rclpy(Arm(Stamp(12, 345, "base"), 7, (0.1, -0.2, 0.3), (0.01, 0.02, -0.03),
                        1.0, "drafter", "heisd"))
    back = deserialize_message(serialize_message(cmd), ArmCommand)
    assert back == cmd
    assert back.header.stamp.sec == 12 and back.header.frame_id == "base"
    np.testing.assert_array_equal(back.delta_position, [0.1, -0.2, 0.3])

    floats = dict.fromkeys(STATS_FLOAT32, 0.5)
    stats = stats_rclpy(Stats(Stamp(1, 2, "cam"), 3, "heisd", "retrieval", True, 2, [4, 3],
                              floats, "retrieval: low score"))
    back_stats = deserialize_message(serialize_message(stats), DecodeStats)
    assert back_stats == stats
    assert list(back_stats.tokens_per_forward) == [4, 3]


def test_nan_fields_survive(typestore) -> None:
    """DecodeStats uses NaN for 'not available' (fused_metric, retrieval_score)."""
    floats = dict.fromkeys(STATS_FLOAT32, 1.25)
    floats["fused_metric"] = math.nan
    floats["retrieval_score"] = math.nan
    values = Stats(Stamp(5, 6, "x"), 9, "ar", "skip", True, 0, [], floats, "")
    back = deserialize_message(serialize_message(stats_rclpy(values)), DecodeStats)
    assert math.isnan(back.fused_metric) and math.isnan(back.retrieval_score)
    assert back.accept_length == 1.25
    assert_same_cdr(typestore, STATS, stats_rclpy(values), stats_rosbags(typestore, values))


def test_defaults_match_rosbags(typestore) -> None:
    assert_same_cdr(typestore, ARM, arm_rclpy(Arm()), arm_rosbags(typestore, Arm()))
    assert_same_cdr(typestore, STATS, stats_rclpy(Stats()), stats_rosbags(typestore, Stats()))


def test_type_hashes_match_rosbags(typestore) -> None:
    """The RIHS01 hashes rosidl generated (stored in bags) equal rosbags' for our .msg text."""
    prefixes = [p for p in os.environ.get("AMENT_PREFIX_PATH", "").split(os.pathsep) if p]
    candidates = [Path(p, "share", "heisd_ros", "msg") for p in [*prefixes, sys.prefix]]
    msg_share = next((c for c in candidates if (c / "ArmCommand.json").is_file()), None)
    assert msg_share is not None, f"no share/heisd_ros/msg/*.json in {candidates}"
    for name in (ARM, STATS):
        generated = json.loads((msg_share / f"{name.rsplit('/', 1)[1]}.json").read_text())
        hashes = {h["type_name"]: h["hash_string"] for h in generated["type_hashes"]}
        assert hashes[name] == typestore.hash_rihs01(name)


_names = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
                 max_size=24)
_stamps = st.builds(Stamp, st.integers(-(2**31), 2**31 - 1), st.integers(0, 2**32 - 1), _names)
_f64 = st.floats(allow_nan=False)
_f32 = st.floats(width=32, allow_nan=False)


@settings(max_examples=60, deadline=None)
@given(st.builds(Arm, _stamps, st.integers(0, 2**64 - 1), st.tuples(_f64, _f64, _f64),
                 st.tuples(_f64, _f64, _f64), _f64, _names, _names))
def test_arm_command_cdr_equals_rosbags(typestore, values: Arm) -> None:
    assert_same_cdr(typestore, ARM, arm_rclpy(values), arm_rosbags(typestore, values))


@settings(max_examples=60, deadline=None)
@given(st.builds(Stats, _stamps, st.integers(0, 2**64 - 1), _names, _names, st.booleans(),
                 st.integers(0, 2**32 - 1), st.lists(st.integers(0, 2**32 - 1), max_size=9),
                 st.fixed_dictionaries({k: _f32 for k in STATS_FLOAT32}), _names))
def test_decode_stats_cdr_equals_rosbags(typestore, values: Stats) -> None:
    assert_same_cdr(typestore, STATS, stats_rclpy(values), stats_rosbags(typestore, values))
