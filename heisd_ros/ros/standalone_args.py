"""Command line of the standalone `policy_node` (venv, no `ros2 run`), translated to ROS arguments.

    policy_node --params-file config/policy.yaml -p model_dir:=/path/to/checkpoint [--log-level debug]
                [--ros-args -r __ns:=/arm ...]

`--params-file`, `-p NAME:=VALUE` and `--log-level` become one `--ros-args` section; sections the
user wrote with `--ros-args ... [--]` are passed through verbatim. ROS-free (argparse only).
"""

from __future__ import annotations

import argparse

DESCRIPTION = "The heisd_ros policy node: synchronised camera views + end-effector pose in, 7-DoF commands out."


def split_ros_args(argv: list[str]) -> tuple[list[str], list[str]]:
    """(own arguments, the `--ros-args ... [--]` sections verbatim) of argv[1:]."""
    own: list[str] = []
    ros: list[str] = []
    inside = False
    for a in argv[1:]:
        if a == "--ros-args":
            inside = True
            ros.append(a)
        elif inside and a == "--":
            inside = False
            ros.append(a)
        else:
            (ros if inside else own).append(a)
    return own, ros


def ros_args(argv: list[str]) -> list[str]:
    """argv (program name first) as rclpy.init expects it: the standalone flags become ROS arguments."""
    parser = argparse.ArgumentParser(prog="policy_node", description=DESCRIPTION)
    parser.add_argument("--params-file", action="append", default=[], help="ROS 2 parameter YAML (repeatable)")
    parser.add_argument("-p", "--param", action="append", default=[], metavar="NAME:=VALUE",
                        help="override one parameter (repeatable)")  # fmt: skip
    parser.add_argument("--log-level", default=None, help="debug, info, warn, error")
    own, ros = split_ros_args(argv)
    opts = parser.parse_args(own)
    extra: list[str] = []
    for f in opts.params_file:
        extra += ["--params-file", f]
    for p in opts.param:
        extra += ["-p", p]
    if opts.log_level:
        extra += ["--log-level", opts.log_level]
    return [argv[0], *ros] + (["--ros-args", *extra] if extra else [])
