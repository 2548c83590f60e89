"""The decoder configuration that runs, shown as node parameters (`effective.decoder.*`).

The decoder.* parameters are what the user asked for; the calibration file and the database's
manifest change some of them at configure (`policy.resolve_decoder_config`). The node declares
`effective.decoder.<field>` for every decoder field with the value that runs, so `ros2 param get`
shows it. They are writable parameters only so that the node can set them again at the next
configure (rclpy can neither reset nor undeclare a read-only one); the node refuses every change
that does not come from its own configure.
"""

from __future__ import annotations

from typing import Any

from heisd_ros.core.config import DecoderConfig
from heisd_ros.ros.params import param_specs, ros_type

EFFECTIVE_PREFIX = "effective."
"""Parameters under this prefix show the decoder configuration that runs (the decoder.* parameters
with the calibration file and the database manifest applied, `policy.resolve_decoder_config`). The
node sets them at configure; any other change is refused."""


def effective_values(decoder: DecoderConfig) -> dict[str, Any]:
    """'effective.decoder.<field>' -> value of every decoder field of `decoder`, of the parameter's
    type: a point file's JSON may write a float field as an integer (`"tau": 0`), and a double
    parameter set to 0 is refused by rclpy (a second configure failed on it)."""
    out: dict[str, Any] = {}
    for spec in param_specs():
        if spec.group != "decoder.":
            continue
        obj: Any = decoder
        for key in spec.path:
            obj = getattr(obj, key)
        if spec.kind == "float":
            obj = float(obj)
        elif spec.kind == "float_array":
            obj = [float(x) for x in obj]
        out[EFFECTIVE_PREFIX + spec.name] = list(obj) if isinstance(obj, tuple) else obj
    return out


def show_effective(node: Any, decoder: DecoderConfig) -> dict[str, Any]:
    """Declare (first configure) or set the effective.* parameters of `node` to `decoder`'s values;
    returns them. The caller lets its parameter callback accept these changes while this runs."""
    from rcl_interfaces.msg import ParameterDescriptor
    from rclpy.parameter import Parameter

    values = effective_values(decoder)
    kinds = {EFFECTIVE_PREFIX + s.name: s.kind for s in param_specs() if s.group == "decoder."}
    for name, value in values.items():
        ptype = ros_type(kinds[name])
        if node.has_parameter(name):
            node.set_parameters([Parameter(name, ptype, value)])
        else:
            desc = ParameterDescriptor(description=f"what runs (set at configure; change {name[len(EFFECTIVE_PREFIX):]} "
                                                   "or the calibration file and configure again)", type=ptype.value)
            node.declare_parameter(name, value if value != [] else ptype, desc)
    return values
