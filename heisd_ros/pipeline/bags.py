"""rosbag2 recordings (sqlite3 and MCAP) read and written without ROS: the one home of bag I/O.

Built on the `rosbags` library, never on rclpy, so the offline tools and the tests handle bags on a
machine without ROS 2. Every bag shares one typestore: the ROS 2 (Kilted) standard messages plus
heisd_ros's own (msg/*.msg: ArmCommand, DecodeStats).

- `BagTopics`: the policy node's default topics, as recordings carry them;
- reading: `read_messages` (log time, raw CDR, message and header stamp of each message, read
  lazily in log-time order: one storage chunk at a time, whatever the bag's length), `read_topics`,
  `topic_counts`, `topic_types`, `image_rgb`; a damaged bag raises `BagError` naming it;
- writing: `BagWriter` and the message builders (`header`, `image_msg`, `compressed_image_msg`,
  `pose_msg`, `joint_state_msg`, `arm_command_msg`); `restamp_cdr` moves a header stamp.

Times are integer nanoseconds (`*_ns`); header stamps are builtin_interfaces/Time.
"""

from __future__ import annotations

import functools
import os
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

import numpy as np

from heisd_ros.core.errors import BagError, ConfigError, HeisdError, InvalidObservationError
from heisd_ros.core.files import check_size, read_capped_text
from heisd_ros.core.gripper import PANDA_FINGER_JOINTS
from heisd_ros.core.image_codec import SUPPORTED_ENCODINGS, msg_to_rgb, rgb_to_compressed, rgb_to_raw
from heisd_ros.pipeline.mcap_check import check_mcap

NS_PER_S = 1_000_000_000
IMAGE = "sensor_msgs/msg/Image"
COMPRESSED_IMAGE = "sensor_msgs/msg/CompressedImage"
POSE = "geometry_msgs/msg/PoseStamped"
JOINT_STATE = "sensor_msgs/msg/JointState"
STRING = "std_msgs/msg/String"
BOOL = "std_msgs/msg/Bool"
ARM_COMMAND = "heisd_ros/msg/ArmCommand"
DECODE_STATS = "heisd_ros/msg/DecodeStats"
STORAGES = ("mcap", "sqlite3")
"""rosbag2 storage plugins a bag can be written with (both can be read)."""
METADATA = "metadata.yaml"
"""A rosbag2 directory's description of its topics and storage files (read whole, by rosbags too)."""


@dataclass(frozen=True)
class BagTopics:
    """The policy node's topics (heisd_ros.ros.topics, made absolute), as recordings carry them."""

    images: tuple[tuple[str, str], ...] = (("agentview", "/agentview/image_raw"), ("wrist", "/wrist/image_raw"))
    """(view, topic) pairs, primary view first."""
    ee_pose: str = "/ee_pose"
    joint_states: str = "/joint_states"
    """The finger joints (sensor_msgs/JointState), for models whose state token reads the finger gap."""
    finger_joints: tuple[str, str] = PANDA_FINGER_JOINTS
    instruction: str = "/instruction"
    episode_result: str = "/episode_result"
    command: str = "/arm_command"
    """heisd_ros/msg/ArmCommand: what the node publishes, or the demonstrated action of a recording."""
    frame_id: str = "base_link"
    """Header frame of the poses, joint states and commands an export writes."""


# ---------------------------------------------------------------------------------------------
# typestore


def msg_dir() -> Path:
    """Where heisd_ros's .msg files are: the source tree, or an installed share/heisd_ros/msg."""
    candidates = [Path(__file__).resolve().parents[2] / "msg", Path(sys.prefix) / "share" / "heisd_ros" / "msg"]
    prefixes = [p for p in os.environ.get("AMENT_PREFIX_PATH", "").split(os.pathsep) if p]
    candidates += [Path(p) / "share" / "heisd_ros" / "msg" for p in prefixes]
    for c in candidates:
        if (c / "ArmCommand.msg").is_file():
            return c
    raise ConfigError(f"cannot find heisd_ros/msg/*.msg (looked in {[str(c) for c in candidates]})")


@functools.lru_cache(maxsize=1)
def typestore() -> Any:
    """The Kilted typestore plus heisd_ros's message types (from their .msg text). Shared: do not
    register more types on it."""
    from rosbags.typesys import Stores, get_types_from_msg, get_typestore

    ts = get_typestore(Stores.ROS2_KILTED)
    types: dict = {}
    for f in sorted(msg_dir().glob("*.msg")):
        types.update(get_types_from_msg(f.read_text(), f"heisd_ros/msg/{f.stem}"))
    ts.register(types)
    return ts


# ---------------------------------------------------------------------------------------------
# reading


def read_errors() -> tuple[type[BaseException], ...]:
    """What rosbags raises for a damaged bag. It has no common base: besides its own errors, corrupt
    metadata, storage or CDR surface as decoding, lookup, struct and SQLite errors, and a damaged
    MCAP record size as an OverflowError (a seek past what an int can address)."""
    import sqlite3
    import struct

    from rosbags.highlevel import AnyReaderError
    from rosbags.rosbag2 import ReaderError
    from rosbags.serde import SerdeError

    errors: list[type[BaseException]] = [AnyReaderError, ReaderError, SerdeError, OSError, ValueError, KeyError,
                                         IndexError, TypeError, OverflowError, struct.error, sqlite3.Error]  # fmt: skip
    try:
        import apsw  # rosbags' SQLite binding

        errors.append(apsw.Error)
    except ImportError:
        pass
    return tuple(errors)


@dataclass(frozen=True)
class BagRecord:
    """One message of a bag."""

    topic: str
    msgtype: str
    t_ns: int
    """Log (recorded) time."""
    raw: bytes
    """The message's CDR serialisation, as stored."""
    msg: Any
    stamp_ns: int | None
    """Header stamp; None for a message without a header."""


def read_messages(path: str | Path, topics: Iterable[str] | None = None,
                  msgtypes: Iterable[str] | None = None) -> Iterator[BagRecord]:  # fmt: skip
    """The bag's messages on `topics` and of `msgtypes` (None: any), in log-time order.

    A bag is untrusted input: every message is deserialised here (a malformed one fails the read,
    it never reaches a consumer), and damage to the metadata, the storage file, a message or its
    header stamp raises BagError naming the bag.
    """
    from rosbags.highlevel import AnyReader

    path = Path(path)
    wanted_topics = None if topics is None else set(topics)
    wanted_types = None if msgtypes is None else set(msgtypes)
    if not path.is_dir():
        raise BagError(f"bag {path} not found (a rosbag2 directory)")
    for storage in sorted(path.glob("*.mcap")):
        check_mcap(storage)  # sizes the file claims, before rosbags allocates them
    if (path / METADATA).is_file():
        check_size(path / METADATA, BagError)  # rosbags reads it whole
    try:
        with AnyReader([path], default_typestore=typestore()) as reader:
            conns = [c for c in reader.connections if (wanted_topics is None or c.topic in wanted_topics)
                     and (wanted_types is None or c.msgtype in wanted_types)]  # fmt: skip
            if not conns:  # rosbags reads every connection when given none
                return
            for conn, t_ns, raw in reader.messages(connections=conns):
                msg = reader.deserialize(raw, conn.msgtype)
                stamp_ns = _header_stamp_ns(path, conn.topic, msg)
                yield BagRecord(conn.topic, conn.msgtype, t_ns, bytes(raw), msg, stamp_ns)
    except HeisdError:
        raise
    except read_errors() as err:
        raise BagError(f"cannot read bag {path}: {type(err).__name__}: {err}") from err


def _header_stamp_ns(bag: Path, topic: str, msg: Any) -> int | None:
    hdr = getattr(msg, "header", None)
    if hdr is None:
        return None
    stamp = hdr.stamp
    if not 0 <= stamp.nanosec < NS_PER_S:
        raise BagError(f"bag {bag}: {topic} has a header stamp with nanosec {stamp.nanosec}")
    return int(stamp.sec) * NS_PER_S + int(stamp.nanosec)


def read_topics(path: str | Path, topics: Iterable[str] | None = None) -> dict[str, list[tuple[int, Any]]]:
    """topic -> [(log time ns, deserialised message)] of a bag."""
    out: dict[str, list[tuple[int, Any]]] = {}
    for r in read_messages(path, topics):
        out.setdefault(r.topic, []).append((r.t_ns, r.msg))
    return out


def _topic_metadata(path: str | Path, field: str, convert: Any) -> dict[str, Any]:
    """Topic -> `convert(topic_metadata[field])` (or of the entry's own `field`) for every topic of
    a bag's metadata.yaml (the storage file is not opened)."""
    import yaml

    path = Path(path)
    try:
        meta = yaml.safe_load(read_capped_text(path / METADATA, BagError))["rosbag2_bagfile_information"]
        out = {}
        for e in meta["topics_with_message_count"] or []:
            value = e[field] if field in e else e["topic_metadata"][field]
            out[str(e["topic_metadata"]["name"])] = convert(value)
        return out
    except (OSError, UnicodeDecodeError, yaml.YAMLError, KeyError, TypeError, ValueError) as err:
        raise BagError(f"cannot read bag {path}: metadata.yaml: {type(err).__name__}: {err}") from err


def topic_counts(path: str | Path) -> dict[str, int]:
    """Topic -> message count, from the bag's metadata.yaml (the storage file is not opened)."""
    return _topic_metadata(path, "message_count", int)


def topic_types(path: str | Path) -> dict[str, str]:
    """Topic -> message type (e.g. sensor_msgs/msg/Image), from the bag's metadata.yaml."""
    return _topic_metadata(path, "type", str)


def image_rgb(msg: Any) -> np.ndarray:
    """A deserialised sensor_msgs/Image (rgb8, bgr8, rgba8, bgra8, mono8) or CompressedImage (png,
    jpeg) -> RGB uint8 [H, W, 3]; an image that cannot be read raises BagError."""
    try:
        return msg_to_rgb(msg)
    except InvalidObservationError as err:
        raise BagError(str(err)) from err


def restamp_cdr(raw: bytes, msgtype: str, stamp_ns: int) -> bytes:
    """The CDR of a message with a header, its header stamp set to `stamp_ns` (clipped at 0)."""
    ts = typestore()
    msg = ts.deserialize_cdr(raw, msgtype)
    msg.header.stamp = time_msg(max(0, stamp_ns))
    return bytes(ts.serialize_cdr(msg, msgtype))


# ---------------------------------------------------------------------------------------------
# writing


class BagWriter:
    """A new rosbag2 directory being written; messages are serialised with `typestore()`.

    Topics are declared with `add` (once each) before their first message. Use as a context
    manager, or call `close`; a write failure raises BagError naming the bag.
    """

    def __init__(self, path: str | Path, storage: str = "mcap") -> None:
        from rosbags.rosbag2 import StoragePlugin, Writer

        if storage not in STORAGES:
            raise ConfigError(f"storage must be one of {STORAGES}, got {storage!r}")
        self.path = Path(path)
        self.ts = typestore()
        self.counts: dict[str, int] = {}
        """topic -> messages written."""
        self._conns: dict[str, tuple[Any, str]] = {}
        plugin = StoragePlugin.MCAP if storage == "mcap" else StoragePlugin.SQLITE3
        with self._failures():
            self._writer = Writer(self.path, version=9, storage_plugin=plugin)
            self._writer.open()

    @contextmanager
    def _failures(self) -> Iterator[None]:
        from rosbags.rosbag2.errors import WriterError

        try:
            yield
        except (WriterError, OSError) as err:
            raise BagError(f"cannot write bag {self.path}: {err}") from err

    def add(self, topic: str, msgtype: str, latched: bool = False) -> None:
        """Declare `topic` (no-op when already declared); latched: offered as reliable + transient-local,
        as the node subscribes to the instruction (a late joiner still gets it)."""
        if topic in self._conns:
            return
        qos = {"offered_qos_profiles": latched_qos()} if latched else {}
        with self._failures():
            conn = self._writer.add_connection(topic, msgtype, typestore=self.ts, **qos)
        self._conns[topic] = (conn, msgtype)
        self.counts[topic] = 0

    def write(self, topic: str, t_ns: int, msg: Any) -> None:
        """Serialise `msg` (of the topic's type) and write it at log time t_ns."""
        self.write_raw(topic, t_ns, self.ts.serialize_cdr(msg, self._conns[topic][1]))

    def write_raw(self, topic: str, t_ns: int, raw: bytes) -> None:
        with self._failures():
            self._writer.write(self._conns[topic][0], int(t_ns), raw)
        self.counts[topic] += 1

    def close(self) -> None:
        with self._failures():
            self._writer.close()

    def __enter__(self) -> "BagWriter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def latched_qos() -> list[Any]:
    """Reliable + transient-local offered QoS of a latched topic (the instruction)."""
    from rosbags.interfaces import Qos, QosDurability, QosHistory, QosLiveliness, QosReliability, QosTime

    never = QosTime(sec=0, nsec=0)
    return [Qos(
        history=QosHistory.KEEP_LAST, depth=1, reliability=QosReliability.RELIABLE,
        durability=QosDurability.TRANSIENT_LOCAL, deadline=never, lifespan=never,
        liveliness=QosLiveliness.AUTOMATIC, liveliness_lease_duration=never,
        avoid_ros_namespace_conventions=False,
    )]


def time_msg(t_ns: int) -> Any:
    """builtin_interfaces/Time of t_ns >= 0."""
    return typestore().types["builtin_interfaces/msg/Time"](sec=t_ns // NS_PER_S, nanosec=t_ns % NS_PER_S)


def header(t_ns: int, frame_id: str) -> Any:
    return typestore().types["std_msgs/msg/Header"](stamp=time_msg(t_ns), frame_id=frame_id)


def image_msg(hdr: Any, rgb: np.ndarray, encoding: str = "rgb8") -> Any:
    """sensor_msgs/Image of RGB uint8 [H, W, 3] in a raw encoding (rgb8, bgr8, rgba8, bgra8, mono8;
    alpha 255, mono the channel mean)."""
    if encoding not in SUPPORTED_ENCODINGS:
        raise ConfigError(f"encoding must be one of {SUPPORTED_ENCODINGS}, got {encoding!r}")
    data, step = rgb_to_raw(rgb, encoding)
    h, w = np.shape(rgb)[:2]
    return typestore().types[IMAGE](header=hdr, height=h, width=w, encoding=encoding, is_bigendian=0, step=step,
                                    data=data)  # fmt: skip


def compressed_image_msg(hdr: Any, rgb: np.ndarray, codec: str) -> Any:
    """sensor_msgs/CompressedImage of RGB uint8 [H, W, 3], codec 'png' or 'jpeg' (needs Pillow)."""
    data = np.frombuffer(rgb_to_compressed(rgb, codec), dtype=np.uint8)
    return typestore().types[COMPRESSED_IMAGE](header=hdr, format=f"rgb8; {codec} compressed rgb8", data=data)


def pose_msg(hdr: Any, pos: Sequence[float], quat_xyzw: Sequence[float] = (0.0, 0.0, 0.0, 1.0)) -> Any:
    """geometry_msgs/PoseStamped of a position (m) and an (x, y, z, w) orientation."""
    T = typestore().types
    position = T["geometry_msgs/msg/Point"](x=float(pos[0]), y=float(pos[1]), z=float(pos[2]))
    orientation = T["geometry_msgs/msg/Quaternion"](x=float(quat_xyzw[0]), y=float(quat_xyzw[1]),
                                                    z=float(quat_xyzw[2]), w=float(quat_xyzw[3]))  # fmt: skip
    return T[POSE](header=hdr, pose=T["geometry_msgs/msg/Pose"](position=position, orientation=orientation))


def joint_state_msg(hdr: Any, names: Sequence[str], positions: Sequence[float]) -> Any:
    """sensor_msgs/JointState with positions only."""
    q = np.asarray(positions, dtype=np.float64)
    return typestore().types[JOINT_STATE](header=hdr, name=list(names), position=q, velocity=np.zeros(0),
                                          effort=np.zeros(0))  # fmt: skip


def arm_command_msg(hdr: Any, step_id: int, action: Sequence[float], mode: str, method: str) -> Any:
    """heisd_ros/msg/ArmCommand of a 7-D action (delta position [3], delta rotation [3], gripper)."""
    a = np.asarray(action, dtype=np.float64)
    return typestore().types[ARM_COMMAND](header=hdr, step_id=int(step_id), delta_position=a[:3].copy(),
                                          delta_rotation=a[3:6].copy(), gripper=float(a[6]), decode_mode=mode,
                                          method=method)  # fmt: skip
