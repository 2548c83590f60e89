"""The policy node with a real (untrained tiny) model over real topics, fed input beyond its limits:
a megabyte instruction, a NUL in the instruction, too many tokens, a pose at 1e30 m, a pose jump,
oversized raw and compressed frames, frames smaller than the model's input or of another shape,
and frames of another size that are resized (logged once per view).

Every case: no command from the bad input, a clear warning (quoting at most a short prefix of the
input), and the next valid set commanded: within 1 s of its stamp, as the node commands no set older
than image_staleness_s (1 s here); the rig allows RECOVERY_S for the command to reach it.
"""

from __future__ import annotations

import io
import struct
import threading
import time

import numpy as np
import pytest
import rclpy
from geometry_msgs.msg import PoseStamped
from rcl_interfaces.msg import Log
from rclpy.executors import SingleThreadedExecutor
from rclpy.parameter import Parameter
from sensor_msgs.msg import CompressedImage, Image
from std_msgs.msg import String
from waiting import wait_until

from heisd_ros.ros import conversions as conv
from heisd_ros.ros.node import EVENT_QOS, LATCHED_QOS, SENSOR_QOS, PolicyNode

msg_mod = pytest.importorskip("heisd_ros.msg", reason="interfaces not built (make setup)")

DOMAIN_ID = 76
TASK = "pick up the red bowl"
VIEWS = ("agentview", "wrist")
COMPRESSED_TOPICS = ("cam_a/image_raw/compressed", "cam_b/image_raw/compressed")
RECOVERY_S = 3.0
"""How long the rig waits for the command of the valid set after a refused one (the node itself
publishes it within image_staleness_s of the set's stamp or not at all; the rest is a loaded
machine's delivery)."""


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from heisd_ros.models.loader import tiny_vla

    root = tmp_path_factory.mktemp("limits_policy")
    tiny_vla(seed=0).save_pretrained(root / "model")
    return root / "model"


def _cdr_string(text: str) -> bytes:
    """A serialised std_msgs/String (little-endian CDR) holding `text` exactly, NULs included."""
    data = text.encode() + b"\x00"
    return b"\x00\x01\x00\x00" + struct.pack("<I", len(data)) + data


def _png(rgb: np.ndarray | None = None, image=None) -> bytes:
    from PIL import Image as PILImage

    buf = io.BytesIO()
    (image or PILImage.fromarray(rgb)).save(buf, format="PNG")
    return buf.getvalue()


class Rig:
    """Publishes the node's inputs and records its commands and log lines."""

    def __init__(self, ctx) -> None:
        self.node = rclpy.create_node("limits_rig", context=ctx)
        n = self.node
        self.commands: list[tuple[float, float]] = []  # (monotonic arrival, header stamp)
        self.logs: list[Log] = []
        n.create_subscription(msg_mod.ArmCommand, "arm_command", self._on_cmd, EVENT_QOS)
        n.create_subscription(Log, "/rosout", self.logs.append, 500)
        self.pub_raw = {v: n.create_publisher(Image, f"{v}/image_raw", SENSOR_QOS) for v in VIEWS}
        self.pub_png = {v: n.create_publisher(CompressedImage, t, SENSOR_QOS) for v, t in zip(VIEWS, COMPRESSED_TOPICS)}
        self.pub_pose = n.create_publisher(PoseStamped, "ee_pose", SENSOR_QOS)
        self.pub_instr = n.create_publisher(String, "instruction", LATCHED_QOS)
        self.executor = SingleThreadedExecutor(context=ctx)
        self.executor.add_node(n)
        self.thread = threading.Thread(target=self.executor.spin, daemon=True)
        self.thread.start()
        self.rng = np.random.default_rng(0)
        self.policy: PolicyNode | None = None
        self.compressed = False

    def _on_cmd(self, msg) -> None:
        self.commands.append((time.monotonic(), conv.stamp_to_s(msg.header.stamp)))

    def now(self) -> float:
        return self.node.get_clock().now().nanoseconds * 1e-9

    def start(self, model_dir, compressed: bool = False, **params) -> PolicyNode:
        overrides = {"model_dir": str(model_dir), "decoder.method": "ar", "control_rate_hz": 20.0,
                     "diagnostics_period_s": 0.2, "warn_throttle_s": 0.0, "image_staleness_s": 1.0,
                     "pose_staleness_s": 1.0, "watchdog_factor": 40.0, "compressed_images": compressed,
                     "command_enabled": True, **params}
        remaps = []  # the compressed streams come on the rig's own names: remapped, as a user would
        if compressed:
            remaps = [a for v, t in zip(VIEWS, COMPRESSED_TOPICS) for a in ("-r", f"{v}/image_raw/compressed:={t}")]
        self.compressed = compressed
        self.policy = PolicyNode(context=self.node.context, node_name=f"limits_{len(self.logs)}_{time.monotonic_ns()}",
                                 cli_args=["--ros-args", *remaps], parameter_overrides=[Parameter(k, value=v) for k, v in overrides.items()])
        self.executor.add_node(self.policy)
        pubs = [*(self.pub_png if compressed else self.pub_raw).values(), self.pub_pose, self.pub_instr]
        assert self.wait(lambda: all(p.get_subscription_count() > 0 for p in pubs), 10.0), "discovery timed out"
        return self.policy

    def stop(self, node: PolicyNode) -> None:
        self.executor.remove_node(node)
        node.destroy_node()

    def close(self) -> None:
        self.executor.shutdown(timeout_sec=2.0)
        self.thread.join(2.0)
        self.node.destroy_node()

    def instruct(self, text: str) -> None:
        # as serialised bytes: rclpy would cut a Python string at a NUL before sending it
        self.pub_instr.publish(_cdr_string(text))
        expected = text.strip() if len(text) < 1024 and "\x00" not in text else None
        self.wait(lambda: self.policy.instruction == expected and
                  (expected is not None or self.policy.idle_reason.startswith("instruction refused")), 2.0)  # fmt: skip

    def frame(self, view: str, t: float, size=(64, 64)):
        if self.compressed:
            msg = CompressedImage(format="png", data=_png(self.rng.integers(0, 255, size + (3,), dtype=np.uint8)))
            msg.header.stamp = conv.s_to_stamp(t)
            return msg
        return conv.rgb_to_image(self.rng.integers(0, 255, size + (3,), dtype=np.uint8), t, view)

    def publish_set(self, pos=(0.1, 0.2, 0.3), size=(64, 64), frame=None) -> float:
        t = self.now()
        for v in VIEWS:
            msg = frame(v, t) if frame is not None else self.frame(v, t, size)
            (self.pub_png if self.compressed else self.pub_raw)[v].publish(msg)
        self.pub_pose.publish(conv.position_to_pose(pos, t))
        return t

    def commanded(self, stamp: float, timeout_s: float) -> float | None:
        """Seconds from now until the command for the set stamped `stamp` arrived; None if it did not."""
        t0 = time.monotonic()
        self.wait(lambda: any(abs(s - stamp) < 1e-6 for _, s in self.commands), timeout_s)
        got = [a for a, s in self.commands if abs(s - stamp) < 1e-6]
        return got[0] - t0 if got else None

    def warnings(self, since: int) -> list[str]:
        return [l.msg for l in self.logs[since:] if l.name == self.policy.get_name() and l.level >= 30]

    def infos(self) -> list[str]:
        return [l.msg for l in self.logs if l.name == self.policy.get_name() and l.level == 20]

    wait = staticmethod(wait_until)  # the suite's one wait (test/waiting.py)


@pytest.fixture(scope="module")
def rig(ctx):
    r = Rig(ctx)
    yield r
    r.close()


@pytest.fixture(scope="module")
def raw_node(rig, model_dir):
    node = rig.start(model_dir)
    yield node
    rig.stop(node)


def _big_mono(view: str, t: float) -> Image:
    msg = Image(height=3000, width=4000, encoding="mono8", step=4000, data=bytes(4000 * 3000))
    msg.header.stamp = conv.s_to_stamp(t)
    return msg


def _steady(rig) -> None:
    """A valid instruction and a commanded valid set, from a known position."""
    rig.instruct(TASK)
    for _ in range(3):
        if rig.commanded(rig.publish_set(), 2.0) is not None:
            return
    raise AssertionError("valid input is not commanded")


# name -> (publish the bad input, words of the warning, whether the instruction is what was refused)
BAD = {
    "megabyte instruction": (lambda r: r.instruct("pick up the alphabet soup " * 40_000),
                             "exceeds max_instruction_bytes 1024", True),
    "NUL in the instruction": (lambda r: r.instruct("pick up the alphabet\x00 soup"),
                               "control character '\\x00'", True),
    "right-to-left override in the instruction": (lambda r: r.instruct("pick up the \u202epuos tebahpla"),
                                                  "control character '\\u202e'", True),
    "too many tokens": (lambda r: r.instruct("w " * 300),
                        "300 tokens exceeds input_limits.max_instruction_tokens", True),
    "pose at 1e30 m": (lambda r: r.publish_set(pos=(1e30, 0.0, 0.3)), "outside the workspace box", False),
    "pose jump": (lambda r: r.publish_set(pos=(-1.9, 0.2, 0.3)), "end-effector position jumped 2.000 m", False),
    "oversized raw frame": (lambda r: r.publish_set(frame=_big_mono),
                            "frame 3000x4000 exceeds max_image_pixels", False),
    "frame smaller than the model's input": (lambda r: r.publish_set(size=(32, 32)),
                                             "smaller than the model's input 64x64", False),
    "frame of another shape": (lambda r: r.publish_set(size=(64, 256)), "aspect ratio 4.00x", False),
}


@pytest.mark.parametrize("case", list(BAD))
def test_refused_input_no_command_a_warning_and_recovery_within_1s(rig, raw_node, case):
    publish_bad, words, instruction = BAD[case]
    _steady(rig)
    n_log = len(rig.logs)
    bad = publish_bad(rig)
    if instruction:  # the task asked for is refused: no command at all until a valid instruction arrives
        stamps = [rig.publish_set() for _ in range(3) if time.sleep(0.1) is None]
        assert all(rig.commanded(s, 0.3) is None for s in stamps), "commanded after a refused instruction"
    else:
        assert rig.commanded(bad, 0.5) is None, "a command from the bad input"
    assert rig.wait(lambda: any(words in m for m in rig.warnings(n_log)), 2.0), rig.warnings(n_log)[-5:]
    assert max(len(m) for m in rig.warnings(n_log)) < 600, "a log line quotes too much of the input"
    if instruction:
        rig.instruct(TASK)
    latency = rig.commanded(rig.publish_set(), RECOVERY_S)
    assert latency is not None, f"valid input not commanded within {RECOVERY_S} s after: {case}"


def test_frames_of_another_size_are_resized_and_logged_once_per_view(rig, raw_node):
    _steady(rig)
    for _ in range(4):
        assert rig.commanded(rig.publish_set(size=(96, 128)), 2.0) is not None
        time.sleep(0.06)
    for view in VIEWS:
        notes = [m for m in rig.infos() if f"view {view!r}: 96x128 frames are resized" in m]
        assert len(notes) == 1, rig.infos()


def test_small_frames_are_commanded_once_allowed(rig, raw_node):
    _steady(rig)
    raw_node.set_parameters([Parameter("input_limits.allow_small_frames", value=True)])
    try:
        assert rig.commanded(rig.publish_set(size=(32, 32)), 2.0) is not None
    finally:
        raw_node.set_parameters([Parameter("input_limits.allow_small_frames", value=False)])


def test_a_compressed_bomb_is_refused_from_its_header(rig, model_dir):
    from PIL import Image as PILImage

    bomb = _png(image=PILImage.new("1", (8000, 8000)))
    assert len(bomb) < 10_000

    def bomb_frame(view: str, t: float) -> CompressedImage:
        msg = CompressedImage(format="png", data=bomb)
        msg.header.stamp = conv.s_to_stamp(t)
        return msg

    raw = rig.policy  # left running (it sees no raw frames meanwhile)
    node = rig.start(model_dir, compressed=True)
    try:
        _steady(rig)
        n_log = len(rig.logs)
        started = time.monotonic()
        bad = rig.publish_set(frame=bomb_frame)
        assert rig.wait(lambda: any("frame 8000x8000 exceeds max_image_pixels" in m for m in rig.warnings(n_log)),
                        2.0), rig.warnings(n_log)  # fmt: skip
        assert time.monotonic() - started < 1.0  # a header parse, not a 64-megapixel decode
        assert rig.commanded(bad, 0.3) is None
        assert rig.commanded(rig.publish_set(), RECOVERY_S) is not None
    finally:
        rig.stop(node)
        rig.policy, rig.compressed = raw, False
