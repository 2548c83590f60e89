"""Shadow mode in the node: while it executes its own method (ar, the user's known-good path), what
heisd at the loaded point would have done, step by step, published for `heisd choose-point --shadow`.

With `shadow.method: heisd` the node loads a `ShadowDecoder` (heisd_ros/core/shadow.py) over the same
model, drafter and database, and after each executed step's outputs have gone out (never before:
the command path is unchanged) it computes on that step's observation everything heisd's decisions
read and publishes it as one `heisd_ros/ShadowStep` on `shadow_steps` (record it with `ros2 bag
record`). `/diagnostics` summarises it, with the decisions heisd at the loaded point would have made
replayed over the records as they come (`PointReplay`): its mode mix and its skip steps' deviation
from the executed tokens.

The shadow costs a vision pass, a query and two decodes. `shadow.when: slack` runs it only when the
control period leaves room for it (the time left before the next tick against the last shadow's
duration) and counts the steps it skipped; that rule reads a clock, so it decides only whether a
record is made, never a command. `always` shadows every step even when the next tick is then missed:
for lockstep simulation and bags played slower than real time, where no input waits on the node.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from heisd_ros.core.config import DecoderConfig, require
from heisd_ros.core.model_api import Decoder
from heisd_ros.core.shadow import ShadowDecoder
from heisd_ros.core.types import Observation, StepStats
from heisd_ros.pipeline.shadow_bags import shadow_fields
from heisd_ros.pipeline.shadow_replay import PointReplay
from heisd_ros.ros import conversions as conv

SHADOW_METHODS = ("", "heisd")
SHADOW_WHEN = ("slack", "always")
SKIP_BINS_KEPT = 10_000
"""Skip-step deviations kept for the diagnostics' p95 (the most recent; a long run forgets the oldest)."""


@dataclass(frozen=True)
class ShadowConfig:
    """Shadow mode (shadow.*): what heisd would have done on the steps the node executes with its own method."""

    method: str = ""
    """'' (off) or 'heisd': compute, after each executed step's outputs, what heisd at the loaded operating point reads, and publish it on shadow_steps (ros2 bag record it for heisd choose-point --shadow)."""
    when: str = "slack"
    """'slack': shadow a step only when the control period leaves time for it (skipped steps are counted); 'always': every step, even if the next tick is missed (lockstep simulation, slow bag replay)."""

    def __post_init__(self) -> None:
        require(self.method in SHADOW_METHODS, f"shadow.method must be one of {list(SHADOW_METHODS)}, got {self.method!r}")
        require(self.when in SHADOW_WHEN, f"shadow.when must be one of {list(SHADOW_WHEN)}, got {self.when!r}")


def shadow_decoder_config(executing: DecoderConfig, shadow: ShadowConfig) -> DecoderConfig:
    """The shadow's configuration: the executing decoder's (the loaded point's settings) as heisd.
    Raises ConfigError when the node already executes what it would shadow."""
    require(executing.method != shadow.method,
            f"shadow.method {shadow.method!r} is the executing method: shadow another method (e.g. method ar)")  # fmt: skip
    return executing.with_method(shadow.method)


class LoadedPolicy(NamedTuple):
    """What configure loads: the executing decoder and, in shadow mode, its shadow over the same parts."""

    decoder: Decoder
    shadow: ShadowDecoder | None = None


@dataclass
class ShadowSummary:
    """Counters of the shadow since configure, for /diagnostics."""

    records: int = 0
    skipped_no_slack: int = 0
    skipped_database: int = 0
    failed: int = 0
    total_ms: float = 0.0


class ShadowRunner:
    """Runs the shadow after each executed step on the inference thread (StepRunner holds it).

    `estimate_s`: the shadow's expected duration before any was measured here (configure's warm-up
    shadows); then the median of the last `DURATIONS_KEPT` shadows, so one slow shadow does not
    stop the rest."""

    DURATIONS_KEPT = 5

    def __init__(self, shadow: ShadowDecoder, publisher: Any, frame_id: str, when: str, estimate_s: float = 0.0) -> None:
        self.decoder = shadow
        self._publisher, self._frame_id, self._when = publisher, frame_id, when
        self._replay = PointReplay(shadow.cfg)
        self._durations: deque[float] = deque([estimate_s], maxlen=self.DURATIONS_KEPT)
        self._lock = threading.Lock()  # the diagnostics timer reads what the inference thread writes
        self._summary = ShadowSummary()
        self._modes: dict[str, int] = {}
        self._skip_bins: deque[float] = deque(maxlen=SKIP_BINS_KEPT)
        self._skip_gripper = 0

    @property
    def estimate_s(self) -> float:
        return float(np.median(self._durations))

    def reset(self, instruction: str | None) -> None:
        """A new episode: the shadow's window, live features and the replayed sequence start over."""
        self.decoder.reset(instruction)
        self._replay = PointReplay(self.decoder.cfg)

    def pass_over(self, obs: Observation, executed_live: np.ndarray | None, why: str) -> None:
        """An executed step without a record ('no slack' or 'database unhealthy'): the shadow's window
        and live features follow it; the diagnostics' replay starts over after the gap, as
        `heisd choose-point --shadow` does (records are replayed in runs of consecutive steps)."""
        self.decoder.pass_over(obs, executed_live)
        self._replay = PointReplay(self.decoder.cfg)
        with self._lock:
            if why == "no slack":
                self._summary.skipped_no_slack += 1
            else:
                self._summary.skipped_database += 1

    def after_step(self, obs: Observation, stats: StepStats, executed_live: np.ndarray | None, *, stamp_s: float,
                   step_id: int, episode: int, slack_s: float) -> bool:  # fmt: skip
        """Shadow one executed step; whether a record was published (not: no slack, counted)."""
        if self._when == "slack" and slack_s < self.estimate_s:
            self.pass_over(obs, executed_live, "no slack")
            return False
        t0 = time.monotonic()
        step = self.decoder.shadow(obs, stats.tokens, executed_live)
        took_s = time.monotonic() - t0
        self._durations.append(took_s)
        replayed = self._replay.step(step)
        msg = _message(shadow_fields(step, step_id, episode, obs.instruction,
                                     float(stats.latency_ms.get("total", math.nan))), stamp_s, self._frame_id)  # fmt: skip
        self._publisher(msg)
        with self._lock:
            s = self._summary
            s.records += 1
            s.total_ms += took_s * 1e3
            self._modes[replayed.mode] = self._modes.get(replayed.mode, 0) + 1
            if replayed.mode == "skip":
                self._skip_bins.append(replayed.position_bins)
                self._skip_gripper += int(replayed.gripper_differs)
        return True

    def failed(self) -> None:
        with self._lock:
            self._summary.failed += 1

    def diagnostics(self) -> dict[str, str]:
        """The /diagnostics values of the shadow: its counters and heisd-at-the-point's replayed decisions."""
        with self._lock:
            s, bins = self._summary, list(self._skip_bins)
            modes = " ".join(f"{k}:{v}" for k, v in sorted(self._modes.items())) or "-"
            skips = self._modes.get("skip", 0)
            return {
                "shadow_method": self.decoder.cfg.method, "shadow_records": str(s.records),
                "shadow_skipped_no_slack": str(s.skipped_no_slack), "shadow_skipped_database": str(s.skipped_database),
                "shadow_failed": str(s.failed),
                "shadow_mean_ms": f"{s.total_ms / s.records:.1f}" if s.records else "nan", "shadow_point_mode_mix": modes,
                "shadow_point_skip_position_p95_bins": f"{np.percentile(bins, 95):.1f}" if bins else "nan",
                "shadow_point_skip_gripper_disagreement": f"{self._skip_gripper / skips:.4f}" if skips else "nan",
            }  # fmt: skip


def _message(fields: dict[str, Any], stamp_s: float, frame_id: str) -> Any:
    from heisd_ros.msg import ShadowStep

    return ShadowStep(header=conv.header_msg(stamp_s, frame_id), **fields)
