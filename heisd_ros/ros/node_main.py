"""The `policy_node` process: one PolicyNode spun until SIGINT/SIGTERM (`heisd_ros.ros.node.main`
calls `run` with the node to make).

The loop is the process's own, not rclpy's `spin`: a signal only ends it, and shutdown then runs in
order (inputs off, goals finished, worker joined, node destroyed, context shut down). A callback
that raises is logged, not allowed to end the process.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
from typing import Any, Callable

import rclpy
from rclpy.executors import ExternalShutdownException, SingleThreadedExecutor
from rclpy.signals import SignalHandlerOptions

from heisd_ros.core.errors import HeisdError
from heisd_ros.ros.standalone_args import ros_args
from heisd_ros.ros.transport import fastdds_reader_memory
from heisd_ros.ros.worker import describe


def stop_process(proc: subprocess.Popen, timeout_s: float = 30.0) -> int:
    """End a `policy_node` started as a subprocess the way `run` expects (SIGINT: its ordered
    shutdown), killing it if it has not exited after `timeout_s`; its exit code."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
    try:
        return proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


def _on_stop_signals(handler: Callable[[int, Any], None]) -> None:
    if threading.current_thread() is threading.main_thread():  # Python allows handlers only there
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, handler)


def _spin_once(executor: Any, node: Any, timeout_s: float) -> None:
    """One executor turn; a callback's exception is logged and the node goes on. rclpy re-raises a
    callback's exception out of spin_once, and its action server's own callbacks can fail under a
    burst of goals (a status publication refused): one bad request must not end the node."""
    try:
        executor.spin_once(timeout_sec=timeout_s)
    except (ExternalShutdownException, KeyboardInterrupt):
        raise
    except Exception as err:  # noqa: BLE001 - see the docstring
        node.get_logger().warning(f"a callback failed and was skipped: {describe(err)}",
                                  throttle_duration_sec=2.0)  # fmt: skip


def run(make_node: Callable[[], Any], argv: list[str] | None = None) -> int:
    """Run the policy node until SIGINT/SIGTERM (exit 0); exit 1 with the reason when it cannot start.

    rclpy's own signal handlers are off: they shut the context down at once, under the step in
    flight and the log lines still to come. Here a signal only ends the spin loop; the node then
    stops its inputs, aborts a running goal and spins until its result is out (`finish_goals`),
    stops its worker, is destroyed, and only then is the context shut down. With autostart the node
    configures on a thread beside the (single-threaded) executor, which keeps the lifecycle services
    answering ("configuring") while the model loads."""
    argv = list(sys.argv if argv is None else ["policy_node", *argv])
    fastdds_reader_memory()  # received frames must not pin memory (heisd_ros/ros/transport.py)
    rclpy.init(args=ros_args(argv), signal_handler_options=SignalHandlerOptions.NO)
    stop = threading.Event()
    _on_stop_signals(lambda signum, frame: stop.set())
    log = rclpy.logging.get_logger("policy_node")
    try:
        node = make_node()  # after rclpy.init; with autostart it configures once the executor spins
    except HeisdError as err:
        log.fatal(f"cannot start: {type(err).__name__}: {err}")
        rclpy.try_shutdown()
        return 1
    executor = SingleThreadedExecutor()
    executor.add_node(node)
    node.autostart_in_background()
    code = 0
    try:
        while not stop.is_set() and rclpy.ok():
            _spin_once(executor, node, 0.1)  # the signal handler runs between two waits
            if node.startup_error is not None:
                err = node.startup_error
                log.fatal(f"cannot start: {type(err).__name__}: {err}")
                code = 1
                break
    except ExternalShutdownException:
        pass
    finally:
        node.get_logger().info("shutting down")
        node.wait_for_startup(60.0)
        node.finish_goals(lambda timeout_s: _spin_once(executor, node, timeout_s))
        node.close()
        executor.shutdown(timeout_sec=1.0)
        node.destroy_node()
        rclpy.try_shutdown()
    return code
