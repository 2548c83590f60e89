"""The policy node's inference thread: the one thread that touches the decoder.

The control timer hands it at most one job at a time (`submit`); a tick that finds it busy is
dropped and counted by the node, never queued, so inputs can arrive at any rate without building
a backlog. Episode results are queued and handed to the decoder before the next step.

A step can fail, the thread cannot: any exception of a step (a decoder bug, a torch out-of-memory
error, a publisher that went away) costs that step its command and is reported as an ERROR naming
its cause, and the thread takes the next job. Only a BaseException that is not an Exception ends
the thread (KeyboardInterrupt and SystemExit are never caught here); the node's control timer
then notices (`alive`) and starts a fresh thread (`revive`).
"""

from __future__ import annotations

import threading
import time
import traceback
from pathlib import Path
from typing import Callable

from heisd_ros.ros.status import ERROR, NodeStatus
from heisd_ros.ros.step import Job, StepRunner

MESSAGE_CHARS = 200
"""How much of an exception's message a report quotes (a torch error can run to pages)."""


def describe(err: BaseException) -> str:
    """'Type: first line of the message (at file.py:line in function)', short enough for one log line."""
    lines = str(err).strip().splitlines()
    text = lines[0] if lines else ""
    if len(text) > MESSAGE_CHARS:
        text = text[:MESSAGE_CHARS] + "..."
    where = traceback.extract_tb(err.__traceback__)[-1:] if err.__traceback__ is not None else []
    at = f" (at {Path(where[0].filename).name}:{where[0].lineno} in {where[0].name})" if where else ""
    return f"{type(err).__name__}: {text}{at}" if text else f"{type(err).__name__}{at}"


class InferenceWorker:
    """Runs `runner` on its own daemon thread; `period_s()` paces its idle wake-ups and health checks."""

    def __init__(self, runner: StepRunner, status: NodeStatus, period_s: Callable[[], float]) -> None:
        self._runner, self._status, self._period_s = runner, status, period_s
        self._cv = threading.Condition()
        self._job: Job | None = None
        self._busy = False
        self._shadowing = False  # shadow mode: the last step's shadow runs (after its job ended)
        self._job_started = 0.0  # monotonic time the current job was handed over, then taken
        self._feedback: list[bool] = []
        self._stop = False
        self._death: BaseException | None = None  # what ended the last thread, for `revive`
        self.restarts = 0
        """Threads started after one died."""
        self._thread = self._new_thread()

    def _new_thread(self) -> threading.Thread:
        return threading.Thread(target=self._run, name="heisd-inference", daemon=True)

    def start(self) -> None:
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def revive(self) -> str | None:
        """Start a fresh thread if the running one died; the cause of death when it did, else None.
        The job it was running is lost (never retried: its inputs are old by now)."""
        with self._cv:
            if self._stop or not self._thread.ident or self._thread.is_alive():
                return None
            cause = describe(self._death) if self._death is not None else "no exception"
            was_busy, self._busy, self._job, self._death = self._busy, False, None, None
            self._thread = self._new_thread()
            self.restarts += 1
        if was_busy:
            self._runner.job_done()
        self._thread.start()
        return cause

    def running_s(self) -> float | None:
        """How long the current job has been running, s; None when the worker is idle."""
        with self._cv:
            return time.monotonic() - self._job_started if self._busy else None

    @property
    def shadowing(self) -> bool:
        """Shadow mode: the last step's shadow is running; a tick now is dropped (not a hang: the
        step's job, which the watchdog times, has ended)."""
        with self._cv:
            return self._shadowing

    def submit(self, job: Job) -> bool:
        """Hand over the next job (the caller checked `running_s() is None`); False, the job dropped,
        when a shadow began in between."""
        with self._cv:
            if self._shadowing:
                return False
            self._job = job
            self._busy = True
            self._job_started = time.monotonic()  # restarted when the worker takes it
            self._cv.notify_all()
            return True

    def episode_result(self, success: bool) -> None:
        with self._cv:
            self._feedback.append(success)
            self._cv.notify_all()

    def stop(self, timeout_s: float) -> None:
        """Stop the thread after the step in progress and join it. Idempotent."""
        with self._cv:
            self._stop = True
            self._cv.notify_all()
        thread = self._thread
        if thread.is_alive() and thread is not threading.current_thread():
            thread.join(timeout_s)

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

    def _run(self) -> None:
        try:
            self._loop()
        except BaseException as err:  # recorded for the restart's log line, then the thread ends
            self._death = err
            raise

    def _loop(self) -> None:
        while True:
            period_s = self._period_s()
            taken = self._take(period_s)
            if taken is None:
                return
            job, feedback = taken
            for success in feedback:
                try:
                    self._runner.episode_result(success)
                except Exception as err:  # e.g. persisting the skip thresholds failed: the steps go on
                    self._status.report("decoder", ERROR, f"episode result not applied: {describe(err)}")
            if job is not None:
                self._step(job)
            try:
                self._runner.refresh_health(period_s)
            except Exception as err:
                self._status.report("health", ERROR, f"health check failed: {describe(err)}")

    def _step(self, job: Job) -> None:
        try:
            self._runner.run(job)
        except Exception as err:
            self._status.problem("step_failed", ERROR, f"step failed: {describe(err)}")
        finally:
            shadow = self._runner.take_shadow()
            self._runner.job_done()
            with self._cv:
                self._busy = False
                self._shadowing = shadow is not None
        if shadow is not None:
            try:
                shadow()  # catches what it raises, reporting it
            finally:
                with self._cv:
                    self._shadowing = False
