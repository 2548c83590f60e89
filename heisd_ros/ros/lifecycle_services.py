"""The policy node's lifecycle interface (lifecycle_msgs), on rclpy's public API, answering every request.

rclpy's LifecycleNodeMixin creates ~/change_state, ~/get_state, ... with rcl's default service
queue (10 requests: a burst of 150 got 30 answers) and logs a transition the current state does not
offer as an ERROR of the node. The node is created with `enable_communication_interface=False` and
holds a `LifecycleInterface`: the same services, with `request_queue_depth` queues, driven by the
public `trigger_*` methods (rcl's state machine still publishes ~/transition_event). It keeps the state the
node is in (`LifecycleStates`, the standard managed-node machine of design.ros2.org/articles/
node_lifecycle.html): rclpy keeps its own only behind private attributes. A request for a
transition the state does not offer, or one made while another transition runs (configure loads
the model for seconds), is refused at once with a warning naming the state and what it offers.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

from lifecycle_msgs.msg import State, Transition, TransitionDescription
from lifecycle_msgs.srv import ChangeState, GetAvailableStates, GetAvailableTransitions, GetState

PRIMARY = {State.PRIMARY_STATE_UNCONFIGURED: "unconfigured", State.PRIMARY_STATE_INACTIVE: "inactive",
           State.PRIMARY_STATE_ACTIVE: "active", State.PRIMARY_STATE_FINALIZED: "finalized"}  # fmt: skip
TRANSITION_STATES = {State.TRANSITION_STATE_CONFIGURING: "configuring", State.TRANSITION_STATE_CLEANINGUP: "cleaningup",
                     State.TRANSITION_STATE_SHUTTINGDOWN: "shuttingdown", State.TRANSITION_STATE_ACTIVATING: "activating",
                     State.TRANSITION_STATE_DEACTIVATING: "deactivating",
                     State.TRANSITION_STATE_ERRORPROCESSING: "errorprocessing"}  # fmt: skip
LABELS = {State.PRIMARY_STATE_UNKNOWN: "unknown", **PRIMARY, **TRANSITION_STATES}
# transition id -> (label, start state, transition state, goal state on success); a failure returns
# to the start state, an error goes through errorprocessing to unconfigured (the node's on_error)
TRANSITIONS = {
    Transition.TRANSITION_CONFIGURE: ("configure", State.PRIMARY_STATE_UNCONFIGURED, State.TRANSITION_STATE_CONFIGURING,
                                      State.PRIMARY_STATE_INACTIVE),
    Transition.TRANSITION_CLEANUP: ("cleanup", State.PRIMARY_STATE_INACTIVE, State.TRANSITION_STATE_CLEANINGUP,
                                    State.PRIMARY_STATE_UNCONFIGURED),
    Transition.TRANSITION_ACTIVATE: ("activate", State.PRIMARY_STATE_INACTIVE, State.TRANSITION_STATE_ACTIVATING,
                                     State.PRIMARY_STATE_ACTIVE),
    Transition.TRANSITION_DEACTIVATE: ("deactivate", State.PRIMARY_STATE_ACTIVE, State.TRANSITION_STATE_DEACTIVATING,
                                       State.PRIMARY_STATE_INACTIVE),
    Transition.TRANSITION_UNCONFIGURED_SHUTDOWN: ("shutdown", State.PRIMARY_STATE_UNCONFIGURED,
                                                  State.TRANSITION_STATE_SHUTTINGDOWN, State.PRIMARY_STATE_FINALIZED),
    Transition.TRANSITION_INACTIVE_SHUTDOWN: ("shutdown", State.PRIMARY_STATE_INACTIVE,
                                              State.TRANSITION_STATE_SHUTTINGDOWN, State.PRIMARY_STATE_FINALIZED),
    Transition.TRANSITION_ACTIVE_SHUTDOWN: ("shutdown", State.PRIMARY_STATE_ACTIVE, State.TRANSITION_STATE_SHUTTINGDOWN,
                                            State.PRIMARY_STATE_FINALIZED),
}  # fmt: skip
SUCCESS, FAILURE, ERROR = "success", "failure", "error"
"""Outcomes of a transition's callback (TransitionCallbackReturn's labels)."""


def _state(state_id: int) -> State:
    return State(id=state_id, label=LABELS[state_id])


class LifecycleStates:
    """The node's lifecycle state and the transitions it offers; `run` carries one transition
    through its transition state, one at a time. Thread-safe; ROS-free apart from the message ids."""

    def __init__(self) -> None:
        self.current = State.PRIMARY_STATE_UNCONFIGURED
        self._busy = threading.Lock()

    @property
    def label(self) -> str:
        return LABELS[self.current]

    def offered(self) -> dict[int, str]:
        """Transition id -> label of the transitions the current state offers."""
        return {t: spec[0] for t, spec in TRANSITIONS.items() if spec[1] == self.current}

    def by_label(self, label: str) -> int | None:
        return next((t for t, name in self.offered().items() if name == label), None)

    def refusal(self, transition_id: int) -> str:
        """Why `transition_id` cannot start now ('' = it can)."""
        offered = self.offered()
        if transition_id not in offered:
            return (f"lifecycle request refused: transition {transition_id} is not available from state "
                    f"'{self.label}' (available: {', '.join(offered.values()) or 'none'})")  # fmt: skip
        return ""

    def run(self, transition_id: int, callback: Callable[[], str]) -> str:
        """Take `transition_id`: the transition state while `callback()` runs, then the goal state
        (SUCCESS), the start state (FAILURE) or, through errorprocessing, unconfigured (ERROR).
        Returns the outcome, or '' when refused (`refusal`, or another transition is running)."""
        if not self._busy.acquire(blocking=False):
            return ""
        try:
            if self.refusal(transition_id):
                return ""
            _, start, middle, goal = TRANSITIONS[transition_id]
            self.current = middle
            outcome = callback()
            self.current = {SUCCESS: goal, FAILURE: start}.get(outcome, State.PRIMARY_STATE_UNCONFIGURED)
            return outcome
        finally:
            self._busy.release()

    @property
    def transition_running(self) -> bool:
        return self._busy.locked()


class LifecycleInterface:
    """~/change_state, ~/get_state, ~/get_available_states, ~/get_available_transitions and
    ~/get_transition_graph of `node`; `trigger(transition_id)` takes a transition (returning whether
    it succeeded); requests queue as `qos` says."""

    def __init__(self, node: Any, states: LifecycleStates, trigger: Callable[[int], bool], qos: Any) -> None:
        self._node, self._states, self._trigger = node, states, trigger
        specs = ((ChangeState, "change_state", self._change_state), (GetState, "get_state", self._get_state),
                 (GetAvailableStates, "get_available_states", self._available_states),
                 (GetAvailableTransitions, "get_available_transitions", self._available_transitions),
                 (GetAvailableTransitions, "get_transition_graph", self._transition_graph))  # fmt: skip
        self.services = [node.create_service(srv, f"~/{name}", cb, qos_profile=qos) for srv, name, cb in specs]

    def _change_state(self, request: Any, response: Any) -> Any:
        transition_id = request.transition.id
        if request.transition.label:
            transition_id = self._states.by_label(request.transition.label)
            if transition_id is None:
                self._node.get_logger().warning(
                    f"lifecycle request refused: no transition {request.transition.label[:64]!r} from state "
                    f"'{self._states.label}' (available: {', '.join(self._states.offered().values()) or 'none'})")
                response.success = False
                return response
        response.success = self._trigger(transition_id)
        return response

    def _get_state(self, request: Any, response: Any) -> Any:
        response.current_state = _state(self._states.current)
        return response

    def _available_states(self, request: Any, response: Any) -> Any:
        response.available_states = [_state(s) for s in LABELS if s != State.PRIMARY_STATE_UNKNOWN]
        return response

    @staticmethod
    def _description(transition_id: int) -> TransitionDescription:
        label, start, _, goal = TRANSITIONS[transition_id]
        return TransitionDescription(transition=Transition(id=transition_id, label=label),
                                     start_state=_state(start), goal_state=_state(goal))  # fmt: skip

    def _available_transitions(self, request: Any, response: Any) -> Any:
        response.available_transitions = [self._description(t) for t in self._states.offered()]
        return response

    def _transition_graph(self, request: Any, response: Any) -> Any:
        response.available_transitions = [self._description(t) for t in TRANSITIONS]
        return response
