"""The node's `torch_threads` parameter: validated like every other, applied to the whole process
before the model loads, and only the inference thread decodes (the executor's callbacks run no
torch work beside it)."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import rclpy
import torch
from geometry_msgs.msg import PoseStamped
from rclpy.executors import SingleThreadedExecutor
from rclpy.parameter import Parameter
from sensor_msgs.msg import Image
from std_msgs.msg import String

from heisd_ros.core.errors import ConfigError
from heisd_ros.ros import conversions as conv
from heisd_ros.ros.node import EVENT_QOS, LATCHED_QOS, SENSOR_QOS, PolicyNode, load_decoder
from heisd_ros.ros.params import build_config, param_specs

msg_mod = pytest.importorskip("heisd_ros.msg", reason="interfaces not built (make setup)")

DOMAIN_ID = 78
TASK = "pick up the red bowl"


@pytest.fixture
def keep_torch_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_torch_threads_defaults_to_one_read_only():
    spec = next(s for s in param_specs() if s.name == "torch_threads")
    assert spec.default == 1 and spec.kind == "int" and spec.read_only
    assert build_config({"model_dir": "tiny"}).node.torch_threads == 1
    assert build_config({"model_dir": "tiny", "torch_threads": 4}).node.torch_threads == 4


@pytest.mark.parametrize("value", [0, -1, 1025, True, 2.0, "2"])
def test_torch_threads_out_of_range_or_not_an_integer_is_refused(value):
    with pytest.raises(ConfigError, match="torch_threads"):
        build_config({"model_dir": "tiny", "torch_threads": value})


@pytest.mark.parametrize("value, words", [(0, "torch_threads must be an integer in"), (2.0, "must be of type int")])
def test_invalid_torch_threads_fails_node_start_up(ctx, value, words):
    overrides = [Parameter("model_dir", value="fake"), Parameter("torch_threads", value=value)]
    with pytest.raises(ConfigError, match=words):
        PolicyNode(lambda cfg: pytest.fail("the decoder must not load"), context=ctx, node_name="bad_threads",
                   parameter_overrides=overrides)  # fmt: skip


class ThreadRecorder:
    """The real decoder, recording the thread of every call the node makes into it."""

    def __init__(self, decoder) -> None:
        self._decoder = decoder
        self.calls: list[tuple[str, str]] = []  # (method, thread name)

    def __getattr__(self, name):
        attr = getattr(self._decoder, name)
        if name not in ("reset", "step", "episode_feedback", "health", "close"):
            return attr

        def call(*args, **kwargs):
            self.calls.append((name, threading.current_thread().name))
            return attr(*args, **kwargs)

        return call


def test_torch_threads_is_set_before_the_model_loads_and_only_the_worker_decodes(
        ctx, untrained_policy, monkeypatch, keep_torch_threads):  # fmt: skip
    from heisd_ros import policy

    wanted = 1 if torch.get_num_threads() != 1 else 2
    at_load: list[int] = []
    real_load = policy.load_model

    def load_model(*args, **kwargs):
        at_load.append(torch.get_num_threads())
        return real_load(*args, **kwargs)

    monkeypatch.setattr(policy, "load_model", load_model)
    recorders: list[ThreadRecorder] = []

    def factory(cfg):
        recorders.append(ThreadRecorder(load_decoder(cfg)))
        return recorders[-1]

    root = untrained_policy
    params = {"model_dir": str(root / "model"), "drafter_dir": str(root / "drafter"), "db_path": str(root / "db"),
              "calibration_path": str(root / "calibration.json"), "decoder.method": "heisd",
              "torch_threads": wanted, "image_staleness_s": 1.0, "pose_staleness_s": 1.0,
              # no warm-up (it decodes at configure, before the worker exists); a latched instruction
              "warmup_steps": 0, "instruction_durability": "transient_local"}  # fmt: skip
    node = PolicyNode(factory, context=ctx, node_name="threads",
                      parameter_overrides=[Parameter(k, value=v) for k, v in params.items()])  # fmt: skip
    rig = rclpy.create_node("threads_rig", context=ctx)
    stats: list = []
    rig.create_subscription(msg_mod.DecodeStats, "decode_stats", stats.append, EVENT_QOS)
    pub_img = {v: rig.create_publisher(Image, f"{v}/image_raw", SENSOR_QOS) for v in ("agentview", "wrist")}
    pub_pose = rig.create_publisher(PoseStamped, "ee_pose", SENSOR_QOS)
    rig.create_publisher(String, "instruction", LATCHED_QOS).publish(String(data=TASK))
    executor = SingleThreadedExecutor(context=ctx)
    executor.add_node(rig)
    executor.add_node(node)
    spinner = threading.Thread(target=executor.spin, daemon=True)
    spinner.start()
    try:
        assert at_load == [wanted]
        other = []
        threading.Thread(target=lambda: other.append(torch.get_num_threads())).start()
        rng = np.random.default_rng(0)
        end = time.monotonic() + 20.0
        k = 0
        while len(stats) < 4 and time.monotonic() < end:  # images and poses at 50 Hz keep the executor busy
            k += 1
            t = rig.get_clock().now().nanoseconds * 1e-9
            for v, pub in pub_img.items():
                pub.publish(conv.rgb_to_image(rng.integers(0, 255, (64, 64, 3), dtype=np.uint8), t, v))
            pub_pose.publish(conv.position_to_pose((0.1 + 0.002 * (k % 20), 0.05, 0.1), t))  # inside the workspace box
            time.sleep(0.02)
        assert len(stats) >= 4, "the node decoded no steps"
        assert other == [wanted]
        calls = recorders[0].calls
        assert {name for name, _ in calls} >= {"reset", "step", "health"}
        assert {thread for _, thread in calls} == {"heisd-inference"}, calls
    finally:
        executor.shutdown(timeout_sec=2.0)
        spinner.join(2.0)
        node.destroy_node()
        rig.destroy_node()
