"""What the node gives back and how much it says: every numeric parameter refuses non-finite values,
a refused lifecycle request is a warning, no log line exceeds 1 kB whatever the input, and
configure/cleanup cycles with the real mini policy leave memory where the first configure put it."""

from __future__ import annotations

import gc
import math
from pathlib import Path

import numpy as np
import pytest
from rclpy.parameter import Parameter

from heisd_ros.core.errors import ConfigError
from heisd_ros.ros.params import build_config, param_specs

msg_mod = pytest.importorskip("heisd_ros.msg", reason="interfaces not built (make setup)")

DOMAIN_ID = 99
REPO = Path(__file__).resolve().parents[2]
NUMERIC = [s for s in param_specs() if s.kind in ("float", "int", "float_array", "int_array")]


def _value(spec, v):
    if spec.kind.endswith("_array"):
        return [v] * max(1, len(spec.default))
    return v


@pytest.mark.parametrize("spec", [s for s in NUMERIC if "float" in s.kind], ids=lambda s: s.name)
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf], ids=["nan", "inf", "-inf"])
def test_every_float_parameter_refuses_non_finite_values(spec, bad):
    with pytest.raises(ConfigError):
        build_config({"model_dir": "m", spec.name: _value(spec, bad)})


@pytest.mark.parametrize("spec", NUMERIC, ids=lambda s: s.name)
def test_negative_and_huge_values_are_refused_cleanly_or_kept_as_given(spec):
    """Nothing but a ConfigError comes out of validation; an accepted value is the one given."""
    for v in ((-1.0, 1e30) if "float" in spec.kind else (-1, 2**62)):
        try:
            cfg = build_config({"model_dir": "m", spec.name: _value(spec, v)})
        except ConfigError:
            continue
        from heisd_ros.ros.params import config_to_values

        assert config_to_values(cfg)[spec.name] == _value(spec, v)


@pytest.fixture(scope="module")
def rig(node_rig):
    return node_rig


def test_every_set_parameters_request_is_answered_over_the_service(rig):
    """Over the node's real set_parameters service (what `ros2 param set` calls): a value of an unknown
    type (99) is refused with the reason (rclpy's own service raised in its callback and never
    answered), a read-only or undeclared parameter is refused, a valid change applied; list and get
    answer as ROS tools expect."""
    from rcl_interfaces.msg import Parameter as ParameterMsg
    from rcl_interfaces.msg import ParameterValue
    from rcl_interfaces.srv import GetParameters, ListParameters, SetParameters

    policy = rig.start()
    name = policy.get_name()
    clients = {}
    try:
        def make() -> None:
            for srv, suffix in ((SetParameters, "set_parameters"), (ListParameters, "list_parameters"),
                                (GetParameters, "get_parameters")):
                clients[suffix] = rig.node.create_client(srv, f"/{name}/{suffix}")

        rig.on_executor(make)

        def call(suffix: str, request):
            assert clients[suffix].wait_for_service(timeout_sec=5.0), suffix
            future = clients[suffix].call_async(request)
            assert rig.wait(future.done, 5.0), f"{suffix}: no answer"
            return future.result()

        def value(kind: int, **fields) -> ParameterValue:
            return ParameterValue(type=kind, **fields)

        bad = ParameterMsg(name="warn_throttle_s", value=value(3, double_value=1.0))
        bad.value.type = 99
        results = call("set_parameters", SetParameters.Request(parameters=[
            bad,
            ParameterMsg(name="control_rate_hz", value=value(3, double_value=5.0)),  # read-only
            ParameterMsg(name="no_such_parameter", value=value(3, double_value=1.0)),
            ParameterMsg(name="warn_throttle_s", value=value(3, double_value=1.5)),
        ])).results
        assert [r.successful for r in results] == [False, False, False, True], [r.reason for r in results]
        assert "invalid value" in results[0].reason and "warn_throttle_s" in results[0].reason
        assert policy.cfg.node.warn_throttle_s == 1.5
        names = call("list_parameters", ListParameters.Request()).result.names
        assert "warn_throttle_s" in names and "decoder.method" in names
        got = call("get_parameters", GetParameters.Request(names=["warn_throttle_s"])).values
        assert [v.double_value for v in got] == [1.5]
    finally:
        for c in clients.values():
            rig.on_executor(c.destroy)
        rig.stop()


def test_set_parameters_refuses_an_infinite_action_limit(rig):
    policy = rig.start()
    try:
        before = policy.cfg
        result = policy.set_parameters([Parameter("action_limits", value=[math.inf] * 7)])[0]
        assert not result.successful and "finite" in result.reason and policy.cfg == before
    finally:
        rig.stop()


def test_a_refused_lifecycle_request_is_a_warning_with_the_reason(rig):
    from lifecycle_msgs.msg import Transition
    from lifecycle_msgs.srv import ChangeState

    policy = rig.start()  # active: configure is not offered
    try:
        n_log = len(rig.logs)
        response = rig.call("change_state", ChangeState.Request(transition=Transition(id=Transition.TRANSITION_CONFIGURE)))
        assert not response.success
        mine = lambda: [l for l in rig.logs[n_log:] if l.name == policy.get_name()]  # noqa: E731
        assert rig.wait(lambda: any("lifecycle request refused" in l.msg and "'active'" in l.msg for l in mine()), 2.0)
        assert not [l.msg for l in mine() if l.level >= 40], "a refused request logged an error"
        response = rig.call("change_state", ChangeState.Request(transition=Transition(id=Transition.TRANSITION_DEACTIVATE)))
        assert response.success  # positive control: an offered transition still runs
    finally:
        rig.stop()


def test_no_log_line_or_diagnostic_exceeds_1_kb_for_hostile_input(rig):
    """Inputs whose text would be quoted: a 200 kB encoding name, a 200 kB frame_id, a 200 kB
    instruction; the node refuses each with a line of at most 1 kB and commands again after."""
    from heisd_ros.ros import conversions as conv

    policy = rig.start()
    try:
        rig.instruct("pick up the red bowl")
        assert rig.acted(rig.publish_set())
        n_log, n_diag = len(rig.logs), len(rig.diags)
        mine = lambda: [l.msg for l in rig.logs[n_log:] if l.name == policy.get_name()]  # noqa: E731
        long = "x" * 200_000
        for hostile, words in ((lambda: rig.publish_set(mutate=lambda m: setattr(m, "encoding", long)), "encoding"),
                               (lambda: rig.publish_set(frame_id=long), "frame"),
                               (lambda: rig.pub_instr.publish(rig.String(data=long)), "instruction")):  # fmt: skip
            hostile()
            assert rig.wait(lambda: any(words in m for m in mine()), 3.0), f"no line about the {words}: {mine()}"
            rig.instruct("pick up the red bowl")
        assert rig.acted(rig.publish_set()), "no command after the hostile inputs"
        # whatever a future refusal quotes, the line is clipped where the node writes it
        policy._status.report("test", 1, "a refusal quoting " + long)
        assert rig.wait(lambda: any("a refusal quoting" in m for m in mine()), 2.0)
        assert rig.wait(lambda: len(rig.diags) > n_diag + 2, 3.0)
        messages = [s.message for d in rig.diags[n_diag:] for s in d.status]
        assert max(len(m.encode()) for m in mine()) <= 1024, max(mine(), key=len)[:200]
        assert max(len(m.encode()) for m in messages) <= 1024
    finally:
        rig.stop()


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024.0
    return float("nan")


@pytest.mark.slow  # ten loads of the real mini policy
def test_configure_cleanup_cycles_give_back_what_the_first_configure_took(rig):
    """10 x (deactivate, cleanup, configure, activate) with the mini policy and its warm-up: the
    resident memory after each configure stays within 20 MB of the first's (cleanup hands the
    released model's heap back; without it the first model's pages stayed: +40 MB once)."""
    from heisd_ros.ros.node import PolicyNode

    mini = REPO / "models" / "mini_libero"
    node = PolicyNode(context=rig.ctx, node_name="policy_cycles", parameter_overrides=[
        Parameter("model_dir", value=str(mini / "vla")), Parameter("drafter_dir", value=str(mini / "drafter")),
        Parameter("decoder.method", value="drafter"), Parameter("warmup_steps", value=4)])  # fmt: skip
    try:
        first = _rss_mb()
        after = []
        for _ in range(10):
            node.trigger_deactivate()
            node.trigger_cleanup()
            gc.collect()
            node.trigger_configure()
            node.trigger_activate()
            after.append(_rss_mb())
        growth = np.max(after) - first
        assert growth <= 20.0, f"RSS after each configure (MB): first {first:.0f}, then {[round(a) for a in after]}"
    finally:
        node.destroy_node()
