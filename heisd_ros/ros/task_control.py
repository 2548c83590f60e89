"""Task control of the policy node: which episode runs, and the one gate of every actuator output.

An *episode* is one run of a task: started by a `~/run_task` goal (heisd_ros/RunTask) or by a new
instruction on the instruction topic, ended by the stack's episode_result, `~/reset`, a cancel, the
goal's step limit or timeout, a newer goal or instruction, or deactivation. Between episodes the
node is idle: it decodes nothing and commands nothing until a new goal or instruction arrives (with
`after_episode: continue`, an episode_result or reset of an episode the instruction topic started
begins the next episode of the same instruction instead).

The gate (`hold`): a step's command is published only while the node is active, command_enabled
is true and the step belongs to the running episode. The check and the publication happen under one
lock that every switch-off (deactivate, cancel, ~/enable false, a new goal) also takes, so once a
switch-off has returned no command of an earlier step can follow. DecodeStats and diagnostics do not
pass the gate.

Goals: a goal is accepted only while the node is active and its task is one the decoder can run
(an instruction the database lacks is rejected at goal time, with the reason). An accepted goal is
EXECUTING at once: its execute coroutine awaits the episode's end (an rclpy Future, resolved on the
executor; a waiting coroutine costs nothing between spins) and then gives the terminal state and
result. Every goal has a deadline: its own timeout_s, else the node's goal_timeout_s. Feedback is
published per step. Everything that touches the action server (feedback, a goal's end) runs on the
node's executor, also when the inference thread or a lifecycle call from another thread causes it.
"""

from __future__ import annotations

import math
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from heisd_ros.core.errors import InputLimitError
from heisd_ros.core.types import StepStats
from heisd_ros.ros import topics
from heisd_ros.ros.input_limits import check_instruction, quote
from heisd_ros.ros.params import NodeConfig
from heisd_ros.ros.qos import request_qos
from heisd_ros.ros.worker import describe

SUCCEEDED_REASONS = frozenset({"episode_result", "max_steps"})
"""Ends that give the goal SUCCEEDED; a cancel gives CANCELED, every other end ABORTED."""


@dataclass
class Episode:
    """The running episode."""

    number: int
    """Counts episodes since start-up; a step carries the number it was decoded for."""
    instruction: str
    goal: Any = None
    """The ~/run_task goal handle it serves (None: started by the instruction topic)."""
    max_steps: int = 0
    deadline_s: float | None = None
    """Node time at which the goal times out (None: no timeout)."""
    steps: int = 0
    """Steps decoded in this episode."""


class TaskControl:
    """Episodes, the actuator gate, ~/run_task and ~/reset of one policy node.

    config: the node's current NodeConfig; clock_s: node time, s; task_problem: why an instruction's
    task cannot run ('' = it can; the decoder's database knows it). The gate's command_enabled half
    changes only through `set_enabled`, which the node's parameter callback calls once a
    command_enabled value is valid (~/enable is that parameter set from a service).
    """

    def __init__(self, node: Any, config: Callable[[], NodeConfig], clock_s: Callable[[], float],
                 task_problem: Callable[[str], str] = lambda text: "") -> None:  # fmt: skip
        from rclpy.action import ActionServer
        from std_srvs.srv import Trigger

        from heisd_ros.action import RunTask

        self._node, self._config, self._clock_s, self._task_problem = node, config, clock_s, task_problem
        self._log = node.get_logger()
        self._result_type = RunTask.Result
        self._feedback_type = RunTask.Feedback
        self._lock = threading.Lock()  # the state below; held across an actuator publication
        self._active = False
        self._enabled = config().command_enabled
        self._episode: Episode | None = None
        self._count = 0
        self._idle = f"no instruction received yet on {node.resolve_topic_name(topics.INSTRUCTION)!r} and no ~/run_task goal"
        self._ends: dict[bytes, Any] = {}  # goal id -> Future of its result, resolved when its episode ends
        cfg = config()
        requests = request_qos(cfg.request_queue_depth)
        self._action = ActionServer(node, RunTask, "~/run_task", execute_callback=self._execute,
                                    goal_callback=self._on_goal, handle_accepted_callback=self._on_accepted,
                                    cancel_callback=self._on_cancel, goal_service_qos_profile=requests,
                                    cancel_service_qos_profile=requests, result_service_qos_profile=requests,
                                    result_timeout=math.ceil(cfg.goal_result_retention_s))  # fmt: skip
        self._services = [node.create_service(Trigger, "~/reset", self._on_reset, qos_profile=requests)]

    # ------------------------------------------------------------------ state, read by the node
    def current(self) -> tuple[int, str] | None:
        """(episode number, instruction) of the running episode, None when idle."""
        with self._lock:
            ep = self._episode
            return (ep.number, ep.instruction) if ep is not None else None

    @property
    def idle_reason(self) -> str:
        with self._lock:
            return self._idle

    @property
    def commanding(self) -> str:
        """The gate's state in words, for diagnostics and logs."""
        with self._lock:
            if not self._active:
                return "inactive"
            return "commanding" if self._enabled else "dry run (command_enabled false)"

    @contextmanager
    def hold(self, episode: int) -> Iterator[bool]:
        """Whether a step of `episode` may publish its command now; the gate stays as it is until
        the block ends (the caller publishes inside it)."""
        with self._lock:
            ep = self._episode
            yield self._active and self._enabled and ep is not None and ep.number == episode

    # ------------------------------------------------------------------ switches
    def activate(self) -> None:
        with self._lock:
            self._active = True

    def deactivate(self, reason: str = "deactivated") -> None:
        """Close the gate (an actuator publication in progress finishes first) and end the episode."""
        with self._lock:
            self._active = False
        self._end(reason)

    def set_enabled(self, enabled: bool) -> None:
        """Apply command_enabled (called by the node's parameter callback once the value is valid)."""
        with self._lock:
            changed, self._enabled = self._enabled != enabled, enabled
        if changed:
            self._log.info("commanding enabled" if enabled else "commanding disabled: dry run (DecodeStats only)")

    def close(self) -> None:
        """End everything: the gate closes, a running goal is aborted, the servers are destroyed."""
        self.deactivate("shutdown")
        self._action.destroy()
        for srv in self._services:
            self._node.destroy_service(srv)

    # ------------------------------------------------------------------ episode events
    def on_instruction(self, text: str) -> None:
        """A valid instruction from the topic ('' clears it): a new text starts a new episode (a
        running goal is preempted); the running episode's own text changes nothing."""
        with self._lock:
            old = self._episode
            if text and old is not None and old.instruction == text:
                return
            self._episode = self._new_episode(text) if text else None
            if not text:
                self._idle = "instruction cleared: waiting for a new goal or instruction"
        self._log.info(f"instruction: {quote(text)}" if text else "instruction cleared")
        self._finish(old, "preempted")

    def on_instruction_refused(self, why: str) -> None:
        """The newest instruction was refused: the user asked for something other than the running
        task, so it is not commanded any longer (docs/node.md, input limits)."""
        with self._lock:
            old, self._episode = self._episode, None
            self._idle = f"instruction refused: {why}"
        self._finish(old, "preempted")

    def on_episode_result(self, success: bool) -> None:
        self._end("episode_result", success=success, follow=self._config().after_episode)

    def tick(self) -> None:
        """Called by the control timer: ends a goal whose timeout has passed."""
        with self._lock:
            ep = self._episode
            due = ep is not None and ep.deadline_s is not None and self._clock_s() >= ep.deadline_s
        if due:
            self._end("timeout")

    def stepped(self, episode: int, stats: StepStats, latency_s: float, commanded: bool) -> None:
        """A step of `episode` was decoded (worker thread): counted, fed back to its goal, and the
        episode ended when it reached the goal's step limit."""
        with self._lock:
            ep = self._episode
            if ep is None or ep.number != episode:
                return
            ep.steps += 1
            goal, steps, limit = ep.goal, ep.steps, ep.max_steps
        if goal is not None:
            self._soon(goal.publish_feedback, self._feedback_type(
                step=steps, mode=stats.mode, decode_ms=float(stats.latency_ms.get("total", 0.0)),
                command_latency_ms=latency_s * 1e3, commanded=commanded))  # fmt: skip
        if limit and steps >= limit:
            self._end("max_steps")

    def _new_episode(self, instruction: str, goal: Any = None, max_steps: int = 0,
                     timeout_s: float = 0.0) -> Episode:  # fmt: skip
        """A new running episode (the caller holds the lock)."""
        self._count += 1
        deadline = self._clock_s() + timeout_s if timeout_s > 0 else None
        return Episode(self._count, instruction, goal, max_steps, deadline)

    def _end(self, reason: str, success: bool | None = None, follow: str = "stop") -> bool:
        """End the running episode (if any) for `reason`; `follow` 'continue' starts the next episode
        of the same instruction (not after a goal's: its client asked for one), 'stop' leaves the
        node idle. Returns whether a next episode started."""
        with self._lock:
            old = self._episode
            if old is None:
                return False
            follow = follow if old.goal is None else "stop"
            self._episode = self._new_episode(old.instruction) if follow == "continue" else None
            if self._episode is None:
                self._idle = f"episode ended ({reason}): waiting for a new goal or instruction"
        outcome = "" if success is None else (", success" if success else ", failure")
        self._log.info(f"episode {old.number} ended after {old.steps} steps: {reason}{outcome}"
                       + ("; the next one starts" if follow == "continue" else ""))  # fmt: skip
        self._finish(old, reason, success)
        return follow == "continue"

    # ------------------------------------------------------------------ ~/run_task
    def _soon(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run `fn(*args)` on the node's executor (the action server is not thread-safe)."""
        executor = self._node.executor
        if executor is None:
            fn(*args)
        else:
            executor.create_task(fn, *args)

    def _finish(self, episode: Episode | None, reason: str, success: bool | None = None) -> None:
        """Give the episode's goal (if any) its result: executed on the executor, terminal at once."""
        if episode is None or episode.goal is None:
            return
        result = self._result_type(steps=episode.steps, success_reported=success is not None, success=bool(success),
                                   reason=reason)  # fmt: skip
        self._soon(self._resolve, bytes(episode.goal.goal_id.uuid), result)

    def _resolve(self, goal_id: bytes, result: Any) -> None:
        end = self._ends.get(goal_id)
        if end is not None and not end.done():
            end.set_result(result)

    @property
    def open_goals(self) -> int:
        """Goals accepted whose execution has not returned its result yet."""
        return len(self._ends)

    async def _execute(self, goal: Any) -> Any:
        """EXECUTING from acceptance until the episode ends; then the terminal state and the result."""
        goal_id = bytes(goal.goal_id.uuid)
        end = self._ends.get(goal_id)
        try:
            result = await end if end is not None else self._result_type(reason="unknown")
        finally:
            self._ends.pop(goal_id, None)
        finish = goal.canceled if goal.is_cancel_requested else (
            goal.succeed if result.reason in SUCCEEDED_REASONS else goal.abort)
        try:
            finish()
        except RuntimeError as err:  # rclpy's RCLError (its module is private)
            # rclpy sets the goal's state, then publishes the status array; under a burst of goals the
            # middleware can refuse that publication. The state is set and the result still goes to
            # the client; raised, it would end this coroutine with an empty result and a traceback.
            self._log.warning(f"~/run_task: the goal status was not published ({describe(err)}); the result "
                              "is sent", throttle_duration_sec=2.0)  # fmt: skip
        return result

    def _on_goal(self, request: Any) -> Any:
        from rclpy.action import GoalResponse

        why = self._goal_problem(request)
        if why:
            self._log.warning(f"~/run_task goal refused: {why}")
            return GoalResponse.REJECT
        return GoalResponse.ACCEPT

    def _goal_problem(self, request: Any) -> str:
        with self._lock:
            if not self._active:
                return "the node is not active (configure and activate it first)"
        try:
            text = check_instruction(request.instruction, self._config().input_limits)
        except InputLimitError as err:
            return str(err)
        if not text:
            return "the instruction is empty"
        if not (math.isfinite(request.timeout_s) and request.timeout_s >= 0.0):
            return f"timeout_s must be finite and >= 0, got {request.timeout_s}"
        return self._task_problem(text)

    def _on_accepted(self, goal: Any) -> None:
        """A new goal preempts the running episode, starts its own and is EXECUTING at once."""
        from rclpy.task import Future

        req = goal.request
        text = req.instruction.strip()
        timeout_s = float(req.timeout_s) or self._config().goal_timeout_s  # 0: the node's default
        self._ends[bytes(goal.goal_id.uuid)] = Future()
        with self._lock:
            if not self._active:  # deactivated between the goal's check and its acceptance
                inactive = Episode(0, text, goal, 0, None)
            else:
                inactive = None
                old = self._episode
                self._episode = self._new_episode(text, goal, int(req.max_steps), timeout_s)
        goal.execute()
        if inactive is not None:
            self._log.warning(f"~/run_task goal {quote(text)} ended at once: the node is not active")
            self._finish(inactive, "deactivated")
            return
        limits = (f"{req.max_steps} steps" if req.max_steps else "no step limit") + f", {timeout_s:g} s" + (
            "" if req.timeout_s > 0 else " (goal_timeout_s)")  # fmt: skip
        self._log.info(f"~/run_task goal: {quote(text)} ({limits})")
        self._finish(old, "preempted")

    def _on_cancel(self, goal: Any) -> Any:
        """Accept every cancel: the goal's commands stop here, before the cancel is answered."""
        from rclpy.action import CancelResponse

        with self._lock:
            ours = self._episode is not None and self._episode.goal == goal
        if ours:
            self._end("canceled")
        return CancelResponse.ACCEPT

    # ------------------------------------------------------------------ services
    def _on_reset(self, request: Any, response: Any) -> Any:
        running = self.current() is not None
        started = self._end("reset", follow=self._config().after_episode)
        response.success = True
        if not running:
            response.message = "no episode was running"
        else:
            response.message = ("episode ended; the next one started" if started
                                else "episode ended; waiting for a new goal or instruction")  # fmt: skip
        return response
