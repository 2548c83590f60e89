"""Memory of `heisd replay` on a long recording: it streams the bag, so it must not grow with it.

Usage:
    python benchmarks/replay_memory.py [--seconds 180] [--rate 1.0] [--workdir /tmp] [--keep-bag]
                                       [--domain-id 85] [--out benchmarks/replay_memory.json]

Writes a recording of two 640x480 rgb8 cameras at 30 Hz with the pose, finger joints, a depth
camera, /robot_description and /diagnostics (`heisd_ros.tools.make_recording`; 180 s is about
10 GB, written under --workdir and deleted afterwards unless --keep-bag), then replays it paced at
--rate into a policy node started in the same process (a stub decoder: the replay is measured, not
the policy) and samples the process's resident memory every 0.1 s. Reports the RSS at the start of
playing, its peak, the peak of each quarter of the run, the growth (peak - start; the acceptance
bound is 300 MB for 180 s) and the replay's figures. The same bound per minute is checked on a
20-s recording by test/ros/test_replay_memory.py.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from heisd_ros.core.types import StepStats
from heisd_ros.pipeline.outputs import git_revision, write_json
from heisd_ros.replay.playback import rss_mb
from heisd_ros.tools import replay as rp
from heisd_ros.tools.make_recording import RecordingConfig, make_recording

BOUND_MB = 300.0


class StubDecoder:
    """Answers every step at once with a zero action."""

    def __init__(self, cfg) -> None:
        self.method = cfg.decoder.method

    def reset(self, instruction) -> None:
        pass

    def step(self, obs):
        return np.zeros(7), StepStats(mode="drafter", method=self.method, llm_forwards=1, tokens=tuple(range(7)),
                                      latency_ms={"total": 0.1})  # fmt: skip

    def episode_feedback(self, success) -> None:
        pass

    def health(self):
        return True, "stub"


def sample(samples: list, stop: threading.Event) -> None:
    while not stop.is_set():
        samples.append((time.monotonic(), rss_mb()))
        time.sleep(0.1)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=180.0)
    p.add_argument("--rate", type=float, default=1.0)
    p.add_argument("--workdir", default=tempfile.gettempdir())
    p.add_argument("--keep-bag", action="store_true")
    p.add_argument("--domain-id", type=int, default=85)
    p.add_argument("--out", default="")
    a = p.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="replay_memory_", dir=a.workdir))
    bag = work / "recording"
    try:
        t0 = time.monotonic()
        written = make_recording(bag, RecordingConfig(seconds=a.seconds))
        write_s = time.monotonic() - t0
        print(f"wrote {written['bytes'] / 1e9:.2f} GB ({written['steps']} steps) in {write_s:.0f} s", flush=True)
        cfg = rp.ReplayConfig(rate=a.rate, start_node=True, out=str(work / "out"), domain_id=a.domain_id, quiet=True,
                              maps=("/cam_high/image_raw=agentview,/cam_wrist/image_raw=wrist,/ee=pose",),
                              params_file=str(REPO / "config" / "policy.yaml"),
                              params=("control_rate_hz:=30.0",), warmup_steps=1)  # fmt: skip
        samples: list = []
        stop = threading.Event()
        sampler = threading.Thread(target=sample, args=(samples, stop), daemon=True)
        sampler.start()
        try:
            result = rp.replay(bag, cfg, decoder_factory=StubDecoder)
        finally:
            stop.set()
            sampler.join()
        row = result["methods"]["heisd"]
        rss = [r for _, r in samples]
        quarters = [max(q) for q in np.array_split(np.array(rss), 4)]
        report = {"command": " ".join(sys.argv), "git_rev": git_revision(), "bag_bytes": written["bytes"],
                  "bag_seconds": a.seconds, "write_s": write_s, "rate": a.rate, "steps": row["bag_steps"],
                  "commands": row["commands"], "replay_wall_s": row["wall_s"], "rss_mb": row["rss_mb"],
                  "rss_peak_per_quarter_mb": [round(q, 1) for q in quarters],
                  "rss_growth_mb": round(row["rss_mb"]["peak"] - row["rss_mb"]["start"], 1), "bound_mb": BOUND_MB}  # fmt: skip
        print(json.dumps(report, indent=1))
        if a.out:
            write_json(a.out, report)
        return 0 if report["rss_growth_mb"] < BOUND_MB else 1
    finally:
        if not a.keep_bag:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
