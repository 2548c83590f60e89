"""`heisd` command line: one subcommand per tool, each a `main(argv)` in its own module.

Usage: heisd <command> [options]    (heisd <command> --help for the options of one command)

The LIBERO workbench's commands (gen-demos, eval-libero, ...) are `heisd-libero <command>`, a
package of its own beside the node (heisd_libero); `heisd <one of them>` says so (`MOVED`).
`run` is the dispatch both command lines share.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Mapping

COMMANDS: dict[str, tuple[str, str]] = {
    "bench": ("heisd_ros.tools.bench", "run decoding methods side by side and report speed/accuracy"),
    "replay": ("heisd_ros.tools.replay", "play a rosbag2 into the policy node and record its outputs"),
    "demo": ("heisd_ros.tools.demo", "set up and run the policy node on a bag, with a summary"),
    "train-prior": ("heisd_ros.tools.train_prior", "fit the proprioceptive action prior into a VLA copy"),
    "train-drafter": ("heisd_ros.tools.train_drafter", "train the EAGLE-style drafter head"),
    "build-db": ("heisd_ros.tools.build_db", "build the Qdrant demonstration database"),
    "calibrate": ("heisd_ros.tools.calibrate", "calibrate the fused metric and verify-skip thresholds"),
    "choose-point": ("heisd_ros.tools.choose_point", "pick the operating point from a calibration run"),
    "check-model": ("heisd_ros.tools.check_model", "check a checkpoint's behaviour and time ar against drafter/heisd"),
}
MOVED = ("gen-demos", "dagger", "train-vla", "eval-libero", "skip-checks", "publish-mini")
"""Former `heisd` commands that are now the workbench's: `heisd-libero <command>`."""
WORKBENCH = "heisd-libero"


def usage(prog: str, commands: Mapping[str, tuple[str, str]]) -> str:
    lines = [f"usage: {prog} <command> [options]", "", "commands:"]
    for name, (module, text) in commands.items():
        if importlib.util.find_spec(module) is not None:
            lines.append(f"  {name:<14} {text}")
    return "\n".join(lines)


def run(prog: str, commands: Mapping[str, tuple[str, str]], argv: list[str] | None,
        elsewhere: Mapping[str, str] | None = None) -> int:  # fmt: skip
    """Dispatch `argv` (sys.argv[1:] when None) to its command's `main`; `elsewhere` maps a command
    of the other command line to the line printed instead (exit 2)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage(prog, commands))
        return 0
    name, rest = argv[0], argv[1:]
    if name in (elsewhere or {}):
        print(f"{prog}: {elsewhere[name]}", file=sys.stderr)
        return 2
    if name not in commands or importlib.util.find_spec(commands[name][0]) is None:
        print(f"{prog}: unknown command {name!r}\n\n{usage(prog, commands)}", file=sys.stderr)
        return 2
    module = importlib.import_module(commands[name][0])
    return int(module.main(rest) or 0)


def main(argv: list[str] | None = None) -> int:
    moved = {name: f"moved: {WORKBENCH} {name} (the LIBERO workbench, installed beside the node: docs/install.md)"
             for name in MOVED}
    return run("heisd", COMMANDS, argv, moved)


if __name__ == "__main__":
    sys.exit(main())
