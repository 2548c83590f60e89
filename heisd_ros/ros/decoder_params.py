"""One name per decoder setting: the `decoder.*` parameters answer what runs.

Precedence, as ROS has it: a value given explicitly (`-p`, a launch argument, a line of a
parameter file) beats the operating-point file (`calibration_path`), which beats the configuration
dataclass's default. The decoder.* parameters are declared without a value (`params.declare_all`),
so the ones given are known: rclpy fills a declared parameter only from an override. The node then
writes every decoder.* parameter with the value that runs: once at start-up, so `ros2 param get`
answers before configure, and at every configure, where the point file is read again and the
database manifest sets the query views. Configure logs where each value that is not a default came
from. The parameters are the node's to write: a change from outside is refused (decoder settings
take effect at configure).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from heisd_ros.core.config import DecoderConfig
from heisd_ros.ros.params import PolicyNodeConfig, build_config, config_to_values, param_specs, ros_type

DECODER_PREFIX = "decoder."
OUTSIDE_CHANGE_REFUSED = ("decoder.* take effect at configure: give the value with -p (or a parameter file, or "
                          "the operating-point file) and configure again")  # fmt: skip


def decoder_values(decoder: DecoderConfig) -> dict[str, Any]:
    """'decoder.<field>' -> value of every decoder field, of its parameter's type (a point file's
    JSON may write a float field as an integer, `"tau": 0`, which rclpy refuses for a double)."""
    out: dict[str, Any] = {}
    for spec in param_specs():
        if spec.group != DECODER_PREFIX:
            continue
        obj: Any = decoder
        for key in spec.path:
            obj = getattr(obj, key)
        if spec.kind == "float":
            obj = float(obj)
        elif spec.kind == "float_array":
            obj = [float(x) for x in obj]
        out[spec.name] = list(obj) if isinstance(obj, tuple) else obj
    return out


def resolve(cfg: PolicyNodeConfig, explicit: Mapping[str, Any]) -> PolicyNodeConfig:
    """`cfg` with the decoder that runs: the point file and the database manifest applied
    (`policy.resolve_decoder_config`), then the explicit values on top. Raises what reading the
    files raises (a corrupt point file: CalibrationError)."""
    from heisd_ros.policy import PolicyPaths, resolve_decoder_config

    n = cfg.node
    paths = PolicyPaths(model_dir=n.model_dir, drafter_dir=n.drafter_dir, db_path=n.db_path,
                        calibration_path=n.calibration_path)  # fmt: skip
    applied = dataclasses.replace(cfg, decoder=resolve_decoder_config(cfg.decoder, paths, cfg.store))
    values = config_to_values(applied)
    values.update(explicit)
    return build_config(values)


def sources(decoder: DecoderConfig, explicit: Mapping[str, Any], point_path: str) -> str:
    """Where each decoder value that is not the default came from, for the configure log."""
    defaults = decoder_values(DecoderConfig())
    running = decoder_values(decoder)
    given = [f"{k[len(DECODER_PREFIX):]}={running[k]!r}" for k in running if k in explicit]
    applied = [f"{k[len(DECODER_PREFIX):]}={v!r}" for k, v in running.items() if k not in explicit and v != defaults[k]]
    parts = []
    if given:
        parts.append("explicit (-p, launch or parameter file): " + ", ".join(given))
    if applied:
        where = f"the operating-point file {point_path!r}" if point_path else "the database manifest"
        parts.append(f"from {where}" + (" and the database manifest" if point_path else "") + ": " + ", ".join(applied))
    return "; ".join(parts + ["every other decoder.* is its default"]) if parts else "every decoder.* is its default"


def write_back(node: Any, decoder: DecoderConfig) -> None:
    """Set every decoder.* parameter of `node` to `decoder`'s value. The caller lets its parameter
    callback accept these changes while this runs."""
    from rclpy.parameter import Parameter

    kinds = {s.name: s.kind for s in param_specs() if s.group == DECODER_PREFIX}
    node.set_parameters([Parameter(name, ros_type(kinds[name]), value) for name, value in decoder_values(decoder).items()])
