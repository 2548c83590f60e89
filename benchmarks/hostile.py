"""Hostile input for the policy node: what `soak.py --hostile` publishes during a burst, and its figures.

A burst replaces every input stream, at its usual rate, with messages drawn from `Hostile`:
camera frames (raw: noise, random sizes and encodings, wrong row steps and lengths, headers that
claim huge sizes, 4000x3000 frames; compressed: random bytes, truncated or bit-flipped PNG/JPEG,
PNG/JPEG of random sizes, an 8000x8000 1-bit PNG of 8 KB, a PNG whose header claims 60000x60000),
poses (NaN, inf, 1e30, jumps of up to 100 m, zero / NaN / non-unit quaternions, random valid
ones), instructions (empty, blank, NUL or other control characters, random Unicode, up to 1 MB of
words, a 100k-character token, the other task's instruction) and random episode results, with
header stamps that are mostly now and otherwise 0, an hour or 0.3 s off, or the largest stamp.
Large messages (frames over 8 MB, the PNG bomb, 1 MB instructions) go out at most once per
`LARGE_PERIOD_S` per stream, so the burst stays within the memory of a small machine.

`burst_figures` turns the recorded commands, diagnostics and RSS samples into the report: whether
commands resume after each burst and how soon, the largest gap between diagnostics, and RSS after
each calm phase against the steady state of the first.
"""

from __future__ import annotations

import io
import struct
import zlib
from collections import Counter
from pathlib import Path

import numpy as np

LARGE_PERIOD_S = 2.0
"""At most one large message per stream in this time."""
LARGE_HW = (3000, 4000)
"""Height, width of the largest raw frame (rgb8: 36 MB)."""
INSTRUCTION_PERIOD_S = 0.2
RESULT_PERIOD_S = 0.5
BAD_ENCODINGS = ("", "16UC1", "32FC1", "yuv422", "bayer_rggb8", "rgb16", "jpeg", "RGB8 ", "rgb8\x01")
BAD_FORMATS = ("", "png", "jpeg", "rgb8; jpeg compressed bgr8", "tiff", "bmp", "png\x00jpeg", "x" * 300)
WORDS = ("pick", "up", "the", "alphabet", "soup", "and", "place", "it", "in", "basket", "bowl", "plate")
UNICODE_RANGES = ((0x20, 0x7E), (0xA0, 0x2FF), (0x370, 0x3FF), (0x4E00, 0x4FFF), (0x1F300, 0x1F64F), (0xE000, 0xE0FF))
"""Code points drawn for random instructions (no surrogates: a message's string is valid UTF-8)."""


def _png(img) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def _png_claiming(height: int, width: int) -> bytes:
    """A small valid PNG whose header (IHDR, CRC fixed) claims height x width."""
    from PIL import Image as PILImage

    data = bytearray(_png(PILImage.new("RGB", (8, 8))))
    ihdr = 8 + 8  # signature, then the IHDR chunk's length and type
    data[ihdr : ihdr + 8] = struct.pack(">II", width, height)
    crc = zlib.crc32(bytes(data[ihdr - 4 : ihdr + 13]))
    data[ihdr + 13 : ihdr + 17] = struct.pack(">I", crc)
    return bytes(data)


class Hostile:
    """Random, mostly malformed messages for the node's input topics, from one seeded generator.

    image_size: the model's input size (the valid frames'); compressed: CompressedImage frames
    (else Image); instructions: the valid ones (a burst also sends the other task's).
    """

    def __init__(self, seed: int, image_size: int, compressed: bool, instructions: list[str]) -> None:
        from PIL import Image as PILImage

        self.rng = np.random.default_rng(seed)
        self.size, self.compressed, self.instructions = image_size, compressed, instructions
        self.pool = self.rng.integers(0, 256, LARGE_HW[0] * LARGE_HW[1] * 4, dtype=np.uint8).tobytes()
        self.counts: Counter = Counter()
        """Messages published per (stream, kind)."""
        self._last_large: dict[str, float] = {}
        self.blobs = {"bomb": _png(PILImage.new("1", (8000, 8000))), "header_lies": _png_claiming(60000, 60000)}
        self.bank = [self._encoded(fmt, h, w) for fmt in ("PNG", "JPEG") for h, w in
                     ((image_size, image_size), (16, 16), (480, 640), (image_size, 8 * image_size), (1, 1024),
                      (1024, 768), (image_size // 2, image_size // 2))]  # fmt: skip
        """(format, bytes) of noise images of assorted sizes, encoded once (mutated at run time)."""

    def _encoded(self, fmt: str, h: int, w: int) -> tuple[str, bytes]:
        from PIL import Image as PILImage

        img = PILImage.fromarray(self.rng.integers(0, 256, (h, w, 3), dtype=np.uint8))
        buf = io.BytesIO()
        img.save(buf, format=fmt)
        return fmt.lower(), buf.getvalue()

    def _large_ok(self, stream: str, t: float) -> bool:
        if t - self._last_large.get(stream, -1e9) < LARGE_PERIOD_S:
            return False
        self._last_large[stream] = t
        return True

    def _pick(self, stream: str, kinds: tuple[str, ...], t: float) -> str:
        kind = kinds[int(self.rng.integers(len(kinds)))]
        if kind.startswith("large") and not self._large_ok(stream, t):
            kind = kinds[0]
        self.counts[f"{stream}:{kind}"] += 1
        return kind

    def _bytes(self, n: int) -> bytes:
        start = int(self.rng.integers(0, max(1, len(self.pool) - n)))
        return self.pool[start : start + n]

    def stamp(self, now_s: float):
        """A header stamp: mostly now; otherwise 0, far or slightly off, or the largest one."""
        from builtin_interfaces.msg import Time

        r = self.rng.random()
        t = now_s if r < 0.7 else float(self.rng.choice([0.0, now_s - 3600, now_s + 3600, now_s - 0.3, now_s + 0.3]))
        if r > 0.97:
            return Time(sec=2**31 - 1, nanosec=999_999_999)
        ns = int(max(t, 0.0) * 1e9)
        return Time(sec=ns // 1_000_000_000, nanosec=ns % 1_000_000_000)

    # ------------------------------------------------------------------ messages
    def image(self, stream: str, now_s: float, t: float):
        return self.compressed_image(stream, now_s, t) if self.compressed else self.raw_image(stream, now_s, t)

    def raw_image(self, stream: str, now_s: float, t: float):
        from sensor_msgs.msg import Image

        rng, s = self.rng, self.size
        kind = self._pick(stream, ("noise", "size", "encoding", "step", "empty", "header_lies", "large"), t)
        h, w, enc = s, s, "rgb8"
        if kind == "size":
            h, w = (int(v) for v in rng.integers(1, 721, 2))
            enc = str(rng.choice(["rgb8", "bgr8", "rgba8", "bgra8", "mono8"]))
        elif kind == "large":
            h, w = LARGE_HW
        elif kind == "empty":
            h, w = (0, s) if rng.random() < 0.5 else (s, 0)
        elif kind == "header_lies":
            h, w = (int(v) for v in rng.integers(10_000, 100_000, 2))
        channels = {"rgba8": 4, "bgra8": 4, "mono8": 1}.get(enc, 3)
        step = w * channels
        n = 0 if kind == "header_lies" else step * h
        if kind == "encoding":
            enc = str(rng.choice(BAD_ENCODINGS))
        elif kind == "step":
            step = int(rng.integers(0, 2 * step + 2))
            n = max(0, step * h + int(rng.integers(-h, h + 1)))
        msg = Image(height=h, width=w, encoding=enc, step=step, is_bigendian=int(rng.random() < 0.1))
        msg.header.stamp, msg.header.frame_id = self.stamp(now_s), stream
        msg.data = self._bytes(n)
        return msg

    def compressed_image(self, stream: str, now_s: float, t: float):
        from sensor_msgs.msg import CompressedImage

        rng = self.rng
        kinds = ("encoded", "random_bytes", "truncated", "bit_flips", "header_lies", "large_bomb")
        kind = self._pick(stream, kinds, t)
        fmt, data = self.bank[int(rng.integers(len(self.bank)))]
        if kind == "random_bytes":
            fmt, data = str(rng.choice(BAD_FORMATS)), self._bytes(int(rng.integers(0, 65536)))
        elif kind == "truncated":
            data = data[: int(rng.integers(0, len(data)))]
        elif kind == "bit_flips":
            arr = np.frombuffer(data, dtype=np.uint8).copy()
            idx = rng.integers(0, arr.size, max(1, arr.size // 200))
            arr[idx] ^= rng.integers(1, 256, idx.size, dtype=np.uint8)
            data = arr.tobytes()
        elif kind in ("header_lies", "large_bomb"):
            fmt, data = "png", self.blobs["bomb" if kind == "large_bomb" else kind]
        msg = CompressedImage(format=fmt)
        msg.header.stamp, msg.header.frame_id = self.stamp(now_s), stream
        msg.data = data
        return msg

    def pose(self, valid_xyz: np.ndarray, now_s: float, t: float):
        from geometry_msgs.msg import PoseStamped

        rng = self.rng
        kinds = ("random", "nan", "inf", "huge", "jump", "quat_zero", "quat_nan", "quat_scaled", "stamp_only")
        kind = self._pick("pose", kinds, t)
        xyz, quat = np.asarray(valid_xyz, dtype=np.float64).copy(), np.array([0.0, 0.0, 0.0, 1.0])
        i = int(rng.integers(3))
        if kind == "random":
            xyz = rng.uniform(-1.0, 1.0, 3)
        elif kind in ("nan", "inf", "huge"):
            xyz[i] = {"nan": np.nan, "inf": -np.inf if rng.random() < 0.5 else np.inf, "huge": 1e30}[kind]
        elif kind == "jump":
            xyz += rng.uniform(-1, 1, 3) * 10 ** rng.uniform(-0.3, 2)
        elif kind == "quat_zero":
            quat[:] = 0.0
        elif kind == "quat_nan":
            quat[int(rng.integers(4))] = np.nan
        elif kind == "quat_scaled":
            quat *= 10 ** rng.uniform(-3, 3)
        msg = PoseStamped()
        msg.header.stamp, msg.header.frame_id = self.stamp(now_s), "base_link"
        p, q = msg.pose.position, msg.pose.orientation
        p.x, p.y, p.z = (float(v) for v in xyz)
        q.x, q.y, q.z, q.w = (float(v) for v in quat)
        return msg

    def instruction(self, t: float) -> str:
        rng = self.rng
        kinds = ("other_task", "empty", "blank", "nul", "control", "unicode", "words", "token", "large_words")
        kind = self._pick("instruction", kinds, t)
        valid = str(rng.choice(self.instructions))
        if kind == "other_task":
            return valid
        if kind in ("empty", "blank"):
            return "" if kind == "empty" else " \t \n  "
        if kind == "nul":
            return valid[: int(rng.integers(1, len(valid)))] + "\x00" + valid
        if kind == "control":
            chars = [chr(int(c)) for c in rng.choice([*range(1, 32), 127], 8)]
            return "".join(ch for pair in zip(valid, chars * 10) for ch in pair)
        if kind == "unicode":
            lo, hi = UNICODE_RANGES[int(rng.integers(len(UNICODE_RANGES)))]
            return "".join(chr(int(c)) for c in rng.integers(lo, hi + 1, int(rng.integers(1, 400))))
        if kind == "token":
            return "x" * 100_000
        n_bytes = 1_000_000 if kind == "large_words" else int(rng.integers(200, 20_000))
        words = rng.choice(WORDS, n_bytes // 5 + 1)
        return " ".join(words.tolist())[:n_bytes]

    def result(self) -> bool:
        self.counts["episode_result:random"] += 1
        return bool(self.rng.random() < 0.5)


# ---------------------------------------------------------------------------------------------
# figures


def _first_valid_command(commands: list[tuple[float, float, int]], after_s: float, before_s: float) -> float | None:
    """Arrival time of the first command decoded from input stamped after `after_s` (node clock)."""
    for arrival, stamp, _ in commands:
        if after_s < arrival < before_s and after_s <= stamp <= arrival:
            return arrival
    return None


def burst_figures(bursts: list[tuple[float, float]], commands: list, diag_times: list[float],
                  rss: list[tuple[float, float]], t_start_node_s: float, calm_s: float, run_end_s: float) -> dict:
    """Per burst (node-clock start, end): commands during it, time to the first valid command after it;
    RSS at the end of each calm phase against the steady state (the first calm phase's median)."""
    rows = []
    for i, (start, end) in enumerate(bursts):
        nxt = bursts[i + 1][0] if i + 1 < len(bursts) else run_end_s
        first = _first_valid_command(commands, end, nxt)
        rows.append({"start_s": round(start - t_start_node_s, 2), "during": sum(1 for a, *_ in commands if start <= a < end),
                     "resume_s": None if first is None else round(first - end, 3)})  # fmt: skip
    resumed = [r["resume_s"] for r in rows if r["resume_s"] is not None]
    diag = np.diff(sorted(diag_times)) if len(diag_times) > 1 else np.zeros(0)
    rss_arr = np.array(rss) if rss else np.zeros((0, 2))
    calm_ends = [s - t_start_node_s for s, _ in bursts]
    first_calm = rss_arr[rss_arr[:, 0] < min(calm_ends[:1] or [calm_s]), 1] if len(rss_arr) else np.zeros(0)
    steady = float(np.median(first_calm)) if len(first_calm) else float("nan")
    after = [float(rss_arr[rss_arr[:, 0] < t][-1, 1]) for t in calm_ends[1:] if np.any(rss_arr[:, 0] < t)]
    return {
        "bursts": len(rows),
        "bursts_resumed": len(resumed),
        "resume_s": {"p50": float(np.median(resumed)) if resumed else None,
                     "p95": float(np.percentile(resumed, 95)) if resumed else None,
                     "max": float(max(resumed)) if resumed else None},
        "commands_during_bursts": sum(r["during"] for r in rows),
        "longest_gap_between_diagnostics_s": float(diag.max()) if len(diag) else None,
        "rss_steady_mb": steady,
        "rss_after_calm_mb": [round(v, 1) for v in after],
        "rss_after_calm_max_excess_mb": float(max(after) - steady) if after else None,
        "per_burst": rows,
    }  # fmt: skip


def log_figures(path: str) -> dict:
    """The node's log: lines, the longest line, tracebacks, thread deaths, WARN/ERROR lines, rosout
    and RCL errors (a shutdown that publishes on a dead context)."""
    try:
        lines = Path(path).read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return {}
    return {
        "lines": len(lines),
        "longest_line_chars": max((len(line) for line in lines), default=0),
        "tracebacks": sum("Traceback (most recent call last)" in line for line in lines),
        "exception_in_thread": sum("Exception in thread" in line for line in lines),
        "warn_lines": sum("[WARN]" in line for line in lines),
        "error_lines": sum("[ERROR]" in line for line in lines),
        "fatal_lines": sum("[FATAL]" in line for line in lines),
        "rosout_or_rcl_errors": sum("rosout" in line or "RCLError" in line for line in lines),
    }
