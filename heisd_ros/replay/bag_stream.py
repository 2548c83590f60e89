"""A bag's input messages streamed in recorded order, routed to the policy node's inputs and cut
into synchronised steps. ROS-free; `heisd_ros.replay.playback` publishes what it yields.

- `plan_routes`: which bag topics feed which input of the node (a view by name, `pose`,
  `joint_states`, `instruction`, `episode_result`): explicit `--map` entries first, then topics
  named like the node's own inputs. Every other topic is left out of the replay (reported once).
- `stream_segments`: reads the routed topics lazily (one storage chunk at a time, `bags.read_messages`)
  and yields `Segment`s: the messages up to and including one synchronised set of the views, plus
  the pose and joint states recorded with that set even when the recording wrote them after its
  images. The look-ahead is one segment, capped at `MAX_SEGMENT_MESSAGES` and `MAX_SEGMENT_BYTES`,
  so memory does not grow with the bag's length.

Every message is deserialised and checked on the way (`bags.read_messages`): a damaged bag raises
ConfigError naming it before its bad message could be published.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Mapping

import numpy as np

from heisd_ros.core.errors import ConfigError
from heisd_ros.pipeline import bags
from heisd_ros.ros.sync import ApproxTimeSync, SyncConfig

IMAGE_TYPES = (bags.IMAGE, bags.COMPRESSED_IMAGE)
STATE_KINDS = ("pose", "joint_states")
"""Inputs that are state: the node keeps the newest; a step's state may be recorded after its images."""
EVENT_KINDS = ("instruction", "episode_result")
KIND_TYPES = {"pose": (bags.POSE,), "joint_states": (bags.JOINT_STATE,), "instruction": (bags.STRING,),
              "episode_result": (bags.BOOL,)}  # fmt: skip
"""Message types each non-image input takes (a view takes Image or CompressedImage)."""
MAX_SEGMENT_MESSAGES = 256
MAX_SEGMENT_BYTES = 64 << 20
"""Look-ahead bound: a segment this large is handed on without a step (e.g. a view never arrives)."""


@dataclass(frozen=True)
class Route:
    """One bag topic replayed into one input of the node."""

    bag_topic: str
    msgtype: str
    kind: str
    """A view name, or one of STATE_KINDS / EVENT_KINDS."""
    topic: str
    """The node's (resolved) input topic it is published on."""

    @property
    def is_image(self) -> bool:
        return self.msgtype in IMAGE_TYPES


@dataclass(frozen=True)
class RoutePlan:
    """What a replay publishes, what it leaves out, and the recording's own commands (for plots)."""

    routes: dict[str, Route]
    """bag topic -> route."""
    ignored: dict[str, str]
    """bag topic -> type of every topic left out."""
    reference: str | None = None
    """A heisd_ros/ArmCommand topic of the bag: the recorded actions (never published)."""

    @property
    def views(self) -> tuple[str, ...]:
        return tuple(sorted({r.kind for r in self.routes.values() if r.is_image}))


def _fits(kind: str, msgtype: str, views: tuple[str, ...]) -> bool:
    return msgtype in IMAGE_TYPES if kind in views else msgtype in KIND_TYPES.get(kind, ())


def plan_routes(bag_types: Mapping[str, str], targets: Mapping[str, tuple[str, ...]], views: tuple[str, ...],
                explicit: Mapping[str, str] = {}, command_topic: str = "") -> RoutePlan:  # fmt: skip
    """Route the bag's topics (`bag_types`: topic -> type) to the node's inputs.

    targets: input kind -> the names of its topic, published-on name first (resolved in the node's
    namespace), then the names a recording may carry it under (e.g. resolved in the root namespace).
    explicit: bag topic -> kind (`--map`); an input it names is not matched by name. A mapping to an
    unknown input, from a topic the bag lacks or of the wrong type raises ConfigError.
    """
    clash = set(views) & (set(STATE_KINDS) | set(EVENT_KINDS))
    if clash:
        raise ConfigError(f"view names {sorted(clash)} clash with the node's other inputs")
    routes: dict[str, Route] = {}
    for bag_topic, kind in explicit.items():
        if kind not in targets:
            raise ConfigError(f"--map {bag_topic}={kind}: unknown input; the node's inputs are {sorted(targets)}")
        if bag_topic not in bag_types:
            raise ConfigError(f"--map {bag_topic}={kind}: the bag has no topic {bag_topic} "
                              f"(it has {sorted(bag_types)})")  # fmt: skip
        if not _fits(kind, bag_types[bag_topic], views):
            raise ConfigError(f"--map {bag_topic}={kind}: {bag_types[bag_topic]} cannot feed input {kind!r}")
        if kind in {r.kind for r in routes.values()}:
            raise ConfigError(f"--map: two bag topics feed input {kind!r}")
        routes[bag_topic] = Route(bag_topic, bag_types[bag_topic], kind, targets[kind][0])
    mapped = {r.kind for r in routes.values()}
    for kind, names in targets.items():
        if kind in mapped:
            continue
        for bag_topic in names:
            if bag_topic in bag_types and bag_topic not in routes and _fits(kind, bag_types[bag_topic], views):
                routes[bag_topic] = Route(bag_topic, bag_types[bag_topic], kind, names[0])
                break
    commands = [t for t, ty in bag_types.items() if ty == bags.ARM_COMMAND and t not in routes]
    reference = command_topic if command_topic in commands else (commands[0] if commands else None)
    ignored = {t: ty for t, ty in sorted(bag_types.items()) if t not in routes}
    return RoutePlan(routes, ignored, reference)


@dataclass
class BagMessage:
    """One routed message, as it will be published."""

    topic: str
    """The node's input topic."""
    kind: str
    msgtype: str
    t_ns: int
    """Recorded (log) time."""
    raw: bytes
    stamp_ns: int | None
    """Header stamp, None for messages without a header."""

    @property
    def time_ns(self) -> int:
        return self.stamp_ns if self.stamp_ns is not None else self.t_ns


@dataclass
class Segment:
    """Messages in recorded order, ending with one synchronised set of the views (step_ns set) and
    the state recorded with it, or a run of messages without a complete set (step_ns None)."""

    messages: list[BagMessage] = field(default_factory=list)
    step_ns: int | None = None
    """Stamp of the set: its newest image stamp."""

    @property
    def size(self) -> int:
        return sum(len(m.raw) for m in self.messages)


@dataclass
class StreamLog:
    """What a stream saw besides its segments (kept small: 8 floats per recorded command)."""

    steps: int = 0
    messages: int = 0
    reference: list[tuple[int, np.ndarray]] = field(default_factory=list)
    """(stamp ns, 7-D action) of every recorded command on the plan's reference topic."""


def _action(msg) -> np.ndarray:
    return np.array([*msg.delta_position, *msg.delta_rotation, msg.gripper], dtype=np.float64)


def stream_segments(path: str | Path, plan: RoutePlan, slop_s: float, log: StreamLog | None = None,
                    max_messages: int = MAX_SEGMENT_MESSAGES, max_bytes: int = MAX_SEGMENT_BYTES) -> Iterator[Segment]:  # fmt: skip
    """The bag's routed messages as segments (see the module docstring); `log` counts them."""
    log = log if log is not None else StreamLog()
    views = plan.views
    sync = ApproxTimeSync(SyncConfig(views, slop_s, 1e12, 1e12)) if views else None
    if sync is not None:
        sync.add_pose(0.0, None)  # grouping needs only the images
    newest: dict[str, int] = {}
    seg, size = Segment(), 0
    slop_ns = int(slop_s * 1e9)
    topics = list(plan.routes) + ([plan.reference] if plan.reference else [])
    try:
        for r in bags.read_messages(path, topics=topics):
            if r.topic == plan.reference:
                log.reference.append((r.stamp_ns if r.stamp_ns is not None else r.t_ns, _action(r.msg)))
                continue
            route = plan.routes[r.topic]
            m = BagMessage(route.topic, route.kind, r.msgtype, r.t_ns, r.raw, r.stamp_ns)
            log.messages += 1
            if seg.step_ns is not None:
                if m.kind in STATE_KINDS and m.time_ns <= seg.step_ns + slop_ns:
                    seg.messages.append(m)
                    continue
                yield seg
                seg, size = Segment(), 0
            seg.messages.append(m)
            size += len(m.raw)
            if route.is_image and sync is not None and m.stamp_ns is not None:
                if sync.add_frame(m.kind, m.stamp_ns * 1e-9, None):
                    newest[m.kind] = m.stamp_ns
                synced = sync.poll(m.stamp_ns * 1e-9)
                if synced is not None:
                    sync.consume(synced)
                    seg.step_ns = max(newest.values())
                    log.steps += 1
                    continue
            if len(seg.messages) >= max_messages or size >= max_bytes:
                yield seg
                seg, size = Segment(), 0
    except bags.BagError as err:
        raise ConfigError(str(err)) from err
    if seg.messages:
        yield seg


def lockstep_order(seg: Segment) -> list[BagMessage]:
    """A step's messages for lockstep: images last, so the node never sees a set before its state
    and events (a recording may write the pose after the images)."""
    images = [m for m in seg.messages if m.msgtype in IMAGE_TYPES]
    return [m for m in seg.messages if m.msgtype not in IMAGE_TYPES] + images
