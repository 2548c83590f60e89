"""The demonstration-source flags `heisd build-db`, `train-drafter` and `calibrate` share.

    --demos DIR | --bags DIR | --lerobot DIR   [--dataset NAME] [--tasks 0-9]
    [--map SRC=ROLE,...] [--instruction TEXT] [--finger-joints J1,J2]
    [--twist-linear-scale S] [--twist-angular-scale S]
    [--gripper-open-positive] [--gripper-range LO,HI] [--trust-actions]

docs/your_data.md walks through them; `heisd_ros.pipeline.sources` reads with them.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from heisd_ros.pipeline.sources import SourceOptions

OPTION_FLAGS = tuple(f.name for f in dataclasses.fields(SourceOptions))


def _pair(text: str) -> tuple[float, float]:
    try:
        lo, hi = (float(x) for x in text.split(","))
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"expected LO,HI, got {text!r}") from err
    return lo, hi


def _names(text: str) -> tuple[str, ...]:
    return tuple(s.strip() for s in text.split(",") if s.strip())


def add_source_arguments(p: argparse.ArgumentParser, skip: tuple[str, ...] = ()) -> None:
    """Add the source flags to `p`, except those named in `skip` (a tool's own --demos, --tasks)."""
    d = SourceOptions()
    src = p.add_argument_group("demonstration sources (docs/your_data.md)")
    flags = {
        "demos": "directory of LIBERO-layout *.hdf5 files (or one file)",
        "bags": "directory with rosbag2 recordings below it",
        "lerobot": "LeRobot dataset directory (layout v2.x or v3: meta/info.json)",
        "dataset": "dataset name in the point ids (default: from the source)",
        "tasks": "HDF5 or LeRobot task indices, e.g. 0-7 (default: all)",
    }
    for name, text in flags.items():
        if name not in skip:
            src.add_argument(f"--{name}", default=None if name == "tasks" else "", metavar=name.upper(), help=text)
    src.add_argument("--map", dest="source_map", default="", metavar="SRC=ROLE,...",
                     help="what is what: TOPIC=ROLE,... for --bags (default: the node's topics), FEATURE=ROLE,... for "
                          "--lerobot; roles agentview, wrist, pose, action, gripper, fingers, instruction, result")
    src.add_argument("--instruction", default="", metavar="TEXT",
                     help="the task of bags that record no instruction topic")
    src.add_argument("--finger-joints", type=_names, default=d.finger_joints, metavar="J1,J2",
                     help="the two finger joints of the 'fingers' JointState topic (default: the Panda's)")
    src.add_argument("--twist-linear-scale", type=float, default=d.twist_linear_scale, metavar="S",
                     help="a TwistStamped action's linear = delta position * this (a velocity held for one step: the "
                          "recording rate in Hz, as the node's Servo twist with position_unit_m 1)")
    src.add_argument("--twist-angular-scale", type=float, default=d.twist_angular_scale, metavar="S",
                     help="a TwistStamped action's angular = delta rotation * this")
    src.add_argument("--gripper-open-positive", action="store_true",
                     help="the source's gripper value is larger when open (the policy's: -1 open, +1 close)")
    src.add_argument("--gripper-range", type=_pair, default=d.gripper_range, metavar="LO,HI",
                     help="the source's gripper values end to end, LO,HI (default -1,1), mapped onto -1..1")
    src.add_argument("--trust-actions", action="store_true",
                     help="skip the action checks that are heuristics (episodes starting closed, absolute targets, "
                          "the fit to the model's statistics)")


def pop_options(args: dict[str, Any]) -> SourceOptions:
    """Take the reading options out of a parsed-arguments dict (the source paths stay: they are
    fields of the tool's own config)."""
    return SourceOptions(**{k: args.pop(k) for k in OPTION_FLAGS})
