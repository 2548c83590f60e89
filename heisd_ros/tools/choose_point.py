"""`heisd choose-point`: pick the operating point by a fixed rule, from shadow recordings of your own
arm or from a closed-loop LIBERO calibration run.

Usage:
    heisd choose-point --shadow BAG [BAG ...] --calibration my_calibration.json --out my_point.json \
        [--max-position-p95-bins 30] [--max-gripper-disagreement 0.005] [--min-episodes 10] [--min-steps 500]
    heisd choose-point --run artifacts/calib_run/report.json --calibration artifacts/calibration_fitted.json \
        --out artifacts/calibration.json [--max-success-drop 5] [--max-gripper-disagreement 0.005] \
        [--max-position-p95-bins 30] [--min-episodes 50]

With --shadow: the node ran its own method (ar) with `shadow.method: heisd` and `ros2 bag record`
kept its shadow_steps topic; the calibration file's point and its variations are replayed over every
recorded episode and chosen by heisd_ros/pipeline/shadow_point.py's rule (skip steps within their
bounds against what was executed; the highest expected speed-up). Where the calibration's tau is above
0, `meta.chosen_point.boundary_off` (printed as `boundary_off`) gives the chosen point's replayed
figures at tau 0: what the boundary costs, never a candidate. What follows is the LIBERO path.

The run is an `heisd-libero eval-libero --purpose calibration --shadow-ar` report (init states held out
from both the demonstrations and the evaluation) with `ar`, and `heisd` and/or heisd variants as the
candidates (`--variants`, fields of `fused_metric` and `verify_skip` only), at one committed
revision. The rule, fixed before any candidate is seen: a candidate is eligible when
- it ran at least `--min-episodes` episodes, all paired with ar's (same task and init state);
- its success, paired against ar's, is at most `--max-success-drop` points below (method - ar);
- its strict steps all carry ar's tokens (strict-step agreement);
- every lossy step of it was shadowed, and its skip steps (a demonstration's action executed
  unverified) stay close to greedy ar on the same observations: over its skip steps alone, the
  gripper token differs on at most `--max-gripper-disagreement` of them (0.5 %), and the 95th
  percentile of a step's position-group |delta bin| is at most `--max-position-p95-bins` (30: the
  sequence-wise acceptance bound of one group). A candidate without skip steps passes these two;
  its other lossy steps (relaxed acceptance) are reported, not gated: their bound is the
  acceptance rule's own;
and among the eligible candidates the one with the lowest mean step time wins. The output is the
calibration file with the chosen candidate's fields written in, and in `meta.chosen_point` the run,
the rule and every candidate's figures (per kind of lossy step) and verdict; the evaluation then
reports that point on episodes it was not chosen on.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from dataclasses import asdict, dataclass
from typing import Any

from heisd_ros.core.errors import ConfigError, HeisdError
from heisd_ros.core.config import DecoderConfig, from_dict
from heisd_ros.core.files import read_json
from heisd_ros.pipeline.calibration import POINT_SCALARS, POINT_SECTIONS, apply_point, complete_point, save_calibration
from heisd_ros.pipeline.libero_runs import LOSSY_CLASSES, class_figures
from heisd_ros.pipeline.method_variants import MethodVariant, parse_variants
from heisd_ros.pipeline.outputs import file_digest
from heisd_ros.pipeline.shadow_point import ShadowRule

SECTIONS = (*POINT_SECTIONS, *POINT_SCALARS)
"""What an operating-point file holds, hence what a candidate may change."""


def candidates(report: dict[str, Any]) -> dict[str, MethodVariant]:
    """{label: variant} of the heisd candidates of a calibration report (plain `heisd`: no change)."""
    meta = report.get("_meta", {})
    if meta.get("purpose") != "calibration":
        raise ConfigError("the run is not a calibration run (heisd-libero eval-libero --purpose calibration)")
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


@dataclass(frozen=True)
class PointRule:
    """The eligibility bounds of `choose` (the module docstring says what each one means)."""

    max_success_drop: float = 5.0
    max_gripper_disagreement: float = 0.005
    max_position_p95_bins: float = 30.0
    min_episodes: int = 50

    def describe(self) -> str:
        return (f"lowest mean step among candidates with >= {self.min_episodes} episodes paired with ar, success "
                f"(paired) >= ar's - {self.max_success_drop} points, every strict step equal to ar's, every lossy "
                f"step shadowed, and on its skip steps alone (none: passes) gripper disagreement with greedy ar "
                f"<= {self.max_gripper_disagreement:.1%} and p95 position |delta bin| "
                f"<= {self.max_position_p95_bins:g}")


def _refusals(row: dict[str, Any], ar_episodes: int, rule: PointRule) -> list[str]:
    """Why a candidate's report row is not eligible (empty: eligible)."""
    why = []
    paired = row.get("paired_vs_ar")
    if row["episodes"] < rule.min_episodes:
        why.append(f"{row['episodes']} episodes < {rule.min_episodes}")
    if paired is None or paired["pairs"] != row["episodes"] or paired["pairs"] > ar_episodes:
        why.append("episodes not all paired with ar's")
    elif paired["difference"] < -rule.max_success_drop / 100.0 - 1e-12:
        why.append(f"success {paired['difference']:+.0%} against ar (paired)")
    agreement = row.get("strict_agreement") or {}
    if agreement.get("agree") != agreement.get("checked") or not agreement.get("logged", False):
        why.append(f"strict-step agreement {agreement.get('agree')} / {agreement.get('checked')}")
    elif agreement.get("same_start") != agreement.get("pairs"):
        why.append(f"first observation equals ar's in {agreement.get('same_start')} / {agreement.get('pairs')} pairs")
    shadow = row.get("shadow")
    if shadow is None:
        if row.get("lossy_steps", 1):
            why.append("no shadow of its lossy steps (run with --shadow-ar)")
    elif "by_class" not in shadow:
        why.append("a report without per-class shadow figures (rebuild it: heisd-libero eval-libero --report-from LOG)")
    else:
        if shadow.get("unshadowed_lossy_steps", 0):
            why.append(f"{shadow['unshadowed_lossy_steps']} lossy steps without a shadow")
        skip = class_figures(shadow, "skip")
        if skip.get("steps") and skip["gripper_disagreement"] > rule.max_gripper_disagreement:
            why.append(f"skip-step gripper disagreement {skip['gripper_disagreement']:.2%}")
        if skip.get("steps") and skip["position_p95_bins"] > rule.max_position_p95_bins:
            why.append(f"skip-step p95 position |delta bin| {skip['position_p95_bins']:g}")
    return why


def shadow_row(row: dict[str, Any]) -> dict[str, Any]:
    """A candidate's deviation from greedy ar as `meta.chosen_point` records it: the gated skip-step
    figures by name, and every lossy class's figures (`by_class`) and all lossy steps' (`lossy`)."""
    shadow = row.get("shadow") or {}
    skip = class_figures(shadow, "skip")
    return {"skip_steps": skip.get("steps", 0), "skip_position_p95_bins": skip.get("position_p95_bins"),
            "skip_gripper_disagreement": skip.get("gripper_disagreement"),
            "shadow_by_class": {c: class_figures(shadow, c) for c in LOSSY_CLASSES if class_figures(shadow, c)},
            "shadow_lossy": shadow.get("lossy")}


def choose(report: dict[str, Any], rule: PointRule) -> tuple[str, list[dict[str, Any]]]:
    """(the chosen label, every candidate's row with its verdict) by the module's rule."""
    rows = []
    for name in candidates(report):
        r = report[name]
        paired = r.get("paired_vs_ar") or {}
        why = _refusals(r, report["ar"]["episodes"], rule)
        rows.append({"name": name, "success_rate": r["success_rate"], "episodes": r["episodes"],
                     "success_vs_ar_paired": paired.get("difference"),
                     "success_vs_ar_ci95": paired.get("difference_ci95"), "mcnemar_p": paired.get("mcnemar_p"),
                     "mean_step_ms": r["mean_step_ms"], "p95_step_ms": r["p95_step_ms"],
                     "speedup_vs_ar": r["speedup_vs_ar"], **shadow_row(r), "eligible": not why, "refused": why})
    eligible = [row for row in rows if row["eligible"]]
    if not eligible:
        raise ConfigError("no candidate meets the rule (" + "; ".join(
            f"{row['name']}: {', '.join(row['refused'])}" for row in rows) + "); widen the candidates or the run")
    return min(eligible, key=lambda row: row["mean_step_ms"])["name"], rows


def write_point(report: dict[str, Any], calibration: dict[str, Any], variant: MethodVariant) -> dict[str, Any]:
    """The whole operating point the candidate ran: the run's decoder configuration (the calibration
    file applied on the evaluation's settings, `_meta.model.decoder_config`) with the candidate's
    fields, every setting written out (`complete_point`); the calibration's meta is kept."""
    recorded = report.get("_meta", {}).get("model", {}).get("decoder_config")
    base = from_dict(DecoderConfig, recorded) if recorded else apply_point(DecoderConfig(), calibration)
    return complete_point({"meta": copy.deepcopy(calibration.get("meta", {}))}, variant.config(base))


def run(run_path: str, calibration_path: str, out_path: str, rule: PointRule) -> dict[str, Any]:
    report = read_json(run_path, ConfigError)
    used = report.get("_meta", {}).get("model", {}).get("calibration_digest")
    if used != file_digest(calibration_path):
        raise ConfigError(f"{calibration_path} is not the calibration file the run used (digest {used})")
    rev = str(report.get("_meta", {}).get("git_rev") or "")
    if not rev or rev.endswith("+dirty") or "," in rev:
        raise ConfigError(f"the run's revision is {rev or 'unknown'}: a point is chosen on a run at one committed "
                          "revision, so that its command reproduces it")
    calibration = read_json(calibration_path, ConfigError)
    name, rows = choose(report, rule)
    chosen = write_point(report, calibration, candidates(report)[name])
    meta = report["_meta"]
    chosen["chosen_from"] = {"kind": "libero_run", "run": str(run_path), "run_git_rev": meta.get("git_rev"),
                             "run_digest": file_digest(run_path), "candidate": name,
                             "calibration_digest": file_digest(calibration_path)}
    chosen.setdefault("meta", {})["chosen_point"] = {
        "chosen": name, "rule": rule.describe(), "bounds": asdict(rule),
        "run": str(run_path), "run_git_rev": meta.get("git_rev"), "tasks": meta.get("tasks"),
        "init_states": meta.get("init_states"), "ar_success_rate": report["ar"]["success_rate"],
        "ar_mean_step_ms": report["ar"]["mean_step_ms"], "candidates": rows, "from_calibration": str(calibration_path),
    }
    save_calibration(chosen, out_path)
    return chosen


def run_shadow(bags: list[str], calibration_path: str, out_path: str, rule) -> dict[str, Any]:
    """The point from shadow recordings of the user's own arm (heisd_ros/pipeline/shadow_point.py):
    the calibration file's point and its variations replayed over the recorded episodes."""
    from heisd_ros.pipeline.shadow_bags import bag_digest, read_shadow_bags
    from heisd_ros.pipeline.shadow_point import boundary_off, evaluate
    from heisd_ros.pipeline.shadow_point import choose as choose_from_shadow

    calibration = read_json(calibration_path, ConfigError)
    base = apply_point(DecoderConfig(method="heisd"), calibration)
    episodes = read_shadow_bags(bags)
    label, point, figures = choose_from_shadow(base, episodes, rule)
    chosen = complete_point({"meta": copy.deepcopy(calibration.get("meta", {}))}, point)
    chosen["chosen_from"] = {"kind": "shadow_recordings", "bags": [str(b) for b in bags],
                             "bag_digests": [bag_digest(b) for b in bags], "candidate": label,
                             "calibration_digest": file_digest(calibration_path)}  # fmt: skip
    chosen.setdefault("meta", {})["chosen_point"] = {
        "chosen": label, "bounds": asdict(rule), "episodes": len({e.source for e in episodes}),
        "runs": len(episodes),
        "steps": sum(len(e.steps) for e in episodes), "candidates": figures, "from_calibration": str(calibration_path),
    }  # fmt: skip
    if point.fused_metric.tau > 0:  # reported, never chosen: what τ costs at the chosen verify-skip
        chosen["meta"]["chosen_point"]["boundary_off"] = {"calibration_tau": point.fused_metric.tau,
                                                          **evaluate(boundary_off(point), episodes, rule)}
    save_calibration(chosen, out_path)
    return chosen


def _print_shadow(chosen: dict[str, Any], out: str) -> None:
    info = chosen["meta"]["chosen_point"]
    print(f"{info['episodes']} shadow episodes, {info['steps']} steps")
    for label, f in info["candidates"].items():
        print(f"{label:>36}: expected {f['expected_speedup']:.2f}x ar, skips {f['skip_share']:.0%}, skip steps "
              f"p95 {f['skip_position_p95_bins']:.1f} bins, gripper {f['skip_gripper_disagreement']:.2%}"
              + ("" if f["eligible"] else f" (not eligible: {', '.join(f['why_refused'])})"))
    off = info.get("boundary_off")
    if off:
        mine = info["candidates"][info["chosen"]]
        print(f"boundary_off (the chosen point at tau 0, not {off['calibration_tau']:.3g}; reported, never chosen): "
              f"expected {off['expected_speedup']:.2f}x ar against {mine['expected_speedup']:.2f}x, drafter steps "
              f"{_share(off, 'drafter'):.0%} against {_share(mine, 'drafter'):.0%}, skips {off['skip_share']:.0%}, "
              f"skip steps p95 {off['skip_position_p95_bins']:.1f} bins, gripper {off['skip_gripper_disagreement']:.2%}"
              + ("" if off["eligible"] else f" (outside the bounds: {', '.join(off['why_refused'])})"))
    print(f"chose {info['chosen']}; wrote {out}")


def _share(figures: dict[str, Any], mode: str) -> float:
    return figures["mode_mix"].get(mode, 0) / figures["steps"] if figures["steps"] else 0.0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="heisd choose-point", description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--run", help="eval-libero report (.json) of a --purpose calibration run")
    source.add_argument("--shadow", nargs="+", metavar="BAG",
                        help="rosbag2 recordings of the node's shadow_steps (shadow.method heisd) on your own arm")
    p.add_argument("--calibration", required=True, help="the calibration file that run used")
    p.add_argument("--out", required=True, help="calibration file to write")
    d = PointRule()
    p.add_argument("--max-success-drop", type=float, default=d.max_success_drop,
                   help="points below ar's success (paired) a candidate may be")
    p.add_argument("--max-gripper-disagreement", type=float, default=d.max_gripper_disagreement,
                   help="share of a candidate's skip steps whose gripper token may differ from greedy ar's")
    p.add_argument("--max-position-p95-bins", type=float, default=d.max_position_p95_bins,
                   help="bound on the p95 over skip steps of a step's position-group |delta bin| against greedy ar")
    p.add_argument("--min-episodes", type=int, default=None,
                   help=f"episodes a candidate must have run (default {d.min_episodes}; with --shadow, recorded: "
                        f"{ShadowRule().min_episodes})")
    p.add_argument("--min-steps", type=int, default=ShadowRule().min_steps, help="--shadow: steps the recording must hold")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    if args.shadow:
        try:
            rule = ShadowRule(args.max_position_p95_bins, args.max_gripper_disagreement,
                              args.min_episodes if args.min_episodes is not None else ShadowRule().min_episodes,
                              args.min_steps)  # fmt: skip
            _print_shadow(run_shadow(args.shadow, args.calibration, args.out, rule), args.out)
        except (HeisdError, OSError, json.JSONDecodeError, KeyError) as err:
            print(f"heisd choose-point: {type(err).__name__}: {err}", file=sys.stderr)
            return 2
        return 0
    if args.min_episodes is None:
        args.min_episodes = d.min_episodes
    try:
        rule = PointRule(args.max_success_drop, args.max_gripper_disagreement, args.max_position_p95_bins,
                         args.min_episodes)
        chosen = run(args.run, args.calibration, args.out, rule)
    except (HeisdError, OSError, json.JSONDecodeError, KeyError) as err:
        print(f"heisd choose-point: {type(err).__name__}: {err}", file=sys.stderr)
        return 2
    info = chosen["meta"]["chosen_point"]
    for row in info["candidates"]:
        print(f"{row['name']:>16}: success {row['success_rate']:.0%} of {row['episodes']}, mean step "
              f"{row['mean_step_ms']:.1f} ms, {row['speedup_vs_ar']:.2f}x ar, skip steps "
              + (f"p95 {row['skip_position_p95_bins']:g} bins, gripper {row['skip_gripper_disagreement']:.2%}"
                 if row["skip_steps"] else "no shadowed skip step")
              + ("" if row["eligible"] else f" (not eligible: {', '.join(row['refused'])})"))
    print(f"chose {info['chosen']}; wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
