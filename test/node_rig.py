"""The one rig of the node tests: a ROS node publishing the policy node's inputs and recording its
outputs, spun on its own thread; it can start a PolicyNode on the same executor (with clients of
its services and action) or stand beside one in another process.

Options fit the tests that use it: its own context on a domain (in-process node tests) or a given
one (tests whose node runs elsewhere), the frame size, and the instruction's QoS (latched for a
node started after the instruction was sent)."""

from __future__ import annotations

import time

import numpy as np
from fake_decoder import FakeDecoder
from waiting import wait_until

VIEWS = ("agentview", "wrist")
SIZE = (8, 8)
# Data-age limit of the test nodes: wide enough that a 2-core CI machine stalling the executor for a
# few hundred ms does not turn a fresh set stale (a CI failure at 0.3 s), still far below the sleeps
# of the staleness cases.
STALENESS_S = 0.6


CLIENT_QUEUE_DEPTH = 1000
"""Requests and responses the rig's service and action clients queue (bursts in the tests)."""

class NodeRig:
    """A test node publishing the policy node's inputs and recording its outputs, spun in a thread
    on its own ROS domain; `start` runs a PolicyNode (commanding, no warm-up unless asked) on the
    same executor, with clients of its services and action."""

    def __init__(self, domain_id: int | None = None, ctx=None, image_size: tuple[int, int] = SIZE,
                 latched_instruction: bool = False, name: str = "rig") -> None:  # fmt: skip
        """Its own context on `domain_id`, or the given `ctx` (left running at close)."""
        import threading

        import rclpy
        from diagnostic_msgs.msg import DiagnosticArray
        from geometry_msgs.msg import PoseStamped, TwistStamped
        from heisd_ros.msg import ArmCommand, DecodeStats
        from rcl_interfaces.msg import Log
        from rclpy.executors import SingleThreadedExecutor
        from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy
        from sensor_msgs.msg import Image
        from std_msgs.msg import Bool, Float64MultiArray, String

        from heisd_ros.ros.qos import EVENT_QOS, LATCHED_QOS, SENSOR_QOS

        self._own_ctx = ctx is None
        if ctx is None:
            ctx = rclpy.Context()
            rclpy.init(context=ctx, domain_id=domain_id)
        self.ctx = ctx
        self.size = image_size
        self.node = rclpy.create_node(name, context=self.ctx)
        self.commands, self.stats, self.diags, self.logs, self.twists, self.grips = [], [], [], [], [], []
        self.received_at: list = []
        """(node time s, ArmCommand) of every command."""
        self.arrivals: list = []
        """(monotonic s, ArmCommand) of every command."""
        n = self.node
        n.create_subscription(ArmCommand, "arm_command", self._on_cmd, EVENT_QOS)
        n.create_subscription(DecodeStats, "decode_stats", self.stats.append, EVENT_QOS)
        n.create_subscription(DiagnosticArray, "/diagnostics", self.diags.append, EVENT_QOS)
        # /rosout's own QoS (transient local): a node that logs before discovery has matched it with
        # this subscription (a node just started, a loaded machine) delivers those lines on matching
        rosout_qos = QoSProfile(depth=1000, reliability=ReliabilityPolicy.RELIABLE,
                                durability=DurabilityPolicy.TRANSIENT_LOCAL)  # fmt: skip
        n.create_subscription(Log, "/rosout", self.logs.append, rosout_qos)
        n.create_subscription(TwistStamped, "delta_twist_cmds", self.twists.append, EVENT_QOS)
        n.create_subscription(Float64MultiArray, "gripper_positions", self.grips.append, EVENT_QOS)
        self.pub_img = {v: n.create_publisher(Image, f"{v}/image_raw", SENSOR_QOS) for v in VIEWS}
        self.pub_pose = n.create_publisher(PoseStamped, "ee_pose", SENSOR_QOS)
        # volatile, the rclpy default; latched for a node that subscribes after the instruction was sent
        self.pub_instr = n.create_publisher(String, "instruction", LATCHED_QOS if latched_instruction else 10)
        self.pub_result = n.create_publisher(Bool, "episode_result", EVENT_QOS)
        self.String, self.Bool = String, Bool
        self.executor = SingleThreadedExecutor(context=self.ctx)
        self.executor.add_node(n)
        self.thread = threading.Thread(target=self.executor.spin, daemon=True)
        self.thread.start()
        self.rng = np.random.default_rng(0)
        self.newest_frame_s = 0.0
        self.started = 0
        self.policy = None
        self.decoder = None
        self.clients: dict = {}

    def _on_cmd(self, msg):
        self.commands.append(msg)
        self.received_at.append((self.now(), msg))
        self.arrivals.append((time.monotonic(), msg))

    def now(self) -> float:
        return self.node.get_clock().now().nanoseconds * 1e-9

    def fake(self, **kwargs) -> FakeDecoder:
        return FakeDecoder(**kwargs)

    def start(self, decoder=None, remaps: dict | None = None, cli_args: tuple = (), **params):
        """A PolicyNode with `params` over the rig's defaults; `remaps` (node name -> topic) and
        `cli_args` go on its command line, as `--ros-args -r NAME:=TOPIC` would."""
        from rclpy.parameter import Parameter

        from heisd_ros.ros.node import PolicyNode

        overrides = {"model_dir": "fake", "control_rate_hz": 20.0, "diagnostics_period_s": 0.2,
                     "warn_throttle_s": 0.0, "image_staleness_s": STALENESS_S, "pose_staleness_s": STALENESS_S,
                     "expected_image_height": SIZE[0], "expected_image_width": SIZE[1], "command_enabled": True,
                     "warmup_steps": 0, **params}  # fmt: skip
        self.decoder = decoder or FakeDecoder()
        self.started += 1  # unique names: rclpy drops /rosout of a re-created node of the same name
        args = ["--ros-args", *(a for name, topic in (remaps or {}).items() for a in ("-r", f"{name}:={topic}")),
                *cli_args]  # fmt: skip
        node = PolicyNode(lambda cfg: self.decoder, node_name=f"policy_node_{self.started}", context=self.ctx,
                          cli_args=args, parameter_overrides=[Parameter(k, value=v) for k, v in overrides.items()])
        self.executor.add_node(node)
        self.policy = node
        self._make_clients(node.get_name())
        if overrides.get("autostart", True) and set(remaps or {}) <= {"instruction"}:  # else the caller waits
            self.wait_discovery(instruction="instruction" not in (remaps or {}))
        return node

    def wait_discovery(self, instruction: bool = True) -> None:
        pubs = [*self.pub_img.values(), self.pub_pose, self.policy._session.outputs.command, self.policy._session.outputs.stats,
                self.policy._session.diagnostics_pub] + ([self.pub_instr] if instruction else [])  # fmt: skip
        assert self.wait(lambda: all(p.get_subscription_count() > 0 for p in pubs), 5.0), "discovery timed out"

    def _make_clients(self, name: str) -> None:
        """Clients of the policy node's services and action, made on the executor's thread: rclpy's
        ActionClient registers itself with the executor before it is fully built."""
        from heisd_ros.action import RunTask
        from lifecycle_msgs.srv import ChangeState, GetState
        from rclpy.action import ActionClient
        from std_srvs.srv import SetBool, Trigger

        from heisd_ros.ros.qos import request_qos

        # deep queues on the client side too: a burst's responses are each delivered, as the node's are
        q = request_qos(CLIENT_QUEUE_DEPTH)

        def make() -> None:
            for c in self.clients.values():
                c.destroy()
            n = self.node
            self.clients = {
                "enable": n.create_client(SetBool, f"/{name}/enable", qos_profile=q),
                "reset": n.create_client(Trigger, f"/{name}/reset", qos_profile=q),
                "change_state": n.create_client(ChangeState, f"/{name}/change_state", qos_profile=q),
                "get_state": n.create_client(GetState, f"/{name}/get_state", qos_profile=q),
                "run_task": ActionClient(n, RunTask, f"/{name}/run_task", goal_service_qos_profile=q,
                                         result_service_qos_profile=q, cancel_service_qos_profile=q),
            }  # fmt: skip

        self.on_executor(make)

    def call(self, name: str, request, timeout_s: float = 5.0):
        """Call one of the policy node's services; its response."""
        client = self.clients[name]
        assert client.wait_for_service(timeout_sec=timeout_s), f"no service {client.srv_name}"
        response = self.ask(name, request, timeout_s)
        assert response is not None, f"{client.srv_name}: no response"
        return response

    def ask(self, name: str, request, timeout_s: float):
        """One call of a service the caller knows is there: its response, or None if none came within
        `timeout_s` (a first call to a node just started can go unanswered while discovery settles)."""
        future = self.clients[name].call_async(request)
        return future.result() if self.wait(future.done, timeout_s) else None

    def on_executor(self, fn, timeout_s: float = 15.0):
        """`fn()` run on the spinning executor's thread (its result): destroying an entity, or a
        lifecycle transition that does, from another thread races with the executor building its
        wait set (as `ros2 lifecycle set` would, through the node's service)."""
        task = self.executor.create_task(fn)
        assert self.wait(task.done, timeout_s), "the executor did not run the task"
        return task.result()  # raises what fn raised

    def stop(self) -> None:
        node, self.policy = self.policy, None
        self.executor.remove_node(node)
        self.on_executor(node.destroy_node)

    def close(self) -> None:
        import rclpy

        old = list(self.clients.values())
        self.on_executor(lambda: [c.destroy() for c in old])
        self.executor.shutdown(timeout_sec=2.0)
        self.thread.join(2.0)
        self.node.destroy_node()
        if self._own_ctx:
            rclpy.shutdown(context=self.ctx)

    def instruct(self, text: str, timeout_s: float = 2.0, policy=None) -> bool:
        """Publish the instruction and, when a policy node runs (the rig's, or `policy`), wait until it
        holds it, so a set published next is not left waiting (and ageing) behind the instruction's
        delivery. Whether it does."""
        self.pub_instr.publish(self.String(data=text))
        policy = policy or self.policy
        if policy is not None and text:
            return self.wait(lambda: policy.instruction == text.strip(), timeout_s)
        return True

    def policy_status(self, since: int = 0) -> list:
        """(level, message, values) of every '<node>: policy' diagnostic status since the index."""
        return [(s.level[0], s.message, {kv.key: kv.value for kv in s.values})
                for d in self.diags[since:] for s in d.status if s.name.endswith(": policy")]  # fmt: skip

    def errors_logged(self, policy, words: str, since: int = 0) -> list:
        """/rosout lines of `policy` at ERROR or above containing `words`."""
        return [l for l in self.logs[since:] if l.name == policy.get_name() and l.level >= 40 and words in l.msg]

    def publish_set(self, t=None, pos=(0.1, 0.2, 0.3), views=VIEWS, size=None, encoding="rgb8", mutate=None,
                    pose_t=None, pose_msg=None, pose=True, frame_id="base_link") -> float:
        """One synchronised set stamped `t` (default now): random frames of `size` (the rig's) and the pose."""
        from heisd_ros.ros import conversions as conv

        size = size or self.size
        t = self.now() if t is None else t
        # The pose first, as on a robot whose pose stream runs faster than its cameras: the node attaches the
        # newest pose to a set once its frames are in, so frames landing before their pose would be paired
        # with the previous one (after a bad-pose case, the bad one) and that set would be lost.
        if pose:
            self.pub_pose.publish(pose_msg or conv.position_to_pose(pos, t if pose_t is None else pose_t, frame_id))
        for v in views:
            msg = conv.rgb_to_image(self.rng.integers(0, 255, size + (3,), dtype=np.uint8), t, v, encoding)
            if mutate is not None:
                mutate(msg)
            self.pub_img[v].publish(msg)
        self.newest_frame_s = t
        return t

    def stream_until(self, done, timeout_s: float, publish=None, period_s: float = 1 / 30) -> bool:
        """Fresh sets every `period_s`, as a camera streams them (`publish()`, default `publish_set`),
        until `done()`; whether it held within `timeout_s`. A single set can be lost to a slow step or
        go stale before a busy node reaches it; a stream cannot."""
        publish = publish or self.publish_set
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            publish()
            if self.wait(done, period_s):
                return True
        return bool(done())

    def acted(self, t_s: float, timeout_s: float = 2.0) -> bool:
        """Whether a command for the set stamped `t_s` arrives within `timeout_s`."""
        from heisd_ros.ros import conversions as conv

        return self.wait(lambda: any(abs(conv.stamp_to_s(c.header.stamp) - t_s) < 1e-6 for c in self.commands),
                         timeout_s)  # fmt: skip

    def stats_for(self, t_s: float, timeout_s: float = 2.0) -> bool:
        """Whether the DecodeStats of the set stamped `t_s` arrive within `timeout_s`."""
        from heisd_ros.ros import conversions as conv

        return self.wait(lambda: any(abs(conv.stamp_to_s(s.header.stamp) - t_s) < 1e-6 for s in self.stats),
                         timeout_s)  # fmt: skip

    wait = staticmethod(wait_until)  # the suite's one wait (test/waiting.py)

    def policy_logs(self, level: int):
        return [l.msg for l in self.logs if l.name == self.policy.get_name() and l.level >= level]

    def diag_levels_since(self, k0: int):
        return [(s.level[0], s.message) for d in self.diags[k0:] for s in d.status if s.name.endswith(": policy")]
