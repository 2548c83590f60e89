"""The policy node's parameter services (rcl_interfaces), answering every request.

rclpy's own services convert each value of a SetParameters request before anything checks it, and
a value whose type field is not a ParameterType (say 99, from a hostile or broken client) raises
inside the service callback: the client waits forever. These six services are the same interface
on the node's public parameter API (what `ros2 param` and every ROS tool call), with that
conversion checked: such a value is refused with the reason, like any other invalid one. The node
is created with `start_parameter_services=False` and holds one `ParameterServices`.
"""

from __future__ import annotations

from typing import Any

from rcl_interfaces.msg import ListParametersResult, SetParametersResult
from rcl_interfaces.srv import (
    DescribeParameters,
    GetParameters,
    GetParameterTypes,
    ListParameters,
    SetParameters,
    SetParametersAtomically,
)
from rclpy.exceptions import ParameterException, ParameterNotDeclaredException, ParameterUninitializedException
from rclpy.parameter import Parameter
from rclpy.qos import qos_profile_parameters


def _parameter(msg: Any) -> tuple[Parameter | None, str]:
    """(the request's parameter, '') or (None, why it cannot be one)."""
    try:
        return Parameter.from_parameter_msg(msg), ""
    except (ValueError, TypeError, AttributeError) as err:
        return None, f"parameter {msg.name!r}: invalid value ({type(err).__name__}: {err})"


class ParameterServices:
    """describe/get/get_types/list/set/set_atomically parameters of `node`, under its name."""

    def __init__(self, node: Any) -> None:
        self._node = node
        specs = ((DescribeParameters, "describe_parameters", self._describe),
                 (GetParameters, "get_parameters", self._get),
                 (GetParameterTypes, "get_parameter_types", self._get_types),
                 (ListParameters, "list_parameters", self._list),
                 (SetParameters, "set_parameters", self._set),
                 (SetParametersAtomically, "set_parameters_atomically", self._set_atomically))
        self.services = [node.create_service(srv, f"~/{name}", callback, qos_profile=qos_profile_parameters)
                         for srv, name, callback in specs]

    @staticmethod
    def _names_or_empty(read: Any, names: Any) -> list:
        """`read(names)`, or [] when a name is not declared (or not set), as rclpy's services answer."""
        try:
            return read(list(names))
        except (ParameterNotDeclaredException, ParameterUninitializedException):
            return []

    def _describe(self, request: Any, response: Any) -> Any:
        response.descriptors = self._names_or_empty(self._node.describe_parameters, request.names)
        return response

    def _get(self, request: Any, response: Any) -> Any:
        params = self._names_or_empty(self._node.get_parameters, request.names)
        response.values = [p.get_parameter_value() for p in params]
        return response

    def _get_types(self, request: Any, response: Any) -> Any:
        response.types = self._names_or_empty(self._node.get_parameter_types, request.names)
        return response

    def _list(self, request: Any, response: Any) -> Any:
        try:
            response.result = self._node.list_parameters(list(request.prefixes), request.depth)
        except (TypeError, ValueError):
            response.result = ListParametersResult()
        return response

    def _set(self, request: Any, response: Any) -> Any:
        """Each parameter on its own (a refused one does not stop the others), as rclpy does."""
        for msg in request.parameters:
            response.results.append(self._apply([msg]))
        return response

    def _set_atomically(self, request: Any, response: Any) -> Any:
        response.result = self._apply(list(request.parameters))
        return response

    def _apply(self, msgs: list[Any]) -> SetParametersResult:
        params = []
        for msg in msgs:
            param, why = _parameter(msg)
            if param is None:
                return SetParametersResult(successful=False, reason=why)
            params.append(param)
        try:
            return self._node.set_parameters_atomically(params)
        except ParameterException as err:  # undeclared, read-only, of another type: refused, answered
            return SetParametersResult(successful=False, reason=f"{type(err).__name__}: {err}")
