"""Soak test: the policy node under sustained sensor load for a long time.

Usage:
    python benchmarks/soak.py [--duration-s 600] [--camera-hz 30] [--pose-hz 100] [--views 3]
        [--control-rate-hz 10] [--method heisd] [--tiny-dir artifacts/tiny] [--domain-id 71]
        [--seed 100] [--out benchmarks/soak.json]
    python benchmarks/soak.py --model-dir artifacts/mini_vla --drafter-dir artifacts/mini_drafter \
        --db-path artifacts/mini_db --calibration-path artifacts/mini_calibration.json --views 2 \
        --demos A_demo.hdf5,B_demo.hdf5 --steps-per-episode 110 [--out benchmarks/node_rss_mini.json]
    python benchmarks/soak.py --hostile --views 2 --duration-s 330 [--calm-s 10 --burst-s 5]
    python benchmarks/soak.py --vs-bench [--vs-threads 1] [--vs-rounds 2] [--duration-s 60]

The node runs as its own process (`python -m heisd_ros.ros.node`, as deployed) on the tiny policy
(`artifacts/tiny`, built on first use; with 3 views a matching 3-view database is derived from it
once, under `<tiny-dir>/db_3views`), or on the model, drafter, database and calibration given with
--model-dir etc. This process plays held-out synthetic episodes (or, with --demos, the first
--demo-episodes episodes of each LIBERO-layout HDF5 file, with their instructions) at the sensor rates: every camera view at --camera-hz, the end-effector pose at --pose-hz (interpolated between
control steps), the instruction (latched) and an episode result at the end of each episode, so
episodes and instruction changes keep coming for the whole run. It records every ArmCommand,
DecodeStats and diagnostics message and samples the node's RSS every few seconds.

Reports: command rate vs control rate, dropped ticks, rejected steps by kind, command age (arrival
time minus the command's header stamp = its newest input) p50/p95/p99/max and its drift between the
first and the second half of the run (a backlog would make it grow), decode time percentiles, mode
mix, RSS at start (after warm-up) and end, its maximum and slope, the node's peak RSS over its whole
life (VmHWM, loading included), the database's point count, the node's exit code after SIGINT
and whether it died before (crashes). Writes JSON with the config, git revision and figures.

--hostile (the fuzz run): after the warm-up, calm_s of the valid load and burst_s of random contents
on every input topic (benchmarks/hostile.py) alternate, in a raw-image leg and a compressed-image leg
(each its own node process, duration_s measured). Adds per burst the time from its end to the first
command decoded from input stamped after it, RSS at the end of every calm phase against the first,
the longest silence of /diagnostics, what was published, and the node log's tracebacks and longest
line. Written under 'hostile' of --out.

--vs-bench: the node's decode time (DecodeStats total_ms, the decoder's own latency_ms['total'], as
bench's step time) against `heisd bench` on the tiny policy, both with vs_threads torch threads and
on the same synthetic episodes. In each of vs_rounds rounds: `heisd bench` back to back, `heisd bench
--pace-hz` at the node's control rate, and the node on two views streaming for duration_s per method
of bench_methods; odd rounds run that sequence in reverse, so load that changes during the run (other
processes on the machine) weighs on both sides alike. Reports per method the node's and both benches'
mean and p95 over the rounds, their ratios (also per round, and with bench's per-mode means weighted
by the node's mode mix), and the stage means per mode of all three. Written under 'node_vs_bench' of
--out.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from heisd_ros.core.errors import ConfigError
from heisd_ros.pipeline.outputs import git_revision
from heisd_ros.ros.node_main import stop_process
from heisd_ros.ros.topics import image_topic

REPO = Path(__file__).resolve().parents[1]
STAGE_FIELDS = ("vision", "retrieval", "draft", "verify", "total")
"""The stage times a DecodeStats carries (`<stage>_ms`); `other` = total minus the first four."""
THIRD_VIEW = "side"
"""The third camera: a mirrored agent view (the synthetic scenes render two)."""


@dataclass(frozen=True)
class SoakConfig:
    duration_s: float = 600.0
    """Length of the measured run, after warm-up."""
    warmup_s: float = 15.0
    """Load before measuring (model warm-up, first episode), not counted."""
    camera_hz: float = 30.0
    pose_hz: float = 100.0
    views: int = 3
    """2 (agentview, wrist) or 3 (+ a mirrored side view)."""
    control_rate_hz: float = 10.0
    method: str = "heisd"
    tiny_dir: str = "artifacts/tiny"
    domain_id: int = 90
    """ROS domain of the node and the load (the tests use 61-72)."""
    seed: int = 100
    """Seed of the played (held-out) episodes; the database holds the tiny build's own."""
    steps_per_episode: int = 40
    """Control steps per played episode (demos are cut to it, or hold their last frame)."""
    model_dir: str = ""
    """A model directory to run instead of the tiny build ('' = tiny); with drafter_dir, db_path, calibration_path."""
    drafter_dir: str = ""
    db_path: str = ""
    calibration_path: str = ""
    demos: str = ""
    """Comma-separated LIBERO-layout HDF5 files played instead of the synthetic episodes ('' = synthetic)."""
    demo_episodes: int = 2
    """Episodes played from each demos file (their order alternates between the files)."""
    rss_period_s: float = 5.0
    out: str = "benchmarks/soak.json"
    node_log: str = "artifacts/soak_node.log"
    compressed: bool = False
    """Publish the views as PNG sensor_msgs/CompressedImage on `<view>/image_raw/compressed`."""
    node_threads: int = 0
    """The node's torch_threads parameter (0 = the parameter's default)."""
    hostile: bool = False
    """Fuzz mode: calm_s of valid streaming, then burst_s of random contents on every input topic
    (benchmarks/hostile.py), repeated; a raw-image and a compressed-image leg of duration_s each,
    without expected_image_* (frames of any size reach the node); the report goes under 'hostile'."""
    calm_s: float = 10.0
    burst_s: float = 5.0
    vs_bench: bool = False
    """Node vs bench, interleaved in vs_rounds rounds (module docstring); under 'node_vs_bench'."""
    bench_methods: str = "ar,heisd"
    vs_threads: int = 1
    """--vs-bench: torch threads of the node (torch_threads) and of heisd bench (--threads)."""
    vs_rounds: int = 2
    """--vs-bench: rounds of (bench back to back, bench paced, the node per method)."""

    def __post_init__(self) -> None:
        if self.vs_rounds < 1 or self.vs_threads < 1:
            raise ConfigError("vs_rounds and vs_threads must be >= 1")
        if self.views not in (2, 3):
            raise ConfigError("views must be 2 or 3")
        if not (self.duration_s > 0 and self.camera_hz > 0 and self.pose_hz > 0 and self.control_rate_hz > 0):
            raise ConfigError("durations and rates must be > 0")
        from heisd_ros.policy import is_tiny

        if self.model_dir and not is_tiny(self.model_dir) and not self.db_path:
            raise ConfigError("--model-dir needs --db-path (and --drafter-dir for drafter-based methods)")

    @property
    def view_names(self) -> tuple[str, ...]:
        return ("agentview", "wrist", THIRD_VIEW)[: self.views]


# ---------------------------------------------------------------------------------------------
# artifacts


def _views(images: dict[str, np.ndarray], names: tuple[str, ...]) -> list[np.ndarray]:
    extra = {THIRD_VIEW: np.ascontiguousarray(images["agentview"][:, ::-1])}
    return [images[n] if n in images else extra[n] for n in names]


def prepare(cfg: SoakConfig, say) -> dict[str, str]:
    """The policy's files: cfg.model_dir etc., or the tiny build with a database covering cfg.views."""
    from heisd_ros.policy import TINY_MODEL, PolicyPaths, is_tiny, resolve_paths

    if cfg.model_dir and not is_tiny(cfg.model_dir):
        return {"model_dir": cfg.model_dir, "drafter_dir": cfg.drafter_dir, "db_path": cfg.db_path,
                "calibration_path": cfg.calibration_path}  # fmt: skip
    tiny = resolve_paths(PolicyPaths(TINY_MODEL, tiny_cache_dir=cfg.tiny_dir), progress=say)
    paths = {k: v for k, v in dataclasses.asdict(tiny).items() if k != "tiny_cache_dir"}
    if cfg.views == 3:
        paths["db_path"] = str(_three_view_db(Path(cfg.tiny_dir), say))
    return paths


def _three_view_db(root: Path, say) -> Path:
    """The tiny database with obs recomputed over (agentview, wrist, side); built once."""
    import torch

    from heisd_ros.core.config import StoreConfig
    from heisd_ros.core.engine import embed_views
    from heisd_ros.models.loader import load_vla
    from heisd_ros.pipeline import synthetic_demos as synthetic
    from heisd_ros.store import make_store

    out = root / "db_3views"
    stamp = out / "built_from.json"
    manifest = json.loads((root / "manifest.json").read_text())
    if stamp.is_file() and json.loads(stamp.read_text()) == manifest:
        return out
    say("soak: deriving a 3-view database from the tiny build")
    subprocess.run(["rm", "-rf", str(out)], check=True)
    params = manifest["params"]
    vla = load_vla(root / "model")
    steps = {(s.instruction, s.episode, s.step): s for s in synthetic.episodes(
        params["seed"], params["n_episodes"], params["n_steps"], vla.cfg.image_size)}  # fmt: skip
    with make_store(StoreConfig(backend="edge", path=str(root / "db"))) as src:
        points = list(src.scroll())
    new = []
    with torch.inference_mode():
        for p in points:
            s = steps[(p.task, p.episode, p.step)]
            query, _ = embed_views(vla, _views(s.images, ("agentview", "wrist", THIRD_VIEW)))
            new.append(dataclasses.replace(p, obs=query))
    with make_store(StoreConfig(backend="edge", path=str(out)), new[0].obs.shape[0], new[0].feat.shape[0], create=True) as dst:
        dst.upsert(new)
    stamp.write_text(json.dumps(manifest))
    return out


# ---------------------------------------------------------------------------------------------
# the load


@dataclass
class Frame:
    images: list[np.ndarray]
    ee_pos: np.ndarray
    instruction: str
    encoded: list[bytes] = dataclasses.field(default_factory=list)
    """The views as PNG (compressed runs)."""


def encode_frames(episodes: list[list[Frame]]) -> None:
    """PNG-encode every view of every frame once (before the run, so the load costs no encoding)."""
    import io

    from PIL import Image as PILImage

    cache: dict[int, bytes] = {}
    for ep in episodes:
        for frame in ep:
            for img in frame.images:
                if id(img) not in cache:
                    buf = io.BytesIO()
                    PILImage.fromarray(np.ascontiguousarray(img)).save(buf, format="PNG")
                    cache[id(img)] = buf.getvalue()
            frame.encoded = [cache[id(img)] for img in frame.images]


def episode_frames(cfg: SoakConfig, image_size: int) -> list[list[Frame]]:
    if cfg.demos:
        return demo_frames(cfg)
    from heisd_ros.pipeline import synthetic_demos as synthetic

    by_ep: dict[tuple[str, int], list[Frame]] = {}
    for s in synthetic.episodes(cfg.seed, 2, cfg.steps_per_episode, image_size):
        by_ep.setdefault((s.instruction, s.episode), []).append(
            Frame(_views(s.images, cfg.view_names), s.ee_pos, s.instruction))
    # alternate the tasks, so the instruction changes between episodes
    eps = list(by_ep.values())
    half = len(eps) // 2
    return [e for pair in zip(eps[:half], eps[half:]) for e in pair]


def demo_frames(cfg: SoakConfig) -> list[list[Frame]]:
    """The first cfg.demo_episodes episodes of each cfg.demos file, alternating between the files."""
    from heisd_libero.sim.recorder import read_hdf5_demos

    per_file = []
    for path in cfg.demos.split(","):
        _, eps = read_hdf5_demos(Path(path.strip()))
        frames = []
        for ep in eps[: cfg.demo_episodes]:
            n = cfg.steps_per_episode
            steps = [Frame(_views({v: ep.images[v][t] for v in ep.images}, cfg.view_names), ep.ee_pos[t],
                           ep.instruction) for t in range(min(n, ep.length))]  # fmt: skip
            frames.append(steps + [steps[-1]] * (n - len(steps)))
        per_file.append(frames)
    return [e for group in zip(*per_file) for e in group]


def _db_points(db_path: str) -> int | None:
    """Points in the embedded database (opened and closed before the node takes it)."""
    if not db_path:
        return None
    from heisd_ros.core.config import StoreConfig
    from heisd_ros.store import make_store

    with make_store(StoreConfig(backend="edge", path=db_path)) as store:
        return int(store.count())


class Driver:
    """Publishes the sensor streams and records the node's outputs (one rclpy context, spun in a thread)."""

    def __init__(self, cfg: SoakConfig) -> None:
        import rclpy
        from diagnostic_msgs.msg import DiagnosticArray
        from geometry_msgs.msg import PoseStamped
        from heisd_ros.msg import ArmCommand, DecodeStats
        from rclpy.executors import SingleThreadedExecutor
        from sensor_msgs.msg import CompressedImage, Image
        from std_msgs.msg import Bool, String

        from heisd_ros.ros.node import EVENT_QOS, LATCHED_QOS, SENSOR_QOS

        self.cfg = cfg
        self.ctx = rclpy.Context()
        rclpy.init(context=self.ctx, domain_id=cfg.domain_id)
        self.node = rclpy.create_node("soak_driver", context=self.ctx)
        n = self.node
        self.lock = threading.Lock()
        self.commands: list[tuple[float, float, int]] = []  # (arrival s, stamp s, step id)
        self.stats: list[tuple[float, float, str]] = []  # (arrival s, total ms, mode)
        self.stages: list[tuple[float, ...]] = []  # STAGE_FIELDS of each DecodeStats, ms
        self.diag: dict[str, str] = {}
        self.diag_levels: list[tuple[float, int, str]] = []
        self.diag_times: list[float] = []  # arrivals of the policy's diagnostics while recording
        self.bursts: list[list[float]] = []  # [start, end] of each hostile burst, node clock s
        self._bursting = False
        self._next_extra = {"instruction": 0.0, "result": 0.0}
        self.recording = False
        n.create_subscription(ArmCommand, "arm_command", self._on_cmd, EVENT_QOS)
        n.create_subscription(DecodeStats, "decode_stats", self._on_stats, EVENT_QOS)
        n.create_subscription(DiagnosticArray, "/diagnostics", self._on_diag, EVENT_QOS)
        self.CompressedImage = CompressedImage
        image_type = CompressedImage if cfg.compressed else Image
        self.pub_img = [n.create_publisher(image_type, image_topic(v, cfg.compressed), SENSOR_QOS) for v in cfg.view_names]
        self.pub_pose = n.create_publisher(PoseStamped, "ee_pose", SENSOR_QOS)
        self.pub_instr = n.create_publisher(String, "instruction", LATCHED_QOS)
        self.pub_result = n.create_publisher(Bool, "episode_result", EVENT_QOS)
        self.String, self.Bool = String, Bool
        self.executor = SingleThreadedExecutor(context=self.ctx)
        self.executor.add_node(n)
        self.spinner = threading.Thread(target=self.executor.spin, daemon=True)
        self.spinner.start()
        self.published = {"images": 0, "poses": 0, "episodes": 0}

    def now(self) -> float:
        return self.node.get_clock().now().nanoseconds * 1e-9

    def _on_cmd(self, msg) -> None:
        t = self.now()
        if self.recording:
            with self.lock:
                self.commands.append((t, msg.header.stamp.sec + 1e-9 * msg.header.stamp.nanosec, msg.step_id))

    def _on_stats(self, msg) -> None:
        if self.recording:
            with self.lock:
                self.stats.append((self.now(), float(msg.total_ms), msg.mode))
                self.stages.append(tuple(float(getattr(msg, f"{k}_ms")) for k in STAGE_FIELDS))

    def _on_diag(self, msg) -> None:
        for st in msg.status:
            if st.name.endswith(": policy"):
                with self.lock:
                    self.diag = {kv.key: kv.value for kv in st.values}
                    if self.recording:
                        self.diag_times.append(self.now())
                    if self.recording and st.level[0] > 0:
                        self.diag_levels.append((self.now(), st.level[0], st.message))

    def connected(self) -> bool:
        return all(p.get_subscription_count() > 0 for p in [*self.pub_img, self.pub_pose, self.pub_instr])

    def play(self, episodes: list[list[Frame]], seconds: float, stop: threading.Event, hostile=None) -> None:
        """Camera frames at camera_hz, poses at pose_hz, one control step of the episode per 1/control_rate;
        with `hostile` (a hostile.Hostile), its bursts replace every stream (see `_in_burst`)."""
        from heisd_ros.ros import conversions as conv

        cfg = self.cfg
        step_s = 1.0 / cfg.control_rate_hz
        t0 = time.monotonic()
        next_cam, next_pose = t0, t0
        ep_i, instruction, result_sent = 0, None, -1
        while not stop.is_set():
            now = time.monotonic()
            if now - t0 >= seconds:
                return
            k_total = int((now - t0) / step_s)
            ep_i, k = divmod(k_total, cfg.steps_per_episode)
            ep = episodes[ep_i % len(episodes)]
            frame = ep[k]
            burst = hostile is not None and self._in_burst(now - t0)
            if burst:
                instruction = None  # the valid one is published again when the burst ends
                self._burst_extras(hostile, now)
            elif frame.instruction != instruction:
                instruction = frame.instruction
                self.pub_instr.publish(self.String(data=instruction))
            if ep_i != result_sent and k == 0 and ep_i > 0 and not burst:
                self.pub_result.publish(self.Bool(data=True))  # the previous episode ended
                self.published["episodes"] += 1
                result_sent = ep_i
            stamp = self.now()
            if now >= next_pose:
                frac = ((now - t0) / step_s) % 1.0
                nxt = ep[min(k + 1, len(ep) - 1)].ee_pos
                pos = frame.ee_pos + frac * (nxt - frame.ee_pos)
                self.pub_pose.publish(hostile.pose(pos, stamp, now) if burst else conv.position_to_pose(pos, stamp))
                self.published["poses"] += 1
                next_pose += 1.0 / cfg.pose_hz
            if now >= next_cam:
                for i, (pub, name) in enumerate(zip(self.pub_img, cfg.view_names)):
                    pub.publish(hostile.image(name, stamp, now) if burst else self._frame_msg(frame, i, stamp, name))
                self.published["images"] += len(self.pub_img)
                next_cam += 1.0 / cfg.camera_hz
            time.sleep(max(0.0, min(next_cam, next_pose) - time.monotonic()))

    def _frame_msg(self, frame: Frame, i: int, stamp: float, name: str):
        from heisd_ros.ros import conversions as conv

        if not self.cfg.compressed:
            return conv.rgb_to_image(frame.images[i], stamp, name)
        msg = self.CompressedImage(format="png", data=frame.encoded[i])
        msg.header.stamp, msg.header.frame_id = conv.s_to_stamp(stamp), name
        return msg

    def _in_burst(self, t: float) -> bool:
        """After the warm-up: calm_s of valid input, then burst_s of hostile input, repeated; transitions
        are recorded in `bursts` (node clock)."""
        cfg = self.cfg
        u = t - cfg.warmup_s
        active = u >= 0 and u % (cfg.calm_s + cfg.burst_s) >= cfg.calm_s
        if active != self._bursting:
            self._bursting = active
            with self.lock:
                if active:
                    self.bursts.append([self.now(), float("nan")])
                else:
                    self.bursts[-1][1] = self.now()
        return active

    def _burst_extras(self, hostile, now: float) -> None:
        """Hostile instructions and episode results, at their own rates."""
        from hostile import INSTRUCTION_PERIOD_S, RESULT_PERIOD_S

        if now >= self._next_extra["instruction"]:
            self.pub_instr.publish(self.String(data=hostile.instruction(now)))
            self._next_extra["instruction"] = now + INSTRUCTION_PERIOD_S
        if now >= self._next_extra["result"]:
            self.pub_result.publish(self.Bool(data=hostile.result()))
            self._next_extra["result"] = now + RESULT_PERIOD_S

    def close(self) -> None:
        import rclpy

        self.executor.shutdown(timeout_sec=2.0)
        self.spinner.join(2.0)
        self.node.destroy_node()
        rclpy.try_shutdown(context=self.ctx)


def _rss_mb(pid: int, field: str = "VmRSS") -> float:
    """A memory figure of /proc/PID/status in MB: VmRSS (now) or VmHWM (peak over the process's life)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return float("nan")


def _cpu_s(pid: int) -> float:
    """CPU time (user + system, all threads) a process has used, s."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return float("nan")


def start_node(cfg: SoakConfig, paths: dict[str, str], image_size: int = 64) -> subprocess.Popen:
    views = cfg.view_names
    params = {**paths, "decoder.method": cfg.method, "control_rate_hz": float(cfg.control_rate_hz),
              "decoder.views": list(views),
              "compressed_images": cfg.compressed, "diagnostics_period_s": 1.0,
              # commands are what the soak measures; every episode runs on, as the stream keeps coming
              "command_enabled": True, "after_episode": "continue"}  # fmt: skip
    if cfg.node_threads > 0:
        params["torch_threads"] = cfg.node_threads
    if not cfg.hostile:
        params.update({"expected_image_height": image_size, "expected_image_width": image_size})
    cmd = [sys.executable, "-m", "heisd_ros.ros.node", "--params-file", str(REPO / "config" / "policy.yaml")]
    for k, v in params.items():
        cmd += ["-p", f"{k}:={json.dumps(v)}"]
    log_path = Path(cfg.node_log)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "ROS_DOMAIN_ID": str(cfg.domain_id), "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log_path.open("w"), stderr=subprocess.STDOUT)


def _pct(a, q) -> float:
    return float(np.percentile(a, q)) if len(a) else float("nan")


def run(cfg: SoakConfig, say=print) -> dict:
    paths = prepare(cfg, say)
    db_points = _db_points(paths["db_path"])
    frames = episode_frames(cfg, 64)
    if cfg.compressed:
        encode_frames(frames)
    image_size = int(frames[0][0].images[0].shape[0])
    hostile = None
    if cfg.hostile:
        from hostile import Hostile

        instructions = sorted({f.instruction for ep in frames for f in ep})
        hostile = Hostile(cfg.seed, image_size, cfg.compressed, instructions)
    driver = Driver(cfg)
    proc = start_node(cfg, paths, image_size)
    stop = threading.Event()
    try:
        end = time.monotonic() + 120
        while not driver.connected() and proc.poll() is None and time.monotonic() < end:
            time.sleep(0.1)
        if proc.poll() is not None or not driver.connected():
            raise RuntimeError(f"the node did not come up (exit {proc.poll()}); see {cfg.node_log}")
        say(f"soak: node pid {proc.pid} up; warm-up {cfg.warmup_s:.0f} s, then {cfg.duration_s:.0f} s measured")
        # the load goes on a little past the measured window, so the last diagnostics still see it
        player = threading.Thread(target=driver.play, args=(frames, cfg.warmup_s + cfg.duration_s + 10, stop, hostile),
                                  daemon=True)  # fmt: skip
        player.start()
        time.sleep(cfg.warmup_s)
        m = _measure(cfg, driver, proc, say)
    finally:
        stop.set()
        t_stop = time.monotonic()
        stop_process(proc)
        stop_s = time.monotonic() - t_stop
        driver.close()
    result = _report(cfg, driver, m["diag0"], m["diag"], m["rss"], m["measured_s"], proc.returncode, m["crashed_at"])
    result["rss_mb"]["vmhwm"] = m["hwm"]
    result["shutdown_s"] = round(stop_s, 2)
    result["cpu_cores_used"] = m["cpu_cores_used"]  # CPU s per s measured: the node, this process (the load)
    if hostile is not None:
        from hostile import burst_figures, log_figures

        bursts = [(s, e) for s, e in driver.bursts if np.isfinite(e) and e + cfg.calm_s <= m["end_node_s"]]
        result["hostile"] = burst_figures(bursts, driver.commands, driver.diag_times, m["rss"], m["start_node_s"],
                                          cfg.calm_s, m["end_node_s"])  # fmt: skip
        result["hostile"]["published"] = dict(sorted(hostile.counts.items()))
        result["node_log"] = log_figures(cfg.node_log)
    return {**result, "paths": paths, "db_points": db_points, "image_size": image_size}


def _measure(cfg: SoakConfig, driver: Driver, proc: subprocess.Popen, say) -> dict:
    """Record for duration_s: RSS every rss_period_s, progress every 30 s; stop early if the node exits."""
    rss: list[tuple[float, float]] = []
    crashed_at = None
    driver.recording = True
    t_start, start_node_s = time.monotonic(), driver.now()
    cpu0 = (_cpu_s(proc.pid), _cpu_s(os.getpid()))
    with driver.lock:
        diag0 = dict(driver.diag)
    next_report = t_start + 30
    while time.monotonic() - t_start < cfg.duration_s:
        rss.append((time.monotonic() - t_start, _rss_mb(proc.pid)))
        if proc.poll() is not None and crashed_at is None:
            crashed_at = time.monotonic() - t_start
            say(f"soak: the node exited with {proc.returncode} after {crashed_at:.0f} s")
            break
        if time.monotonic() >= next_report:
            next_report += 30
            with driver.lock:
                n = len(driver.commands)
            say(f"soak: {time.monotonic() - t_start:5.0f} s  commands {n}  rss {rss[-1][1]:.0f} MB  "
                f"dropped {driver.diag.get('dropped_ticks')}  rejected {driver.diag.get('rejected')}")
        time.sleep(min(cfg.rss_period_s, max(0.05, t_start + cfg.duration_s - time.monotonic())))
    measured_s, end_node_s = time.monotonic() - t_start, driver.now()
    cpu = {"node": (_cpu_s(proc.pid) - cpu0[0]) / measured_s, "load": (_cpu_s(os.getpid()) - cpu0[1]) / measured_s}
    driver.recording = False
    time.sleep(2.5)  # diagnostics covering the end of the window (the load is still on)
    with driver.lock:
        diag = dict(driver.diag)
    return {"rss": rss, "crashed_at": crashed_at, "diag0": diag0, "diag": diag, "measured_s": measured_s,
            "hwm": _rss_mb(proc.pid, "VmHWM"), "start_node_s": start_node_s, "end_node_s": end_node_s,
            "cpu_cores_used": cpu}  # fmt: skip


def _counts(text: str) -> dict[str, int]:
    """'input:5 slow:1' -> {'input': 5, 'slow': 1} (the diagnostics' rejected-steps field)."""
    out = {}
    for item in (text or "").split():
        if ":" in item:
            k, _, v = item.rpartition(":")
            out[k] = int(v) if v.isdigit() else 0
    return out


def _since(before: dict, after: dict, key: str) -> int:
    return int(after.get(key, 0) or 0) - int(before.get(key, 0) or 0)


def stage_means_by_mode(driver: Driver) -> dict[str, dict[str, float]]:
    """Per mode: its steps and the mean of each DecodeStats stage, ms (as heisd bench's
    `mode_stage_mean_ms`), with `other` = total minus vision, retrieval, draft and verify."""
    out: dict[str, dict[str, float]] = {}
    for mode in sorted({m for _, _, m in driver.stats}):
        rows = np.array([st for (_, _, m), st in zip(driver.stats, driver.stages) if m == mode])
        means = dict(zip(STAGE_FIELDS, rows.mean(axis=0).tolist()))
        means["other"] = means["total"] - sum(means[k] for k in STAGE_FIELDS[:-1])
        out[mode] = {"steps": len(rows), **means}
    return out


def _report(cfg, driver, diag0, diag, rss, measured_s, exit_code, crashed_at) -> dict:
    cmds = np.array([(t, s) for t, s, _ in driver.commands]) if driver.commands else np.zeros((0, 2))
    age_ms = (cmds[:, 0] - cmds[:, 1]) * 1e3 if len(cmds) else np.zeros(0)
    half = len(age_ms) // 2
    decode = np.array([ms for _, ms, _ in driver.stats])
    modes: dict[str, int] = {}
    for _, _, m in driver.stats:
        modes[m] = modes.get(m, 0) + 1
    rss_arr = np.array([r for r in rss if np.isfinite(r[1])])
    slope = float(np.polyfit(rss_arr[:, 0], rss_arr[:, 1], 1)[0] * 60) if len(rss_arr) > 2 else float("nan")
    gaps = np.diff(cmds[:, 0]) if len(cmds) > 1 else np.zeros(0)
    levels: dict[str, int] = {}
    for _, lvl, msg in driver.diag_levels:
        key = f"{'WARN' if lvl == 1 else 'ERROR'}: {msg.split(':')[0][:60]}"
        levels[key] = levels.get(key, 0) + 1
    return {
        "config": dataclasses.asdict(cfg),
        "git_rev": git_revision(),
        "cpu_count": os.cpu_count(),
        "load_average_at_end": list(os.getloadavg()),
        "measured_s": round(measured_s, 2),
        "published": dict(driver.published),
        "commands": len(cmds),
        "command_rate_hz": len(cmds) / measured_s if measured_s else float("nan"),
        "control_rate_hz": cfg.control_rate_hz,
        "command_rate_ratio": len(cmds) / measured_s / cfg.control_rate_hz if measured_s else float("nan"),
        "longest_gap_between_commands_s": float(gaps.max()) if len(gaps) else float("nan"),
        "decoded_steps": len(decode),
        "dropped_ticks": _since(diag0, diag, "dropped_ticks"),
        "rejected": {k: v - _counts(diag0.get("rejected", "")).get(k, 0)
                     for k, v in _counts(diag.get("rejected", "")).items()
                     if v - _counts(diag0.get("rejected", "")).get(k, 0)},
        "watchdog_trips": _since(diag0, diag, "watchdog_trips"),
        "fallback_steps": _since(diag0, diag, "fallback_steps"),
        "clipped_commands": _since(diag0, diag, "clipped_commands"),
        "clock_resets": _since(diag0, diag, "clock_resets"),
        "non_ok_diagnostics": levels,
        "mode_mix": dict(sorted(modes.items())),
        "command_age_ms": {"p50": _pct(age_ms, 50), "p95": _pct(age_ms, 95), "p99": _pct(age_ms, 99),
                           "max": float(age_ms.max()) if len(age_ms) else float("nan"),
                           "first_half_p50": _pct(age_ms[:half], 50), "second_half_p50": _pct(age_ms[half:], 50)},
        "decode_ms": {"mean": float(decode.mean()) if len(decode) else float("nan"), "p50": _pct(decode, 50),
                      "p95": _pct(decode, 95), "p99": _pct(decode, 99),
                      "max": float(decode.max()) if len(decode) else float("nan"),
                      "mean_by_mode": {m: float(np.mean([ms for _, ms, mm in driver.stats if mm == m])) for m in modes},
                      "stage_mean_by_mode": stage_means_by_mode(driver)},
        "node_diag_latency_ms": {"median": diag.get("latency_median_ms"), "p95": diag.get("latency_p95_ms")},
        "rss_mb": {"start": float(rss_arr[0, 1]) if len(rss_arr) else float("nan"),
                   "end": float(rss_arr[-1, 1]) if len(rss_arr) else float("nan"),
                   "max": float(rss_arr[:, 1].max()) if len(rss_arr) else float("nan"),
                   "slope_mb_per_min": slope, "samples": [[round(t, 1), round(m, 1)] for t, m in rss_arr.tolist()]},
        "node_exit_code": exit_code,
        "crashes": int(crashed_at is not None or exit_code not in (0, None)),
        "crashed_at_s": crashed_at,
    }  # fmt: skip


REPORT_KEYS = ("hostile", "node_vs_bench")
"""Entries of the soak report written by the other modes (a plain soak keeps them)."""


def write_report(path: str, result: dict, key: str = "") -> None:
    """Write `result` to `path`: under `key`, or at the top level keeping the REPORT_KEYS entries."""
    out = Path(path)
    old = json.loads(out.read_text()) if out.is_file() else {}
    new = {**old, key: result} if key else {**result, **{k: old[k] for k in REPORT_KEYS if k in old}}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(new, indent=1) + "\n")


def run_hostile(cfg: SoakConfig, say=print) -> dict:
    """The fuzz run: a raw-image leg, then a compressed-image leg (each its own node process)."""
    legs, at_start = {}, {"git_rev": git_revision(), "git_dirty": _dirty()}
    for compressed in (False, True):
        name = "compressed" if compressed else "raw"
        say(f"soak: hostile leg {name}")
        log = str(Path(cfg.node_log).with_name(f"{Path(cfg.node_log).stem}_hostile_{name}.log"))
        legs[name] = run(dataclasses.replace(cfg, compressed=compressed, node_log=log), say)
    return {"at_start": at_start, "git_rev": git_revision(), "git_dirty": _dirty(), "legs": legs,
            "crashes": sum(leg["crashes"] for leg in legs.values())}  # fmt: skip


def _dirty() -> list[str]:
    """Uncommitted changes under heisd_ros/ (the node that ran is the working tree's)."""
    out = subprocess.run(["git", "status", "--short", "heisd_ros"], check=False, cwd=REPO, capture_output=True, text=True)
    return out.stdout.splitlines()


VS_BENCH_SEED = 1000
"""The episodes the node plays in --vs-bench: those `heisd bench --seed 0` decodes (its seed + 1000)."""


def _bench(cfg: SoakConfig, pace_hz: float | None, say) -> dict:
    """`heisd bench` on the tiny policy with cfg.vs_threads threads, back to back or paced at `pace_hz`:
    per method of cfg.bench_methods its mean / median / p95 step, mode mix and stage means per mode."""
    out = Path(cfg.node_log).with_name("soak_bench.json")
    cmd = [str(Path(sys.executable).with_name("heisd")), "bench", "--model", "tiny", "--tiny-dir", cfg.tiny_dir,
           "--methods", cfg.bench_methods, "--episodes", "2", "--steps", str(cfg.steps_per_episode),
           "--threads", str(cfg.vs_threads), "--json", str(out)]  # fmt: skip
    if pace_hz:
        cmd += ["--pace-hz", f"{pace_hz:g}"]
    say("soak: " + " ".join(cmd[1:]))
    subprocess.run(cmd, cwd=REPO, check=True, capture_output=True)
    rep = json.loads(out.read_text())
    figures = ("mean_step_ms", "median_step_ms", "p95_step_ms", "mode_mix", "mode_stage_mean_ms")
    return {"command": " ".join(["heisd", *cmd[1:]]), "pace_hz": rep["_meta"]["pace_hz"],
            "paced_ticks_skipped": rep["_meta"]["paced_ticks_skipped"],
            **{m: {k: rep[m][k] for k in figures} for m in cfg.bench_methods.split(",")}}  # fmt: skip


def _node_leg(cfg: SoakConfig, method: str, say) -> dict:
    r = run(dataclasses.replace(cfg, method=method), say)
    return {k: r[k] for k in ("decode_ms", "mode_mix", "decoded_steps", "command_rate_hz", "dropped_ticks",
                              "cpu_cores_used", "crashes")}  # fmt: skip


def _vs_round(cfg: SoakConfig, index: int, say) -> dict:
    """One round: bench back to back, bench paced at the control rate, the node per method; odd
    rounds in reverse order. Each leg records the 1-minute load average before and after it."""
    legs = [("bench", lambda: _bench(cfg, None, say)), ("paced_bench", lambda: _bench(cfg, cfg.control_rate_hz, say))]
    legs += [(f"node {m}", lambda m=m: _node_leg(cfg, m, say)) for m in cfg.bench_methods.split(",")]
    if index % 2:
        legs.reverse()
    out: dict = {"order": [name for name, _ in legs], "node": {}}
    for name, leg in legs:
        load0 = os.getloadavg()[0]
        result = leg()
        result["load_average_1min"] = [round(load0, 2), round(os.getloadavg()[0], 2)]
        if name.startswith("node "):
            out["node"][name.split(" ", 1)[1]] = result
        else:
            out[name] = result
    return out


def _pool(parts: list[dict]) -> dict[str, float]:
    """Stage means of several runs of one mode ({'steps': n, stage: mean}), weighted by their steps;
    `other` = total minus vision, retrieval, draft and verify."""
    n = sum(p["steps"] for p in parts)
    means = {k: sum(p["steps"] * p.get(k, 0.0) for p in parts) / n for k in STAGE_FIELDS}
    means["other"] = means["total"] - sum(means[k] for k in STAGE_FIELDS[:-1])
    return {"steps": n, **means}


def _vs_method(rounds: list[dict], method: str) -> dict:
    """Node vs both benches for one method, over the rounds: means of the per-round mean and p95,
    their ratios, the ratio per round, the ratio with bench's per-mode means weighted by the node's
    mode mix (heisd's mix drifts in the node, whose episode results adapt verify-skip), and stage means per mode."""
    node = [r["node"][method]["decode_ms"] for r in rounds]
    node_ms = {"mean": float(np.mean([d["mean"] for d in node])), "p95": float(np.mean([d["p95"] for d in node]))}
    modes = {m for d in node for m in d["stage_mean_by_mode"]}
    stages = {m: {"node": _pool([d["stage_mean_by_mode"][m] for d in node if m in d["stage_mean_by_mode"]])}
              for m in sorted(modes)}  # fmt: skip
    out: dict = {"node_ms": node_ms}
    for side in ("bench", "paced_bench"):
        runs = [r[side][method] for r in rounds]
        ms = {"mean": float(np.mean([b["mean_step_ms"] for b in runs])),
              "p95": float(np.mean([b["p95_step_ms"] for b in runs]))}  # fmt: skip
        out[f"{side}_ms"] = ms
        both = [m for m in stages if all(m in b["mode_stage_mean_ms"] for b in runs)]
        for m in both:
            stages[m][side] = _pool([b["mode_stage_mean_ms"][m] for b in runs])
        weights = [stages[m]["node"]["steps"] for m in both]
        mixed = (sum(w * stages[m]["node"]["total"] for w, m in zip(weights, both))
                 / max(sum(w * stages[m][side]["total"] for w, m in zip(weights, both)), 1e-9))  # fmt: skip
        out[f"node_over_{side}"] = {
            "mean": node_ms["mean"] / ms["mean"], "p95": node_ms["p95"] / ms["p95"],
            "mean_at_node_mode_mix": mixed if both else float("nan"),
            "mean_per_round": [d["mean"] / b["mean_step_ms"] for d, b in zip(node, runs)],
            "p95_per_round": [d["p95"] / b["p95_step_ms"] for d, b in zip(node, runs)],
        }  # fmt: skip
    out["stage_mean_ms_by_mode"] = stages
    return out


def run_vs_bench(cfg: SoakConfig, say=print) -> dict:
    """The node against `heisd bench`, back to back and paced, interleaved in rounds (module docstring)."""
    cfg = dataclasses.replace(cfg, views=2, seed=VS_BENCH_SEED, node_threads=cfg.vs_threads)
    at_start = {"git_rev": git_revision(), "git_dirty": _dirty(), "load_average": list(os.getloadavg())}
    rounds = []
    for i in range(cfg.vs_rounds):
        say(f"soak: node vs bench, round {i + 1} of {cfg.vs_rounds}")
        rounds.append(_vs_round(cfg, i, say))
    return {"at_start": at_start, "git_rev": git_revision(), "git_dirty": _dirty(), "cpu_count": os.cpu_count(),
            "load_average_at_end": list(os.getloadavg()), "threads": cfg.vs_threads, "pace_hz": cfg.control_rate_hz,
            "rounds": cfg.vs_rounds, "node_duration_s": cfg.duration_s,
            "methods": {m: _vs_method(rounds, m) for m in cfg.bench_methods.split(",")},
            "per_round": rounds, "crashes": sum(r["node"][m]["crashes"] for r in rounds for m in r["node"])}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    d = SoakConfig()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for f in dataclasses.fields(SoakConfig):
        default = getattr(d, f.name)
        if isinstance(default, bool):
            p.add_argument(f"--{f.name.replace('_', '-')}", action="store_true", default=default)
        else:
            p.add_argument(f"--{f.name.replace('_', '-')}", type=type(default), default=default)
    args = p.parse_args(argv)
    cfg = SoakConfig(**{f.name: getattr(args, f.name) for f in dataclasses.fields(SoakConfig)})
    command = " ".join([Path(sys.executable).name, *sys.argv])
    if cfg.hostile or cfg.vs_bench:
        result = {"command": command, **(run_hostile(cfg) if cfg.hostile else run_vs_bench(cfg))}
        write_report(cfg.out, result, "hostile" if cfg.hostile else "node_vs_bench")
        short = {k: v for k, v in result.items() if k not in ("legs", "per_round")}
        if cfg.hostile:
            short["legs"] = {n: {"crashes": leg["crashes"], "node_exit_code": leg["node_exit_code"],
                                 **{k: leg["hostile"][k] for k in ("bursts", "bursts_resumed", "resume_s",
                                                                   "rss_steady_mb", "rss_after_calm_max_excess_mb")},
                                 "rss_mb": {k: v for k, v in leg["rss_mb"].items() if k != "samples"},
                                 "node_log": leg["node_log"]} for n, leg in result["legs"].items()}  # fmt: skip
        print(json.dumps(short, indent=1))
        return 0 if result.get("crashes", 0) == 0 else 1
    result = {"command": command, **run(cfg)}
    write_report(cfg.out, result)
    short = {k: result[k] for k in ("db_points", "measured_s", "commands", "command_rate_hz", "dropped_ticks", "rejected",
                                    "command_age_ms", "decode_ms", "mode_mix", "node_exit_code", "crashes")}  # fmt: skip
    short["rss_mb"] = {k: v for k, v in result["rss_mb"].items() if k != "samples"}
    print(json.dumps(short, indent=1))
    return 0 if result["crashes"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
