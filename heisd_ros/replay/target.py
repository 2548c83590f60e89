"""The policy node a replay plays into: its configuration, its topics resolved like the node
resolves them (namespace, node name, `~/`), the node found on the ROS graph, and the warm-up of a
node the replay starts itself.

A started node's outputs are read from its own publishers. A running node's are looked up on the
graph by name and namespace; if it is not there, they are resolved from its parameter file.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np

from heisd_ros.core.errors import ConfigError, HeisdError
from heisd_ros.core.model_api import Decoder
from heisd_ros.pipeline import bags
from heisd_ros.replay.bag_stream import RoutePlan, stream_segments
from heisd_ros.replay.playback import OUTPUT_TYPES
from heisd_ros.ros import topics
from heisd_ros.ros.shadow import LoadedPolicy
from heisd_ros.ros.params import (
    REMOVED_PARAMETERS,
    PolicyNodeConfig,
    build_config,
    param_specs,
)

NODE_NAME = "policy_node"


def normalise_namespace(ns: str) -> str:
    return "/" + ns.strip("/") if ns.strip("/") else "/"


def load_node_config(params_file: str | Path | None, overrides: Mapping[str, Any] = {}, node_name: str = NODE_NAME,
                     namespace: str = "/") -> PolicyNodeConfig:  # fmt: skip
    """The node's configuration from its ROS 2 parameter file (the `/**` entry, then the node's own
    by name or full name) plus NAME:=VALUE overrides; parameters that are not the node's
    (use_sim_time, QoS overrides) are left out. No file: the defaults plus the overrides."""
    import yaml

    from heisd_ros.core.files import read_capped_text

    doc: Any = {}
    if params_file is not None:
        try:
            doc = yaml.safe_load(read_capped_text(params_file, ConfigError)) or {}
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as err:
            raise ConfigError(f"cannot read parameter file {params_file}: {err}") from err
    full = normalise_namespace(namespace).rstrip("/") + "/" + node_name
    values: dict[str, Any] = {}
    for key in ("/**", node_name, full, full.lstrip("/")):
        entry = doc.get(key) if isinstance(doc, dict) else None
        if isinstance(entry, dict) and isinstance(entry.get("ros__parameters"), dict):
            values.update(_flatten(entry["ros__parameters"]))
    values.update(overrides)
    # Only the views and switches are read from this configuration: the model need not be named.
    if not values.get("model_dir"):
        values["model_dir"] = "unnamed"
    ours = {s.name for s in param_specs()} | set(REMOVED_PARAMETERS)  # a removed name is refused
    return build_config({k: v for k, v in values.items() if k in ours})


def _flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def resolve(topic: str, node_name: str, namespace: str) -> str:
    """A topic name as the node resolves it (relative names join its namespace, `~` its name)."""
    from rclpy.expand_topic_name import expand_topic_name

    return expand_topic_name(topic, node_name, normalise_namespace(namespace))


def input_targets(cfg: PolicyNodeConfig, node_name: str, namespace: str) -> dict[str, tuple[str, ...]]:
    """Input kind -> (the node's resolved topic, the same name resolved in the root namespace): a
    recording names the inputs either way."""
    compressed = cfg.node.compressed_images
    named = {**{view: topics.image_topic(view, compressed) for view in cfg.decoder.views}, "pose": topics.POSE,
             "joint_states": topics.JOINT_STATES, "instruction": topics.INSTRUCTION,
             "episode_result": topics.EPISODE_RESULT}  # fmt: skip
    out = {}
    for kind, topic in named.items():
        names = [resolve(topic, node_name, namespace), resolve(topic, node_name, "/")]
        if compressed and kind in cfg.decoder.views:  # a recording may carry it under the raw name
            names += [resolve(topics.image_topic(kind), node_name, ns) for ns in (namespace, "/")]
        out[kind] = tuple(dict.fromkeys(names))
    return out


def output_topics(cfg: PolicyNodeConfig, node_name: str, namespace: str) -> dict[str, str]:
    """Resolved output topic -> type, from the configuration."""
    named = {topics.ARM_COMMAND: OUTPUT_TYPES["arm_command"], topics.DECODE_STATS: OUTPUT_TYPES["decode_stats"],
             "/diagnostics": OUTPUT_TYPES["/diagnostics"]}  # fmt: skip
    a = cfg.node.arm_outputs  # the arm-stack outputs that are switched on
    for on, topic in ((a.publish_twist, topics.SERVO_TWIST), (a.publish_pose_target, topics.POSE_TARGET),
                      (a.publish_gripper_trajectory, topics.GRIPPER_TRAJECTORY),
                      (a.publish_gripper_positions, topics.GRIPPER_POSITIONS)):  # fmt: skip
        if on:
            named[topic] = OUTPUT_TYPES[topic]
    return {resolve(t, node_name, namespace): ty for t, ty in named.items()}


def node_outputs(node: Any) -> dict[str, str]:
    """A node's own output topics (its publishers of the node's output types) -> type."""
    wanted = set(OUTPUT_TYPES.values())
    out = {}
    for pub in node.publishers:
        cls = pub.msg_type
        msgtype = f"{cls.__module__.split('.')[0]}/msg/{cls.__name__}"
        if msgtype in wanted:
            out[pub.topic_name] = msgtype
    return out


def discover_outputs(probe: Any, node_name: str, namespace: str, timeout_s: float) -> dict[str, str] | None:
    """A running node's output topics -> type, read from the graph; None if it did not appear."""
    from rclpy.node import NodeNameNonExistentError

    wanted = set(OUTPUT_TYPES.values())
    end = time.monotonic() + timeout_s
    while True:
        try:
            found = probe.get_publisher_names_and_types_by_node(node_name, normalise_namespace(namespace))
        except NodeNameNonExistentError:
            found = None
        if found is not None:
            out = {t: ty for t, types in found for ty in types if ty in wanted}
            if bags.DECODE_STATS in out.values() or time.monotonic() >= end:
                return out
        if time.monotonic() >= end:
            return None
        time.sleep(0.05)


def policy_nodes(probe: Any) -> list[str]:
    """Full names of the nodes on the graph that publish DecodeStats (to suggest --namespace)."""
    names = set()
    for topic, types in probe.get_topic_names_and_types():
        if bags.DECODE_STATS in types:
            for info in probe.get_publishers_info_by_topic(topic):
                names.add(normalise_namespace(info.node_namespace).rstrip("/") + "/" + info.node_name)
    return sorted(names)


# ---------------------------------------------------------------------------------------------
# warm-up of a started node


@dataclass
class StepInputs:
    """The inputs of one synchronised step of a bag (deserialised), as the node would decode them."""

    frames: dict[str, Any] = field(default_factory=dict)
    pose: Any = None
    joints: Any = None
    instruction: str | None = None
    stamp_s: float = 0.0


def first_steps(bag: str | Path, plan: RoutePlan, slop_s: float, n: int) -> list[StepInputs]:
    """The inputs of the bag's first `n` synchronised steps (fewer if the bag has fewer)."""
    ts = bags.typestore()
    state = StepInputs()
    out: list[StepInputs] = []
    if n <= 0:
        return out
    for seg in stream_segments(bag, plan, slop_s):
        for m in seg.messages:
            msg = ts.deserialize_cdr(m.raw, m.msgtype)
            if m.kind == "pose":
                state.pose = msg
            elif m.kind == "joint_states":
                state.joints = msg
            elif m.kind == "instruction":
                state.instruction = msg.data.strip()
            elif m.kind in plan.views:
                state.frames[m.kind] = msg
        if seg.step_ns is not None:
            out.append(StepInputs(dict(state.frames), state.pose, state.joints, state.instruction, seg.step_ns * 1e-9))
            if len(out) >= n:
                break
    return out


def _observation(decoder: Decoder, cfg: PolicyNodeConfig, step: StepInputs) -> Any:
    from heisd_ros.core.gripper import finger_gap
    from heisd_ros.core.types import Observation

    if step.pose is None or not step.instruction or set(step.frames) != set(cfg.decoder.views):
        raise ConfigError("a step of the bag lacks a view, the pose or the instruction")
    gap = None
    if decoder.inputs.reads_finger_gap:
        if step.joints is None:
            raise ConfigError("the model reads the finger gap and the bag's step has no joint states")
        names = list(step.joints.name)
        gap = finger_gap([step.joints.position[names.index(j)] for j in cfg.node.finger_joints])
    p = step.pose.pose.position
    return Observation(images={v: bags.image_rgb(step.frames[v]) for v in cfg.decoder.views},
                       instruction=step.instruction, ee_pos=np.array([p.x, p.y, p.z], dtype=np.float64),
                       task=cfg.node.task or None, stamp_s=step.stamp_s, gripper_gap=gap)  # fmt: skip


def warm_up(decoder: Decoder, cfg: PolicyNodeConfig, steps: list[StepInputs]) -> None:
    """Decode the bag's first steps as an episode would, then reset the decoder: the node starts its
    first episode from a clean state, but every path those steps took (vision traces per view count,
    the database, the drafter, verification) has paid its first-call cost. Warming one step alone is
    not enough: a method that chooses its source from measured step costs (heisd) would otherwise
    compare a warm drafter with a cold first retrieval and keep to the drafter."""
    observations = [_observation(decoder, cfg, s) for s in steps]
    instruction = None
    for obs in observations:
        if obs.instruction != instruction:
            decoder.reset(obs.instruction)
            instruction = obs.instruction
        decoder.step(obs)
    decoder.reset(observations[0].instruction if observations else None)


def warmed(factory: Callable[[PolicyNodeConfig], Any], steps: list[StepInputs],
           say: Callable[[str], None]) -> Callable[[PolicyNodeConfig], Any]:  # fmt: skip
    """`factory` whose decoder is warmed up on the bag's first steps before the node starts (the
    factory may return a decoder or a LoadedPolicy: its executing decoder is warmed)."""

    def build(cfg: PolicyNodeConfig) -> Any:
        loaded = factory(cfg)
        decoder = loaded.decoder if isinstance(loaded, LoadedPolicy) else loaded
        if not steps:
            return loaded
        t0 = time.monotonic()
        try:
            warm_up(decoder, cfg, steps)
        except (HeisdError, ValueError, KeyError) as err:
            say(f"warm-up skipped ({type(err).__name__}: {err}); the first steps include it")
            return loaded
        say(f"warm-up: the bag's first {len(steps)} step(s) decoded unmeasured in {time.monotonic() - t0:.1f} s")
        return loaded

    return build
