"""Node parameters, generated from the configuration dataclasses.

Three groups, each one frozen dataclass validated in `__post_init__`:
- node-only settings (`NodeConfig`, below): rates, staleness limits, clipping, paths (topic names
  are fixed, heisd_ros.ros.topics, and changed by remapping);
- `decoder.*`: `DecoderConfig` and its sub-configs (heisd_ros.core.config), nested by field name;
- `store.*`: `StoreConfig` (the demonstration database).

Every field becomes one ROS parameter with a `ParameterDescriptor` whose description is the
field's docstring. Values are read back into the dataclasses, so the dataclasses stay the only
source of defaults and validation. Parameters that shape subscriptions, timers or the loaded
model are read-only; the rest can be changed at run time and are re-validated on every change.
`param_file` writes them out as config/policy.yaml (`python -m heisd_ros.ros.param_file > config/policy.yaml`).
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import math
import typing
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from heisd_ros.core.config import DecoderConfig, StoreConfig, from_dict, require, topic_ok
from heisd_ros.core.errors import ConfigError
from heisd_ros.core.gripper import PANDA_FINGER_JOINTS
from heisd_ros.core.types import ACTION_DIM
from heisd_ros.ros.arm_outputs import ARM_OUTPUTS_DYNAMIC, ArmOutputsConfig
from heisd_ros.ros.input_limits import InputLimits
from heisd_ros.ros.shadow import ShadowConfig
from heisd_ros.ros.topics import REMOVED_TOPIC_PARAMETERS

REMOVED_PARAMETERS: dict[str, str] = {
    **{name: f"--ros-args -r {remap}" for name, remap in REMOVED_TOPIC_PARAMETERS.items()},
    "store.path": "db_path (the one parameter naming the database directory)",
    "decoder.source_choice.cost_signal": "nothing: a step's cost is counted in LLM forwards, never timed",
}
"""Parameters of earlier releases -> what replaces each; a file or override that sets one is refused."""


def removed_parameter_message(names: list[str]) -> str:
    """Why a configuration that sets removed parameters is refused, and what to write instead."""
    topics = any(n in REMOVED_TOPIC_PARAMETERS for n in names)
    why = " (topics are set by remapping the node's names, or by the launch file's argument of the same name)"
    return (f"parameters {names} no longer exist{why if topics else ''}: "
            + "; ".join(f"{n} -> {REMOVED_PARAMETERS[n]}" for n in names))

INSTRUCTION_DURABILITIES, AFTER_EPISODE = ("volatile", "transient_local"), ("stop", "continue")
ACTION_CEILING = 100.0
"""The largest action bound accepted, policy units: a bound beyond it checks nothing (1e300 is finite)."""


@dataclass(frozen=True)
class NodeConfig:
    """Settings of the policy node itself (everything that is not the decoder or the database)."""

    compressed_images: bool = False
    """Subscribe to sensor_msgs/CompressedImage (jpeg/png) on `<view>/image_raw/compressed` instead of
    sensor_msgs/Image on `<view>/image_raw`."""
    finger_joints: tuple[str, ...] = PANDA_FINGER_JOINTS
    """The two finger joint names in joint_states; gap = |q1| + |q2| (m)."""
    instruction_durability: str = "volatile"
    """QoS durability of the instruction subscription: 'volatile' (any publisher connects; a message
    sent before the node subscribed is not received) or 'transient_local' (a latched message sent
    earlier arrives too, but a volatile publisher, the rclpy/rclcpp default, is then incompatible)."""
    command_frame_id: str = "base_link"
    """frame_id written into the headers of the outputs."""
    control_rate_hz: float = 10.0
    """Rate of the control timer; each tick decodes the newest synchronised inputs."""
    image_staleness_s: float = 0.5
    """Images older than this (node clock minus header stamp) are never acted on."""
    pose_staleness_s: float = 0.5
    """A pose older than this is never acted on."""
    sync_slop_s: float = 0.05
    """Largest stamp spread between the views of one synchronised set."""
    expected_image_height: int = 0
    """Reject frames of another height (0 = accept any)."""
    expected_image_width: int = 0
    """Reject frames of another width (0 = accept any)."""
    max_abs_action: tuple[float, ...] = (1.0,) * ACTION_DIM
    """Per-dimension clip of the action (dX, dY, dZ, drX, drY, drZ, gripper), policy units."""
    action_limits: tuple[float, ...] = (2.0,) * ACTION_DIM
    """Per-dimension plausibility bound, policy units (>= max_abs_action): a decoded action with
    |a_i| above it is never published, not even clipped (no command, ERROR diagnostic)."""
    watchdog_factor: float = 3.0
    """Inference taking longer than this many control periods trips the watchdog: no commands (ERROR)
    until watchdog_recovery_steps steps in a row decode within the budget."""
    watchdog_recovery_steps: int = 3
    """Consecutive steps within the watchdog budget that clear a tripped watchdog."""
    command_enabled: bool = False
    """Publish the actuator outputs (ArmCommand and every arm-stack command). False, a dry run: the
    node decodes and publishes DecodeStats and diagnostics but commands nothing. Switched at run time
    by the ~/enable service (std_srvs/SetBool) or `ros2 param set`."""
    autostart: bool = True
    """Configure and activate at start-up. False: the node stays unconfigured until a lifecycle
    manager or `ros2 lifecycle set <node> configure` / `activate` brings it up."""
    warmup_steps: int = 4
    """Steps decoded at configure on a synthetic observation (blank frames at the model's input size,
    a pose moving in a straight line, a task of the database), after which the decoder is reset, so
    the first real step costs what later ones do. 0 = no warm-up."""
    goal_timeout_s: float = 300.0
    """Longest episode of a ~/run_task goal that gives no timeout_s (0), s of node time: no goal runs
    unbounded when its client forgets it."""
    goal_result_retention_s: float = 600.0
    """How long a finished ~/run_task goal's result stays available to get_result, s (rclpy's 10 s
    would answer UNKNOWN to a client that reads results after a slow episode)."""
    request_queue_depth: int = 1000
    """Requests queued per service of the node (lifecycle, ~/enable, ~/reset) and of ~/run_task before
    the middleware drops one: a burst of up to this many gets an answer each (the middleware's 10
    leaves the rest unanswered; ROS's parameter services queue 1000 too)."""
    after_episode: str = "stop"
    """What follows the end of an episode (an episode_result, ~/reset): 'stop' commands nothing until
    a new ~/run_task goal or instruction arrives; 'continue' starts a new episode with the same
    instruction at once (for an episode the instruction topic started; a goal's always stops)."""
    model_dir: str = ""
    """Directory of the policy's checkpoint (required; read offline: the node never trains or
    downloads a model)."""
    drafter_dir: str = ""
    """Drafter head directory ('' = none; drafter-based methods then fail at start-up)."""
    db_path: str = ""
    """Embedded demonstration database directory, the one field that names it ('' = none, or a
    server at store.url with store.backend 'remote')."""
    calibration_path: str = ""
    """Calibration file (fused metric statistics, tau, verify-skip thresholds); '' = defaults."""
    task: str = ""
    """Database partition key; '' = use the instruction text."""
    torch_threads: int = 1
    """Torch CPU threads of the decoder (intra-op; inter-op too unless already fixed), set before the
    model loads. One keeps a step's time steady while the node's callbacks and other processes share
    the cores; more pay off only for a model large enough to split over idle cores."""
    quat_norm_tol: float = 0.05
    """A pose whose quaternion norm differs from 1 by more than this is rejected."""
    diagnostics_period_s: float = 1.0
    """Period of the DiagnosticArray on /diagnostics."""
    warn_throttle_s: float = 2.0
    """The same kind of warning is logged at most once per this period."""
    input_limits: InputLimits = field(default_factory=InputLimits)
    """Bounds on instructions, camera frames and poses, checked before any work (input_limits.*)."""
    arm_outputs: ArmOutputsConfig = field(default_factory=ArmOutputsConfig)
    """Outputs for standard arm stacks (MoveIt Servo twist, pose target, gripper), each off until switched on."""
    shadow: ShadowConfig = field(default_factory=ShadowConfig)
    """Shadow mode: what heisd would have done on each executed step, published for heisd choose-point --shadow."""

    def __post_init__(self) -> None:
        require(len(self.finger_joints) == 2 and all(self.finger_joints) and len(set(self.finger_joints)) == 2,
                 f"finger_joints needs two distinct joint names, got {list(self.finger_joints)}")  # fmt: skip
        require(math.isfinite(self.control_rate_hz) and 0.0 < self.control_rate_hz <= 1000.0,
                 f"control_rate_hz must be in (0, 1000], got {self.control_rate_hz}")  # fmt: skip
        for name in ("image_staleness_s", "pose_staleness_s", "diagnostics_period_s"):
            v = getattr(self, name)
            require(math.isfinite(v) and v > 0.0, f"{name} must be finite and > 0, got {v}")
        require(math.isfinite(self.sync_slop_s) and self.sync_slop_s >= 0.0,
                 f"sync_slop_s must be finite and >= 0, got {self.sync_slop_s}")  # fmt: skip
        require(self.sync_slop_s <= self.image_staleness_s, "sync_slop_s must not exceed image_staleness_s")
        require(self.expected_image_height >= 0 and self.expected_image_width >= 0,
                 "expected image size must be >= 0 (0 = any)")  # fmt: skip
        require((self.expected_image_height == 0) == (self.expected_image_width == 0),
                 "set both expected_image_height and expected_image_width, or neither")  # fmt: skip
        require(len(self.max_abs_action) == ACTION_DIM,
                 f"max_abs_action needs {ACTION_DIM} values, got {len(self.max_abs_action)}")  # fmt: skip
        require(all(math.isfinite(v) and v > 0 for v in self.max_abs_action),
                 f"max_abs_action values must be finite and > 0, got {list(self.max_abs_action)}")  # fmt: skip
        require(len(self.action_limits) == ACTION_DIM,
                 f"action_limits needs {ACTION_DIM} values, got {len(self.action_limits)}")  # fmt: skip
        require(all(v <= lim <= ACTION_CEILING for v, lim in zip(self.max_abs_action, self.action_limits)),
                 f"action_limits {list(self.action_limits)} must be finite, >= max_abs_action "
                 f"{list(self.max_abs_action)} and <= {ACTION_CEILING} in every dimension")  # fmt: skip
        require(topic_ok(self.command_frame_id), f"command_frame_id must be a frame id, got {self.command_frame_id!r}")
        require(math.isfinite(self.watchdog_factor) and 1.0 <= self.watchdog_factor <= 100.0,
                 f"watchdog_factor must be in [1, 100], got {self.watchdog_factor}")  # fmt: skip
        require(1 <= self.watchdog_recovery_steps <= 1000, "watchdog_recovery_steps must be in [1, 1000]")
        require(bool(self.model_dir), "model_dir is required: the policy's checkpoint directory (-p model_dir:=DIR)")
        for name, choices in (("instruction_durability", INSTRUCTION_DURABILITIES), ("after_episode", AFTER_EPISODE)):
            require(getattr(self, name) in choices, f"{name} must be one of {list(choices)}, got {getattr(self, name)!r}")
        require(type(self.warmup_steps) is int and 0 <= self.warmup_steps <= 100,
                 f"warmup_steps must be an integer in [0, 100], got {self.warmup_steps!r}")  # fmt: skip
        require(0.0 < self.quat_norm_tol < 1.0, "quat_norm_tol must be in (0, 1)")
        require(type(self.torch_threads) is int and 1 <= self.torch_threads <= 1024,
                 f"torch_threads must be an integer in [1, 1024], got {self.torch_threads!r}")  # fmt: skip
        require(math.isfinite(self.warn_throttle_s) and self.warn_throttle_s >= 0, "warn_throttle_s must be >= 0")
        require(math.isfinite(self.goal_timeout_s) and self.goal_timeout_s > 0,
                f"goal_timeout_s must be finite and > 0, got {self.goal_timeout_s}")  # fmt: skip
        require(1.0 <= self.goal_result_retention_s <= 86400.0, "goal_result_retention_s must be in [1, 86400]")
        require(type(self.request_queue_depth) is int and 1 <= self.request_queue_depth <= 10_000,
                "request_queue_depth must be an integer in [1, 10000]")

    @property
    def expected_hw(self) -> tuple[int, int] | None:
        if self.expected_image_height == 0:
            return None
        return (self.expected_image_height, self.expected_image_width)

    @property
    def control_period_s(self) -> float:
        return 1.0 / self.control_rate_hz

    @property
    def watchdog_budget_s(self) -> float:
        """Longest inference that keeps the watchdog quiet: watchdog_factor control periods."""
        return self.watchdog_factor * self.control_period_s


NODE_DYNAMIC = frozenset({
    "command_frame_id", "image_staleness_s", "pose_staleness_s", "sync_slop_s", "expected_image_height",
    "expected_image_width", "max_abs_action", "action_limits", "watchdog_factor", "watchdog_recovery_steps",
    "command_enabled", "after_episode", "goal_timeout_s",
    "quat_norm_tol", "warn_throttle_s",
}) | {f"input_limits.{f.name}" for f in dataclasses.fields(InputLimits)} | {
    f"arm_outputs.{name}" for name in ARM_OUTPUTS_DYNAMIC}  # fmt: skip
"""Node parameters that may change at run time; every other parameter is read-only."""

GROUPS: tuple[tuple[str, type], ...] = (("", NodeConfig), ("decoder.", DecoderConfig), ("store.", StoreConfig))


@dataclass(frozen=True)
class PolicyNodeConfig:
    """Everything the node is configured with, validated as a whole."""

    node: NodeConfig
    decoder: DecoderConfig
    store_fields: Mapping[str, Any]
    """The store.* parameters as given (every StoreConfig field but `path`, which is db_path); see `store`."""

    def __post_init__(self) -> None:
        if self.store is None:  # no database configured: the store.* values must still be valid
            from_dict(StoreConfig, {**self.store_fields, "path": "(unset)"})

    @property
    def store(self) -> StoreConfig | None:
        """The database config, or None when no database is configured.

        Its `path` is the node's `db_path` (no other parameter names the directory); with neither a
        path nor a `store.url` the node runs without a database (methods that retrieve then fail
        at configure).
        """
        fields = {**self.store_fields, "path": self.node.db_path}
        if not fields["path"] and not fields.get("url"):
            return None
        return from_dict(StoreConfig, fields)


# ---------------------------------------------------------------------------------------------
# parameter specs generated from the dataclasses


@dataclass(frozen=True)
class ParamSpec:
    name: str
    """Full parameter name, e.g. 'decoder.acceptance.max_token_bias_bins'."""
    path: tuple[str, ...]
    """Field path inside the group's dataclass."""
    group: str
    default: Any
    kind: str
    """'bool', 'int', 'float', 'str', 'str_array', 'float_array' or 'int_array'."""
    description: str
    read_only: bool


@functools.lru_cache(maxsize=None)
def field_docs(cls: type) -> dict[str, str]:
    """Attribute docstrings (the string literal under each field) of a dataclass."""
    try:
        tree = ast.parse(inspect.getsource(cls).lstrip())
    except (OSError, TypeError, SyntaxError):
        return {}
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    docs: dict[str, str] = {}
    for prev, node in zip(body, body[1:]):
        if (isinstance(prev, ast.AnnAssign) and isinstance(prev.target, ast.Name) and isinstance(node, ast.Expr)
                and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)):  # fmt: skip
            docs[prev.target.id] = " ".join(node.value.value.split())
    return docs


FALLBACK_DOCS: dict[str, str] = {
    "decoder.method": "Decoding method: ar, drafter, specvla, retrieval or heisd.",
    "decoder.device": "Torch device of the model, e.g. cpu or cuda:0.",
    "decoder.dtype": "Model dtype: float32, bfloat16 or float16.",
    "decoder.fused_metric.window_steps": "Trajectory window w of end-effector positions for R and D.",
    "decoder.fused_metric.alpha": "Weight of Norm(R) in F (1 - alpha weighs Norm(D)).",
    "decoder.fused_metric.r_min_m": "Lower end of the min-max normalisation of R, metres.",
    "decoder.fused_metric.d_min_m": "Lower end of the min-max normalisation of D, metres.",
    "decoder.verify_skip.enabled": "Allow verify-skip of retrieval hits (heisd method).",
    "decoder.verify_skip.min_similarity_bounds": "Clamp [lo, hi] of min_similarity under episode feedback.",
    "decoder.verify_skip.max_distance_bounds_m": "Clamp [lo, hi] of max_distance_m under episode feedback, metres.",
    "store.collection": "Qdrant collection (one per embodiment/dataset).",
    "store.hnsw_m": "HNSW graph degree m.",
    "store.hnsw_ef_construct": "HNSW ef_construct.",
}
"""Descriptions for config fields that carry no docstring (the docstring wins when there is one)."""


def _kind(hint: Any) -> str:
    if hint in (bool, int, float, str):
        return hint.__name__
    if typing.get_origin(hint) is tuple:
        args = [a for a in typing.get_args(hint) if a is not Ellipsis]
        elem = {str: "str", float: "float", int: "int"}.get(args[0] if args else None)
        if elem and all(a is args[0] for a in args):
            return f"{elem}_array"
    raise ConfigError(f"no ROS parameter type for {hint!r}")


def _field_default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        return f.default_factory()  # type: ignore[misc]
    raise ConfigError(f"field {f.name} has no default")


def _specs(cls: type, prefix: str, path: tuple[str, ...], group: str) -> Iterable[ParamSpec]:
    hints = typing.get_type_hints(cls)
    docs = field_docs(cls)
    for f in dataclasses.fields(cls):
        if group == "store." and f.name == "path":  # the directory is the node's db_path: one field
            continue
        hint = hints[f.name]
        if dataclasses.is_dataclass(hint):
            yield from _specs(hint, f"{prefix}{f.name}.", path + (f.name,), group)
            continue
        name = f"{prefix}{f.name}"
        read_only = not (group == "" and name in NODE_DYNAMIC)
        desc = docs.get(f.name) or FALLBACK_DOCS.get(name) or f.name.replace("_", " ")
        yield ParamSpec(name, path + (f.name,), group, _field_default(f), _kind(hint),
                        f"{desc} [{cls.__name__}.{f.name}]", read_only)  # fmt: skip


@functools.lru_cache(maxsize=None)
def param_specs() -> tuple[ParamSpec, ...]:
    """All node parameters, in declaration order."""
    return tuple(s for prefix, cls in GROUPS for s in _specs(cls, prefix, (), prefix))


# ---------------------------------------------------------------------------------------------
# values <-> configs


def _coerce(spec: ParamSpec, value: Any) -> Any:
    """A ROS parameter value as the dataclass field expects it (arrays become tuples)."""
    if spec.kind.endswith("_array"):
        return tuple(value)
    return value


def build_config(values: Mapping[str, Any]) -> PolicyNodeConfig:
    """Full parameter name -> value (missing names take their defaults) -> validated config.

    Raises ConfigError naming the offending parameter group.
    """
    removed = [name for name in REMOVED_PARAMETERS if name in values]
    if removed:
        raise ConfigError(removed_parameter_message(removed))
    unknown = sorted(set(values) - {s.name for s in param_specs()})
    if unknown:
        raise ConfigError(f"unknown parameters {unknown}")
    trees: dict[str, dict[str, Any]] = {prefix: {} for prefix, _ in GROUPS}
    for spec in param_specs():
        value = values.get(spec.name, spec.default)
        node = trees[spec.group]
        for key in spec.path[:-1]:
            node = node.setdefault(key, {})
        node[spec.path[-1]] = _coerce(spec, value)
    node_cfg = from_dict(NodeConfig, trees[""])
    decoder = from_dict(DecoderConfig, trees["decoder."])
    return PolicyNodeConfig(node_cfg, decoder, trees["store."])


def config_to_values(cfg: PolicyNodeConfig) -> dict[str, Any]:
    """Inverse of `build_config` (for writing parameter files and for tests)."""
    objs = {"": cfg.node, "decoder.": cfg.decoder}
    out: dict[str, Any] = {}
    for spec in param_specs():
        if spec.group == "store.":
            out[spec.name] = cfg.store_fields.get(spec.path[-1], spec.default)
            continue
        obj: Any = objs[spec.group]
        for key in spec.path:
            obj = getattr(obj, key)
        out[spec.name] = list(obj) if isinstance(obj, tuple) else obj
    return out


# ---------------------------------------------------------------------------------------------
# rclpy glue (imported lazily so the specs above are usable without ROS)


def ros_type(kind: str):
    from rclpy.parameter import Parameter

    return {"bool": Parameter.Type.BOOL, "int": Parameter.Type.INTEGER, "float": Parameter.Type.DOUBLE,
            "str": Parameter.Type.STRING, "str_array": Parameter.Type.STRING_ARRAY,
            "float_array": Parameter.Type.DOUBLE_ARRAY, "int_array": Parameter.Type.INTEGER_ARRAY}[kind]  # fmt: skip


def declare_all(node: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """Declare every parameter on `node` with a descriptor: (name -> value, the decoder.* values given
    explicitly; declared without a value, only an override fills one: decoder_params). Raises
    ConfigError when an override has the wrong type (e.g. an integer for a double)."""
    from rcl_interfaces.msg import ParameterDescriptor
    from rclpy.exceptions import (
        InvalidParameterTypeException,
        InvalidParameterValueException,
    )

    values: dict[str, Any] = {}
    explicit: dict[str, Any] = {}
    for spec in param_specs():
        ptype = ros_type(spec.kind)
        decoder = spec.group == "decoder."
        desc = ParameterDescriptor(description=spec.description, read_only=spec.read_only and not decoder,
                                   type=ptype.value)  # fmt: skip
        default = list(spec.default) if isinstance(spec.default, tuple) else spec.default
        try:
            param = node.declare_parameter(spec.name, ptype if decoder or default == [] else default, desc)
        except InvalidParameterTypeException as err:
            raise ConfigError(f"parameter {spec.name!r} must be of type {spec.kind}: {err}") from err
        except InvalidParameterValueException as err:
            raise ConfigError(f"parameter {spec.name!r} rejected: {err}") from err
        value = param.value
        values[spec.name] = spec.default if value is None else value
        if decoder and value is not None:
            explicit[spec.name] = value
    # Names of earlier releases, declared without a value so that a parameter file still setting
    # one is seen (rclpy drops overrides of undeclared names silently) and refused by build_config.
    for name, instead in REMOVED_PARAMETERS.items():
        removed = ParameterDescriptor(description=f"removed: use {instead}", read_only=True, dynamic_typing=True)
        param = node.declare_parameter(name, None, removed)
        if param.value is not None:
            values[name] = param.value
    return values, explicit


def validate_update(current: Mapping[str, Any], changes: Mapping[str, Any]) -> tuple[PolicyNodeConfig | None, str]:
    """Check a parameter update against the whole config: (new config, '') or (None, reason)."""
    ours = {s.name for s in param_specs()}  # removed topic names are read-only: rclpy refuses them
    merged = dict(current)
    # Parameters that are not ours (use_sim_time, qos overrides) are left to rclpy.
    merged.update({k: v for k, v in changes.items() if k in ours})
    try:
        return build_config(merged), ""
    except ConfigError as err:
        return None, str(err)
