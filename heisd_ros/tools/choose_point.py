"""`heisd choose-point`: pick the operating point from a closed-loop calibration run, by a fixed rule.

Usage:
    heisd choose-point --run artifacts/calib_run/report.json --calibration artifacts/calibration_fitted.json \
        --out artifacts/calibration.json [--max-success-drop 5]

The run is an `heisd eval-libero --purpose calibration` report (init states held out from both the
demonstrations and the evaluation) with `ar`, and `heisd` and/or heisd variants as the candidates
(`--variants`, fields of `fused_metric` and `verify_skip` only). The rule, fixed before any
candidate is seen: among the candidates whose success rate is at least `ar`'s minus
`--max-success-drop` points, the one with the lowest mean step time. The output is the calibration
file with the chosen candidate's fields written in, and in `meta.chosen_point` the run, the rule and
every candidate's figures; the evaluation then reports that point on episodes it was not chosen on.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path
from typing import Any

from heisd_ros.core.errors import ConfigError, HeisdError
from heisd_ros.pipeline.calibration import save_calibration
from heisd_ros.tools.eval_variants import MethodVariant, parse_variants

SECTIONS = ("fused_metric", "verify_skip")
"""What a calibration file holds, hence what a candidate may change."""


def candidates(report: dict[str, Any]) -> dict[str, MethodVariant]:
    """{label: variant} of the heisd candidates of a calibration report (plain `heisd`: no change)."""
    meta = report.get("_meta", {})
    if meta.get("purpose") != "calibration":
        raise ConfigError("the run is not a calibration run (heisd eval-libero --purpose calibration)")
    found = {"heisd": MethodVariant("heisd", "heisd")} if "heisd" in report else {}
    for v in parse_variants(";".join(meta.get("variants", []))):
        if v.name in report and v.method == "heisd":
            bad = [k for k, _ in v.overrides if k.split(".")[0] not in SECTIONS]
            if bad:
                raise ConfigError(f"candidate {v.name} changes {bad}: a calibration file holds only {SECTIONS}")
            found[v.name] = v
    if "ar" not in report or not found:
        raise ConfigError("a calibration run needs ar and at least one heisd candidate")
    return found


def choose(report: dict[str, Any], max_success_drop: float) -> tuple[str, list[dict[str, Any]]]:
    """(the chosen label, every candidate's row with its verdict) by the module's rule."""
    floor = report["ar"]["success_rate"] - max_success_drop / 100.0
    rows = []
    for name in candidates(report):
        r = report[name]
        rows.append({"name": name, "success_rate": r["success_rate"], "episodes": r["episodes"],
                     "mean_step_ms": r["mean_step_ms"], "p95_step_ms": r["p95_step_ms"],
                     "speedup_vs_ar": r["speedup_vs_ar"], "eligible": r["success_rate"] >= floor})
    eligible = [row for row in rows if row["eligible"]]
    if not eligible:
        raise ConfigError(f"no candidate within {max_success_drop} points of ar's success "
                          f"({report['ar']['success_rate']:.0%}); widen the candidates or the run")
    return min(eligible, key=lambda row: row["mean_step_ms"])["name"], rows


def write_point(calibration: dict[str, Any], variant: MethodVariant) -> dict[str, Any]:
    """The calibration with the variant's fields written into their sections."""
    out = copy.deepcopy(calibration)
    for path, value in variant.overrides:
        section, field = path.split(".", 1)
        out.setdefault(section, {})[field] = value
    return out


def run(run_path: str, calibration_path: str, out_path: str, max_success_drop: float) -> dict[str, Any]:
    from heisd_ros.tools.eval_policies import file_digest

    report = json.loads(Path(run_path).read_text())
    used = report.get("_meta", {}).get("model", {}).get("calibration_digest")
    if used != file_digest(calibration_path):
        raise ConfigError(f"{calibration_path} is not the calibration file the run used (digest {used})")
    calibration = json.loads(Path(calibration_path).read_text())
    name, rows = choose(report, max_success_drop)
    chosen = write_point(calibration, candidates(report)[name])
    meta = report["_meta"]
    chosen.setdefault("meta", {})["chosen_point"] = {
        "chosen": name, "rule": f"lowest mean step among candidates with success >= ar's - {max_success_drop} points",
        "run": str(run_path), "run_git_rev": meta.get("git_rev"), "tasks": meta.get("tasks"),
        "init_states": meta.get("init_states"), "ar_success_rate": report["ar"]["success_rate"],
        "ar_mean_step_ms": report["ar"]["mean_step_ms"], "candidates": rows, "from_calibration": str(calibration_path),
    }
    save_calibration(chosen, out_path)
    return chosen


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="heisd choose-point", description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--run", required=True, help="eval-libero report (.json) of a --purpose calibration run")
    p.add_argument("--calibration", required=True, help="the calibration file that run used")
    p.add_argument("--out", required=True, help="calibration file to write")
    p.add_argument("--max-success-drop", type=float, default=5.0, help="points below ar's success a candidate may be")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        chosen = run(args.run, args.calibration, args.out, args.max_success_drop)
    except (HeisdError, OSError, json.JSONDecodeError, KeyError) as err:
        print(f"heisd choose-point: {type(err).__name__}: {err}", file=sys.stderr)
        return 2
    info = chosen["meta"]["chosen_point"]
    for row in info["candidates"]:
        print(f"{row['name']:>16}: success {row['success_rate']:.0%} of {row['episodes']}, mean step "
              f"{row['mean_step_ms']:.1f} ms, {row['speedup_vs_ar']:.2f}x ar{'' if row['eligible'] else ' (not eligible)'}")
    print(f"chose {info['chosen']}; wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
