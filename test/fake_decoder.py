"""The one test decoder: `heisd_ros.core.model_api.Decoder` with scripted actions and modes, a record
of every call, and failure switches. The node, replay and bag tests run the real node around it.

Step n (1-based): mode `modes[n % len(modes)]` ("ar" for method ar), `forwards` LLM forwards (7 for
ar), total latency `ms_per_forward` x forwards + the sleep `delay_s`; the action is `action(obs, n)`,
or by default [ee_pos, 0.1, 0.2, 0.3, 1.0] (the pose comes back in the command). A "skip" step is
skipped; "ar" and "drafter" steps are strict (lossless), the others are not.
"""

from __future__ import annotations

import math
import time
from types import SimpleNamespace
from typing import Callable, Sequence

import numpy as np

from heisd_ros.core.errors import DatabaseUnavailableError, UnknownTaskError
from heisd_ros.core.model_api import DecoderInputs
from heisd_ros.core.types import Observation, StepStats

VIEWS = ("agentview", "wrist")
UNKNOWN_TASK = "an unknown task"
"""An instruction the fake's database does not hold (its step raises UnknownTaskError)."""


class FakeDecoder:
    def __init__(self, cfg=None, *, method: str | None = None, modes: Sequence[str] = ("drafter",), forwards: int = 2,
                 ms_per_forward: float = 0.0, delay_s: float = 0.0,
                 action: Callable[[Observation, int], np.ndarray] | None = None,
                 image_shape: tuple[int, ...] | None = None, reads_finger_gap: bool = False,
                 known_tasks: Sequence[str] = ()) -> None:
        self.method = method or (cfg.decoder.method if cfg is not None else "heisd")
        self.views = tuple(cfg.decoder.views) if cfg is not None else VIEWS
        self.modes, self.forwards, self.ms_per_forward, self.delay_s = tuple(modes), forwards, ms_per_forward, delay_s
        self.action, self.image_shape = action, image_shape
        self._inputs = DecoderInputs(views=self.views, reads_finger_gap=reads_finger_gap)
        self._known_tasks = list(known_tasks)
        self.steps = 0
        self.resets: list[str | None] = []
        self.reset_steps: list[int] = []
        """Steps decoded before each reset."""
        self.positions: list[np.ndarray] = []
        self.feedback: list[bool] = []
        self.closed = False
        # failure switches
        self.db_down = False
        self.big_action = False  # beyond max_abs_action (clipped), within action_limits
        self.huge_action = False  # beyond action_limits
        self.nan_action = False
        self.fallback = ""
        self.skip = SimpleNamespace(min_similarity=0.95, max_distance_m=0.02)
        """The verify-skip thresholds an evaluation records at an episode's start."""
        self.restored = 0
        """Calls of `restore_operating_point` (an evaluation's episode start)."""

    @property
    def inputs(self) -> DecoderInputs:
        return self._inputs

    def known_tasks(self) -> list[str]:
        return list(self._known_tasks)

    def task_problem(self, task: str) -> str:
        return f"no demonstrations for task {task!r}" if task == UNKNOWN_TASK else ""

    def reset(self, instruction: str | None = None) -> None:
        self.resets.append(instruction)
        self.reset_steps.append(self.steps)

    def prepare_vision(self) -> None:  # no backbone
        pass

    def restore_operating_point(self) -> None:
        self.restored += 1

    def step(self, obs: Observation) -> tuple[np.ndarray, StepStats]:
        if obs.task_key == UNKNOWN_TASK:
            raise UnknownTaskError(f"no demonstrations for task {obs.task_key!r}")
        if self.db_down:
            raise DatabaseUnavailableError("database directory /nonexistent is missing")
        assert set(obs.images) == set(self.views), sorted(obs.images)
        assert all(image.dtype == np.uint8 for image in obs.images.values())
        if self.image_shape is not None:
            assert all(image.shape == self.image_shape for image in obs.images.values())
        time.sleep(self.delay_s)
        self.steps += 1
        n = self.steps
        self.positions.append(np.asarray(obs.ee_pos))
        a = (np.asarray(self.action(obs, n), dtype=np.float64).copy() if self.action is not None
             else np.concatenate([obs.ee_pos, [0.1, 0.2, 0.3, 1.0]]))
        if self.big_action:
            a[0] = 1.5
        if self.huge_action:
            a[4] = -7.5
        if self.nan_action:
            a[2] = math.nan
        mode = "ar" if self.method == "ar" else self.modes[n % len(self.modes)]
        fwd = 7 if mode == "ar" else self.forwards
        per_forward = [7 // fwd + (1 if i < 7 % fwd else 0) for i in range(fwd)]  # 2 forwards: [4, 3]
        return a, StepStats(mode=mode, method=self.method, llm_forwards=fwd, tokens_per_forward=per_forward,
                            latency_ms={"total": self.ms_per_forward * fwd + 1000 * self.delay_s},
                            tokens=tuple(range(7)), fallback=self.fallback, skipped=mode == "skip",
                            strict=mode in ("ar", "drafter"))

    def episode_feedback(self, success: bool) -> None:
        self.feedback.append(success)

    def health(self) -> tuple[bool, str]:
        return (not self.db_down, "database missing" if self.db_down else "ok")

    def close(self) -> None:
        self.closed = True
