"""`heisd-libero skip-checks`: choose verify-skip's agreement checks from the skip steps of a shadowed run.

Usage:
    heisd-libero skip-checks --log artifacts/explore/explore.jsonl --point models/mini_libero/calibration.json \
        --out artifacts/point.json [--method heisd] [--grid 0,6,8,12,16,20,30] \
        [--max-position-p95-bins 24] [--max-gripper-disagreement 0.005]

The log is an `heisd-libero eval-libero --shadow-ar` log of a run on calibration init states whose `--method`
ran the operating point `--point` with both agreement checks off (`max_hit_spread_bins` and
`max_bins_from_verified` 0): every skip step then carries its measures (`skip_spread`,
`skip_from_verified`) and greedy ar's tokens on the same observation. Each pair of thresholds of the
grid (0 = that check off) keeps the skip steps whose measures pass it (a measure that was not taken
refuses); a pair is eligible when its kept steps' position |delta bin| p95 and gripper disagreement
are within the bounds, and the eligible pair keeping the most skips wins (ties: the looser checks).
The bound's default, 24 bins, leaves 6 under the point's 30 for the closed loop, whose path
changes once fewer steps skip. The output is `--point` with the chosen thresholds, every setting
written out, and the candidates in `meta.skip_checks`.

This reads the skips one run took and asks which of them a check would have refused; a refused skip
would have been verified, and the path after it would differ, so a run at the chosen point is what
shows the bound holds.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import itertools
import shlex
import sys
from typing import Any

import numpy as np

from heisd_ros.core.errors import ConfigError
from heisd_ros.core.files import read_json

GRID = (0, 6, 8, 12, 16, 20, 30)
"""Thresholds tried for each check, in summed position-group |delta bin| (0 = off)."""


@dataclasses.dataclass(frozen=True)
class SkipStep:
    """What a skip step logged: its position and gripper deviation from greedy ar, and its measures."""

    position_bins: float
    gripper_differs: bool
    spread_bins: float
    from_verified_bins: float


def skip_steps(episodes: list[dict[str, Any]], method: str) -> list[SkipStep]:
    """The shadowed skip steps of `method`'s episodes."""
    out = []
    for e in episodes:
        if e["method"] != method:
            continue
        for s in e["steps"]:
            if s.get("skipped") and s.get("shadow") is not None:
                t, a = np.asarray(s["tokens"]), np.asarray(s["shadow"])
                out.append(SkipStep(float(np.abs(t[:3] - a[:3]).sum()), bool(t[6] != a[6]),
                                    float(s.get("skip_spread", np.nan)), float(s.get("skip_from_verified", np.nan))))
    return out


def candidates(steps: list[SkipStep], grid: tuple[int, ...], max_p95: float, max_gripper: float) -> list[dict]:
    """Every (spread, from-verified) pair of the grid with what it keeps and whether it is eligible."""
    pos = np.array([s.position_bins for s in steps])
    grip = np.array([s.gripper_differs for s in steps], dtype=float)
    spread = np.nan_to_num(np.array([s.spread_bins for s in steps]), nan=np.inf)
    verified = np.nan_to_num(np.array([s.from_verified_bins for s in steps]), nan=np.inf)
    rows = []
    for x, y in itertools.product(grid, repeat=2):
        keep = np.ones(len(steps), dtype=bool)
        if x:
            keep &= spread <= x
        if y:
            keep &= verified <= y
        kept = int(keep.sum())
        p95 = float(np.percentile(pos[keep], 95)) if kept else None
        g = float(grip[keep].mean()) if kept else None
        rows.append({"max_hit_spread_bins": x, "max_bins_from_verified": y, "kept_skips": kept,
                     "kept_share": kept / len(steps) if steps else None, "position_p95_bins": p95,
                     "gripper_disagreement": g,
                     "eligible": kept > 0 and p95 <= max_p95 and g <= max_gripper})
    return rows


def choose(rows: list[dict]) -> dict:
    """The eligible pair keeping the most skips; ties go to the looser checks (0, off, loosest)."""
    eligible = [r for r in rows if r["eligible"]]
    if not eligible:
        raise ConfigError("no pair of thresholds keeps the skip steps within the bound; tighten the grid "
                          "or the point (min_S, O_dist)")

    def looseness(x: int) -> float:
        return np.inf if x == 0 else x

    return max(eligible, key=lambda r: (r["kept_skips"], looseness(r["max_hit_spread_bins"]),
                                        looseness(r["max_bins_from_verified"])))


def run(log_path: str, point_path: str, out_path: str, method: str, grid: tuple[int, ...], max_p95: float,
        max_gripper: float, command: str = "") -> dict:
    from heisd_ros.core.config import DecoderConfig
    from heisd_ros.pipeline.calibration import apply_point, complete_point, save_calibration
    from heisd_ros.pipeline.outputs import file_digest
    from heisd_libero.eval_report import ResultLog

    log = ResultLog.read(log_path)
    key = log.run_key
    if key.get("calibration_digest") != file_digest(point_path):
        raise ConfigError(f"{point_path} is not the operating point the run used (digest {key.get('calibration_digest')})")
    if key.get("purpose") != "calibration":
        raise ConfigError("the run is not a calibration run (heisd-libero eval-libero --purpose calibration)")
    point = read_json(point_path, ConfigError)
    vs = apply_point(DecoderConfig(), point).verify_skip
    if vs.max_hit_spread_bins or vs.max_bins_from_verified:
        raise ConfigError("the run's point already gates skips by agreement: its skip steps are not all the "
                          "point would skip; run it with both checks off")
    steps = skip_steps(log.episodes, method)
    if not steps:
        raise ConfigError(f"no shadowed skip step of {method!r} in {log_path} (run with --shadow-ar)")
    rows = candidates(steps, grid, max_p95, max_gripper)
    best = choose(rows)
    chosen = copy.deepcopy(point)
    chosen["verify_skip"].update(max_hit_spread_bins=best["max_hit_spread_bins"],
                                 max_bins_from_verified=best["max_bins_from_verified"])
    chosen.setdefault("meta", {})["skip_checks"] = {
        "command": command,
        "log": str(log_path), "log_git_rev": key.get("git_rev"), "method": method,
        "scene_shift_m": key.get("scene_shift_m", 0.0), "scene_seed": key.get("scene_seed", 0),
        "skip_steps": len(steps), "bounds": {"max_position_p95_bins": max_p95, "max_gripper_disagreement": max_gripper},
        "chosen": best, "candidates": rows}
    out = complete_point(chosen, apply_point(DecoderConfig(), chosen))
    out["chosen_from"] = {"kind": "libero_run", "rule": "skip checks on the skip steps of a shadowed run",
                          "run": str(log_path), "run_git_rev": key.get("git_rev"), "run_digest": file_digest(log_path),
                          "point_digest": file_digest(point_path), "previous": point.get("chosen_from")}
    save_calibration(out, out_path)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="heisd-libero skip-checks", description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--log", required=True, help="eval-libero log (.jsonl) of a --purpose calibration --shadow-ar run")
    p.add_argument("--point", required=True, help="the operating-point file that run used (checks off)")
    p.add_argument("--out", required=True, help="operating-point file to write")
    p.add_argument("--method", default="heisd", help="the label whose skip steps are read")
    p.add_argument("--grid", default=",".join(map(str, GRID)), help="thresholds tried for each check (0 = off)")
    p.add_argument("--max-position-p95-bins", type=float, default=24.0)
    p.add_argument("--max-gripper-disagreement", type=float, default=0.005)
    args = p.parse_args(argv)
    command = "heisd-libero skip-checks " + shlex.join(sys.argv[1:] if argv is None else argv)
    try:
        grid = tuple(int(x) for x in args.grid.split(","))
        out = run(args.log, args.point, args.out, args.method, grid, args.max_position_p95_bins,
                  args.max_gripper_disagreement, command)
    except (ConfigError, OSError, ValueError) as err:
        print(f"heisd-libero skip-checks: {err}", file=sys.stderr)
        return 2
    best = out["meta"]["skip_checks"]["chosen"]
    print(f"skip-checks: max_hit_spread_bins {best['max_hit_spread_bins']}, max_bins_from_verified "
          f"{best['max_bins_from_verified']}: keeps {best['kept_skips']} of {out['meta']['skip_checks']['skip_steps']} "
          f"skips, position p95 {best['position_p95_bins']:.1f} bins, gripper {best['gripper_disagreement']:.4f} "
          f"-> {args.out}")
    return 0
