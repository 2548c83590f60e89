"""What the node's tools share with the LIBERO workbench (`heisd_libero`, docs/eval_libero.md):
the init states it keeps for evaluation, where it publishes the mini policy, and the parts of its
runs' files the node's tools read.

The workbench writes `heisd-libero eval-libero` logs and reports; three node commands read them
without needing the workbench (no simulator) installed:
- `heisd calibrate --step-costs-from LOG`: `step_costs`, the measured step time per decoding mode;
- `heisd choose-point --run REPORT`: `class_figures`, a candidate's shadow figures per lossy class;
- `heisd demo`: records its LIBERO bag at one of `EVAL_INIT_STATES`, and runs the committed mini
  policy (`PUBLISHED_DIR`, written by `heisd-libero publish-mini`) when the pipeline's is absent.
The workbench imports these definitions from here, so writer and reader share one of each
(`heisd_ros.pipeline.closed_loop` reads the logs' trajectories the same way).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from heisd_ros.core.errors import ConfigError
from heisd_ros.pipeline.calibration import StepCosts
from heisd_ros.pipeline.log_files import READ_ERRORS, open_log

EVAL_INIT_STATES = range(40, 50)
"""LIBERO init states kept for closed-loop evaluation; demos never use them."""
PUBLISHED_DIR = "models/mini_libero"
"""The committed compact copy of the mini LIBERO policy."""
LOSSY_CLASSES = ("skip", "relaxed", "token_relaxed")
"""What a lossy step did. `skip`: a demonstration's action executed with no verification;
`relaxed`: a retrieval-mode step whose retrieved draft passed a relaxed rule (sequence-wise or token
by token); `token_relaxed`: a drafter-mode step accepted token by token (specvla)."""


def published_paths(root: str | Path = PUBLISHED_DIR) -> dict[str, Path]:
    """The model, drafter and calibration of a published copy at `root` (PolicyPaths' field names)."""
    r = Path(root)
    return {"model_dir": r / "vla", "drafter_dir": r / "drafter", "calibration_path": r / "calibration.json"}


def published_present(root: str | Path = PUBLISHED_DIR) -> bool:
    p = published_paths(root)
    return (p["model_dir"] / "config.json").is_file() and (p["drafter_dir"] / "drafter.safetensors").is_file() \
        and p["calibration_path"].is_file()


def class_figures(shadow: dict[str, Any] | None, cls: str) -> dict[str, Any]:
    """A report's deviation figures of one lossy class ({} where the method has no such step)."""
    return dict(((shadow or {}).get("by_class") or {}).get(cls) or {})


def step_costs(path: str | Path, method: str = "heisd") -> StepCosts:
    """`calibration.StepCosts` from an eval-libero log (.jsonl, .jsonl.xz or .jsonl.gz): the median step time
    of `method` in drafter mode, in retrieval mode accepted in one forward, and in retrieval mode
    finished by the drafter (what a cost-aware tau weighs, measured on this machine)."""
    p = Path(path)
    groups: dict[str, list[float]] = {"drafter": [], "pass": [], "fail": []}
    try:
        with open_log(p) as f:
            for line in f:
                rec = json.loads(line)
                if rec.get("kind") != "episode" or rec.get("method") != method:
                    continue
                for st in rec["steps"]:
                    if st["mode"] == "drafter":
                        groups["drafter"].append(st["ms"]["total"])
                    elif st["mode"] == "retrieval":
                        groups["pass" if st["forwards"] == 1 else "fail"].append(st["ms"]["total"])
    except (*READ_ERRORS, json.JSONDecodeError, KeyError) as err:
        raise ConfigError(f"{p}: not a readable eval-libero log ({err})") from err
    missing = [k for k, v in groups.items() if not v]
    if missing:
        raise ConfigError(f"{p}: no {method} steps of kind {missing} to measure step costs from")
    return StepCosts(*(float(np.median(groups[k])) for k in ("drafter", "pass", "fail")))
