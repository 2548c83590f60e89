"""What one configure of the policy node creates around its loaded decoder, released by one `close()`.

The node holds a `Session` between configure and cleanup (None otherwise): the synchroniser and the
newest finger gap (under `inputs_lock`), the outputs, the step runner and its inference thread, the
diagnostics timer, the subscriptions and publishers made for it, and, while active, the control
timer. Callbacks that find no session (cleanup has begun, possibly on another thread) do nothing.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from heisd_ros.core.model_api import Decoder
from heisd_ros.ros.outputs import CommandOutputs
from heisd_ros.ros.shadow import ShadowRunner
from heisd_ros.ros.step import StepRunner
from heisd_ros.ros.sync import ApproxTimeSync
from heisd_ros.ros.watchdog import Watchdog
from heisd_ros.ros.worker import InferenceWorker


@dataclass
class Session:
    """The resources of one configured node (see the module docstring)."""

    node: Any
    decoder: Decoder
    sync: ApproxTimeSync
    inputs_lock: threading.Lock
    watchdog: Watchdog = field(default_factory=Watchdog)
    gap: tuple[float, float] | None = None
    """(header stamp s, finger gap m) of the newest joint_states with both finger joints."""
    outputs: CommandOutputs | None = None
    diagnostics_pub: Any = None
    runner: StepRunner | None = None
    shadow: ShadowRunner | None = None
    """Shadow mode's runner (held by `runner`, read here for /diagnostics); None when it is off."""
    worker: InferenceWorker | None = None
    diagnostics_timer: Any = None
    control_timer: Any = None
    publishers: list = field(default_factory=list)
    subscriptions: list = field(default_factory=list)

    @property
    def reads_gap(self) -> bool:
        return self.decoder.inputs.reads_finger_gap

    def start_control(self, period_s: float, callback: Any) -> None:
        if self.control_timer is None:
            self.control_timer = self.node.create_timer(period_s, callback)

    def stop_control(self) -> None:
        timer, self.control_timer = self.control_timer, None
        if timer is not None:
            self.node.destroy_timer(timer)

    def stop_inputs(self) -> None:
        """No new step: the control timer and the input subscriptions go (shutdown's first act, so
        the executor's turns serve the goals' results, not camera frames)."""
        self.stop_control()
        for sub in self.subscriptions:
            self.node.destroy_subscription(sub)
        self.subscriptions = []

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop commanding and the inference thread (the step in progress finishes without
        publishing), joining it. Idempotent."""
        if self.outputs is not None:
            self.outputs.close()
        if self.worker is not None:
            self.worker.stop(timeout_s)

    def close(self, close_decoder: Any) -> None:
        """Release everything: timers and subscriptions first (no callback starts a step), then the
        worker, the decoder (`close_decoder(decoder)`, once no worker can use it: the embedded
        database's file lock is freed) and the publishers."""
        self.stop_inputs()
        timer, self.diagnostics_timer = self.diagnostics_timer, None
        if timer is not None:
            self.node.destroy_timer(timer)
        self.stop()
        if self.worker is None or not self.worker.alive:
            close_decoder(self.decoder)
        for pub in self.publishers:
            self.node.destroy_publisher(pub)
        self.publishers = []
