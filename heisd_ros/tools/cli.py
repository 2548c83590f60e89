"""`heisd` command line: one subcommand per tool, each a `main(argv)` in its own module.

Usage: heisd <command> [options]    (heisd <command> --help for the options of one command)
"""

from __future__ import annotations

import importlib
import importlib.util
import sys

COMMANDS: dict[str, tuple[str, str]] = {
    "bench": ("heisd_ros.tools.bench", "run decoding methods side by side and report speed/accuracy"),
    "replay": ("heisd_ros.tools.replay", "play a rosbag2 into the policy node and record its outputs"),
    "demo": ("heisd_ros.tools.demo", "set up and run the policy node on a bag, with a summary"),
    "gen-demos": ("heisd_ros.tools.gen_demos", "generate scripted LIBERO demonstrations"),
    "dagger": ("heisd_ros.tools.dagger", "roll a policy out in LIBERO and label the states it visits with the expert"),
    "train-vla": ("heisd_ros.tools.train_vla", "train the mini VLA on the demonstrations"),
    "train-prior": ("heisd_ros.tools.train_prior", "fit the proprioceptive action prior into a VLA copy"),
    "train-drafter": ("heisd_ros.tools.train_drafter", "train the EAGLE-style drafter head"),
    "build-db": ("heisd_ros.tools.build_db", "build the Qdrant demonstration database"),
    "calibrate": ("heisd_ros.tools.calibrate", "calibrate the fused metric and verify-skip thresholds"),
    "eval-libero": ("heisd_ros.tools.eval_libero", "closed-loop LIBERO evaluation of every method"),
    "choose-point": ("heisd_ros.tools.choose_point", "pick the operating point from a calibration run"),
    "skip-checks": ("heisd_ros.tools.skip_checks", "choose verify-skip's agreement checks from a shadowed run"),
    "check-model": ("heisd_ros.tools.check_model", "check a checkpoint's behaviour and time ar against drafter/heisd"),
    "publish-mini": ("heisd_ros.tools.publish_mini", "write the committed compact copy of the mini policy"),
}


def _usage() -> str:
    lines = ["usage: heisd <command> [options]", "", "commands:"]
    for name, (module, text) in COMMANDS.items():
        if importlib.util.find_spec(module) is not None:
            lines.append(f"  {name:<14} {text}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS or importlib.util.find_spec(COMMANDS[name][0]) is None:
        print(f"heisd: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[name][0])
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
