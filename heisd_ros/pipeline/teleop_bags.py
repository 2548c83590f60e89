"""rosbag2 recordings (teleoperation, or `heisd-libero gen-demos` exports) as demonstration episodes.

A topic map names what each recorded topic is, `TOPIC=ROLE` pairs joined by commas
(`heisd build-db --map`); the message type is read from the bag:

| role | message types | |
|---|---|---|
| agentview, wrist | sensor_msgs/Image, sensor_msgs/CompressedImage | camera views, primary first |
| pose | geometry_msgs/PoseStamped | end-effector pose, m, robot base frame |
| action | heisd_ros/ArmCommand, geometry_msgs/TwistStamped or Twist | the *commanded* action: one step each |
| gripper | std_msgs/Float64, Float32 or Bool | commanded gripper (with a twist action) |
| fingers | sensor_msgs/JointState | the two finger joints (`finger_joints`), optional |
| instruction | std_msgs/String | the task, optional (else `BagReading.instruction`) |
| result | std_msgs/Bool | episode outcome, optional (else a success) |

Pairing. Every action message is one step, timed by its header stamp (a message without a header
by its log time). Each step takes the image of every view and the pose nearest in time, within
`max_skew_s`; a step without them is dropped. The gripper topic is held: a step takes the last
gripper value published at or before it (steps before the first one are dropped). Finger joints
are paired like the pose and kept only when every step has them.

A twist is a velocity: the step's delta is `linear / twist_linear_scale` and
`angular / twist_angular_scale`; with both scales at the control rate this is the inverse of the
node's Servo twist (delta / control period, docs/arm_stacks.md).
The actions then go through the action convention (`heisd_ros.pipeline.action_convention`).

Episode numbers are stable as a recording set grows: a bag named `demo_<i>` (gen-demos) is
(crc32(parent directory) mod 100000) * 1000 + i, any other the crc32 of its path below the root
(`scan_bags` refuses the rare clash).
"""

from __future__ import annotations

import hashlib
import re
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from heisd_ros.core.gripper import PANDA_FINGER_JOINTS
from heisd_ros.pipeline.action_convention import ActionConvention, DemoDataError
from heisd_ros.pipeline.bags import (ARM_COMMAND, BOOL, COMPRESSED_IMAGE, IMAGE, JOINT_STATE, POSE, STRING, BagError,
                                     BagTopics, image_rgb, read_messages, topic_types)
from heisd_ros.pipeline.demo_episode import EPISODES_PER_TASK, VIEWS, DemoEpisode, EpisodeRef

TWIST = "geometry_msgs/msg/TwistStamped"
TWIST_UNSTAMPED = "geometry_msgs/msg/Twist"
FLOAT64, FLOAT32 = "std_msgs/msg/Float64", "std_msgs/msg/Float32"
ROLE_TYPES: dict[str, tuple[str, ...]] = {
    **{v: (IMAGE, COMPRESSED_IMAGE) for v in VIEWS},
    "pose": (POSE,), "action": (ARM_COMMAND, TWIST, TWIST_UNSTAMPED), "gripper": (FLOAT64, FLOAT32, BOOL),
    "fingers": (JOINT_STATE,), "instruction": (STRING,), "result": (BOOL,),
}
"""Role -> the message types a topic of that role may carry."""
MAX_SKEW_S = 0.025


@dataclass(frozen=True)
class TopicMap:
    """Which recorded topic carries what (see the module docstring); '' = not recorded."""

    views: tuple[tuple[str, str], ...]
    """(view, topic) pairs, in `VIEWS` order."""
    pose: str
    action: str
    gripper: str = ""
    fingers: str = ""
    instruction: str = ""
    result: str = ""

    def __post_init__(self) -> None:
        if not self.views or self.views[0][0] != VIEWS[0]:
            raise DemoDataError(f"the topic map needs the primary view: TOPIC={VIEWS[0]}")
        if not self.pose or not self.action:
            raise DemoDataError("the topic map needs TOPIC=pose and TOPIC=action (docs/your_data.md)")

    @staticmethod
    def parse(text: str) -> TopicMap:
        """'TOPIC=ROLE,TOPIC=ROLE,...' -> TopicMap; each role at most once, every role known."""
        roles: dict[str, str] = {}
        for item in filter(None, (s.strip() for s in text.split(","))):
            topic, sep, role = item.rpartition("=")
            if not sep or not topic or role not in ROLE_TYPES:
                raise DemoDataError(f"bad map entry {item!r}: expected TOPIC=ROLE, ROLE one of {sorted(ROLE_TYPES)}")
            if role in roles:
                raise DemoDataError(f"role {role!r} is mapped twice ({roles[role]}, {topic})")
            roles[role] = topic
        views = tuple((v, roles.pop(v)) for v in VIEWS if v in roles)
        return TopicMap(views=views, pose=roles.pop("pose", ""), action=roles.pop("action", ""), **roles)

    @staticmethod
    def node_topics(topics: BagTopics | None = None) -> TopicMap:
        """The policy node's own topics, as `heisd-libero gen-demos` exports its demonstrations."""
        topics = topics or BagTopics()
        return TopicMap(views=tuple(topics.images), pose=topics.ee_pose, action=topics.command,
                        fingers=topics.joint_states, instruction=topics.instruction, result=topics.episode_result)

    def roles(self) -> dict[str, str]:
        """role -> topic of every mapped role."""
        out = dict(self.views)
        out.update({r: t for r in ("pose", "action", "gripper", "fingers", "instruction", "result")
                    if (t := getattr(self, r))})
        return out


@dataclass(frozen=True)
class BagReading:
    """How recordings are read: the topic map and what the recordings do not say themselves."""

    topics: TopicMap = field(default_factory=TopicMap.node_topics)
    instruction: str = ""
    """The task of recordings without an instruction topic."""
    finger_joints: tuple[str, str] = PANDA_FINGER_JOINTS
    twist_linear_scale: float = 1.0
    """A twist's linear velocity = delta position * this (so the delta = linear / this)."""
    twist_angular_scale: float = 1.0
    max_skew_s: float = MAX_SKEW_S
    """Largest |time difference| between a step's action and the image / pose paired with it (s)."""
    convention: ActionConvention = field(default_factory=ActionConvention)

    def __post_init__(self) -> None:
        if not (self.twist_linear_scale > 0 and self.twist_angular_scale > 0 and self.max_skew_s > 0):
            raise DemoDataError("twist scales and max_skew_s must be > 0")

    def digest(self) -> str:
        """Short hash of these options (part of the cache key of an episode read with them)."""
        return hashlib.sha1(repr(self).encode()).hexdigest()[:8]


def bag_dirs(bags: str | Path) -> list[Path]:
    """rosbag2 directories (those holding metadata.yaml) under `bags`, sorted."""
    root = Path(bags)
    found = sorted({p.parent for p in root.rglob("metadata.yaml")})
    if not found:
        raise DemoDataError(f"no rosbag2 recordings (metadata.yaml) under {root}")
    return found


def episode_number(bag: Path, root: Path) -> int:
    """The stable episode number of a recording (module docstring)."""
    m = re.fullmatch(r"demo_(\d+)", bag.name)
    if m:
        return (zlib.crc32(bag.parent.name.encode()) % 100000) * EPISODES_PER_TASK + int(m.group(1)) % EPISODES_PER_TASK
    rel = bag.relative_to(root) if bag != root and bag.is_relative_to(root) else Path(bag.name)
    return zlib.crc32(rel.as_posix().encode())


def scan_bags(bags: str | Path, dataset: str, reading: BagReading | None = None) -> list[EpisodeRef]:
    """EpisodeRefs of the recordings under `bags` (the instruction is read when one is loaded,
    unless `reading` gives it); `reading` None = the node's topics."""
    root = Path(bags)
    refs, seen = [], {}
    for b in bag_dirs(root):
        number = episode_number(b, root)
        if number in seen:
            raise DemoDataError(f"recordings {seen[number]} and {b} get the same episode number; rename one")
        seen[number] = b
        task = reading.instruction if reading is not None and reading.instruction else b.parent.name
        refs.append(EpisodeRef("bag", str(b), b.name, dataset, task, number, -1, reader=reading))
    return refs


def _topic_types(bag: Path) -> dict[str, str]:
    try:
        return topic_types(bag)
    except BagError as err:
        raise DemoDataError(str(err)) from err


def _check_types(bag: Path, topics: TopicMap, types: dict[str, str]) -> None:
    for role, topic in topics.roles().items():
        if topic not in types:
            optional = role in ("fingers", "instruction", "result")
            if optional:
                continue
            raise DemoDataError(f"{bag}: no topic {topic} ({role}); the recording has {sorted(types)}")
        if types[topic] not in ROLE_TYPES[role]:
            raise DemoDataError(f"{bag}: {topic} ({role}) carries {types[topic]}; a {role} topic must be one of "
                                f"{list(ROLE_TYPES[role])}")
    if types[topics.action] != ARM_COMMAND and not topics.gripper:
        raise DemoDataError(f"{bag}: a {types[topics.action]} action needs a gripper topic (TOPIC=gripper)")
    if types[topics.action] == ARM_COMMAND and topics.gripper:
        raise DemoDataError(f"{bag}: the ArmCommand action carries its gripper; drop the gripper topic from the map")


def _streams(bag: Path, topics: TopicMap) -> dict[str, list[tuple[int, Any]]]:
    """topic -> [(header stamp ns, or log time without a header, message)] by time."""
    wanted = set(topics.roles().values())
    streams: dict[str, list[tuple[int, Any]]] = {t: [] for t in wanted}
    try:
        for r in read_messages(bag, wanted):
            streams[r.topic].append((r.t_ns if r.stamp_ns is None else r.stamp_ns, r.msg))
    except BagError as err:
        raise DemoDataError(str(err)) from err
    return {t: sorted(s, key=lambda x: x[0]) for t, s in streams.items()}


def _nearest(stamps: np.ndarray, t: int) -> int:
    i = int(np.searchsorted(stamps, t))
    cands = [j for j in (i - 1, i) if 0 <= j < len(stamps)]
    return min(cands, key=lambda j: abs(int(stamps[j]) - t))


def _arm_action(msg: Any, msgtype: str, reading: BagReading) -> np.ndarray:
    """The 7-D (or, for a twist, 6-D) raw action of one action message."""
    if msgtype == ARM_COMMAND:
        return np.concatenate([np.asarray(msg.delta_position, float), np.asarray(msg.delta_rotation, float),
                               [float(msg.gripper)]])
    twist = getattr(msg, "twist", msg)
    lin, ang = twist.linear, twist.angular
    return np.array([lin.x, lin.y, lin.z, ang.x, ang.y, ang.z], float) / np.repeat(
        [reading.twist_linear_scale, reading.twist_angular_scale], 3)


def _instruction(bag: Path, streams: dict, reading: BagReading) -> str:
    topic = reading.topics.instruction
    if topic and streams.get(topic):
        text = str(streams[topic][0][1].data).strip()
        if text:
            return text
    if reading.instruction:
        return reading.instruction
    where = f"no message on {topic}" if topic else "no instruction topic mapped"
    raise DemoDataError(f"{bag}: {where}; give the task with --instruction TEXT (or map TOPIC=instruction)")


def _finger_series(messages: list[tuple[int, Any]], names: tuple[str, str]) -> list[tuple[int, np.ndarray]]:
    """(stamp, [q1, q2]) of the JointState messages that name both finger joints, by stamp."""
    out = []
    for stamp, msg in messages:
        listed = list(msg.name)
        if all(n in listed for n in names) and len(msg.position) == len(listed):
            out.append((stamp, np.array([float(msg.position[listed.index(n)]) for n in names])))
    return sorted(out, key=lambda x: x[0])


def _pair_steps(bag: Path, streams: dict, types: dict, reading: BagReading) -> list[dict]:
    """One dict per kept step: raw action, and the index of the paired message of each topic."""
    topics = reading.topics
    skew = int(reading.max_skew_s * 1e9)
    paired = [t for _, t in topics.views] + [topics.pose]
    for t in paired + [topics.action] + ([topics.gripper] if topics.gripper else []):
        if not streams[t]:
            raise DemoDataError(f"{bag}: no message on {t}")
    stamps = {t: np.array([s for s, _ in streams[t]], dtype=np.int64) for t in paired}
    grip = streams[topics.gripper] if topics.gripper else []
    grip_stamps = np.array([s for s, _ in grip], dtype=np.int64)
    fingers = _finger_series(streams.get(topics.fingers, []), reading.finger_joints) if topics.fingers else []
    finger_stamps = np.array([s for s, _ in fingers], dtype=np.int64)
    steps = []
    for stamp, msg in streams[topics.action]:
        picks = {t: _nearest(stamps[t], stamp) for t in paired}
        if any(abs(int(stamps[t][i]) - stamp) > skew for t, i in picks.items()):
            continue
        action = _arm_action(msg, types[topics.action], reading)
        if topics.gripper:
            g = int(np.searchsorted(grip_stamps, stamp, side="right")) - 1
            if g < 0:
                continue
            action = np.append(action, float(grip[g][1].data))
        j = _nearest(finger_stamps, stamp) if len(fingers) else -1
        finger = fingers[j][1] if j >= 0 and abs(int(finger_stamps[j]) - stamp) <= skew else None
        steps.append({"action": action, "picks": picks, "fingers": finger})
    if not steps:
        raise DemoDataError(f"{bag}: no action could be paired with every view and the pose within "
                            f"{reading.max_skew_s} s")
    return steps


def load_bag_episode(bag: str | Path, dataset: str, reading: BagReading | None = None, with_images: bool = True,
                     episode: int | None = None) -> DemoEpisode:
    """One recording as a DemoEpisode in the policy's action convention (`with_images` False:
    no image is decoded, `images` stays empty)."""
    bag = Path(bag)
    reading = reading or BagReading()
    topics = reading.topics
    types = _topic_types(bag)
    _check_types(bag, topics, types)
    streams = _streams(bag, topics)
    instruction = _instruction(bag, streams, reading)
    steps = _pair_steps(bag, streams, types, reading)
    actions = reading.convention.to_policy(np.stack([s["action"] for s in steps]), str(bag))
    poses = np.array([[p.x, p.y, p.z] for p in (streams[topics.pose][s["picks"][topics.pose]][1].pose.position
                                                 for s in steps)], float)
    images = {}
    if with_images:
        try:
            images = {view: np.stack([image_rgb(streams[t][s["picks"][t]][1]) for s in steps])
                      for view, t in topics.views}
        except BagError as err:
            raise DemoDataError(f"{bag}: {err}") from err
    # finger positions only where every kept step has them: a partial series would mix measured and missing gaps
    rows = [s["fingers"] for s in steps]
    qpos = np.asarray(rows, float) if all(r is not None for r in rows) else None
    result = streams.get(topics.result) if topics.result else None
    success = bool(result[-1][1].data) if result else True
    number = episode_number(bag, bag.parent) if episode is None else episode
    return DemoEpisode(dataset, instruction, instruction, number, str(bag), actions, poses, images, success, qpos)
