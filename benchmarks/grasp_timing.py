"""When does a closed-loop policy close the gripper, and does it lift afterwards? (NOTES entry 33)

Reads `heisd eval-libero` logs (jsonl or jsonl.gz) and, per method, counts the episodes whose
gripper token ever asks to close, and of those the ones whose end-effector rises `--rise-m` within
`--window` steps of the first close, with the delay. The expert holds 12 steps after closing, then
lifts (about 14 steps to rise 3 cm); a policy that freezes at the grasp never rises, one that lifts
before its fingers have closed rises after 3-10 steps. Also counts single-step "open" tokens
within the window (a grasp dropped and re-closed).

    .venv/bin/python benchmarks/grasp_timing.py benchmarks/libero_object_screen_dwell_ar.jsonl.gz
"""

from __future__ import annotations

import argparse
import functools
import gzip
import json
from collections import defaultdict
from pathlib import Path

from heisd_ros.core.action_tokenizer import ActionTokenizer

GRIPPER = 6


def is_close(token: int, vocab_size: int) -> bool:
    """Whether a gripper token asks to close (its bin is above the middle of the 256)."""
    return int(_tokenizer(vocab_size).to_bins(token)) > 128


@functools.lru_cache(maxsize=None)
def _tokenizer(vocab_size: int) -> ActionTokenizer:
    return ActionTokenizer(vocab_size)


def episode_timing(steps: list[dict], vocab_size: int, rise_m: float, window: int) -> dict | None:
    """{'delay': steps from the first close to the rise (None: no rise), 'reopen_tokens': n} or None."""
    first = next((i for i, s in enumerate(steps) if is_close(s["tokens"][GRIPPER], vocab_size)), None)
    if first is None:
        return None
    z0 = steps[first]["ee"][2]
    span = steps[first : first + window]
    delay = next((i for i, s in enumerate(span) if s["ee"][2] - z0 > rise_m), None)
    reopen = sum(not is_close(s["tokens"][GRIPPER], vocab_size) for s in span)
    return {"delay": delay, "reopen_tokens": reopen, "close_z": z0}


def summarise(paths: list[Path], vocab_size: int, rise_m: float, window: int) -> dict:
    out: dict = defaultdict(lambda: {"episodes": 0, "closed": 0, "lifted": 0, "delays": [], "reopened": 0,
                                     "successes": 0})
    for path in paths:
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rt") as f:
            for line in f:
                rec = json.loads(line)
                if rec.get("kind") != "episode":
                    continue
                m = out[rec["method"]]
                m["episodes"] += 1
                m["successes"] += int(rec["success"])
                t = episode_timing(rec["steps"], vocab_size, rise_m, window)
                if t is None:
                    continue
                m["closed"] += 1
                m["reopened"] += int(t["reopen_tokens"] > 0)
                if t["delay"] is not None:
                    m["lifted"] += 1
                    m["delays"].append(t["delay"])
    for m in out.values():
        m["delays"].sort()
    return dict(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("logs", nargs="+", type=Path)
    p.add_argument("--vocab-size", type=int, default=1283, help="the model's vocabulary (mini VLA: 1283)")
    p.add_argument("--rise-m", type=float, default=0.03)
    p.add_argument("--window", type=int, default=40)
    args = p.parse_args(argv)
    for path in args.logs:
        for method, m in summarise([path], args.vocab_size, args.rise_m, args.window).items():
            print(f"{path.name} [{method}]: {m['successes']}/{m['episodes']} successes; {m['closed']} close, "
                  f"{m['lifted']} of them rise {args.rise_m * 100:.0f} cm within {args.window} steps "
                  f"(after {m['delays']} steps); {m['reopened']} emit an open token in that window")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
