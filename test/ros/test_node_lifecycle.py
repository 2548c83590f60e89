"""The policy node as a managed node on an arm: lifecycle transitions, the command gate
(command_enabled, deactivate), the ~/run_task action, ~/reset and the instruction's QoS.

Real rclpy (one process, its own ROS domain) with the scripted decoder of conftest.py; the warm-up
is also checked on the real untrained tiny policy.
"""

from __future__ import annotations

import threading
import time

import pytest
from lifecycle_msgs.msg import State, Transition
from lifecycle_msgs.srv import ChangeState, GetState
from rclpy.lifecycle import TransitionCallbackReturn
from rclpy.parameter import Parameter
from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy
from std_msgs.msg import Bool, String
from std_srvs.srv import Trigger

from heisd_ros.core.errors import ModelLoadError
from heisd_ros.ros.lifecycle import WARMUP_INSTRUCTION
from heisd_ros.ros.node import PolicyNode

msg_mod = pytest.importorskip("heisd_ros.msg", reason="interfaces not built (make setup)")
from heisd_ros.action import RunTask

DOMAIN_ID = 63
TASK = "pick up the red bowl"
GOAL_STATUS = {"succeeded": 4, "canceled": 5, "aborted": 6}  # action_msgs/GoalStatus


@pytest.fixture(scope="module")
def rig(node_rig):
    return node_rig


class Stream:
    """Publishes a synchronised set every `period_s` on a thread until stopped."""

    def __init__(self, rig, period_s: float = 0.02) -> None:
        self.rig, self.period_s = rig, period_s
        self.running = True
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while self.running:
            self.rig.publish_set()
            time.sleep(self.period_s)

    def stop(self) -> None:
        self.running = False
        self.thread.join(2.0)


def _state(rig) -> str:
    return rig.call("get_state", GetState.Request()).current_state.label


def _change(rig, transition: int) -> bool:
    return rig.call("change_state", ChangeState.Request(transition=Transition(id=transition)), 10.0).success


def _send_goal(rig, instruction: str, max_steps: int = 0, timeout_s: float = 0.0):
    """(accepted client goal handle or None, its feedback list)."""
    client = rig.clients["run_task"]
    assert client.wait_for_server(timeout_sec=5.0), "no ~/run_task server"
    feedback: list = []
    future = client.send_goal_async(RunTask.Goal(instruction=instruction, max_steps=max_steps, timeout_s=timeout_s),
                                    feedback_callback=lambda m: feedback.append(m.feedback))  # fmt: skip
    assert rig.wait(future.done, 5.0), "no goal response"
    handle = future.result()
    return (handle if handle.accepted else None), feedback


def _result(rig, handle, timeout_s: float = 5.0):
    future = handle.get_result_async()
    assert rig.wait(future.done, timeout_s), "no result"
    return future.result()


# --- lifecycle ---------------------------------------------------------------------------------


def test_autostart_false_stays_unconfigured_until_configured_and_activated(rig):
    policy = rig.start(autostart=False)
    try:
        assert _state(rig) == "unconfigured"
        assert rig.decoder.resets == [] and policy._session is None
        assert rig.node.count_subscribers("ee_pose") == 0  # inputs are subscribed at configure
        assert _change(rig, Transition.TRANSITION_CONFIGURE) and _state(rig) == "inactive"
        rig.wait_discovery()
        rig.instruct(TASK)  # held while inactive
        n_stats = len(rig.stats)
        rig.publish_set()
        time.sleep(0.3)
        assert len(rig.stats) == n_stats and not rig.commands[n_stats:], "an inactive node decoded"
        assert _change(rig, Transition.TRANSITION_ACTIVATE) and _state(rig) == "active"
        assert rig.acted(rig.publish_set())
    finally:
        rig.stop()


def test_the_lifecycle_interface_answers_as_rclpys_does(rig):
    """The node's own lifecycle services (deep queues): the transitions a state offers, the whole
    graph, transitions by label, and (rcl's) TransitionEvent for each state change."""
    from lifecycle_msgs.msg import TransitionEvent
    from lifecycle_msgs.srv import GetAvailableStates, GetAvailableTransitions

    policy = rig.start(autostart=False)
    name = policy.get_name()
    events = []
    rig.on_executor(lambda: rig.node.create_subscription(TransitionEvent, f"/{name}/transition_event", events.append, 10))
    clients = {}
    rig.on_executor(lambda: clients.update(
        available=rig.node.create_client(GetAvailableTransitions, f"/{name}/get_available_transitions"),
        graph=rig.node.create_client(GetAvailableTransitions, f"/{name}/get_transition_graph"),
        states=rig.node.create_client(GetAvailableStates, f"/{name}/get_available_states")))
    try:
        for c in clients.values():
            assert c.wait_for_service(timeout_sec=5.0)
        assert rig.wait(lambda: rig.node.count_publishers(f"/{name}/transition_event") > 0, 5.0)
        time.sleep(0.5)  # the subscription matched on both ends

        def ask(key, request):
            fut = clients[key].call_async(request)
            assert rig.wait(fut.done, 5.0)
            return fut.result()

        offered = ask("available", GetAvailableTransitions.Request()).available_transitions
        assert sorted(t.transition.label for t in offered) == ["configure", "shutdown"]
        assert {t.goal_state.label for t in offered} == {"inactive", "finalized"}
        assert len(ask("graph", GetAvailableTransitions.Request()).available_transitions) == 7
        assert {"unconfigured", "configuring", "active", "errorprocessing"} <= {
            s.label for s in ask("states", GetAvailableStates.Request()).available_states}
        by_label = ChangeState.Request()
        by_label.transition.label = "configure"
        assert rig.call("change_state", by_label).success and _state(rig) == "inactive"
        assert not rig.call("change_state", by_label).success  # not offered by inactive
        assert rig.wait(lambda: [(e.start_state.label, e.goal_state.label) for e in events] ==
                        [("unconfigured", "configuring"), ("configuring", "inactive")], 5.0), \
            [(e.start_state.label, e.goal_state.label) for e in events]
    finally:
        rig.stop()


@pytest.mark.parametrize("shutdown_from", ["unconfigured", "inactive", "active"])
def test_every_transition_through_the_lifecycle_services(rig, shutdown_from):
    """What `ros2 lifecycle set` does, request by request: configure, activate, deactivate, cleanup,
    configure, activate, then shutdown from each primary state; get_state answers each state."""
    T = Transition
    path = {"unconfigured": [T.TRANSITION_CONFIGURE, T.TRANSITION_ACTIVATE, T.TRANSITION_DEACTIVATE,
                             T.TRANSITION_CLEANUP, T.TRANSITION_UNCONFIGURED_SHUTDOWN],
            "inactive": [T.TRANSITION_CONFIGURE, T.TRANSITION_INACTIVE_SHUTDOWN],
            "active": [T.TRANSITION_CONFIGURE, T.TRANSITION_ACTIVATE, T.TRANSITION_ACTIVE_SHUTDOWN]}[shutdown_from]
    goal = {T.TRANSITION_CONFIGURE: "inactive", T.TRANSITION_ACTIVATE: "active", T.TRANSITION_DEACTIVATE: "inactive",
            T.TRANSITION_CLEANUP: "unconfigured", T.TRANSITION_UNCONFIGURED_SHUTDOWN: "finalized",
            T.TRANSITION_INACTIVE_SHUTDOWN: "finalized", T.TRANSITION_ACTIVE_SHUTDOWN: "finalized"}  # fmt: skip
    rig.start(autostart=False)
    try:
        assert _state(rig) == "unconfigured"
        for transition in path:
            assert _change(rig, transition), (shutdown_from, transition)
            assert _state(rig) == goal[transition], (shutdown_from, transition)
        assert not _change(rig, T.TRANSITION_CONFIGURE)  # finalized offers nothing
    finally:
        rig.stop()


def test_autostart_configures_and_activates(rig):
    rig.start()
    try:
        assert _state(rig) == "active"
        rig.instruct(TASK)
        assert rig.acted(rig.publish_set())
    finally:
        rig.stop()


def test_configure_fails_with_the_reason_for_a_bad_model_dir(rig, tmp_path, monkeypatch):
    """The real loader: a missing directory and one without a checkpoint fail configure; the node
    stays unconfigured with the reason logged and kept; with autostart the constructor raises it."""
    ours = [Parameter("model_dir", value=str(tmp_path / "missing")), Parameter("autostart", value=False),
            Parameter("decoder.method", value="ar")]  # fmt: skip
    node = PolicyNode(context=rig.ctx, node_name="bad_model_1", parameter_overrides=ours)
    try:
        assert node.trigger_configure() == TransitionCallbackReturn.FAILURE
        assert "is not a directory" in node.configure_error and str(tmp_path / "missing") in node.configure_error
        assert node.lifecycle_states.label == "unconfigured" and node._session is None
    finally:
        node.destroy_node()
    (tmp_path / "empty").mkdir()
    ours[0] = Parameter("model_dir", value=str(tmp_path / "empty"))
    with pytest.raises(ModelLoadError, match="config.json"):
        PolicyNode(context=rig.ctx, node_name="bad_model_2", parameter_overrides=ours[:1] + ours[2:])
    # "tiny" is a directory name like any other to the node: it never trains a toy policy
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ModelLoadError, match="tiny"):
        PolicyNode(context=rig.ctx, node_name="bad_model_3",
                   parameter_overrides=[Parameter("model_dir", value="tiny"), ours[2]])
    assert not (tmp_path / "artifacts").exists()


def test_no_command_after_deactivate_returns(rig):
    """Deactivate while a step is being decoded: the step still publishes its DecodeStats, but no
    actuator message is published once the transition has returned; decoding stops."""
    dec = rig.fake()
    gate = {"armed": False, "stamp": None}
    entered, release = threading.Event(), threading.Event()
    plain_step = dec.step

    def held_step(obs):  # with the gate armed, the next step waits inside the decoder until released
        if gate["armed"]:
            gate["armed"], gate["stamp"] = False, obs.stamp_s
            entered.set()
            release.wait(5.0)
        return plain_step(obs)

    dec.step = held_step
    policy = rig.start(dec, control_rate_hz=10.0, image_staleness_s=1.0, pose_staleness_s=1.0)
    published: list[float] = []
    outputs = policy._session.outputs
    original = outputs.publish_command

    def recording(*args, **kwargs):
        try:
            return original(*args, **kwargs)
        finally:
            published.append(time.monotonic())

    outputs.publish_command = recording
    stream = Stream(rig)
    try:
        rig.instruct(TASK)
        assert rig.wait(lambda: len(published) >= 2, 3.0)
        gate["armed"] = True
        assert entered.wait(3.0), "no step started"  # a step in flight, held until the transition returned
        try:
            outcome, returned = rig.on_executor(lambda: (policy.trigger_deactivate(), time.monotonic()))
        finally:
            release.set()
        assert outcome == TransitionCallbackReturn.SUCCESS
        assert rig.stats_for(gate["stamp"]), "the step in flight published no DecodeStats"
        time.sleep(0.5)
        assert all(t <= returned for t in published), "a command was published after deactivate returned"
        n_stats = len(rig.stats)
        time.sleep(0.3)
        assert len(rig.stats) == n_stats, "an inactive node decodes"
        assert policy.instruction is None  # the episode ended with the activation
        assert rig.on_executor(policy.trigger_activate) == TransitionCallbackReturn.SUCCESS
        n_cmd = len(published)
        time.sleep(0.3)
        assert len(published) == n_cmd, "re-activation resumed the old episode"
        rig.instruct(TASK)
        assert rig.wait(lambda: len(published) > n_cmd, 3.0)
    finally:
        stream.stop()
        rig.stop()


def test_cleanup_releases_everything_and_configure_loads_again(rig):
    policy = rig.start()
    try:
        dec = rig.decoder
        assert rig.on_executor(policy.trigger_deactivate) == TransitionCallbackReturn.SUCCESS
        assert rig.on_executor(policy.trigger_cleanup) == TransitionCallbackReturn.SUCCESS
        assert dec.closed and policy._session is None
        assert rig.wait(lambda: rig.node.count_publishers("arm_command") == 0
                        and rig.node.count_subscribers("ee_pose") == 0, 3.0)  # fmt: skip
        rig.decoder = rig.fake()
        assert rig.on_executor(policy.trigger_configure) == TransitionCallbackReturn.SUCCESS
        assert rig.on_executor(policy.trigger_activate) == TransitionCallbackReturn.SUCCESS
        rig.wait_discovery()
        rig.instruct(TASK)
        assert rig.acted(rig.publish_set()) and rig.decoder.steps == 1
        assert rig.on_executor(policy.trigger_shutdown) == TransitionCallbackReturn.SUCCESS
        assert policy.lifecycle_states.current == State.PRIMARY_STATE_FINALIZED and rig.decoder.closed
    finally:
        rig.stop()


def test_warm_up_decodes_synthetic_steps_then_resets(rig):
    policy = rig.start(warmup_steps=3)
    try:
        dec = rig.decoder
        assert dec.steps == 3 and dec.resets == [WARMUP_INSTRUCTION, None] and dec.feedback == []
        rig.instruct(TASK)
        assert rig.acted(rig.publish_set())
        assert dec.resets[-1] == TASK and rig.commands[-1].step_id == 1
        assert rig.wait(lambda: any("warm-up: 3 steps" in m for m in rig.policy_logs(20)), 2.0)
        assert policy.configure_error == ""
    finally:
        rig.stop()


def test_warm_up_of_the_real_policy_leaves_no_episode_state(rig, untrained_policy):
    """The tiny policy's warm-up goes through retrieval too (its calibration retrieves at every
    defined F), and leaves a cold decoder: no trajectory window, no measured source costs."""
    root = untrained_policy
    params = [Parameter(k, value=v) for k, v in {
        "model_dir": str(root / "model"), "drafter_dir": str(root / "drafter"), "db_path": str(root / "db"),
        "calibration_path": str(root / "calibration.json"), "warmup_steps": 4}.items()]  # fmt: skip
    logs_before = len(rig.logs)
    node = PolicyNode(context=rig.ctx, node_name="warm_real", parameter_overrides=params)
    try:
        dec = node._session.decoder
        assert dec.metric.window().shape[0] == 0 and dec.instruction is None and dec.f_live is None
        assert all(a.count == 0 for a in dec.source_choice.cost.values())
        assert rig.wait(lambda: any(l.name == "warm_real" and "warm-up: 4 steps" in l.msg and "retrieval" in l.msg
                                    for l in rig.logs[logs_before:]), 3.0)  # fmt: skip
    finally:
        node.destroy_node()


# --- the command gate ---------------------------------------------------------------------------


def test_a_goal_is_refused_while_inactive_and_for_an_empty_instruction(rig):
    policy = rig.start()
    try:
        handle, _ = _send_goal(rig, "   ")
        assert handle is None
        assert rig.on_executor(policy.trigger_deactivate) == TransitionCallbackReturn.SUCCESS
        handle, _ = _send_goal(rig, TASK)
        assert handle is None
    finally:
        rig.stop()


# --- ~/run_task ---------------------------------------------------------------------------------


def test_run_task_goal_feedback_and_result_at_the_step_limit(rig):
    rig.start()
    n0 = len(rig.commands)
    stream = Stream(rig)
    try:
        handle, feedback = _send_goal(rig, TASK, max_steps=3)
        assert handle is not None
        res = _result(rig, handle)
        assert res.status == GOAL_STATUS["succeeded"]
        assert (res.result.steps, res.result.reason, res.result.success_reported) == (3, "max_steps", False)
        assert rig.wait(lambda: len(feedback) == 3, 2.0)
        assert [f.step for f in feedback] == [1, 2, 3] and all(f.mode == "drafter" and f.commanded for f in feedback)
        assert all(f.command_latency_ms > 0 for f in feedback)
        assert rig.wait(lambda: len(rig.commands) == n0 + 3, 2.0)
        assert rig.decoder.resets == [TASK] and [c.step_id for c in rig.commands[n0:]] == [1, 2, 3]
        time.sleep(0.3)
        assert len(rig.commands) == n0 + 3, "the node kept commanding after the goal ended"
    finally:
        stream.stop()
        rig.stop()


def test_run_task_ends_with_the_stacks_episode_result(rig):
    policy = rig.start()
    stream = Stream(rig)
    try:
        handle, feedback = _send_goal(rig, TASK)
        assert rig.wait(lambda: len(feedback) >= 2, 3.0)
        rig.pub_result.publish(Bool(data=True))
        res = _result(rig, handle)
        assert res.status == GOAL_STATUS["succeeded"]
        assert (res.result.reason, res.result.success_reported, res.result.success) == ("episode_result", True, True)
        assert res.result.steps >= 2
        # the inference thread hands the outcome to the decoder between steps, not before the result is sent
        assert rig.wait(lambda: rig.decoder.feedback == [True], 2.0), rig.decoder.feedback
        n_cmd = len(rig.commands)
        time.sleep(0.3)
        assert len(rig.commands) == n_cmd and policy.instruction is None
    finally:
        stream.stop()
        rig.stop()


def test_cancel_stops_commanding_within_one_control_period(rig):
    period_s = 0.05
    rig.start(rig.fake(delay_s=0.03), control_rate_hz=1 / period_s)
    stream = Stream(rig)
    try:
        handle, feedback = _send_goal(rig, TASK)
        assert rig.wait(lambda: len(feedback) >= 3, 3.0)
        future = handle.cancel_goal_async()
        assert rig.wait(future.done, 2.0) and len(future.result().goals_canceling) == 1
        time.sleep(period_s)
        n_cmd = len(rig.commands)
        time.sleep(0.5)  # sets keep coming: nothing is commanded
        assert len(rig.commands) == n_cmd, "commands after the cancel"
        res = _result(rig, handle)
        assert res.status == GOAL_STATUS["canceled"] and res.result.reason == "canceled"
    finally:
        stream.stop()
        rig.stop()


def test_a_new_goal_preempts_the_running_one(rig):
    rig.start()
    stream = Stream(rig)
    try:
        first, feedback = _send_goal(rig, TASK)
        assert rig.wait(lambda: len(feedback) >= 2, 3.0)
        second, feedback2 = _send_goal(rig, "push the blue block to the left", max_steps=2)
        res = _result(rig, first)
        assert res.status == GOAL_STATUS["aborted"] and res.result.reason == "preempted"
        assert _result(rig, second).result.steps == 2
        assert rig.decoder.resets == [TASK, "push the blue block to the left"]
        # the client may take the result before the last feedback message (one per wake-up)
        assert rig.wait(lambda: [f.step for f in feedback2] == [1, 2], 2.0), [f.step for f in feedback2]
    finally:
        stream.stop()
        rig.stop()


def test_a_goal_times_out(rig):
    rig.start()
    stream = Stream(rig)
    try:
        t0 = time.monotonic()
        handle, _ = _send_goal(rig, TASK, timeout_s=1.0)
        res = _result(rig, handle)
        assert res.status == GOAL_STATUS["aborted"] and res.result.reason == "timeout" and res.result.steps > 0
        assert 0.95 < time.monotonic() - t0 < 5.0  # (t0 before the goal's round trip: a loaded machine's margin)
        n_cmd = len(rig.commands)
        time.sleep(0.3)
        assert len(rig.commands) == n_cmd
    finally:
        stream.stop()
        rig.stop()


# --- ~/reset and the instruction topic ----------------------------------------------------------


def test_reset_ends_the_episode_until_an_instruction_arrives(rig):
    policy = rig.start()
    try:
        rig.instruct(TASK)
        assert rig.acted(rig.publish_set())
        reply = rig.call("reset", Trigger.Request())
        assert reply.success and "waiting for a new goal or instruction" in reply.message
        assert policy.instruction is None and "episode ended (reset)" in policy.idle_reason
        assert not rig.acted(rig.publish_set(), 0.4)
        assert rig.call("reset", Trigger.Request()).message == "no episode was running"
        n_cmd = len(rig.commands)
        rig.instruct(TASK)  # a new episode (the newest set, if still fresh, is its first step)
        assert rig.acted(rig.publish_set())
        assert rig.decoder.resets == [TASK, TASK] and rig.commands[n_cmd].step_id == 1
    finally:
        rig.stop()


def test_a_volatile_instruction_publisher_is_heard(rig):
    """The default durability (volatile) matches the rclpy/rclcpp default publisher."""
    policy = rig.start(remaps={"instruction": "planner_instruction"})
    pub = rig.node.create_publisher(String, "planner_instruction", QoSProfile(depth=10))
    try:
        assert pub.qos_profile.durability == DurabilityPolicy.VOLATILE
        assert rig.wait(lambda: pub.get_subscription_count() == 1, 5.0), "QoS-incompatible"
        pub.publish(String(data=TASK))
        assert rig.wait(lambda: policy.instruction == TASK, 2.0)
        assert rig.acted(rig.publish_set())
    finally:
        rig.on_executor(lambda: rig.node.destroy_publisher(pub))
        rig.stop()


def test_transient_local_durability_hears_a_latched_instruction_sent_before_start(rig):
    latched = QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE, durability=DurabilityPolicy.TRANSIENT_LOCAL)
    pub = rig.node.create_publisher(String, "latched_instruction", latched)
    pub.publish(String(data=TASK))
    try:
        policy = rig.start(remaps={"instruction": "latched_instruction"}, instruction_durability="transient_local")
        assert rig.wait(lambda: policy.instruction == TASK, 3.0)
        rig.stop()
        policy = rig.start(remaps={"instruction": "latched_instruction"})  # volatile: what was sent before is not heard
        assert rig.wait(lambda: pub.get_subscription_count() == 1, 5.0)
        time.sleep(0.3)
        assert policy.instruction is None
        rig.stop()
    finally:
        rig.on_executor(lambda: rig.node.destroy_publisher(pub))
