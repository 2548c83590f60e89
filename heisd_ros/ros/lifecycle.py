"""The policy node as a managed (lifecycle) node: what each transition does, and the warm-up.

    unconfigured --configure--> inactive --activate--> active --deactivate--> inactive --cleanup--> unconfigured

- configure: load and check the model, drafter, database and calibration (`load_decoder`), decode
  `warmup_steps` steps of a synthetic observation and reset the decoder (`warm_up`), then create the
  subscriptions, publishers, the inference thread and the diagnostics timer. A failure leaves the
  node unconfigured, with the reason logged (and kept in `configure_error`).
- activate: start the control timer and open the command gate (task_control.TaskControl).
- deactivate: close the gate first (no command follows once the transition has returned; a step in
  flight still publishes its DecodeStats) and end the episode, then stop the control timer.
- cleanup / shutdown: release everything configure created; the decoder's database is closed, so its
  file lock is free for the next configure.
"""

from __future__ import annotations

import ctypes
import gc
import threading
import time
from typing import Any, Callable

import numpy as np
from lifecycle_msgs.msg import Transition
from rclpy.lifecycle import LifecycleNodeMixin, LifecycleState, TransitionCallbackReturn

from heisd_ros.core.errors import HeisdError, ModelLoadError
from heisd_ros.core.model_api import Decoder
from heisd_ros.core.shadow import ShadowDecoder
from heisd_ros.core.types import Observation
from heisd_ros.ros.input_limits import model_input
from heisd_ros.ros.lifecycle_services import ERROR as ERROR_OUTCOME
from heisd_ros.ros.lifecycle_services import FAILURE, SUCCESS
from heisd_ros.ros.params import PolicyNodeConfig
from heisd_ros.ros.shadow import LoadedPolicy, shadow_decoder_config
from heisd_ros.ros.worker import describe

OUTCOMES = {TransitionCallbackReturn.SUCCESS.value: SUCCESS, TransitionCallbackReturn.FAILURE.value: FAILURE}
"""TransitionCallbackReturn -> the outcome lifecycle_services counts (anything else is an error)."""
RCLPY_TRIGGERS = {Transition.TRANSITION_CONFIGURE: LifecycleNodeMixin.trigger_configure,
                  Transition.TRANSITION_CLEANUP: LifecycleNodeMixin.trigger_cleanup,
                  Transition.TRANSITION_ACTIVATE: LifecycleNodeMixin.trigger_activate,
                  Transition.TRANSITION_DEACTIVATE: LifecycleNodeMixin.trigger_deactivate,
                  **dict.fromkeys((Transition.TRANSITION_UNCONFIGURED_SHUTDOWN, Transition.TRANSITION_INACTIVE_SHUTDOWN,
                                   Transition.TRANSITION_ACTIVE_SHUTDOWN), LifecycleNodeMixin.trigger_shutdown)}
"""rclpy's public trigger of each transition (it runs the node's on_* callback)."""
WARMUP_INSTRUCTION = "pick up the object"
"""The warm-up's instruction when the node names no task and the database lists none."""
WARMUP_STEP_M = 0.1
"""End-effector displacement per warm-up step, m: a straight path with a large displacement, which
the kinematic boundary sends to retrieval under the usual calibrations (docs/design.md §5), so the
retrieval path is warmed as well as the drafter's."""


def policy_paths(cfg: PolicyNodeConfig):
    """The files the node's parameters name (heisd_ros.policy.PolicyPaths)."""
    from heisd_ros.policy import PolicyPaths

    n = cfg.node
    return PolicyPaths(model_dir=n.model_dir, drafter_dir=n.drafter_dir, db_path=n.db_path,
                       calibration_path=n.calibration_path)  # fmt: skip


def load_decoder(cfg: PolicyNodeConfig) -> Decoder:
    """The HybridDecoder of a resolved configuration (heisd_ros.ros.decoder_params.resolve), read only from the
    directories the parameters name."""
    from heisd_ros.policy import build_policy

    _check_model_dir(cfg)
    return build_policy(policy_paths(cfg), cfg.decoder, cfg.store, torch_threads=cfg.node.torch_threads)


def load_node_policy(cfg: PolicyNodeConfig) -> LoadedPolicy:
    """What configure loads (the node's default factory): `load_decoder`'s decoder and, in shadow mode
    (`shadow.method`), its shadow over the same model, drafter and database."""
    from heisd_ros.assembly import assemble_decoders, assemble_shadow
    from heisd_ros.policy import load_parts, resolve_decoder_config, set_torch_threads

    n = cfg.node
    if not n.shadow.method:
        return LoadedPolicy(load_decoder(cfg))
    _check_model_dir(cfg)
    set_torch_threads(n.torch_threads)
    paths = policy_paths(cfg)
    shadow_cfg = resolve_decoder_config(shadow_decoder_config(cfg.decoder, n.shadow), paths, cfg.store)
    # the store sized by the shadow's query views (the method that retrieves), the model as both run it
    parts = load_parts(paths, shadow_cfg, [shadow_cfg.method, cfg.decoder.method], cfg.store)
    # the executing decoder holds the database too, never querying it: its health checks and its
    # close (the file lock) cover the shadow's
    return LoadedPolicy(assemble_decoders(parts, {"run": cfg.decoder})["run"], assemble_shadow(parts, shadow_cfg))


def _check_model_dir(cfg: PolicyNodeConfig) -> None:
    from pathlib import Path

    if not Path(cfg.node.model_dir).is_dir():
        raise ModelLoadError(f"model_dir {cfg.node.model_dir!r} is not a directory: the node loads the policy's "
                             "checkpoint directory it is given")  # fmt: skip


def _warmup_instruction(decoder: Decoder, cfg: PolicyNodeConfig) -> str:
    """The node's task, else the first task of the decoder's database, else a generic instruction."""
    if cfg.node.task:
        return cfg.node.task
    tasks = decoder.known_tasks()
    return tasks[0] if tasks else WARMUP_INSTRUCTION


def warmup_observations(decoder: Decoder, cfg: PolicyNodeConfig, steps: int) -> list[Observation]:
    """`steps` synthetic observations: mid-grey frames of the model's input size (else the node's
    expected size) for every view, an end effector moving `WARMUP_STEP_M` per step along x, the
    finger gap half open."""
    hw = model_input(decoder).image_hw or cfg.node.expected_hw
    frame = np.full((*hw, 3), 128, dtype=np.uint8)
    instruction = _warmup_instruction(decoder, cfg)
    gap = 0.04 if decoder.inputs.reads_finger_gap else None
    return [Observation(images={v: frame.copy() for v in cfg.decoder.views}, instruction=instruction,
                        ee_pos=np.array([0.4 + WARMUP_STEP_M * k, 0.0, 0.3]), task=cfg.node.task or None,
                        stamp_s=k * cfg.node.control_period_s, gripper_gap=gap)
            for k in range(steps)]  # fmt: skip


def warm_up(decoder: Decoder, cfg: PolicyNodeConfig, shadow: ShadowDecoder | None = None) -> tuple[str, float]:
    """Decode `warmup_steps` synthetic steps (each shadowed too, in shadow mode), then reset the
    decoder: its episode state (trajectory window, verify-skip run, the source choice's measured step
    costs) is cleared, so the warm-up never biases the first episode (a cold retrieval measured
    against a warm drafter would keep heisd on the drafter). Returns a summary for the log and the
    last warm-up shadow's duration, s (0 without one: shadow mode's first estimate); raises the
    decoder's HeisdError."""
    decoder.prepare_vision()  # the backbone's graphs, whatever the steps below reach
    steps = cfg.node.warmup_steps
    if steps <= 0:
        return "no warm-up (warmup_steps 0)", 0.0
    if not (model_input(decoder).image_hw or cfg.node.expected_hw):
        return "no warm-up: neither the model nor expected_image_height/width gives the frame size", 0.0
    observations = warmup_observations(decoder, cfg, steps)
    t0 = time.monotonic()
    modes, step_ms, shadow_s = [], [], 0.0
    decoder.reset(observations[0].instruction)
    try:
        for obs in observations:
            t = time.monotonic()
            _, stats = decoder.step(obs)
            step_ms.append((time.monotonic() - t) * 1e3)
            modes.append(str(getattr(stats, "mode", "")))
            if shadow is not None:
                t = time.monotonic()
                shadow.shadow(obs, stats.tokens, decoder.f_live)
                shadow_s = time.monotonic() - t
    finally:
        decoder.reset(None)
        if shadow is not None:
            shadow.reset(None)
    total_s = time.monotonic() - t0
    return (f"warm-up: {steps} steps in {total_s:.2f} s (first {step_ms[0]:.0f} ms, last {step_ms[-1]:.0f} ms), "
            f"modes {modes}{f', last shadow {shadow_s * 1e3:.0f} ms' if shadow is not None else ''}; decoder reset",
            shadow_s)  # fmt: skip


class ManagedPolicy:
    """The transitions of PolicyNode (a mixin before rclpy's LifecycleNode): they call the node's
    `_open_session` / `_close_session` (its `Session`, configure's resources) and its TaskControl `_task`;
    and the two ends of the process: autostart (`start`, or `autostart_in_background`) and the
    shutdown that finishes the goals (`finish_goals`)."""

    configure_error: str = ""
    """Why the last configure failed ('' after a successful one)."""
    _configure_exception: BaseException | None = None
    startup_error: BaseException | None = None
    """Why an autostart run beside the executor failed (the process exits 1 with it); None otherwise."""

    # The transitions, through rclpy's public trigger_* (which run the on_* callbacks below), one
    # at a time, with the state kept in `lifecycle_states` for the node's own lifecycle services.
    def trigger_configure(self) -> TransitionCallbackReturn:
        return self._take(Transition.TRANSITION_CONFIGURE)

    def trigger_cleanup(self) -> TransitionCallbackReturn:
        return self._take(Transition.TRANSITION_CLEANUP)

    def trigger_activate(self) -> TransitionCallbackReturn:
        return self._take(Transition.TRANSITION_ACTIVATE)

    def trigger_deactivate(self) -> TransitionCallbackReturn:
        return self._take(Transition.TRANSITION_DEACTIVATE)

    def trigger_shutdown(self) -> TransitionCallbackReturn:
        by_state = {"unconfigured": Transition.TRANSITION_UNCONFIGURED_SHUTDOWN,
                    "inactive": Transition.TRANSITION_INACTIVE_SHUTDOWN}  # fmt: skip
        return self._take(by_state.get(self.lifecycle_states.label, Transition.TRANSITION_ACTIVE_SHUTDOWN))

    def _on_change_state(self, transition_id: int) -> bool:
        """~/change_state: whether the transition was taken and succeeded."""
        if transition_id not in RCLPY_TRIGGERS:
            self.get_logger().warning(f"lifecycle request refused: unknown transition {transition_id}")
            return False
        return self._take(transition_id) == TransitionCallbackReturn.SUCCESS

    def _take(self, transition_id: int) -> TransitionCallbackReturn:
        """A refused request (not offered by the state, or another transition running) is a warning
        with the reason and ERROR, the caller's mistake rather than a fault of the node."""
        states = self.lifecycle_states
        code: list = [TransitionCallbackReturn.ERROR]

        def callback() -> str:
            code[0] = RCLPY_TRIGGERS[transition_id](self)
            return OUTCOMES.get(code[0].value, ERROR_OUTCOME)

        why = states.refusal(transition_id) or (
            f"lifecycle request refused: a transition is running (state '{states.label}')" if states.transition_running else "")
        if why or not states.run(transition_id, callback):
            self.get_logger().warning(why or f"lifecycle request refused: a transition is running (state '{states.label}')")
            return TransitionCallbackReturn.ERROR
        return code[0]

    def on_configure(self, state: LifecycleState) -> TransitionCallbackReturn:
        n = self.cfg.node
        t0 = time.monotonic()
        self.get_logger().info(f"configuring: method={self.cfg.decoder.method} model_dir={n.model_dir!r}")
        decoder = None
        try:
            run_cfg = self._resolved()
            loaded = self._decoder_factory(run_cfg)
            loaded = loaded if isinstance(loaded, LoadedPolicy) else LoadedPolicy(loaded)
            decoder = loaded.decoder
            summary, shadow_s = warm_up(decoder, run_cfg, loaded.shadow)
            self._run_with(run_cfg, log=True)
            self._open_session(decoder, loaded.shadow, shadow_s)
        except HeisdError as err:
            return self._configure_failed(f"{type(err).__name__}: {err}", decoder, err, TransitionCallbackReturn.FAILURE)
        except Exception as err:  # noqa: BLE001 - rclpy would turn it into ERROR without the reason
            return self._configure_failed(describe(err), decoder, err, TransitionCallbackReturn.ERROR)
        self.configure_error, self._configure_exception = "", None
        self.get_logger().info(f"configured in {time.monotonic() - t0:.1f} s; {summary}")
        return TransitionCallbackReturn.SUCCESS

    def _configure_failed(self, reason: str, decoder: Any, err: BaseException, code: Any) -> Any:
        self.configure_error, self._configure_exception = reason, err
        self.get_logger().error(f"configure failed: {reason}")
        if self._session is not None:
            self._close_session()  # the decoder with it
        elif decoder is not None:  # loaded, but no session took it (a failed warm-up or session)
            close_decoder(decoder, self.get_logger())
        return code

    def on_activate(self, state: LifecycleState) -> TransitionCallbackReturn:
        self._session.start_control(self.cfg.node.control_period_s, self._on_tick)
        self._task.activate()
        self.get_logger().info(f"active: {self._task.commanding}")
        return super().on_activate(state)

    def on_deactivate(self, state: LifecycleState) -> TransitionCallbackReturn:
        self._task.deactivate()  # first: no command once this transition has returned
        self._stop_control_timer()
        self.get_logger().info("inactive: decoding and commanding stopped")
        return super().on_deactivate(state)

    def on_cleanup(self, state: LifecycleState) -> TransitionCallbackReturn:
        self._close_session()
        _return_freed_memory()
        self.get_logger().info("cleaned up: model and database released")
        return TransitionCallbackReturn.SUCCESS

    def on_shutdown(self, state: LifecycleState) -> TransitionCallbackReturn:
        self._teardown("shutdown")
        return TransitionCallbackReturn.SUCCESS

    def on_error(self, state: LifecycleState) -> TransitionCallbackReturn:
        self._teardown("error")
        return TransitionCallbackReturn.SUCCESS  # back to unconfigured

    def _teardown(self, reason: str) -> None:
        """Gate closed first (the running episode ends for `reason`), then the timer and the session."""
        self._task.deactivate(reason)
        self._stop_control_timer()
        self._close_session()

    def _stop_control_timer(self) -> None:
        if self._session is not None:
            self._session.stop_control()

    def start(self) -> None:
        """Configure and activate (autostart). Raises the configure failure (its HeisdError, or a
        HeisdError naming another exception) with the reason."""
        if self.trigger_configure() != TransitionCallbackReturn.SUCCESS:
            err = self._configure_exception
            if isinstance(err, HeisdError):
                raise err
            raise HeisdError(f"configure failed: {self.configure_error or 'see the log'}") from err
        if self.trigger_activate() != TransitionCallbackReturn.SUCCESS:
            raise HeisdError("activate failed; see the log")

    def autostart_in_background(self) -> bool:
        """Configure and activate once, on a thread of its own beside the spinning executor, which
        meanwhile answers get_state ("configuring") and every other request; a failure is kept in
        `startup_error`. A thread, not a callback: a multi-threaded rclpy executor would be needed to
        serve requests during a callback that loads a model, and its dispatch loop, run for every
        camera frame, starves the inference thread of the interpreter (0 commands under a 200 Hz
        compressed-image flood, docs/reliability.md). Returns whether an autostart was started."""
        if not self._autostart_pending:
            return False
        self._autostart_pending = False
        self._autostarting.set()  # before the thread runs: a shutdown now waits for it (wait_for_startup)
        threading.Thread(target=self._run_autostart, name="heisd-autostart", daemon=True).start()
        return True

    def _run_autostart(self) -> None:
        try:
            self.start()
        except HeisdError as err:
            self.startup_error = err
        except Exception as err:  # noqa: BLE001 - the process exits 1 with it instead of a silent thread
            self.startup_error = HeisdError(f"configure failed: {describe(err)}")
        finally:
            self._autostarting.clear()

    def wait_for_startup(self, timeout_s: float) -> None:
        """Let an autostart in progress (`autostart_in_background`) finish before the node is torn down
        (a signal while the model loads); at most `timeout_s`."""
        end = time.monotonic() + timeout_s
        while self._autostarting.is_set() and time.monotonic() < end:
            time.sleep(0.05)

    def finish_goals(self, spin_once: Callable[[float], None], reason: str = "shutdown", timeout_s: float = 1.0) -> bool:
        """Shutdown's first part: no new step (inputs and control timer gone), the running episode
        ended (its goal ABORTED with `reason`), then `spin_once(timeout)` until every goal's result
        is out, at most `timeout_s`. Returns whether none was left open."""
        if self._session is not None:
            self._session.stop_inputs()
        self._task.deactivate(reason)
        end = time.monotonic() + timeout_s
        while self._task.open_goals and time.monotonic() < end:
            spin_once(0.01)
        for _ in range(10):  # a result's response to a waiting client is a done callback: a few turns more
            spin_once(0.005)
        return self._task.open_goals == 0


def close_decoder(decoder: Decoder, logger: Any) -> None:
    """Release a decoder's resources (the embedded database holds a file lock); a failure is a warning."""
    try:
        decoder.close()
    except HeisdError as err:
        logger.warning(f"closing the decoder: {err}")


def _return_freed_memory() -> None:
    """Hand a released model's memory back to the OS. glibc keeps freed heap pages in its arenas
    (and, once a large block has been freed, serves later large blocks from them), so without a
    trim a cleaned-up node stays as large as the first model made it; the next configure then
    adds its own model on top. No-op where the C library has no `malloc_trim` (not glibc)."""
    gc.collect()  # the decoder's reference cycles, before their memory is trimmed
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return
    trim(0)
