"""One control step of the policy node, run on the inference thread (the only code that touches
the decoder): synchronised set -> Observation -> decoder -> safety checks -> outputs.

A step that cannot produce a safe command publishes nothing and reports why (see `NodeStatus`):
input beyond the node's limits (`input_limits`: checked first, cheapest first, before any pixel is
decoded), undecodable or implausible input, an unknown task, a database or decoder fault, an
overrunning inference (watchdog), a result that went stale while decoding, or an action beyond
`action_limits`. A valid action is clipped to `max_abs_action` before it is published.

Every decoded step publishes its DecodeStats; its command (every actuator output) goes out only
through the node's one gate (`Gate.hold`: node active, command_enabled, the step's episode still
running).
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass
from typing import Any, Callable, ContextManager, Protocol

import numpy as np

from heisd_ros.core.errors import (
    DatabaseError,
    HeisdError,
    InputLimitError,
    InvalidObservationError,
    UnknownTaskError,
)
from heisd_ros.core.model_api import Decoder
from heisd_ros.core.types import Observation, StepStats
from heisd_ros.ros import conversions as conv
from heisd_ros.ros.input_limits import (
    TRIM_AFTER_BYTES,
    TRIM_STEPS,
    PoseGate,
    check_frame_shape,
    model_input,
    release_memory,
)
from heisd_ros.ros.outputs import CommandOutputs
from heisd_ros.ros.params import NodeConfig, PolicyNodeConfig
from heisd_ros.ros.shadow import ShadowRunner
from heisd_ros.ros.status import ERROR, WARN, NodeStatus
from heisd_ros.ros.sync import SyncedSet
from heisd_ros.ros.watchdog import Watchdog


@dataclass
class Job:
    """A control tick's work: the newest synchronised set, the instruction it is decoded with and
    the episode it belongs to."""

    synced: SyncedSet
    instruction: str
    tick_s: float
    episode: int = 0
    """The episode's number (task_control.Episode): a new number resets the decoder."""


class Gate(Protocol):
    """Where commands are allowed (task_control.TaskControl)."""

    def hold(self, episode: int) -> ContextManager[bool]:
        """Whether a step of `episode` may publish its command; publish inside the block."""

    def stepped(self, episode: int, stats: StepStats, latency_s: float, commanded: bool) -> None:
        """A step of `episode` was decoded and its outputs published."""


def output_problem(action: np.ndarray, age_s: float, n: NodeConfig) -> tuple[str, int, str] | None:
    """(kind, level, message) when a decoded action must not be published; None when it may.

    `age_s` is how old the step's images are at publication (node clock minus image stamp).
    """
    if age_s > n.image_staleness_s:
        return "slow", WARN, (f"result stale: inputs {age_s:.3f} s old at publication "
                              f"> image_staleness_s {n.image_staleness_s:.3f} (decoding too slow?)")  # fmt: skip
    if age_s < -n.image_staleness_s:
        return "clock", WARN, (f"clock jumped back during decoding: inputs stamped {-age_s:.3f} s "
                               "in the future at publication")  # fmt: skip
    beyond = np.flatnonzero(np.abs(action) > np.asarray(n.action_limits))
    if beyond.size:
        return "out_of_range", ERROR, (f"action out of range: dimension(s) {beyond.tolist()} = "
                                       f"{action[beyond].round(4).tolist()} beyond action_limits "
                                       f"{[n.action_limits[i] for i in beyond]}")  # fmt: skip
    return None


class StepRunner:
    """Drives the decoder: episodes (reset when a job of a new episode arrives), steps and the
    periodic health check. Called only from the inference thread.

    config: the node's current configuration (it may change between steps); clock_s: node time, s;
    finger_gap: stamp -> (gap, '') or (None, why not), None when the model does not read the gap;
    gate: where commands are allowed; shadow: shadow mode's runner, run after each published step
    (None: off).
    """

    def __init__(self, decoder: Decoder, *, config: Callable[[], PolicyNodeConfig], clock_s: Callable[[], float],
                 finger_gap: Callable[[float], tuple[float | None, str]] | None, watchdog: Watchdog,
                 outputs: CommandOutputs, gate: Gate, status: NodeStatus, logger: Any,
                 shadow: ShadowRunner | None = None) -> None:  # fmt: skip
        self._decoder = decoder
        self._config, self._clock_s, self._finger_gap = config, clock_s, finger_gap
        self._watchdog, self._outputs, self._gate = watchdog, outputs, gate
        self._status, self._logger, self._shadow = status, logger, shadow
        self._pending_shadow: Callable[[], None] | None = None  # this step's shadow, run after its job ended
        self._episode: int | None = None  # the episode the decoder was last reset for
        self._step_id = 0
        self.health = (True, "not checked yet")
        """(database healthy, status text) of the last health check."""
        self._health_t = -1e9
        self._model = model_input(decoder)
        self._pose_gate = PoseGate()
        self._refusal: tuple[tuple[str, int], str] | None = None  # ((instruction, token limit), why) of the last check
        self._resize_noted: set[str] = set()  # views whose resized frames were logged
        self._trims_due = 0  # ordinary steps that still hand freed memory back after large inputs

    def episode_result(self, success: bool) -> None:
        """Hand an episode's outcome to the decoder (the verify-skip thresholds learn from it)."""
        self._decoder.episode_feedback(success)

    def refresh_health(self, period_s: float) -> None:
        """Ask the decoder for its health when the last check is `period_s` old (or was invalidated)."""
        if time.monotonic() - self._health_t < period_s:
            return
        self._health_t = time.monotonic()
        try:
            ok, text = self._decoder.health()
        except HeisdError as err:
            ok, text = False, f"{type(err).__name__}: {err}"
        self.health = (bool(ok), str(text))

    def run(self, job: Job) -> None:
        """Decode one job and publish its command, or report why there is none."""
        n = self._config().node
        refused = self._instruction_refusal(job.instruction, n)
        if refused:
            return self._status.problem("instruction", WARN, f"instruction refused: {refused}")
        if job.episode != self._episode:
            self._decoder.reset(job.instruction)
            if self._shadow is not None:
                self._shadow.reset(job.instruction)
            self._pose_gate.reset()
            self._episode, self._step_id = job.episode, 0
        started = time.monotonic()
        try:
            decoded = self._decode(job, n)
        finally:
            self._release_memory(job)
        if decoded is None or not self._watchdog_allows(time.monotonic() - started, n):
            return
        action, stats, obs = decoded
        problem = output_problem(action, self._clock_s() - job.synced.image_stamp_s, n)
        if problem is not None:
            return self._status.problem(*problem)
        if stats.fallback:
            self._status.fallback(stats.fallback)
        self._publish(job, action, stats, n)
        if self._shadow is not None:  # after the job: the command never waits for it (InferenceWorker)
            slack_s = n.control_period_s - (time.monotonic() - started)
            self._pending_shadow = functools.partial(self._run_shadow, job, obs, stats, slack_s)

    def job_done(self) -> None:
        """A job ended, with or without a command (or was dropped): a later hang is reported again."""
        self._watchdog.finished()

    def _instruction_refusal(self, instruction: str, n: NodeConfig) -> str:
        """Why the model cannot take this instruction ('' when it can); checked once per instruction."""
        key = (instruction, n.input_limits.max_instruction_tokens)
        if self._refusal is None or self._refusal[0] != key:
            self._refusal = (key, self._model.instruction_problem(instruction, n.input_limits))
        return self._refusal[1]

    def _images(self, job: Job, n: NodeConfig) -> dict[str, np.ndarray]:
        """The views as RGB [H, W, 3], each checked against the limits from its header before decoding."""
        lim, model_hw = n.input_limits, self._model.image_hw
        images = {}
        for view, frame in job.synced.frames.items():
            try:
                rgb = conv.msg_to_rgb(frame.data, n.expected_hw, lim.max_image_pixels,
                                      lambda h, w: check_frame_shape(h, w, model_hw, lim))  # fmt: skip
            except InvalidObservationError as err:
                raise type(err)(f"view {view!r}: {err}") from err
            if model_hw is not None and rgb.shape[:2] != model_hw and view not in self._resize_noted:
                self._resize_noted.add(view)
                self._logger.info(f"view {view!r}: {rgb.shape[0]}x{rgb.shape[1]} frames are resized to the "
                                  f"model's input {model_hw[0]}x{model_hw[1]} (logged once per view)")  # fmt: skip
            images[view] = rgb
        return images

    def _release_memory(self, job: Job) -> None:
        """After large inputs, hand freed memory back to the OS at the ordinary steps that follow (by
        then the large messages have been replaced and freed), so one huge frame does not raise RSS
        for good. A trim with nothing to release costs microseconds."""
        size = sum(len(getattr(f.data, "data", b"")) for f in job.synced.frames.values())
        if size >= TRIM_AFTER_BYTES:
            self._trims_due = TRIM_STEPS
        elif self._trims_due:
            self._trims_due -= 1
            release_memory()

    def _decode(self, job: Job, n: NodeConfig) -> tuple[np.ndarray, StepStats, Observation] | None:
        """(checked action, stats, the observation), or None after reporting why the step has no action."""
        gap = None
        if self._finger_gap is not None:
            gap, why = self._finger_gap(job.synced.stamp_s)
            if gap is None:
                return self._status.problem("invalid_input", WARN, f"invalid input: {why}")
        try:
            ee_pos = conv.pose_to_position(job.synced.pose.data, n.quat_norm_tol, n.command_frame_id)
            self._pose_gate.check(job.synced.pose.stamp_s, ee_pos, n.input_limits)
            obs = Observation(images=self._images(job, n), instruction=job.instruction, ee_pos=ee_pos,
                              task=n.task or None, stamp_s=job.synced.stamp_s, gripper_gap=gap)  # fmt: skip
            cpu0 = time.thread_time()
            action, stats = self._decoder.step(obs)
            # beside the wall time: a step that waited for a CPU (a contended machine) shows it
            stats.latency_ms["cpu"] = (time.thread_time() - cpu0) * 1e3
            return conv.check_action(action), stats, obs
        except InputLimitError as err:
            return self._status.problem("input_limit", WARN, f"input refused: {err}")
        except InvalidObservationError as err:
            return self._status.problem("invalid_input", WARN, f"invalid input: {err}")
        except UnknownTaskError as err:
            return self._status.problem("unknown_task", ERROR, f"unknown task: {err}")
        except DatabaseError as err:
            self._health_t = -1e9  # re-check the database at once
            return self._status.problem("database", ERROR, f"database: {type(err).__name__}: {err}")
        except HeisdError as err:
            return self._status.problem("decoder", ERROR, f"{type(err).__name__}: {err}")

    def _watchdog_allows(self, inference_s: float, n: NodeConfig) -> bool:
        was_tripped = self._watchdog.tripped
        ok, why = self._watchdog.step(inference_s, n.watchdog_budget_s, n.watchdog_recovery_steps)
        if not ok:
            self._status.problem("watchdog", ERROR, why)
        elif was_tripped:
            self._logger.warning(f"watchdog cleared: {n.watchdog_recovery_steps} steps within budget, "
                                 "commanding again")  # fmt: skip
        return ok

    def _publish(self, job: Job, action: np.ndarray, stats: StepStats, n: NodeConfig) -> None:
        clipped = conv.clip_action(action, n.max_abs_action)
        self._step_id += 1
        sent = None
        latency_s = float("nan")
        try:
            with self._gate.hold(job.episode) as commanding:  # the one gate of every actuator output
                if commanding:
                    sent = self._outputs.publish_command(clipped, stats, job.synced.stamp_s, self._step_id,
                                                         job.synced.pose.data, n)  # fmt: skip
            if sent is not None and sent.note:
                self._status.report("workspace", WARN, sent.note)
            self._outputs.publish_stats(stats, job.synced.stamp_s, self._step_id, n)
            latency_s = self._clock_s() - job.synced.image_stamp_s
            limited = (sent is not None and sent.clipped) or not np.array_equal(clipped, action)
            self._status.published(latency_s, float(stats.latency_ms.get("total", 0.0)), stats.mode, clipped=limited)
        finally:  # a decoded step counts towards its goal's step limit even when publishing failed
            self._gate.stepped(job.episode, stats, latency_s, sent is not None)

    def take_shadow(self) -> Callable[[], None] | None:
        """The shadow of the step that just ended (shadow mode, after a published step), to run once
        its job is over; None when there is none."""
        pending, self._pending_shadow = self._pending_shadow, None
        return pending

    def _run_shadow(self, job: Job, obs: Observation, stats: StepStats, slack_s: float) -> None:
        """Shadow mode on a published step; a failure costs the record, never the node its steps."""
        if not self.health[0]:  # a database outage: the shadow's query would wait for the timeout
            return self._shadow.pass_over(obs, getattr(self._decoder, "f_live", None), "database unhealthy")
        try:
            self._shadow.after_step(obs, stats, getattr(self._decoder, "f_live", None), stamp_s=job.synced.stamp_s,
                                    step_id=self._step_id, episode=job.episode, slack_s=slack_s)  # fmt: skip
        except Exception as err:  # noqa: BLE001 - whatever the shadow raises, the executed step stands
            self._shadow.failed()
            self._status.report("shadow", WARN, f"shadow step failed: {type(err).__name__}: {err}")
