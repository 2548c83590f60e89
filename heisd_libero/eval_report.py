"""Results of `heisd-libero eval-libero`: the resumable JSONL log and the per-method summaries (the figures
are defined once, in `heisd_ros.pipeline.figures`; the Markdown tables are `eval_markdown`).

The log (`<report stem>.jsonl`) holds one JSON object per line:
    {"kind": "run", "key": {...}}                 first line: what must match for a rerun to resume
    {"kind": "session", ...}                      one per invocation: command, git rev, wall time
    {"kind": "episode", "task": 3, "init_state": 40, "method": "heisd", "success": true,
     "steps": [{per-step StepStats}, ...], ...}   one per finished (task, init state, method)
A line cut short by a killed run is ignored (and the episode run again).

Everything here is pure data handling (no simulator, no torch), so it is tested without LIBERO.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from heisd_ros.core.errors import ConfigError
from heisd_ros.pipeline.figures import (
    accept_figures,
    bootstrap_meta,
    distribution,
    latency_figures,
    mode_floor_ms,
    speedup_figures,
    wilson_interval,
)
from heisd_ros.pipeline.log_files import READ_ERRORS, read_log_text
from heisd_libero.eval_evidence import (
    contention,
    episode_time_ratio,
    evidence,
    paired_success,
    shadow_deviation,
)
from heisd_libero.eval_targets import acceptance

STAGES = ("vision", "retrieval", "draft", "prompt", "verify", "detokenize")
LOSSLESS = ("ar", "drafter", "retrieval")
"""Methods whose tokens equal greedy AR decoding by construction (strict acceptance, no skip)."""


def jsonable(x: Any) -> Any:
    """NaN/inf -> None, numpy scalars -> Python, recursively (strict JSON)."""
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if isinstance(x, (np.floating, float)):
        v = float(x)
        return v if math.isfinite(v) else None
    if isinstance(x, np.integer):
        return int(x)
    if isinstance(x, np.bool_):
        return bool(x)
    return x


STARTED_FIELDS = ("git_rev", "cpu", "linear_kernels")
"""What a process's `session_start` line says about the process itself (its revision, processor and kernel
choice); its closing `session` line takes them from there."""


class ResultLog:
    """Append-only JSONL of finished episodes; a rerun with the same run key resumes it."""

    def __init__(self, path: str | Path, run_key: dict[str, Any]) -> None:
        self.path = Path(path)
        self.read_only = False
        self.run_key = jsonable(run_key)
        self.episodes: list[dict[str, Any]] = []
        self.sessions: list[dict[str, Any]] = []
        if self.path.is_file():
            self._load()
        else:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._write({"kind": "run", "key": self.run_key})

    @classmethod
    def read(cls, path: str | Path) -> ResultLog:
        """An existing log, read only (a run's .jsonl or a committed .jsonl.xz / .jsonl.gz), under its own run key."""
        p = Path(path)
        try:
            text = read_log_text(p)
        except READ_ERRORS as err:
            raise ConfigError(f"{p}: not a readable eval-libero log ({err})") from err
        log = cls.__new__(cls)
        log.path, log.read_only = p, True
        records, _ = log._parse(text.splitlines())
        log.run_key = records[0]["key"]
        log._keep(records)
        return log

    def _parse(self, lines: list[str]) -> tuple[list[dict[str, Any]], bool]:
        """(records, whether the last line was cut short by a kill)."""
        records, cut = [], False
        for i, line in enumerate(lines):
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                if i != len(lines) - 1:
                    raise ConfigError(f"{self.path}: corrupt line {i + 1} (only the last line may be cut short)")
                cut = True
        if not records or records[0].get("kind") != "run" or not isinstance(records[0].get("key"), dict):
            raise ConfigError(f"{self.path} is not an eval-libero log (no run key on line 1)")
        return records, cut

    def _keep(self, records: list[dict[str, Any]]) -> None:
        self.episodes = [r for r in records if r.get("kind") == "episode"]
        self.sessions = []
        # A process writes `session_start` first and its `session` line last: a start followed by
        # another start (or the end of the log) was stopped; its episodes are still in the log.
        self.stopped: list[dict[str, Any]] = []
        open_start: dict[str, Any] | None = None
        for r in records:
            kind = r.get("kind")
            if kind == "session_start":
                if open_start is not None:
                    self.stopped.append(open_start)
                open_start = {**r, "episodes_logged": 0}
            elif kind == "session":
                # The revision a process ran is the one it started at (older logs wrote HEAD at
                # the end on this line, which a commit made during the run moves).
                self.sessions.append(r if open_start is None else
                                     {**r, **{k: open_start.get(k) for k in STARTED_FIELDS}})
                open_start = None
            elif kind == "episode" and open_start is not None:
                open_start["episodes_logged"] += 1
        if open_start is not None:
            self.stopped.append(open_start)

    def _load(self) -> None:
        lines = self.path.read_text().splitlines()
        records, cut = self._parse(lines)
        diff = {k for k in set(records[0]["key"]) | set(self.run_key) if records[0]["key"].get(k) != self.run_key.get(k)}
        if diff:
            raise ConfigError(
                f"{self.path} was written with different settings ({', '.join(sorted(diff))}); "
                "rerun with the same settings to resume, or write to another --out")
        if cut:  # a line cut short by a kill: drop it so the next append starts on a fresh line
            self.path.write_text("".join(line + "\n" for line in lines[:-1]))
        self._keep(records)

    def done(self) -> set[tuple[int, int, str]]:
        return {(e["task"], e["init_state"], e["method"]) for e in self.episodes}

    def append(self, record: dict[str, Any]) -> None:
        record = jsonable(record)
        self._write(record)
        if record.get("kind") == "episode":
            self.episodes.append(record)
        elif record.get("kind") == "session":
            self.sessions.append(record)

    def _write(self, record: dict[str, Any]) -> None:
        if self.read_only:
            raise ConfigError(f"{self.path} was opened read only (ResultLog.read)")
        with self.path.open("a") as f:
            f.write(json.dumps(record, separators=(",", ":")) + "\n")
            f.flush()


# ------------------------------------------------------------------------------ summaries


def cycle_lengths(step: dict[str, Any]) -> list[int]:
    """Tokens fixed per decoding cycle of one step: one entry per verification forward, 7 for a skip."""
    return [7] if step["skipped"] else list(step["tpf"])


def _percentiles(values: Sequence[float]) -> dict[str, float]:
    """n, mean, median, p95, p99 of search times (ms)."""
    return {"n": len(values), **distribution(values)}


def floor_ms(step: dict[str, Any]) -> float | None:
    """`mode_floor_ms` of a logged JSONL step; None for records written before `fwd_ms`."""
    return mode_floor_ms(step["ms"], step["fwd_ms"]) if "fwd_ms" in step else None


MODE_STAGES = ("vision", "projector", "prompt", "retrieval", "retrieval_query", "retrieval_fetch", "retrieval_rerank",
               "first_forward", "draft", "completion_forwards", "accept", "detokenize")
"""Where a step's time goes, per mode: `first_forward` is the prefill (fused with the verification of
the retrieval tree in retrieval mode), `completion_forwards` the forwards after it; retrieval's
split into query / fetch / re-rank where the store reports it."""


def stage_ms(step: dict[str, Any], stage: str) -> float:
    """One step's time in one of MODE_STAGES (0 where the step had no such stage)."""
    fwd = step.get("fwd_ms", [])
    if stage == "first_forward":
        return float(fwd[0]) if fwd else 0.0
    if stage == "completion_forwards":
        return float(sum(fwd[1:]))
    return float(step["ms"].get(stage, 0.0))


def mode_profile(steps: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per mode: steps; mean step ms, mean floor ms and their ratio (mean step / mean floor); the
    median step ms, median floor ms and median ratio of step time to its floor; each stage's mean."""
    out = {}
    for mode in sorted({s["mode"] for s in steps}):
        sel = [s for s in steps if s["mode"] == mode]
        floors = np.array([(s["ms"]["total"], f) for s in sel if (f := floor_ms(s)) is not None and f > 0]).reshape(-1, 2)
        has = len(floors) > 0
        out[mode] = {
            "steps": len(sel),
            "stage_mean_ms": {k: float(np.mean([stage_ms(s, k) for s in sel])) for k in MODE_STAGES},
            "mean_step_cpu_ms": float(np.mean([s["cpu_ms"] for s in sel])),
            "mean_step_ms": float(np.mean([s["ms"]["total"] for s in sel])),
            "mean_floor_ms": float(floors[:, 1].mean()) if has else math.nan,
            "mean_ratio_to_floor": float(floors[:, 0].mean() / floors[:, 1].mean()) if has else math.nan,
            "median_step_ms": float(np.median([s["ms"]["total"] for s in sel])),
            "median_floor_ms": float(np.median(floors[:, 1])) if has else math.nan,
            "median_ratio_to_floor": float(np.median(floors[:, 0] / floors[:, 1])) if has else math.nan,
        }
    return out


def summarise_method(method: str, episodes: list[dict[str, Any]]) -> dict[str, Any]:
    """Figures of one method over its episodes (all steps of all episodes count)."""
    steps = [s for e in episodes for s in e["steps"]]
    n_ok = sum(1 for e in episodes if e["success"])
    total = [s["ms"]["total"] for s in steps]
    cpu = [s["cpu_ms"] for s in steps]
    cycles = [c for s in steps for c in cycle_lengths(s)]
    modes = Counter(s["mode"] for s in steps)
    per_task: dict[str, dict[str, Any]] = {}
    for e in episodes:
        t = per_task.setdefault(str(e["task"]), {"episodes": 0, "successes": 0, "instruction": e["instruction"]})
        t["episodes"] += 1
        t["successes"] += int(e["success"])
    for t in per_task.values():
        t["success_rate"] = t["successes"] / t["episodes"]
    n = len(steps)
    return {
        "method": method,
        "episodes": len(episodes),
        "successes": n_ok,
        "success_rate": n_ok / len(episodes) if episodes else math.nan,
        "success_rate_ci95": list(wilson_interval(n_ok, len(episodes))),
        "per_task_success": dict(sorted(per_task.items(), key=lambda kv: int(kv[0]))),
        "steps": n,
        "mean_episode_steps": n / len(episodes) if episodes else math.nan,
        **latency_figures(total),
        "mean_step_cpu_ms": float(np.mean(cpu)) if n else math.nan,
        "stage_mean_ms": {k: float(np.mean([s["ms"].get(k, 0.0) for s in steps])) if n else math.nan for k in STAGES},
        "stage_median_ms": {k: float(np.median([s["ms"].get(k, 0.0) for s in steps])) if n else math.nan for k in STAGES},
        "forwards_per_step": sum(s["forwards"] for s in steps) / n if n else math.nan,
        **accept_figures([s["forwards"] for s in steps], [s["skipped"] for s in steps]),
        "accept_length_hist": {str(k): v for k, v in sorted(Counter(cycles).items())},
        "mode_mix": {k: v / n for k, v in sorted(modes.items())},
        "modes": mode_profile(steps),
        "skip_rate": modes.get("skip", 0) / n if n else math.nan,
        "skip_checks": dict(Counter(s["skip_check"] for s in steps if s.get("skip_check")).most_common()),
        "fallback_steps": sum(1 for s in steps if s.get("fallback")),
        "median_sim_step_ms": float(np.median([s["sim_ms"] for s in steps])) if n else math.nan,
        "mean_episode_cost_s": (sum(s["ms"]["total"] + s["sim_ms"] for s in steps) / 1e3 / len(episodes)
                                if episodes else math.nan),
        "lossless": method in LOSSLESS,
    }


def boundary_mix(steps: list[dict[str, Any]], tau: float) -> dict[str, Any] | None:
    """Where the steps of a method that computes the fused metric went, against the kinematic
    boundary `tau` of the run: step counts by side of the boundary (F below tau, at or above it, no
    full window yet) and mode. None for a method whose steps carry no F (the baselines)."""
    if not any(s.get("F") is not None for s in steps):
        return None
    sides: dict[str, Counter] = {"no_window": Counter(), "below_tau": Counter(), "at_or_above_tau": Counter()}
    for s in steps:
        f = s.get("F")
        side = "no_window" if f is None else ("below_tau" if f < tau else "at_or_above_tau")
        sides[side][s["mode"]] += 1
    return {"tau": tau, "steps": len(steps), **{k: dict(sorted(v.items())) for k, v in sides.items()}}


def _key(e: dict[str, Any]) -> tuple[int, int]:
    return (e["task"], e["init_state"])


def _speedups(episodes: list[dict[str, Any]], ar_episodes: list[dict[str, Any]]) -> tuple[dict[str, Any], bool]:
    """(speedup figures of `episodes` over `ar_episodes`, whether they were paired by (task, init state)).

    Paired when `ar` ran every (task, init state) pair the method ran (a method run on a subset of the
    episodes is compared with `ar` on that subset); the wall and the CPU speedup are ratios of means."""
    ar = {_key(e): e for e in ar_episodes}
    me = {_key(e): e for e in episodes}
    paired = bool(me) and set(me) <= set(ar)
    if paired:
        ar_episodes, episodes = [ar[k] for k in sorted(me)], [me[k] for k in sorted(me)]

    def times(eps: list[dict[str, Any]], field: str) -> list[list[float]]:
        return [[s["ms"]["total"] if field == "total" else s[field] for s in e["steps"]] for e in eps]

    out = speedup_figures(times(ar_episodes, "total"), times(episodes, "total"), paired=paired)
    cpu = speedup_figures(times(ar_episodes, "cpu_ms"), times(episodes, "cpu_ms"), paired=paired)
    return {**out, "speedup_vs_ar_cpu": cpu["speedup_vs_ar"]}, paired


def _ar_on(episodes: list[dict[str, Any]], ar: dict[tuple[int, int], dict[str, Any]]) -> dict[str, Any]:
    """`ar`'s success and step latency on the episodes a subset method ran (its comparison row)."""
    same = summarise_method("ar", [ar[_key(e)] for e in episodes])
    keys = ("episodes", "successes", "success_rate", "success_rate_ci95", "mean_step_ms", "median_step_ms",
            "p95_step_ms", "p99_step_ms")
    return {k: same[k] for k in keys}


def _identical_to_ar(episodes: list[dict[str, Any]], ar: dict[tuple[int, int], dict[str, Any]]) -> float:
    """Fraction of episodes whose token sequence equals `ar`'s on the same (task, init state)."""
    pairs = [(e, ar[(e["task"], e["init_state"])]) for e in episodes if (e["task"], e["init_state"]) in ar]
    if not pairs:
        return math.nan
    same = [[s["tokens"] for s in e["steps"]] == [s["tokens"] for s in a["steps"]] for e, a in pairs]
    return float(np.mean(same))


def build_report(episodes: Iterable[dict[str, Any]], methods: Sequence[str], meta: dict[str, Any],
                 probe_ms: Sequence[float] = ()) -> dict[str, Any]:
    """`{method: summary, ..., "_meta": meta}` (bench.py's layout) with speed-ups and the target check.

    probe_ms: Top-5 task-filtered search times (ms) measured by the evaluator on the database with
    stored demonstration queries (`retrieval_probe`); the headline retrieval latency when given,
    since heisd's own Top-5 queries are only as many as its retrieval-mode steps.
    """
    episodes = list(episodes)
    by_method = {m: [e for e in episodes if e["method"] == m] for m in methods}
    report: dict[str, Any] = {m: summarise_method(m, eps) for m, eps in by_method.items()}
    key = meta.get("model", {})
    tau = key.get("decoder_config", {}).get("fused_metric", {}).get("tau")
    # heisd and its variants ("name=heisd:section.field=value,..."): the methods the boundary routes
    hybrid = {"heisd"} | {v.split("=", 1)[0] for v in key.get("variants", []) if v.split("=", 1)[-1].startswith("heisd:")}
    if tau is not None:  # the run's calibrated boundary (a variant may decode with its own)
        for m, eps in by_method.items():
            if m not in hybrid:
                continue
            mix = boundary_mix([s for e in eps for s in e["steps"]], float(tau))
            if mix is not None:
                report[m]["boundary"] = mix
    ar_pairs = {_key(e): e for e in by_method.get("ar", [])}
    all_paired = True
    run_evidence = evidence(episodes, list(methods))
    for m, r in report.items():
        figures, paired = _speedups(by_method[m], by_method.get("ar", []))
        r.update(figures)
        r.update(episode_time_ratio(by_method[m], by_method.get("ar", [])))
        all_paired = all_paired and paired
        steps = [s for e in by_method[m] for s in e["steps"]]
        r.update(contention(steps))
        r["shadow"] = shadow_deviation(steps)
        r["lossy_steps"] = sum(1 for s in steps if not s.get("strict"))
        if m != "ar" and ar_pairs:
            r["strict_agreement"] = run_evidence["strict_agreement"][m]
            r["paired_vs_ar"] = paired_success(by_method[m], by_method["ar"])
            r["episodes_identical_to_ar"] = _identical_to_ar(by_method[m], ar_pairs)
            if paired and len(by_method[m]) < len(ar_pairs):
                r["ar_on_same_episodes"] = _ar_on(by_method[m], ar_pairs)
    search = {m: [x for e in by_method[m] for x in e.get("search_ms", [])] for m in methods}
    top5 = [x for m in methods for e in by_method[m] if e.get("search_k") == 5 for x in e.get("search_ms", [])]
    meta = dict(meta)
    headline = probe_ms if len(probe_ms) else top5
    meta["retrieval_latency_ms"] = {
        "what": ("store.search wall time of Top-5 task-filtered queries on the run's database, in the eval process: "
                 + ("probe queries (stored demonstration obs vectors of each evaluated task) after the episodes"
                    if len(probe_ms) else "heisd's own retrieval-mode queries")),
        **_percentiles(headline),
        "probe_top5": _percentiles(probe_ms),
        "in_run_top5": _percentiles(top5),
        "by_method": {m: {"top_k": next((e.get("search_k") for e in by_method[m] if e.get("search_k")), None),
                          **_percentiles(v)} for m, v in search.items() if v},
    }
    meta["evidence"] = {k: v for k, v in run_evidence.items() if k != "strict_agreement"}
    meta["bootstrap"] = bootstrap_meta(len(ar_pairs), all_paired, unit="(task, init state) episode")
    meta["acceptance"] = acceptance(report, by_method.get("heisd", []), by_method.get("ar", []),
                                    suite=str(meta.get("suite", "")))
    return jsonable({**report, "_meta": meta})
