"""Offline calibration of the hybrid boundary (docs/design.md §5) and the verify-skip thresholds (§6),
and the operating-point file that carries them.

The operating-point file (the "calibration file" the node's `calibration_path` names) is JSON:
    {"version": 2,
     "fused_metric": {...}, "verify_skip": {...}, "retrieval": {...}, "source_choice": {...},
     "acceptance": {...}, "drafter_tree": {...}, "gripper_hold_steps": N,
     "chosen_from": {...}, "meta": {...}}
Every decoder setting a figure is measured with is in it (`POINT_SECTIONS`, `POINT_SCALARS`), so the
node, replay, demo and evaluation that read it run the same point. `heisd calibrate` and
`heisd choose-point` write complete files; a hand-written file may hold fewer sections or fields
(what it gives is applied, the rest keeps the configuration's value). It is applied on top of a
DecoderConfig; a named file that is missing or corrupt is an error (CalibrationError).
"""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path
from typing import Sequence

import numpy as np

from heisd_ros.core.acceptance import SequenceRelaxedRule
from heisd_ros.core.config import (
    AcceptanceConfig,
    DecoderConfig,
    DrafterTreeConfig,
    FusedMetricConfig,
    RetrievalConfig,
    SourceChoiceConfig,
    VerifySkipConfig,
    from_dict,
    to_dict,
)
from heisd_ros.core.errors import CalibrationError, ConfigError
from heisd_ros.core.files import read_json
from heisd_ros.core.kinematics import FusedMetric, fit_normalisation
from heisd_ros.pipeline.closed_loop import f_summary, fused_values
from heisd_ros.core.verify_skip import calibrate_thresholds
from heisd_ros.pipeline.outputs import write_json

log = logging.getLogger(__name__)


def passes_sequence_rule(draft_tokens: Sequence[int], target_tokens: Sequence[int], rule: SequenceRelaxedRule) -> bool:
    """Would draft pass the sequence-relaxed check against target, group by group (all 7 tokens)?"""
    d, t = np.asarray(draft_tokens), np.asarray(target_tokens)
    return all(rule.accepts(d[a:b], t[a:b], a)[0] for a, b in ((0, 3), (3, 6), (6, 7)))


@dataclasses.dataclass(frozen=True)
class StepCosts:
    """Measured median step times (ms) that a cost-aware tau weighs (`calibrate(tau_rule="cost")`)."""

    drafter_ms: float
    """A step in drafter mode."""
    retrieval_pass_ms: float
    """A retrieval-mode step whose drafts are accepted whole in the fused prefill-verify forward."""
    retrieval_fail_ms: float
    """A retrieval-mode step that had to finish with the drafter."""

    def __post_init__(self) -> None:
        if not all(np.isfinite(v) and v > 0 for v in dataclasses.astuple(self)):
            raise ConfigError(f"step costs must be positive and finite, got {self}")


TAU_RULES = ("balanced", "cost")


def calibrate(
    points: Sequence, fused: FusedMetricConfig, neighbours: int = 5, max_points: int = 4000, seed: int = 0,
    live_prev: dict | None = None, tau_rule: str = "balanced", step_costs: StepCosts | None = None,
    closed_loop: Sequence[np.ndarray] | None = None,
) -> dict:
    """Calibration dict from demonstration points (heisd_ros.store.schema.DemoPoint).

    - Norm(R), Norm(D) statistics from the episodes' end-effector trajectories.
    - tau: the F threshold that best separates steps whose best other-episode retrieval draft
      passes the sequence-relaxed check from those that do not (leave-one-episode-out).
    - min_S / O_dist from S_ij = cos(feat_i, feat_j), d_ij = |p_i - p_j| and whether j's tokens pass
      the sequence-relaxed check against i's, over Top-K neighbour pairs (the offline stage of
      docs/design.md §6).
      live_prev: optional {(task, episode, step): the VLA's own live feature at the previous step}.
      When given, S_ij = cos(live_prev_i, feat_prev_j), exactly what the online rule compares
      (the live feature comes from the model's own tokens, the stored one from the demo's).
    tau_rule: 'balanced' (docs/design.md §5: the threshold that best separates passing from failing
      steps, by balanced accuracy) or 'cost' (the threshold with the least expected step time
      under `step_costs`: where drafts pass often enough, retrieval pays even if F does not
      separate; both rules are reported in meta).
    closed_loop: the policy's own end-effector paths (`closed_loop.read_trajectories`); when given,
      Norm(R), Norm(D) come from them instead of the demonstrations. Either way meta records F's
      distribution along both (`f_demonstrations`, `f_closed_loop`): the tau candidates.
    """
    if tau_rule not in TAU_RULES:
        raise ConfigError(f"tau_rule must be one of {TAU_RULES}, got {tau_rule!r}")
    if tau_rule == "cost" and step_costs is None:
        raise ConfigError("tau_rule 'cost' needs step_costs")
    episodes = _episodes(points)
    demo_paths = [np.stack([p.ee_pos for p in eps]) for eps in episodes.values()]
    norm = fit_normalisation(list(closed_loop) if closed_loop else demo_paths, fused.window_steps, fused)
    fused = dataclasses.replace(fused, **norm)
    f_meta = {"normalisation_from": "closed_loop" if closed_loop else "demonstrations",
              "f_demonstrations": f_summary(fused_values(demo_paths, fused))}
    if closed_loop:
        f_meta["f_closed_loop"] = f_summary(fused_values(closed_loop, fused))
    f_of = _fused_along_episodes(episodes, fused)
    sample = [p for eps in episodes.values() for p in eps]
    if len(sample) > max_points:
        rng = np.random.default_rng(seed)
        sample = [sample[i] for i in rng.choice(len(sample), max_points, replace=False)]
    by_task: dict[str, list] = {}
    for eps in episodes.values():
        by_task.setdefault(eps[0].task, []).extend(eps)
    pairs = _Pairs()
    for task, members in by_task.items():
        pairs.add_task(members, [p for p in sample if p.task == task], f_of, neighbours, live_prev)
    f_arr, ok_arr = np.array(pairs.f_vals), np.array(pairs.f_pass, dtype=bool)
    tau, cost_meta = _choose_tau(f_arr, ok_arr, fused.tau, tau_rule, step_costs)
    # Verify-skip is only ever considered in retrieval mode, so its thresholds are calibrated on
    # the pairs the boundary would send there (F_i >= tau).
    in_retrieval = np.array(pairs.pair_f) >= tau
    skip = calibrate_thresholds(np.array(pairs.sims)[in_retrieval], np.array(pairs.dists)[in_retrieval],
                                np.array(pairs.passed, dtype=bool)[in_retrieval])
    return _calibration_file(norm, tau, skip, pairs, in_retrieval, {"tau_rule": tau_rule, **cost_meta,
                                                                     "n_points": len(points), **f_meta})


def _calibration_file(norm: dict, tau: float, skip, pairs: _Pairs, in_retrieval: np.ndarray, meta: dict) -> dict:
    """The calibration file's content: fused metric, verify-skip thresholds and what they came from."""
    passed = pairs.passed
    return {
        "fused_metric": {**norm, "tau": tau},
        "verify_skip": {
            "enabled": bool(skip.qualified),
            # kept inside the configured clamp range, so the file always validates
            "min_similarity": float(np.clip(skip.min_similarity, *VerifySkipConfig().min_similarity_bounds)),
            "max_distance_m": float(np.clip(skip.max_distance_m, *VerifySkipConfig().max_distance_bounds_m)),
        },
        "meta": {**meta, "n_pairs": len(pairs.sims),
                 "pass_rate": float(np.mean(passed)) if passed else 0.0,
                 "n_pairs_in_retrieval_mode": int(in_retrieval.sum()),
                 "pass_rate_in_retrieval_mode":
                     float(np.mean(np.array(passed)[in_retrieval])) if in_retrieval.any() else 0.0,
                 "retrieval_pass_rate_by_f": {"f": [float(x) for x in pairs.f_vals[:2000]],
                                              "passed": [bool(x) for x in pairs.f_pass[:2000]]},
                 "skip_curve": skip.curve.to_dict()},
    }


def _episodes(points: Sequence) -> dict[tuple[str, int], list]:
    """{(task, episode): its points in step order}."""
    episodes: dict[tuple[str, int], list] = {}
    for p in points:
        episodes.setdefault((p.task, p.episode), []).append(p)
    for eps in episodes.values():
        eps.sort(key=lambda p: p.step)
    return episodes


def _fused_along_episodes(episodes: dict[tuple[str, int], list], fused: FusedMetricConfig) -> dict[int, float]:
    """{id(point): F} of every step along its own episode (what the live metric would have seen);
    steps before the window fills have no F."""
    f_of: dict[int, float] = {}
    for eps in episodes.values():
        metric = FusedMetric(fused)
        for p in eps:
            metric.push(p.ee_pos)
            v = metric.value()
            if v is not None:
                f_of[id(p)] = v
    return f_of


def _unit_rows(rows: list) -> np.ndarray:
    a = np.stack(rows)
    return a / np.linalg.norm(a, axis=1, keepdims=True)


@dataclasses.dataclass
class _Pairs:
    """Leave-one-episode-out Top-K neighbour pairs (step i, neighbour j) and per-step outcomes."""

    sims: list = dataclasses.field(default_factory=list)
    """S_ij per pair."""
    dists: list = dataclasses.field(default_factory=list)
    """d_ij (m) per pair."""
    passed: list = dataclasses.field(default_factory=list)
    """Whether j's tokens pass the sequence-relaxed check against i's, per pair."""
    pair_f: list = dataclasses.field(default_factory=list)
    """F_i per pair (-inf before the window fills)."""
    f_vals: list = dataclasses.field(default_factory=list)
    """F per step that has one."""
    f_pass: list = dataclasses.field(default_factory=list)
    """Whether any of that step's Top-K drafts passes."""

    def add_task(self, members: list, queries: list, f_of: dict[int, float], neighbours: int,
                 live_prev: dict | None) -> None:
        """The pairs of `queries` (points of one task) against the task's other episodes in `members`."""
        rule = SequenceRelaxedRule()
        obs, feats = _unit_rows([m.obs for m in members]), _unit_rows([m.feat for m in members])
        eps_ids = np.array([m.episode for m in members])
        index = {id(m): k for k, m in enumerate(members)}
        for p in queries:
            i = index[id(p)]
            score = obs @ obs[i]
            score[eps_ids == eps_ids[i]] = -np.inf  # leave the episode out
            ok_any = False
            for j in np.argsort(-score)[:neighbours]:
                if not np.isfinite(score[j]):
                    continue
                ok = passes_sequence_rule(members[j].action_tokens, p.action_tokens, rule)
                ok_any |= ok
                self.sims.append(_pair_similarity(p, members[j], feats[i], feats[j], live_prev))
                self.dists.append(float(np.linalg.norm(p.ee_pos - members[j].ee_pos)))
                self.passed.append(ok)
                self.pair_f.append(f_of.get(id(p), -np.inf))
            if id(p) in f_of:
                self.f_vals.append(f_of[id(p)])
                self.f_pass.append(ok_any)


def _pair_similarity(p, neighbour, feat_i: np.ndarray, feat_j: np.ndarray, live_prev: dict | None) -> float:
    """S_ij: the live feature of i's previous step against j's stored `feat_prev` where known (what
    the online rule compares), else the two stored features (unit rows)."""
    key = (p.task, p.episode, p.step)
    if live_prev is not None and key in live_prev:
        lv, pj = live_prev[key], neighbour.feat_prev
        return float(lv @ pj / (np.linalg.norm(lv) * np.linalg.norm(pj) + 1e-12))
    return float(feat_i @ feat_j)


def _choose_tau(f: np.ndarray, ok: np.ndarray, default: float, tau_rule: str,
                step_costs: StepCosts | None) -> tuple[float, dict]:
    """(tau under `tau_rule`, meta comparing both rules when step costs are known)."""
    tau_balanced = _best_threshold(f, ok, default=default)
    if step_costs is None:
        return tau_balanced, {}
    tau_cost = cheapest_threshold(f, ok, step_costs, default=default)
    meta = {"step_costs_ms": dataclasses.asdict(step_costs),
            "expected_step_ms": {"balanced": expected_step_ms(f, ok, tau_balanced, step_costs),
                                 "cost": expected_step_ms(f, ok, tau_cost, step_costs)},
            "tau_balanced": tau_balanced, "tau_cost": tau_cost}
    return (tau_cost if tau_rule == "cost" else tau_balanced), meta


def expected_step_ms(f: np.ndarray, ok: np.ndarray, tau: float, costs: StepCosts) -> float:
    """Mean step time if steps with F >= tau go to retrieval (passing or not) and the rest to the drafter."""
    if f.size == 0:
        return costs.drafter_ms
    retrieval = f >= tau
    per_step = np.where(retrieval, np.where(ok, costs.retrieval_pass_ms, costs.retrieval_fail_ms), costs.drafter_ms)
    return float(per_step.mean())


def cheapest_threshold(f: np.ndarray, ok: np.ndarray, costs: StepCosts, default: float) -> float:
    """The threshold with the least `expected_step_ms`, from 0 (every step to retrieval) through
    the 5th..95th percentiles of F to just above its maximum (none); ties go to the higher tau."""
    if f.size == 0:
        return default
    candidates = np.unique(np.concatenate([[0.0], np.quantile(f, np.linspace(0.05, 0.95, 19)),
                                           [float(f.max()) + 1e-6]]))
    cost = [expected_step_ms(f, ok, t, costs) for t in candidates]
    best = min(cost)
    return float(max(t for t, c in zip(candidates, cost) if c <= best + 1e-9))


def _best_threshold(f: np.ndarray, ok: np.ndarray, default: float) -> float:
    """Threshold maximising balanced accuracy of (F >= tau) as a predictor of a passing draft."""
    if f.size == 0 or ok.all() or not ok.any():
        return default
    best, best_score = default, -1.0
    for tau in np.unique(np.quantile(f, np.linspace(0.05, 0.95, 19))):
        pred = f >= tau
        score = 0.5 * ((pred & ok).sum() / ok.sum() + (~pred & ~ok).sum() / (~ok).sum())
        if score > best_score:
            best, best_score = float(tau), score
    return best


def save_calibration(calib: dict, path: str | Path) -> None:
    """Write the calibration file (atomically: a node never reads half of it)."""
    write_json(path, calib)


POINT_VERSION = 2
"""Version of the operating-point file: 2 holds every decoder setting of the point (1, unversioned:
the fused metric and verify-skip only)."""
POINT_SECTIONS = {"fused_metric": FusedMetricConfig, "verify_skip": VerifySkipConfig, "retrieval": RetrievalConfig,
                  "source_choice": SourceChoiceConfig, "acceptance": AcceptanceConfig,
                  "drafter_tree": DrafterTreeConfig}
"""The DecoderConfig sections an operating point sets whole."""
POINT_SCALARS = ("gripper_hold_steps",)
"""DecoderConfig fields outside the sections that belong to the point."""
NOT_IN_POINT = {"verify_skip": ("state_path", "online")}
"""Fields of those sections that belong to a deployment, not to the point: whether episode feedback
moves the thresholds (no figure is measured with it) and where it is kept."""
POINT_EXTRAS = ("version", "chosen_from", "meta")
"""Other top-level keys of the file: its version, where the point was chosen from, what it was fitted on."""


def point_settings(cfg: DecoderConfig) -> dict:
    """Every setting of the operating point `cfg` runs, as the file holds them."""
    out: dict = {}
    for name in POINT_SECTIONS:
        section = to_dict(getattr(cfg, name))
        for field in NOT_IN_POINT.get(name, ()):
            section.pop(field)
        out[name] = section
    for name in POINT_SCALARS:
        out[name] = getattr(cfg, name)
    return out


def complete_point(calib: dict, cfg: DecoderConfig, chosen_from: dict | None = None) -> dict:
    """The operating-point file of `calib` (a calibration or a chosen point) applied on `cfg`: every
    setting written out, the version, where it was chosen from and `calib`'s meta."""
    applied = apply_point(cfg, calib)
    out = {"version": POINT_VERSION, **point_settings(applied)}
    if chosen_from is not None or "chosen_from" in calib:
        out["chosen_from"] = chosen_from if chosen_from is not None else calib["chosen_from"]
    if "meta" in calib:
        out["meta"] = calib["meta"]
    return out


def apply_point(cfg: DecoderConfig, data: dict) -> DecoderConfig:
    """cfg with every setting an operating-point mapping gives. Raises ConfigError on an unknown key,
    another version or a value its configuration refuses. A user's explicit `verify_skip.enabled:
    false` wins over the file (turning skips off is always safe), and the online stage
    (`verify_skip.online`) is the deployment's, never the file's."""
    if not isinstance(data, dict):
        raise ConfigError(f"an operating point is a JSON object, got {type(data).__name__}")
    version = data.get("version", 1)
    if version not in (1, POINT_VERSION):
        raise ConfigError(f"operating-point version {version!r} unknown (this heisd reads 1 and {POINT_VERSION})")
    unknown = sorted(set(data) - set(POINT_SECTIONS) - set(POINT_SCALARS) - set(POINT_EXTRAS))
    if unknown:
        raise ConfigError(f"unknown operating-point keys {unknown}")
    changes: dict = {}
    for name, cls in POINT_SECTIONS.items():
        if name in data:
            given = data[name]
            if not isinstance(given, dict):
                raise ConfigError(f"operating point: {name} must be an object")
            changes[name] = from_dict(cls, {**to_dict(getattr(cfg, name)), **given})
    for name in POINT_SCALARS:
        if name in data:
            changes[name] = data[name]
    out = dataclasses.replace(cfg, **changes)
    if not cfg.verify_skip.enabled and out.verify_skip.enabled:
        out = dataclasses.replace(out, verify_skip=dataclasses.replace(out.verify_skip, enabled=False))
    if out.verify_skip.online != cfg.verify_skip.online:  # the deployment's choice, never a file's
        out = dataclasses.replace(out, verify_skip=dataclasses.replace(out.verify_skip, online=cfg.verify_skip.online))
    return out


def apply_calibration(cfg: DecoderConfig, path: str | Path | None) -> DecoderConfig:
    """cfg with the operating-point file's settings (`apply_point`); '' = none. A file that is
    named but missing, unreadable or refused raises CalibrationError with the path and the reason:
    running the defaults instead would run a point nobody measured."""
    if not path:
        return cfg
    try:
        return apply_point(cfg, read_json(path, CalibrationError))
    except (OSError, json.JSONDecodeError, TypeError, ConfigError, AttributeError) as err:
        raise CalibrationError(f"operating-point file {path} unusable: {err}") from err


__all__ = ["calibrate", "apply_point", "complete_point", "point_settings", "POINT_VERSION", "StepCosts", "cheapest_threshold", "expected_step_ms", "apply_calibration", "save_calibration", "passes_sequence_rule", "CalibrationError"]
