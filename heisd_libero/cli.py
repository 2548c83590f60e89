"""`heisd-libero` command line: the LIBERO workbench's tools, one subcommand each, dispatched like
`heisd` (heisd_ros.tools.cli.run).

Usage: heisd-libero <command> [options]    (heisd-libero <command> --help for the options of one command)

The node's own commands (build-db, train-drafter, calibrate, choose-point, replay, bench, demo, ...)
stay `heisd <command>`.
"""

from __future__ import annotations

import sys

from heisd_ros.tools.cli import COMMANDS as NODE_COMMANDS
from heisd_ros.tools.cli import run

COMMANDS: dict[str, tuple[str, str]] = {
    "gen-demos": ("heisd_libero.gen_demos", "generate scripted LIBERO demonstrations"),
    "dagger": ("heisd_libero.dagger", "roll a policy out in LIBERO and label the states it visits with the expert"),
    "train-vla": ("heisd_libero.train_vla", "train the mini VLA on the demonstrations"),
    "eval-libero": ("heisd_libero.eval_libero", "closed-loop LIBERO evaluation of every method"),
    "skip-checks": ("heisd_libero.skip_checks", "choose verify-skip's agreement checks from a shadowed run"),
    "publish-mini": ("heisd_libero.publish_mini", "write the committed compact copy of the mini policy"),
    "sim-episodes": ("heisd_libero.sim_episodes", "LIBERO episodes through policy_node and the simulated arm, per method"),
    "sim-demo": ("heisd_libero.sim_demo", "one LIBERO episode closed loop through policy_node and the simulated arm, ar then heisd (make demo)"),
    "sim-arm": ("heisd_libero.sim_arm_node", "the simulated arm as a ROS 2 node (launch/sim.launch.py starts it)"),
}


def main(argv: list[str] | None = None) -> int:
    node = {name: f"{name} is a command of the node package: heisd {name}" for name in NODE_COMMANDS}
    return run("heisd-libero", COMMANDS, argv, node)


if __name__ == "__main__":
    sys.exit(main())
