"""Hostile traffic on the ROS graph against `policy_node` on the committed mini policy: camera floods,
request bursts and lifecycle cycles, with what the arm keeps (commands) and what the node holds (RSS).

Usage (after `make demo`, which builds the demo task's database):
    python benchmarks/hostile_traffic.py [--out benchmarks/hostile_traffic.json] [--domain-id 74]

The node runs as deployed (`python -m heisd_ros.ros.node`, its own process) on models/mini_libero
with artifacts/mini_libero_db/libero_object_task0, commanding, two views, 10 Hz. This process plays
one expert episode's frames (the database's demonstrations, JPEG for the compressed leg) and records
every ArmCommand and DecodeStats. Phases:
- flood (one node per image transport, raw `Image` and `CompressedImage`): CALM_S of pairs at 20 Hz
  with the pose at 100 Hz, FLOOD_S at 200 Hz / 1 kHz, CALM_S at 20 Hz again. Commands per phase, the
  time from the flood's end to the first command decoded from input stamped after it, decode p95
  in the flood, watchdog trips and the synchroniser's refusals (last /diagnostics).
- bursts (one node, inputs streaming at 20 Hz, a goal running): 60 goals at once, 400 cancels of a
  running goal, 100 SetParameters requests (valid, invalid and of type 99), 100 get_state and 50
  refused change_state requests, 60 ~/reset. For each, requests answered, commands per second and
  the longest gap between commands while it is worked off.
- memory (the same node): RSS after warm-up streaming, after each of CYCLES deactivate / cleanup /
  configure / activate cycles, and after 4000x3000 raw frames.
Writes JSON (command, git revision, figures) and prints a summary; docs/reliability.md quotes it.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from heisd_ros.pipeline.outputs import git_revision  # noqa: E402
from heisd_ros.ros.node_main import stop_process  # noqa: E402

POLICY = REPO / "models" / "mini_libero"
DB = REPO / "artifacts" / "mini_libero_db" / "libero_object_task0"
DEMO = REPO / "artifacts" / "mini_libero_demos" / "libero_object" / "pick_up_the_alphabet_soup_and_place_it_in_the_basket_demo.hdf5"
TASK = "pick up the alphabet soup and place it in the basket"
VIEWS = ("agentview", "wrist")
CALM_HZ, FLOOD_HZ, POSE_PER_PAIR = 20.0, 200.0, 5
CALM_S, FLOOD_S = 5.0, 5.0
CYCLES = 10
FINGERS = ("panda_finger_joint1", "panda_finger_joint2")


def _frames(compressed: bool) -> list[tuple]:
    """(agentview, wrist, ee_pos, finger gap) of the demo's first episode, images as the topic carries them."""
    import h5py
    from PIL import Image as PILImage

    with h5py.File(DEMO) as f:
        obs = f["data/demo_0/obs"]
        agent, wrist = obs["agentview_rgb"][:60][:, ::-1], obs["eye_in_hand_rgb"][:60][:, ::-1]
        eef, grip = obs["ee_pos"][:60], obs["gripper_states"][:60]

    def enc(a):
        if not compressed:
            return np.ascontiguousarray(a)
        buf = io.BytesIO()
        PILImage.fromarray(np.ascontiguousarray(a)).save(buf, format="JPEG", quality=90)
        return buf.getvalue()

    return [(enc(a), enc(w), e, g) for a, w, e, g in zip(agent, wrist, eef, grip)]


class Driver:
    """Publishes the node's inputs, records its outputs, holds clients of its services and action."""

    def __init__(self, domain_id: int, compressed: bool) -> None:
        import rclpy
        from diagnostic_msgs.msg import DiagnosticArray
        from geometry_msgs.msg import PoseStamped
        from heisd_ros.action import RunTask
        from heisd_ros.msg import ArmCommand, DecodeStats
        from rclpy.action import ActionClient
        from rclpy.executors import SingleThreadedExecutor
        from sensor_msgs.msg import CompressedImage, Image, JointState
        from std_msgs.msg import String

        from heisd_ros.ros.qos import EVENT_QOS, LATCHED_QOS, SENSOR_QOS, request_qos
        from heisd_ros.ros.topics import image_topic

        self.ctx = rclpy.Context()
        rclpy.init(context=self.ctx, domain_id=domain_id)
        n = self.node = rclpy.create_node("hostile_traffic", context=self.ctx)
        self.compressed, self.frames = compressed, _frames(compressed)
        self.commands: list[tuple[float, float]] = []  # (arrival monotonic s, command stamp s)
        self.stats: list[tuple[float, float]] = []  # (arrival monotonic s, total_ms)
        self.diags: list = []
        n.create_subscription(ArmCommand, "arm_command", self._on_cmd, EVENT_QOS)
        n.create_subscription(DecodeStats, "decode_stats", lambda m: self.stats.append((time.monotonic(), m.total_ms)), EVENT_QOS)
        n.create_subscription(DiagnosticArray, "/diagnostics", self.diags.append, EVENT_QOS)
        self.Image, self.CompressedImage, self.PoseStamped, self.JointState = Image, CompressedImage, PoseStamped, JointState
        image_type = CompressedImage if compressed else Image
        self.pub_img = [n.create_publisher(image_type, image_topic(v, compressed), SENSOR_QOS) for v in VIEWS]
        self.pub_pose = n.create_publisher(PoseStamped, "ee_pose", SENSOR_QOS)
        self.pub_js = n.create_publisher(JointState, "joint_states", SENSOR_QOS)
        self.pub_instr = n.create_publisher(String, "instruction", LATCHED_QOS)
        q = request_qos(1000)
        self.action = ActionClient(n, RunTask, "/policy_node/run_task", goal_service_qos_profile=q,
                                   result_service_qos_profile=q, cancel_service_qos_profile=q)  # fmt: skip
        self.RunTask = RunTask
        self._clients_qos = q
        self.executor = SingleThreadedExecutor(context=self.ctx)
        self.executor.add_node(n)
        threading.Thread(target=self.executor.spin, daemon=True).start()
        self.k = 0
        self.streaming = threading.Event()

    def now(self) -> float:
        return self.node.get_clock().now().nanoseconds * 1e-9

    def _on_cmd(self, msg) -> None:
        self.commands.append((time.monotonic(), msg.header.stamp.sec + 1e-9 * msg.header.stamp.nanosec))

    def client(self, srv_type, name: str):
        return self.node.create_client(srv_type, f"/policy_node/{name}", qos_profile=self._clients_qos)

    def _stamp(self, msg, t: float) -> None:
        msg.header.stamp.sec, msg.header.stamp.nanosec = int(t), int((t % 1.0) * 1e9)

    def pair(self, image=None) -> None:
        agent, wrist, eef, grip = self.frames[self.k % len(self.frames)]
        self.k += 1
        for _ in range(POSE_PER_PAIR):
            pose = self.PoseStamped()
            self._stamp(pose, self.now())
            pose.header.frame_id = "base_link"
            pose.pose.position.x, pose.pose.position.y, pose.pose.position.z = (float(x) for x in eef)
            pose.pose.orientation.w = 1.0
            self.pub_pose.publish(pose)
        t = self.now()
        js = self.JointState(name=list(FINGERS), position=[float(grip[0]), float(grip[1])])
        self._stamp(js, t)
        self.pub_js.publish(js)
        for pub, view, img in zip(self.pub_img, VIEWS, (agent, wrist)):
            if image is not None:
                msg = image
            elif self.compressed:
                msg = self.CompressedImage(format="jpeg", data=img)
            else:
                msg = self.Image(height=img.shape[0], width=img.shape[1], encoding="rgb8", step=img.shape[1] * 3,
                                 data=img.tobytes())  # fmt: skip
            self._stamp(msg, t)
            msg.header.frame_id = view
            pub.publish(msg)

    def stream(self, seconds: float, hz: float) -> None:
        start, k = time.monotonic(), 0
        while (now := time.monotonic()) - start < seconds:
            if start + k / hz > now:
                time.sleep(start + k / hz - now)
            self.pair()
            k += 1

    def background(self, hz: float = CALM_HZ) -> threading.Thread:
        """Stream at `hz` until `streaming` is cleared."""
        self.streaming.set()

        def run() -> None:
            while self.streaming.is_set():
                self.stream(0.5, hz)

        t = threading.Thread(target=run, daemon=True)
        t.start()
        return t

    def wait(self, done, timeout_s: float) -> bool:
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            if done():
                return True
            time.sleep(0.01)
        return bool(done())

    def commands_in(self, t0: float, t1: float) -> list[float]:
        return [a for a, _ in self.commands if t0 <= a < t1]

    def diag_value(self, key: str) -> str:
        for d in reversed(self.diags):
            for s in d.status:
                if s.name.endswith(": policy"):
                    return next((kv.value for kv in s.values if kv.key == key), "")
        return ""

    def close(self) -> None:
        self.streaming.clear()
        self.executor.shutdown(timeout_sec=1.0)
        self.node.destroy_node()
        self.ctx.try_shutdown()


def start_node(domain_id: int, compressed: bool, log: Path) -> subprocess.Popen:
    params = {"model_dir": POLICY / "vla", "drafter_dir": POLICY / "drafter", "db_path": DB,
              "calibration_path": POLICY / "calibration.json", "decoder.views": json.dumps(list(VIEWS)),
              "compressed_images": str(compressed).lower(), "command_enabled": "true", "after_episode": "continue",
              "diagnostics_period_s": 0.5}  # fmt: skip
    cmd = [sys.executable, "-m", "heisd_ros.ros.node", "--params-file", str(REPO / "config" / "policy.yaml")]
    for k, v in params.items():
        cmd += ["-p", f"{k}:={v}"]
    env = {**os.environ, "ROS_DOMAIN_ID": str(domain_id), "PYTHONUNBUFFERED": "1"}
    log.parent.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024.0
    return float("nan")


def _up(d: Driver, proc: subprocess.Popen) -> None:
    ok = d.wait(lambda: proc.poll() is not None or (all(p.get_subscription_count() for p in d.pub_img)
                and d.pub_instr.get_subscription_count() > 0), 180.0)  # fmt: skip
    if not ok or proc.poll() is not None:
        raise RuntimeError(f"the node did not come up (exit {proc.poll()})")
    d.pub_instr.publish(__import__("std_msgs.msg", fromlist=["String"]).String(data=TASK))
    d.stream(3.0, CALM_HZ)  # warm: the first episode's steps


def _longest_gap(times: list[float], t0: float, t1: float) -> float:
    edges = [t0, *times, t1]
    return max(b - a for a, b in zip(edges, edges[1:]))


def flood(d: Driver) -> dict:
    """CALM_S at 20 Hz, FLOOD_S at 200 Hz (poses 5 per pair), CALM_S at 20 Hz."""
    trips0 = d.diag_value("watchdog_trips")
    t0 = time.monotonic()
    d.stream(CALM_S, CALM_HZ)
    t1 = time.monotonic()
    d.stream(FLOOD_S, FLOOD_HZ)
    t2, end_stamp = time.monotonic(), d.now()
    d.stream(CALM_S, CALM_HZ)
    t3 = time.monotonic()
    time.sleep(1.0)  # the last diagnostics
    first_after = next((a for a, stamp in d.commands if stamp > end_stamp), None)
    decode = [ms for a, ms in d.stats if t1 <= a < t2]
    return {
        "pairs_per_s": {"calm": CALM_HZ, "flood": FLOOD_HZ}, "poses_per_pair": POSE_PER_PAIR,
        "commands_hz": {name: round(len(d.commands_in(a, b)) / (b - a), 2)
                        for name, (a, b) in {"before": (t0, t1), "flood": (t1, t2), "after": (t2, t3)}.items()},
        "longest_gap_in_flood_s": round(_longest_gap(d.commands_in(t1, t2), t1, t2), 3),
        "first_command_after_flood_s": None if first_after is None else round(first_after - t2, 3),
        "decode_ms_in_flood": {"mean": round(float(np.mean(decode)), 1) if decode else None,
                               "p95": round(float(np.percentile(decode, 95)), 1) if decode else None},
        "watchdog_trips": {"before": trips0, "after": d.diag_value("watchdog_trips")},
        "sync_refusals": d.diag_value("sync_refusals"), "rejected": d.diag_value("rejected"),
    }  # fmt: skip


def _burst(d: Driver, name: str, send, timeout_s: float = 30.0) -> dict:
    """`send()` -> futures, sent at once while inputs stream; how many were answered, and the commands meanwhile."""
    trips0 = d.diag_value("watchdog_trips")
    t0 = time.monotonic()
    futures = send()
    d.wait(lambda: all(f.done() for f in futures), timeout_s)
    t1 = time.monotonic()
    answered = sum(f.done() for f in futures)
    window_end = max(t1, t0 + 2.0)  # at least 2 s, so a short burst's rate means something
    time.sleep(max(0.0, window_end - time.monotonic()))
    cmds = d.commands_in(t0, window_end)
    return {"requests": len(futures), "answered": answered, "answered_in_s": round(t1 - t0, 2),
            "commands_hz": round(len(cmds) / (window_end - t0), 2),
            "longest_gap_s": round(_longest_gap(cmds, t0, window_end), 3),
            "watchdog_trips": {"before": trips0, "after": d.diag_value("watchdog_trips")}, "burst": name}  # fmt: skip


def bursts(d: Driver) -> list[dict]:
    from lifecycle_msgs.srv import ChangeState, GetState
    from rcl_interfaces.msg import Parameter, ParameterValue
    from rcl_interfaces.srv import SetParameters
    from std_msgs.msg import String
    from std_srvs.srv import Trigger

    assert d.action.wait_for_server(timeout_sec=10.0), "no ~/run_task"
    out = [_burst(d, "60 goals at once", lambda: [d.action.send_goal_async(d.RunTask.Goal(instruction=TASK))
                                                  for _ in range(60)])]  # fmt: skip
    sent = d.action.send_goal_async(d.RunTask.Goal(instruction=TASK))
    d.wait(sent.done, 10.0)
    handle = sent.result()
    out.append(_burst(d, "400 cancels of the running goal", lambda: [handle.cancel_goal_async() for _ in range(400)]))
    out[-1]["commands_hz"] = out[-1]["longest_gap_s"] = None  # the cancel ends the episode: no command is right
    d.pub_instr.publish(String(data=TASK))  # an episode runs through the bursts below
    time.sleep(1.0)
    params = d.client(SetParameters, "set_parameters")
    params.wait_for_service(timeout_sec=10.0)

    def param_requests():
        kinds = [Parameter(name="warn_throttle_s", value=ParameterValue(type=3, double_value=2.0)),
                 Parameter(name="image_staleness_s", value=ParameterValue(type=3, double_value=-1.0)),
                 Parameter(name="warn_throttle_s", value=ParameterValue(type=99))]  # fmt: skip
        return [params.call_async(SetParameters.Request(parameters=[kinds[k % 3]])) for k in range(100)]

    out.append(_burst(d, "100 SetParameters (valid, invalid value, type 99)", param_requests))
    get_state, change = d.client(GetState, "get_state"), d.client(ChangeState, "change_state")
    get_state.wait_for_service(timeout_sec=10.0)
    change.wait_for_service(timeout_sec=10.0)

    def lifecycle_requests():
        reqs = [get_state.call_async(GetState.Request()) for _ in range(100)]
        refused = ChangeState.Request()
        refused.transition.id = 1  # configure, while active: refused
        return reqs + [change.call_async(refused) for _ in range(50)]

    out.append(_burst(d, "100 get_state + 50 refused change_state", lifecycle_requests))
    reset = d.client(Trigger, "reset")
    reset.wait_for_service(timeout_sec=10.0)
    out.append(_burst(d, "60 ~/reset", lambda: [reset.call_async(Trigger.Request()) for _ in range(60)]))
    return out


def memory(d: Driver, proc: subprocess.Popen, n_cycles: int = CYCLES) -> dict:
    """RSS (MB) steady, after each lifecycle cycle, and after 4000x3000 raw frames."""
    from lifecycle_msgs.srv import ChangeState
    from std_msgs.msg import String

    change = d.client(ChangeState, "change_state")
    change.wait_for_service(timeout_sec=10.0)
    d.stream(5.0, CALM_HZ)
    steady = rss_mb(proc.pid)
    cycles = []
    for _ in range(n_cycles):
        for transition in (4, 2, 1, 3):  # deactivate, cleanup, configure, activate
            req = ChangeState.Request()
            req.transition.id = transition
            fut = change.call_async(req)
            if not d.wait(fut.done, 120.0) or not fut.result().success:
                raise RuntimeError(f"lifecycle transition {transition} failed")
        d.pub_instr.publish(String(data=TASK))
        d.stream(2.0, CALM_HZ)
        cycles.append(round(rss_mb(proc.pid), 1))
    big = None
    if not d.compressed:
        rng = np.random.default_rng(0)
        pixels = rng.integers(0, 255, (3000, 4000, 3), dtype=np.uint8)
        big = d.Image(height=3000, width=4000, encoding="rgb8", step=12000, data=pixels.tobytes())
        for _ in range(5):
            d.pair(image=big)
            time.sleep(0.4)
        d.stream(5.0, CALM_HZ)
    return {"steady_mb": round(steady, 1), "after_each_cycle_mb": cycles,
            "cycles_above_first_mb": round(max(cycles) - cycles[0], 1),
            "after_5_frames_4000x3000_mb": round(rss_mb(proc.pid), 1) if big is not None else None}  # fmt: skip


def leg(domain_id: int, compressed: bool, with_bursts: bool, log: Path, cycles: int = CYCLES, say=print) -> dict:
    proc = start_node(domain_id, compressed, log)
    d = Driver(domain_id, compressed)
    result: dict = {"transport": "CompressedImage (JPEG)" if compressed else "Image (rgb8)"}
    try:
        _up(d, proc)
        say(f"hostile_traffic: {result['transport']}: flood")
        result["flood"] = flood(d)
        if with_bursts:
            say("hostile_traffic: request bursts")
            feeder = d.background()
            try:
                result["bursts"] = bursts(d)
            finally:
                d.streaming.clear()
                feeder.join()
            say("hostile_traffic: memory")
            result["memory"] = memory(d, proc, cycles)
    finally:
        d.close()
        result["exit_code"] = stop_process(proc)
        text = log.read_text(errors="replace")
        result["tracebacks"] = text.count("Traceback")
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="benchmarks/hostile_traffic.json")
    p.add_argument("--domain-id", type=int, default=74)
    p.add_argument("--log-dir", default="artifacts/hostile_traffic")
    p.add_argument("--cycles", type=int, default=CYCLES, help="lifecycle cycles of the memory phase")
    args = p.parse_args(argv)
    if not DB.is_dir() or not DEMO.is_file():
        print(f"hostile_traffic: {DB} or {DEMO} missing: run `make demo` first", file=sys.stderr)
        return 2
    load0 = os.getloadavg()
    logs = Path(args.log_dir)
    report = {"command": "python benchmarks/hostile_traffic.py " + " ".join(argv or sys.argv[1:]),
              "git_rev": git_revision(), "cpu_count": os.cpu_count(), "load_average_at_start": load0,
              "legs": [leg(args.domain_id, True, False, logs / "compressed.log"),
                       leg(args.domain_id, False, True, logs / "raw.log", args.cycles)]}  # fmt: skip
    report["load_average_at_end"] = os.getloadavg()
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
