"""Limits on what the policy node accepts as input, checked before any work is spent on it.

ROS-free. Every check raises `InputLimitError` with a reason that quotes at most a short prefix of
the offending input (`quote`), so a hostile message never floods the log:

- instruction: length in UTF-8 bytes (checked first, so a megabyte is refused without encoding or
  tokenising it), control characters (a NUL would cut it in C code downstream; nothing is
  silently truncated), then, with the model, its tokens and the whole prompt against the model's
  positions (`ModelInput`);
- camera frames: the pixel count read from the header before decoding (raw: height x width;
  compressed: the image header, see core/image_codec.py), the frame's shape against the model's input
  (`check_frame_shape`);
- end-effector pose: inside a workspace box, and no jump from the previous pose faster than an
  arm moves (`PoseGate`).

docs/design.md §8 describes the node; docs/node.md lists the parameters.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import math
import re
from dataclasses import dataclass
from typing import Callable

import numpy as np

from heisd_ros.core.config import require
from heisd_ros.core.errors import InputLimitError
from heisd_ros.core.model_api import Decoder
from heisd_ros.core.types import ACTION_DIM

QUOTE_CHARS = 80
"""Longest prefix of a refused input quoted in a log line or diagnostic."""
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
"""C0 and C1 control characters, the Unicode line/paragraph separators (an instruction is one line)
and the bidirectional embedding, override and isolate characters (they make a logged instruction
read other than it is)."""


@dataclass(frozen=True)
class InputLimits:
    """Bounds on the node's inputs; anything beyond them gets no command and a warning."""

    max_instruction_bytes: int = 1024
    """Longest instruction accepted, in UTF-8 bytes (checked before anything else is done with it)."""
    max_instruction_tokens: int = 256
    """Longest instruction accepted, in the model's own tokens; the whole prompt (visual tokens, text
    and the 7 action tokens) must also fit the model's positions."""
    max_image_pixels: int = 3840 * 2160
    """Largest camera frame accepted (height x width), read from the header before decoding."""
    allow_small_frames: bool = False
    """Accept frames smaller than the model's input (they are upsampled); refused otherwise."""
    max_aspect_ratio_change: float = 2.0
    """Refuse frames whose aspect ratio differs from the model's input by more than this factor (resizing
    would distort the scene); a large value accepts any shape."""
    workspace_min_m: tuple[float, ...] = (-2.0, -2.0, -2.0)
    """Lower corner of the box the end-effector position must lie in (x, y, z in the pose's frame), m."""
    workspace_max_m: tuple[float, ...] = (2.0, 2.0, 2.0)
    """Upper corner of that box, m."""
    max_pose_jump_m: float = 0.2
    """A pose further from the last accepted pose than this plus max_ee_speed_m_s times the time between
    their stamps is refused (so a real relocation is accepted once that time covers it)."""
    max_ee_speed_m_s: float = 2.0
    """Fastest plausible end-effector speed, m/s (see max_pose_jump_m)."""

    def __post_init__(self) -> None:
        require(1 <= self.max_instruction_bytes <= 1_000_000, "max_instruction_bytes must be in [1, 1e6]")
        require(1 <= self.max_instruction_tokens <= 1_000_000, "max_instruction_tokens must be in [1, 1e6]")
        require(1 <= self.max_image_pixels <= 2**31, "max_image_pixels must be in [1, 2^31]")
        require(math.isfinite(self.max_aspect_ratio_change) and self.max_aspect_ratio_change >= 1.0,
                 f"max_aspect_ratio_change must be finite and >= 1, got {self.max_aspect_ratio_change}")  # fmt: skip
        require(len(self.workspace_min_m) == 3 and len(self.workspace_max_m) == 3,
                 "workspace_min_m and workspace_max_m need 3 values (x, y, z)")  # fmt: skip
        require(all(math.isfinite(lo) and math.isfinite(hi) and lo < hi
                     for lo, hi in zip(self.workspace_min_m, self.workspace_max_m)),
                 f"workspace_min_m {list(self.workspace_min_m)} must be finite and below workspace_max_m "
                 f"{list(self.workspace_max_m)} in every axis")  # fmt: skip
        for name in ("max_pose_jump_m", "max_ee_speed_m_s"):
            value = getattr(self, name)
            require(math.isfinite(value) and value > 0.0, f"{name} must be finite and > 0, got {value}")


def quote(text: str, limit: int = QUOTE_CHARS) -> str:
    """repr() of at most `limit` characters of `text`, with its full length when cut."""
    if len(text) <= limit:
        return repr(text)
    return f"{text[:limit]!r}... ({len(text)} characters)"


def check_instruction(text: str, limits: InputLimits) -> str:
    """The instruction without surrounding whitespace; InputLimitError when it is too long in bytes
    or holds a control character (tokens are checked against the model later, `ModelInput`)."""
    limit = limits.max_instruction_bytes
    # A character is at least one UTF-8 byte: a text this long is refused without encoding it.
    if len(text) > limit:
        raise InputLimitError(f"instruction of {len(text)} characters exceeds max_instruction_bytes {limit}: "
                              f"{quote(text)}")  # fmt: skip
    text = text.strip()
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > limit:
        raise InputLimitError(f"instruction of {size} bytes exceeds max_instruction_bytes {limit}: {quote(text)}")
    bad = _CONTROL.search(text)
    if bad is not None:
        raise InputLimitError(f"instruction holds control character {bad.group()!r} at index {bad.start()}: "
                              f"{quote(text)}")  # fmt: skip
    return text


def check_frame_shape(height: int, width: int, model_hw: tuple[int, int] | None, limits: InputLimits) -> None:
    """InputLimitError for a frame too large, smaller than the model's input or of a very
    different aspect ratio (`model_hw` None: the model's input is unknown, only the size is checked)."""
    if height * width > limits.max_image_pixels:
        raise InputLimitError(f"frame {height}x{width} exceeds max_image_pixels {limits.max_image_pixels}")
    if model_hw is None or height <= 0 or width <= 0:
        return
    mh, mw = model_hw
    if not limits.allow_small_frames and (height < mh or width < mw):
        raise InputLimitError(f"frame {height}x{width} is smaller than the model's input {mh}x{mw} "
                              "(allow with input_limits.allow_small_frames)")  # fmt: skip
    change = (width / height) / (mw / mh)
    if max(change, 1.0 / change) > limits.max_aspect_ratio_change:
        raise InputLimitError(f"frame {height}x{width} has an aspect ratio {max(change, 1.0 / change):.2f}x "
                              f"away from the model's input {mh}x{mw} (> input_limits.max_aspect_ratio_change "
                              f"{limits.max_aspect_ratio_change:g})")  # fmt: skip


class PoseGate:
    """Plausibility of end-effector positions: inside the workspace box, and no jump from the last
    accepted position faster than an arm moves. A glitch is refused and the next true pose accepted;
    a real relocation is accepted once the time since the last accepted pose allows it. `reset()`
    forgets the last position (a new episode: a simulator may place the arm anywhere)."""

    def __init__(self) -> None:
        self._last: tuple[float, np.ndarray] | None = None

    def reset(self) -> None:
        self._last = None

    def check(self, stamp_s: float, position: np.ndarray, limits: InputLimits) -> None:
        """InputLimitError for an implausible position [3] (m) stamped `stamp_s` (s)."""
        pos = np.asarray(position, dtype=np.float64)
        lo, hi = np.asarray(limits.workspace_min_m), np.asarray(limits.workspace_max_m)
        if not np.all(np.isfinite(pos)) or np.any(pos < lo) or np.any(pos > hi):
            raise InputLimitError(f"end-effector position {np.array2string(pos, precision=4)} m outside the "
                                  f"workspace box {lo.tolist()}..{hi.tolist()} m")  # fmt: skip
        last = self._last
        if last is not None and stamp_s >= last[0]:  # else nothing to compare with, or a new timeline
            dt = stamp_s - last[0]
            jump = float(np.linalg.norm(pos - last[1]))
            allowed = limits.max_pose_jump_m + limits.max_ee_speed_m_s * dt
            if jump > allowed:
                raise InputLimitError(f"end-effector position jumped {jump:.3f} m in {dt:.3f} s (> {allowed:.3f} m: "
                                      "input_limits.max_pose_jump_m + max_ee_speed_m_s x dt)")  # fmt: skip
        self._last = (stamp_s, pos)


@dataclass(frozen=True)
class ModelInput:
    """What the node checks inputs against, read from the decoder's model (None: not known)."""

    image_hw: tuple[int, int] | None = None
    """The model's input frame (height, width); frames of another size are resized to it."""
    max_positions: int | None = None
    """The language model's positions (max_position_embeddings)."""
    instruction_tokens: Callable[[str], int] | None = None
    """Tokens of an instruction alone, by the model's own tokenizer."""
    prompt_length: Callable[[str], int] | None = None
    """Positions of the whole prompt (BOS, visual tokens, state, text) for an instruction."""

    def instruction_problem(self, instruction: str, limits: InputLimits) -> str:
        """Why the model cannot take this instruction ('' when it can)."""
        if self.instruction_tokens is not None:
            n = self.instruction_tokens(instruction)
            if n > limits.max_instruction_tokens:
                return (f"instruction of {n} tokens exceeds input_limits.max_instruction_tokens "
                        f"{limits.max_instruction_tokens}: {quote(instruction)}")  # fmt: skip
        if self.prompt_length is not None and self.max_positions is not None:
            needed = self.prompt_length(instruction) + ACTION_DIM
            if needed > self.max_positions:
                return (f"prompt of {needed} positions (with the {ACTION_DIM} action tokens) exceeds the model's "
                        f"{self.max_positions}: {quote(instruction)}")  # fmt: skip
        return ""


def model_input(decoder: Decoder) -> ModelInput:
    """The `ModelInput` of a decoder (what its model says of its input size, positions and tokens)."""
    i = decoder.inputs
    return ModelInput(image_hw=tuple(i.image_hw) if i.image_hw else None, max_positions=i.max_positions,
                      instruction_tokens=i.instruction_tokens, prompt_length=i.prompt_length)


TRIM_AFTER_BYTES = 8 << 20
"""After a step whose input messages held this many bytes, freed memory is handed back to the OS..."""
TRIM_STEPS = 20
"""... at each of the next this many ordinary steps (late large frames are freed a little later)."""


@functools.lru_cache(maxsize=1)
def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to trim
        return None


def release_memory() -> bool:
    """Return the free memory of every malloc arena to the OS (glibc's `malloc_trim`); False where
    the C library has no such call.

    Buffers of a few MB freed by the message layer, numpy or torch stay in glibc's heaps (its mmap
    threshold grows with the largest block freed, up to 32 MB), so one huge frame would otherwise
    leave the node's RSS tens of MB higher for good.
    """
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
