"""Results of `heisd eval-libero`: the resumable JSONL log, per-method summaries, the Markdown table.

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
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from heisd_ros.core.errors import ConfigError

STAGES = ("vision", "retrieval", "draft", "prompt", "verify", "detokenize")
LOSSLESS = ("ar", "drafter", "retrieval")
"""Methods whose tokens equal greedy AR decoding by construction (strict acceptance, no skip)."""
TARGETS = {"success_within_points_of_ar": 5.0, "speedup_vs_ar": 2.5, "accept_length": 4.5}
"""The acceptance targets of `heisd` against `ar` of the same run."""


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
    def read(cls, path: str | Path) -> "ResultLog":
        """An existing log, read only (a run's .jsonl or a committed .jsonl.gz), under its own run key."""
        import gzip

        p = Path(path)
        try:
            text = gzip.decompress(p.read_bytes()).decode() if p.suffix == ".gz" else p.read_text()
        except (OSError, UnicodeDecodeError, gzip.BadGzipFile) as err:
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
        self.sessions = [r for r in records if r.get("kind") == "session"]

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


def wilson_interval(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval of a success rate (sensible at 0 and n)."""
    if n == 0:
        return (math.nan, math.nan)
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (max(0.0, centre - half), min(1.0, centre + half))


def cycle_lengths(step: dict[str, Any]) -> list[int]:
    """Tokens fixed per decoding cycle of one step: one entry per verification forward, 7 for a skip."""
    return [7] if step["skipped"] else list(step["tpf"])


def _percentiles(values: Sequence[float]) -> dict[str, float]:
    if not values:
        return {"n": 0, "median": math.nan, "p95": math.nan, "mean": math.nan}
    v = np.asarray(values, dtype=np.float64)
    return {"n": int(v.size), "median": float(np.median(v)), "p95": float(np.percentile(v, 95)), "mean": float(v.mean())}


def mode_floor_ms(latency_ms: Mapping[str, float], forward_ms: Sequence[float]) -> float:
    """The floor of a step's mode: vision (+ projector) + retrieval (if issued) + at most
    one LLM forward (prefill fused with verification); a skipped step has no forward."""
    first = forward_ms[0] if forward_ms else 0.0
    return latency_ms.get("vision", 0.0) + latency_ms.get("projector", 0.0) + latency_ms.get("retrieval", 0.0) + first


def floor_ms(step: dict[str, Any]) -> float | None:
    """`mode_floor_ms` of a logged JSONL step; None for records written before `fwd_ms`."""
    return mode_floor_ms(step["ms"], step["fwd_ms"]) if "fwd_ms" in step else None


def mode_profile(steps: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per mode: steps, median step ms, median floor ms and median ratio of step time to its floor."""
    out = {}
    for mode in sorted({s["mode"] for s in steps}):
        sel = [s for s in steps if s["mode"] == mode]
        floors = [(s["ms"]["total"], f) for s in sel if (f := floor_ms(s)) is not None and f > 0]
        out[mode] = {
            "steps": len(sel),
            "median_step_ms": float(np.median([s["ms"]["total"] for s in sel])),
            "median_floor_ms": float(np.median([f for _, f in floors])) if floors else math.nan,
            "median_ratio_to_floor": float(np.median([t / f for t, f in floors])) if floors else math.nan,
        }
    return out


def step_costs(path: str | Path, method: str = "heisd"):
    """`calibration.StepCosts` from an eval-libero log (.jsonl or .jsonl.gz): the median step time
    of `method` in drafter mode, in retrieval mode accepted in one forward, and in retrieval mode
    finished by the drafter (what a cost-aware tau weighs, measured on this machine)."""
    import gzip

    from heisd_ros.pipeline.calibration import StepCosts

    p = Path(path)
    opener = gzip.open if p.suffix == ".gz" else open
    groups: dict[str, list[float]] = {"drafter": [], "pass": [], "fail": []}
    try:
        with opener(p, "rt") as f:
            for line in f:
                rec = json.loads(line)
                if rec.get("kind") != "episode" or rec.get("method") != method:
                    continue
                for st in rec["steps"]:
                    if st["mode"] == "drafter":
                        groups["drafter"].append(st["ms"]["total"])
                    elif st["mode"] == "retrieval":
                        groups["pass" if st["forwards"] == 1 else "fail"].append(st["ms"]["total"])
    except (OSError, json.JSONDecodeError, KeyError) as err:
        raise ConfigError(f"{p}: not a readable eval-libero log ({err})") from err
    missing = [k for k, v in groups.items() if not v]
    if missing:
        raise ConfigError(f"{p}: no {method} steps of kind {missing} to measure step costs from")
    return StepCosts(*(float(np.median(groups[k])) for k in ("drafter", "pass", "fail")))


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
        "median_step_ms": float(np.median(total)) if n else math.nan,
        "p90_step_ms": float(np.percentile(total, 90)) if n else math.nan,
        "mean_step_ms": float(np.mean(total)) if n else math.nan,
        "median_step_cpu_ms": float(np.median(cpu)) if n else math.nan,
        "stage_median_ms": {k: float(np.median([s["ms"].get(k, 0.0) for s in steps])) if n else math.nan for k in STAGES},
        "stage_mean_ms": {k: float(np.mean([s["ms"].get(k, 0.0) for s in steps])) if n else math.nan for k in STAGES},
        "forwards_per_step": sum(s["forwards"] for s in steps) / n if n else math.nan,
        "accept_length": sum(cycles) / len(cycles) if cycles else math.nan,
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
    ar_pairs = {(e["task"], e["init_state"]): e for e in by_method.get("ar", [])}
    for m, r in report.items():
        ar = report.get("ar")
        r["speedup_vs_ar"] = ar["median_step_ms"] / r["median_step_ms"] if ar and r["steps"] else math.nan
        r["speedup_vs_ar_cpu"] = ar["median_step_cpu_ms"] / r["median_step_cpu_ms"] if ar and r["steps"] else math.nan
        if m != "ar" and ar_pairs:
            r["episodes_identical_to_ar"] = _identical_to_ar(by_method[m], ar_pairs)
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
    meta["acceptance"] = acceptance(report)
    return jsonable({**report, "_meta": meta})


def acceptance(report: dict[str, Any]) -> dict[str, Any]:
    """The TARGETS check of `heisd` against `ar` of the same run (not evaluated without both)."""
    h, ar = report.get("heisd"), report.get("ar")
    if not h or not ar or not h["steps"] or not ar["steps"]:
        return {"evaluated": False, "why": "needs both ar and heisd in the run"}
    gap = 100.0 * (ar["success_rate"] - h["success_rate"])
    return {
        "evaluated": True,
        "success_comparison_meaningful": ar["successes"] + h["successes"] > 0,
        "ar_success_rate": ar["success_rate"],
        "heisd_success_rate": h["success_rate"],
        "success_gap_points": gap,
        "success_within_5_points": gap <= TARGETS["success_within_points_of_ar"],
        "heisd_speedup_vs_ar": h["speedup_vs_ar"],
        "speedup_at_least_2.5x": h["speedup_vs_ar"] >= TARGETS["speedup_vs_ar"],
        "heisd_accept_length": h["accept_length"],
        "accept_length_at_least_4.5": h["accept_length"] >= TARGETS["accept_length"],
    }


# ------------------------------------------------------------------------------ Markdown


def _f(x: Any, fmt: str = ".2f") -> str:
    return "n/a" if x is None or (isinstance(x, float) and not math.isfinite(x)) else format(x, fmt)


FOOTNOTE = ["", "Step latency is the wall time of `HybridDecoder.step` (vision, retrieval, drafting, verification,",
            "detokenisation); the simulator is not included. CPU speedup uses the process CPU time of the same",
            "call (immune to preemption by other processes). Accept length = tokens per decoding cycle (a cycle",
            "is a verification forward or a skip).", ""]


def markdown(report: dict[str, Any]) -> str:
    """The report as Markdown: what ran, the per-method and per-task tables, latency and targets."""
    meta = report["_meta"]
    methods = [m for m in report if not m.startswith("_")]
    out = _md_header(meta) + _md_methods(report, methods) + _md_tasks(report, methods)
    out += _md_modes(report, methods) + _md_latency(meta["retrieval_latency_ms"])
    out += _md_targets(meta["acceptance"]) + FOOTNOTE
    return "\n".join(out)


def _md_header(meta: dict[str, Any]) -> list[str]:
    out = [f"# LIBERO closed-loop evaluation: {meta.get('suite', '')}", ""]
    out += [f"Command: `{meta.get('command', '')}`", ""]
    runs = [x for x in meta.get("invocations", []) if x.get("episodes_run")]
    if runs:  # the invocations that ran the episodes (one per shard), in log order
        out += ["Episodes run by:", ""] + [f"- `{x['command']}` ({x['episodes_run']} episodes, git "
                                          f"`{str(x.get('git_rev', ''))[:10]}`)" for x in runs] + [""]
    out += [(f"Subset: tasks {meta.get('tasks')}, init states {meta.get('init_states')} "
             f"({meta.get('pairs', '?')} (task, init state) pairs per method), max {meta.get('max_steps')} steps, "
             f"seed {meta.get('seed')}, {meta.get('threads')} torch thread(s), "
             f"git `{str(meta.get('git_rev', ''))[:10]}`."), ""]
    return out


def _md_methods(report: dict[str, Any], methods: list[str]) -> list[str]:
    out = ["| method | success | median step ms | p90 ms | speedup vs ar | CPU speedup | LLM fwd/step "
           "| accept length | modes |", "|---|---|---|---|---|---|---|---|---|"]
    for m in methods:
        r = report[m]
        modes = ", ".join(f"{k} {v:.0%}" for k, v in r["mode_mix"].items())
        out.append(f"| {m} | {_f(r['success_rate'], '.0%')} ({r['successes']}/{r['episodes']}) | "
                   f"{_f(r['median_step_ms'], '.1f')} | "
                   f"{_f(r['p90_step_ms'], '.1f')} | {_f(r['speedup_vs_ar'])}x | {_f(r['speedup_vs_ar_cpu'])}x | "
                   f"{_f(r['forwards_per_step'])} | {_f(r['accept_length'])} | {modes} |")
    return out


def _md_tasks(report: dict[str, Any], methods: list[str]) -> list[str]:
    tasks = sorted({t for m in methods for t in report[m]["per_task_success"]}, key=int)
    out = ["", "Success per task:", "", "| task | instruction | " + " | ".join(methods) + " |",
           "|---|---|" + "---|" * len(methods)]
    for t in tasks:
        instr = next(report[m]["per_task_success"][t]["instruction"] for m in methods
                     if t in report[m]["per_task_success"])
        cells = []
        for m in methods:
            c = report[m]["per_task_success"].get(t)
            cells.append(f"{c['successes']}/{c['episodes']}" if c else "-")
        out.append(f"| {t} | {instr} | " + " | ".join(cells) + " |")
    return out


def _md_modes(report: dict[str, Any], methods: list[str]) -> list[str]:
    """Step time per mode against its floor, and the verify-skip verdicts."""
    out = ["", "Step time per mode against its floor (vision + projector + retrieval + first LLM forward):", "",
           "| method | mode | steps | median ms | median floor ms | median ratio to floor |", "|---|---|---|---|---|---|"]
    for m in methods:
        for mode, p in report[m].get("modes", {}).items():
            out.append(f"| {m} | {mode} | {p['steps']} | {_f(p['median_step_ms'], '.1f')} | "
                       f"{_f(p['median_floor_ms'], '.1f')} | {_f(p['median_ratio_to_floor'])} |")
    checks = {m: report[m].get("skip_checks") for m in methods if report[m].get("skip_checks")}
    if checks:
        out += ["", "Verify-skip verdicts of the best hit on retrieval steps (why a step was, or was not, skipped):", ""]
        for m, c in checks.items():
            total = sum(c.values())
            out.append(f"- `{m}`: " + ", ".join(f"{k} {v / total:.0%}" for k, v in c.items()) + f" ({total} steps)")
    return out


def _md_latency(lat: dict[str, Any]) -> list[str]:
    out = ["", (f"Retrieval latency (Top-5, task-filtered, {lat['n']} queries): median {_f(lat['median'], '.2f')} ms, "
                f"p95 {_f(lat['p95'], '.2f')} ms ({lat['what']}).")]
    inrun = lat.get("in_run_top5", {})
    if lat.get("probe_top5", {}).get("n") and inrun.get("n"):
        out.append(f"heisd's own Top-5 queries during the episodes: {inrun['n']}, "
                   f"median {_f(inrun['median'], '.2f')} ms, p95 {_f(inrun['p95'], '.2f')} ms.")
    for m, v in lat.get("by_method", {}).items():
        out.append(f"- `{m}` store.search (Top-{v['top_k']}) inside its steps: {v['n']} queries, "
                   f"median {_f(v['median'], '.2f')} ms, p95 {_f(v['p95'], '.2f')} ms")
    return out


def _md_targets(acc: dict[str, Any]) -> list[str]:
    if not acc.get("evaluated"):
        return []
    yes = {True: "met", False: "missed"}
    return ["", "Targets (heisd vs ar, same run):", "",
            (f"- success within 5 points of ar: {yes[acc['success_within_5_points']]} "
             f"(ar {_f(acc['ar_success_rate'], '.0%')}, heisd {_f(acc['heisd_success_rate'], '.0%')})"
             + ("" if acc.get("success_comparison_meaningful", True) else
                " -- vacuous: neither method solved an episode")),
            f"- median step >= 2.5x faster than ar: {yes[acc['speedup_at_least_2.5x']]} "
            f"({_f(acc['heisd_speedup_vs_ar'])}x)",
            (f"- accept length >= 4.5 tokens per cycle: {yes[acc['accept_length_at_least_4.5']]} "
             f"({_f(acc['heisd_accept_length'])})")]
