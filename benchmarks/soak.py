"""Soak test: the policy node under sustained sensor load for a long time.

Usage:
    python benchmarks/soak.py [--duration-s 600] [--camera-hz 30] [--pose-hz 100] [--views 3]
        [--control-rate-hz 10] [--method heisd] [--tiny-dir artifacts/tiny] [--domain-id 71]
        [--seed 100] [--out benchmarks/soak.json]
    python benchmarks/soak.py --model-dir artifacts/mini_vla --drafter-dir artifacts/mini_drafter \
        --db-path artifacts/mini_db --calibration-path artifacts/mini_calibration.json --views 2 \
        --demos A_demo.hdf5,B_demo.hdf5 --steps-per-episode 110 [--out benchmarks/node_rss_mini.json]

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
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from heisd_ros.core.errors import ConfigError
from heisd_ros.pipeline.outputs import git_revision

REPO = Path(__file__).resolve().parents[1]
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
    domain_id: int = 71
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

    def __post_init__(self) -> None:
        if self.views not in (2, 3):
            raise ConfigError("views must be 2 or 3")
        if not (self.duration_s > 0 and self.camera_hz > 0 and self.pose_hz > 0 and self.control_rate_hz > 0):
            raise ConfigError("durations and rates must be > 0")
        if self.model_dir and self.model_dir != "tiny" and not self.db_path:
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
    from heisd_ros.pipeline.tiny_artifacts import build_tiny_artifacts

    if cfg.model_dir:
        return {"model_dir": cfg.model_dir, "drafter_dir": cfg.drafter_dir, "db_path": cfg.db_path,
                "calibration_path": cfg.calibration_path}  # fmt: skip
    root = build_tiny_artifacts(cfg.tiny_dir, progress=say)
    paths = {"model_dir": str(root / "model"), "drafter_dir": str(root / "drafter"), "db_path": str(root / "db"),
             "calibration_path": str(root / "calibration.json")}  # fmt: skip
    if cfg.views == 3:
        paths["db_path"] = str(_three_view_db(root, say))
    return paths


def _three_view_db(root: Path, say) -> Path:
    """The tiny database with obs recomputed over (agentview, wrist, side); built once."""
    import torch

    from heisd_ros.core.config import StoreConfig
    from heisd_ros.core.engine import embed_views
    from heisd_ros.models.loader import load_vla
    from heisd_ros.sim import synthetic
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


def episode_frames(cfg: SoakConfig, image_size: int) -> list[list[Frame]]:
    if cfg.demos:
        return demo_frames(cfg)
    from heisd_ros.sim import synthetic

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
    from heisd_ros.sim.recorder import read_hdf5_demos

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
        from rclpy.executors import SingleThreadedExecutor
        from sensor_msgs.msg import Image
        from std_msgs.msg import Bool, String

        from heisd_ros.msg import ArmCommand, DecodeStats
        from heisd_ros.ros.node import EVENT_QOS, LATCHED_QOS, SENSOR_QOS

        self.cfg = cfg
        self.ctx = rclpy.Context()
        rclpy.init(context=self.ctx, domain_id=cfg.domain_id)
        self.node = rclpy.create_node("soak_driver", context=self.ctx)
        n = self.node
        self.lock = threading.Lock()
        self.commands: list[tuple[float, float, int]] = []  # (arrival s, stamp s, step id)
        self.stats: list[tuple[float, float, str]] = []  # (arrival s, total ms, mode)
        self.diag: dict[str, str] = {}
        self.diag_levels: list[tuple[float, int, str]] = []
        self.recording = False
        n.create_subscription(ArmCommand, "arm_command", self._on_cmd, EVENT_QOS)
        n.create_subscription(DecodeStats, "decode_stats", self._on_stats, EVENT_QOS)
        n.create_subscription(DiagnosticArray, "/diagnostics", self._on_diag, EVENT_QOS)
        self.pub_img = [n.create_publisher(Image, f"{v}/image_raw", SENSOR_QOS) for v in cfg.view_names]
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

    def _on_diag(self, msg) -> None:
        for st in msg.status:
            if st.name.endswith(": policy"):
                with self.lock:
                    self.diag = {kv.key: kv.value for kv in st.values}
                    if self.recording and st.level[0] > 0:
                        self.diag_levels.append((self.now(), st.level[0], st.message))

    def connected(self) -> bool:
        return all(p.get_subscription_count() > 0 for p in [*self.pub_img, self.pub_pose, self.pub_instr])

    def play(self, episodes: list[list[Frame]], seconds: float, stop: threading.Event) -> None:
        """Camera frames at camera_hz, poses at pose_hz, one control step of the episode per 1/control_rate."""
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
            if frame.instruction != instruction:
                instruction = frame.instruction
                self.pub_instr.publish(self.String(data=instruction))
            if ep_i != result_sent and k == 0 and ep_i > 0:
                self.pub_result.publish(self.Bool(data=True))  # the previous episode ended
                self.published["episodes"] += 1
                result_sent = ep_i
            stamp = self.now()
            if now >= next_pose:
                frac = ((now - t0) / step_s) % 1.0
                nxt = ep[min(k + 1, len(ep) - 1)].ee_pos
                self.pub_pose.publish(conv.position_to_pose(frame.ee_pos + frac * (nxt - frame.ee_pos), stamp))
                self.published["poses"] += 1
                next_pose += 1.0 / cfg.pose_hz
            if now >= next_cam:
                for pub, img, name in zip(self.pub_img, frame.images, cfg.view_names):
                    pub.publish(conv.rgb_to_image(img, stamp, name))
                self.published["images"] += len(self.pub_img)
                next_cam += 1.0 / cfg.camera_hz
            time.sleep(max(0.0, min(next_cam, next_pose) - time.monotonic()))

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


def start_node(cfg: SoakConfig, paths: dict[str, str], image_size: int = 64) -> subprocess.Popen:
    views = cfg.view_names
    params = {**paths, "decoder.method": cfg.method, "control_rate_hz": float(cfg.control_rate_hz),
              "decoder.views": list(views), "image_topics": [f"{v}/image_raw" for v in views],
              "expected_image_height": image_size, "expected_image_width": image_size, "diagnostics_period_s": 1.0}  # fmt: skip
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
    image_size = int(frames[0][0].images[0].shape[0])
    driver = Driver(cfg)
    proc = start_node(cfg, paths, image_size)
    stop = threading.Event()
    rss: list[tuple[float, float]] = []
    crashed_at, hwm = None, float("nan")
    try:
        end = time.monotonic() + 120
        while not driver.connected() and proc.poll() is None and time.monotonic() < end:
            time.sleep(0.1)
        if proc.poll() is not None or not driver.connected():
            raise RuntimeError(f"the node did not come up (exit {proc.poll()}); see {cfg.node_log}")
        say(f"soak: node pid {proc.pid} up; warm-up {cfg.warmup_s:.0f} s, then {cfg.duration_s:.0f} s measured")
        # the load goes on a little past the measured window, so the last diagnostics still see it
        player = threading.Thread(target=driver.play, args=(frames, cfg.warmup_s + cfg.duration_s + 10, stop),
                                  daemon=True)  # fmt: skip
        player.start()
        time.sleep(cfg.warmup_s)
        driver.recording = True
        t_start = time.monotonic()
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
        measured_s = time.monotonic() - t_start
        driver.recording = False
        time.sleep(2.5)  # diagnostics covering the end of the window (the load is still on)
        hwm = _rss_mb(proc.pid, "VmHWM")
        with driver.lock:
            diag = dict(driver.diag)
    finally:
        stop.set()
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        driver.close()
    result = _report(cfg, driver, diag0, diag, rss, measured_s, proc.returncode, crashed_at)
    result["rss_mb"]["vmhwm"] = hwm
    return {**result, "paths": paths, "db_points": db_points, "image_size": image_size}


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
        "commands": int(len(cmds)),
        "command_rate_hz": len(cmds) / measured_s if measured_s else float("nan"),
        "control_rate_hz": cfg.control_rate_hz,
        "command_rate_ratio": len(cmds) / measured_s / cfg.control_rate_hz if measured_s else float("nan"),
        "longest_gap_between_commands_s": float(gaps.max()) if len(gaps) else float("nan"),
        "decoded_steps": int(len(decode)),
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
        "decode_ms": {"p50": _pct(decode, 50), "p95": _pct(decode, 95), "p99": _pct(decode, 99),
                      "max": float(decode.max()) if len(decode) else float("nan")},
        "node_diag_latency_ms": {"median": diag.get("latency_median_ms"), "p95": diag.get("latency_p95_ms")},
        "rss_mb": {"start": float(rss_arr[0, 1]) if len(rss_arr) else float("nan"),
                   "end": float(rss_arr[-1, 1]) if len(rss_arr) else float("nan"),
                   "max": float(rss_arr[:, 1].max()) if len(rss_arr) else float("nan"),
                   "slope_mb_per_min": slope, "samples": [[round(t, 1), round(m, 1)] for t, m in rss_arr.tolist()]},
        "node_exit_code": exit_code,
        "crashes": int(crashed_at is not None or exit_code not in (0, None)),
        "crashed_at_s": crashed_at,
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    d = SoakConfig()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for f in dataclasses.fields(SoakConfig):
        p.add_argument(f"--{f.name.replace('_', '-')}", type=type(getattr(d, f.name)), default=getattr(d, f.name))
    args = p.parse_args(argv)
    cfg = SoakConfig(**{f.name: getattr(args, f.name) for f in dataclasses.fields(SoakConfig)})
    result = {"command": " ".join([Path(sys.executable).name, *sys.argv]), **run(cfg)}
    Path(cfg.out).parent.mkdir(parents=True, exist_ok=True)
    Path(cfg.out).write_text(json.dumps(result, indent=1) + "\n")
    short = {k: result[k] for k in ("db_points", "measured_s", "commands", "command_rate_hz", "dropped_ticks", "rejected",
                                    "command_age_ms", "decode_ms", "mode_mix", "node_exit_code", "crashes")}  # fmt: skip
    short["rss_mb"] = {k: v for k, v in result["rss_mb"].items() if k != "samples"}
    print(json.dumps(short, indent=1))
    return 0 if result["crashes"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
