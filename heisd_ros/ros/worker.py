"""The policy node's inference thread: the one thread that touches the decoder.

The control timer hands it at most one job at a time (`submit`); a tick that finds it busy is
dropped and counted by the node, never queued, so inputs can arrive at any rate without building
a backlog. Episode results are queued and handed to the decoder before the next step.
"""

from __future__ import annotations

import threading
import time
from typing import Callable

from heisd_ros.core.errors import HeisdError
from heisd_ros.ros.status import ERROR, NodeStatus
from heisd_ros.ros.step import Job, StepRunner


class InferenceWorker:
    """Runs `runner` on its own daemon thread; `period_s()` paces its idle wake-ups and health checks."""

    def __init__(self, runner: StepRunner, status: NodeStatus, period_s: Callable[[], float]) -> None:
        self._runner, self._status, self._period_s = runner, status, period_s
        self._cv = threading.Condition()
        self._job: Job | None = None
        self._busy = False
        self._job_started = 0.0  # monotonic time the current job was handed over, then taken
        self._feedback: list[bool] = []
        self._stop = False
        self._thread = threading.Thread(target=self._loop, name="heisd-inference", daemon=True)

    def start(self) -> None:
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def running_s(self) -> float | None:
        """How long the current job has been running, s; None when the worker is idle."""
        with self._cv:
            return time.monotonic() - self._job_started if self._busy else None

    def submit(self, job: Job) -> None:
        """Hand over the next job (the caller checked `running_s() is None`)."""
        with self._cv:
            self._job = job
            self._busy = True
            self._job_started = time.monotonic()  # restarted when the worker takes it
            self._cv.notify_all()

    def episode_result(self, success: bool) -> None:
        with self._cv:
            self._feedback.append(success)
            self._cv.notify_all()

    def stop(self, timeout_s: float) -> None:
        """Stop the thread after the step in progress and join it. Idempotent."""
        with self._cv:
            self._stop = True
            self._cv.notify_all()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout_s)

    def _take(self, period_s: float) -> tuple[Job | None, list[bool]] | None:
        """The next job and the queued episode results (waiting up to `period_s`); None to stop."""
        with self._cv:
            self._cv.wait_for(lambda: self._stop or self._job is not None or bool(self._feedback), period_s)
            if self._stop:
                return None
            job, self._job = self._job, None
            feedback, self._feedback = self._feedback, []
            self._job_started = time.monotonic()
            return job, feedback

    def _loop(self) -> None:
        while True:
            period_s = self._period_s()
            taken = self._take(period_s)
            if taken is None:
                return
            job, feedback = taken
            try:
                for success in feedback:
                    self._runner.episode_result(success)
                if job is not None:
                    self._runner.run(job)
            except HeisdError as err:
                # episode_feedback/reset failures (e.g. persisting thresholds): report, keep going
                self._status.problem("decoder", ERROR, f"{type(err).__name__}: {err}")
            finally:
                if job is not None:
                    self._runner.job_done()
                    with self._cv:
                        self._busy = False
            self._runner.refresh_health(period_s)
