"""Stand-ins for launch/launch_ros (not installable here: no wheels) that record what a launch file
builds, and the command line launch_ros would run for a recorded node.

`load_launch(path, monkeypatch, **given)` executes a launch file against the stand-ins and returns
(declared argument -> default, the entities its OpaqueFunction returns); a LaunchConfiguration
performs to the declared default or the given value. `node_argv(node)` is the executable's
command line as launch_ros builds it: arguments, then `--ros-args` with the node's name, namespace,
parameter files, parameters and remappings.
"""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path
from typing import Any


class Rec:
    def __init__(self, *args, **kwargs):
        self.args, self.kwargs = args, kwargs


def fake_launch_modules(arguments: dict[str, str]) -> dict[str, types.ModuleType]:
    class LaunchConfiguration(Rec):
        def perform(self, context):
            return arguments[self.args[0]]

    mods = {}
    for name, attrs in {
        "launch": ["LaunchDescription"],
        "launch.actions": ["DeclareLaunchArgument", "OpaqueFunction", "IncludeLaunchDescription", "EmitEvent",
                           "RegisterEventHandler"],
        "launch.event_handlers": ["OnProcessExit"],
        "launch.events": ["Shutdown"],
        "launch.launch_description_sources": ["PythonLaunchDescriptionSource"],
        "launch.substitutions": ["PathJoinSubstitution"],
        "launch_ros.actions": ["LifecycleNode", "Node"],
        "launch_ros.substitutions": ["FindPackageShare"],
    }.items():  # fmt: skip
        m = types.ModuleType(name)
        for a in attrs:
            setattr(m, a, type(a, (Rec,), {}))
        mods[name] = m
    mods["launch.substitutions"].LaunchConfiguration = LaunchConfiguration
    mods["launch_ros"] = types.ModuleType("launch_ros")
    return mods


def load_launch(path: Path, monkeypatch, **given: str) -> tuple[dict[str, Any], list[Any]]:
    spec = importlib.util.spec_from_file_location(path.stem.replace(".", "_"), path)
    module = importlib.util.module_from_spec(spec)
    arguments: dict[str, str] = {}
    for name, mod in fake_launch_modules(arguments).items():
        monkeypatch.setitem(sys.modules, name, mod)
    spec.loader.exec_module(module)
    entities = module.generate_launch_description().args[0]
    declared = {e.args[0]: e.kwargs["default_value"] for e in entities[:-1]}
    arguments.update({k: v if isinstance(v, str) else "share/heisd_ros/config/policy.yaml" for k, v in declared.items()})
    arguments.update(given)
    return declared, entities[-1].kwargs["function"](context=None)


def _ros_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, list):
        return "[" + ", ".join(f"'{x}'" if isinstance(x, str) else str(x) for x in v) + "]"
    return str(v)


def node_argv(node: Rec, executable: list[str]) -> list[str]:
    """`executable` (the resolved program, as a list) + the node's arguments and ROS arguments."""
    kw = node.kwargs
    argv = [*executable, *kw.get("arguments", []), "--ros-args", "-r", f"__node:={kw['name']}"]
    if kw.get("namespace"):
        argv += ["-r", f"__ns:=/{kw['namespace'].strip('/')}"]
    for p in kw.get("parameters", []):
        if isinstance(p, dict):
            for k, v in p.items():
                argv += ["-p", f"{k}:={_ros_value(v)}"]
        else:
            argv += ["--params-file", str(p)]
    for src, dst in kw.get("remappings", []):
        argv += ["-r", f"{src}:={dst}"]
    return argv
