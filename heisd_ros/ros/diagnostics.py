"""The policy node's /diagnostics message: one status for the policy, one for the database.

The policy status carries the worst problem since the last message (or a warning that decoding is
slower than the control period, or that no instruction has arrived) and the figures of the recent
steps: command rate, frame-to-command latency, decode time, mode mix, rejected steps by kind, the
synchroniser's refusals by kind.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue

from heisd_ros.ros.params import PolicyNodeConfig
from heisd_ros.ros.status import ERROR, OK, WARN, StatusSnapshot


@dataclass(frozen=True)
class NodeState:
    """What the diagnostics report beyond the step counters."""

    instruction: str | None
    watchdog_tripped: bool
    watchdog_trips: int
    clock_resets: int
    health: tuple[bool, str]
    """(database healthy, status text) from the decoder's last health check."""
    worker_restarts: int = 0
    """Inference threads started after one died."""
    skip_thresholds: tuple[float, float] | None = None
    """Verify-skip's running (min_similarity, max_distance_m): feedback moves them from decoder.verify_skip.*."""
    sync_refusals: Mapping[str, int] = field(default_factory=dict)
    """Control ticks whose inputs formed no set, by kind (sync.REFUSAL_KINDS), since configure."""
    commanding: str = ""
    """The command gate: 'inactive', 'commanding' or 'dry run (command_enabled false)'."""
    shadow: Mapping[str, str] = field(default_factory=dict)
    """Shadow mode's values (ros.shadow.ShadowRunner.diagnostics); empty when it is off."""


def horizon_s(cfg: PolicyNodeConfig) -> float:
    """How far back the rates and latencies of a diagnostics message look."""
    return max(5.0, 5 * cfg.node.diagnostics_period_s)


def _median(a: np.ndarray) -> str:
    return f"{np.median(a):.1f}" if len(a) else "nan"


def _p95(a: np.ndarray) -> str:
    return f"{np.percentile(a, 95):.1f}" if len(a) else "nan"


def _pairs(counts: dict[str, int]) -> str:
    return " ".join(f"{k}:{v}" for k, v in sorted(counts.items())) or "-"


def overall(snap: StatusSnapshot, state: NodeState, decode_ms: np.ndarray, period_ms: float) -> tuple[int, str]:
    """(level, message) of the policy status."""
    problems = snap.problems
    level = max([lvl for lvl, _ in problems], default=OK)
    message = problems[-1][1] if problems else "running"
    if state.watchdog_tripped:  # withholding commands is an ERROR for as long as it lasts
        # the newest ERROR says most (a failed step's cause, the hang, the recovery count)
        level, message = ERROR, next((m for lvl, m in reversed(problems) if lvl == ERROR),
                                     "watchdog tripped: commands withheld")  # fmt: skip
    if len(decode_ms) and np.median(decode_ms) > period_ms and level == OK:
        level = WARN
        message = f"decoding takes {np.median(decode_ms):.0f} ms, longer than the control period {period_ms:.0f} ms"
    if state.instruction is None and level == OK:
        level, message = WARN, "waiting for an instruction"
    return level, message


def _values(cfg: PolicyNodeConfig, snap: StatusSnapshot, state: NodeState) -> dict[str, str]:
    n = cfg.node
    recent = snap.recent
    lat = np.array([p.latency_s for p in recent]) * 1e3
    dec = np.array([p.decode_ms for p in recent])
    span = recent[-1].t - recent[0].t if len(recent) > 1 else 0.0
    rate = (len(recent) - 1) / span if span > 0 else 0.0
    health_ok, health_text = state.health
    return {
        "method": cfg.decoder.method, "command_enabled": str(n.command_enabled), "commanding": state.commanding,
        "instruction": state.instruction or "",
        "target_rate_hz": f"{n.control_rate_hz:.2f}", "command_rate_hz": f"{rate:.2f}",
        "control_period_ms": f"{n.control_period_s * 1e3:.1f}", "latency_median_ms": _median(lat),
        "latency_p95_ms": _p95(lat), "decode_median_ms": _median(dec), "steps": str(snap.steps),
        "dropped_ticks": str(snap.dropped_ticks), "clipped_commands": str(snap.clipped),
        "fallback_steps": str(snap.fallbacks), "watchdog": "tripped" if state.watchdog_tripped else "ok",
        "watchdog_trips": str(state.watchdog_trips), "clock_resets": str(state.clock_resets),
        "worker_restarts": str(state.worker_restarts), "sync_refusals": _pairs(state.sync_refusals),
        **({"verify_skip_min_similarity_running": f"{state.skip_thresholds[0]:.4f}",
            "verify_skip_max_distance_m_running": f"{state.skip_thresholds[1]:.4f}"} if state.skip_thresholds else {}),
        "mode_mix": _pairs(snap.modes), "rejected": _pairs(snap.rejected), "last_error": snap.last_error,
        "last_error_age_s": f"{snap.last_error_age_s:.1f}" if snap.last_error else "",
        "database_healthy": str(health_ok), "database_status": health_text, **state.shadow,
    }  # fmt: skip


def diagnostics_message(name: str, cfg: PolicyNodeConfig, snap: StatusSnapshot, state: NodeState) -> DiagnosticArray:
    """The DiagnosticArray of node `name` (fully qualified); the caller stamps its header."""
    decode_ms = np.array([p.decode_ms for p in snap.recent])
    level, message = overall(snap, state, decode_ms, cfg.node.control_period_s * 1e3)
    values = _values(cfg, snap, state)
    policy = DiagnosticStatus(level=bytes([level]), name=f"{name}: policy", hardware_id=name, message=message,
                              values=[KeyValue(key=k, value=v) for k, v in values.items()])  # fmt: skip
    health_ok, health_text = state.health
    db = DiagnosticStatus(level=bytes([OK if health_ok else ERROR]), name=f"{name}: database",
                          hardware_id=name, message=health_text)  # fmt: skip
    return DiagnosticArray(status=[policy, db])
