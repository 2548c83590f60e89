"""What `heisd-libero sim-demo` shows besides its table: the episode as video and two figures.

- `episode.mp4`: the agentview of every simulator step, the methods side by side, each frame
  labelled with the mode of the command the arm was executing (the step that decoded it: ar,
  drafter, retrieval, skip) and that command's frame-to-command age;
- `modes.png`: per method, the mode and decode step of every decoded frame over simulation time;
- `ages.png`: the frame-to-command age of each method (what the arm waits) beside its decode step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path

import numpy as np

MODE_COLOURS = {"ar": (150, 150, 150), "drafter": (66, 135, 245), "retrieval": (46, 184, 92), "skip": (245, 166, 35)}
"""RGB of each mode, in the video and the figures."""
SCALE = 2
"""Each 128 px view drawn at twice its size."""
BAND = 44
"""Height of the label band above each view."""


@dataclass
class EpisodeFilm:
    """One method's episode: the frames and, per frame, what was commanded."""

    method: str
    frames: list[np.ndarray] = field(default_factory=list)
    """agentview after every simulator step (the first: after the reset)."""
    times_s: list[float] = field(default_factory=list)
    """Per frame: its simulation time (the arm's clock, waits for a missed tick included)."""
    executing: list[float | None] = field(default_factory=list)
    """Per frame: the frame stamp of the command executed to reach it (None before the first)."""
    modes: dict[float, str] = field(default_factory=dict)
    """Frame stamp (s, rounded to 1 us) -> the mode that decoded its command."""
    ages_ms: dict[float, float] = field(default_factory=dict)
    """Frame stamp -> frame-to-command age of its command (ms)."""
    decode_ms: dict[float, float] = field(default_factory=dict)


def _labelled(film: EpisodeFilm, k: int) -> np.ndarray:
    import cv2

    img = film.frames[min(k, len(film.frames) - 1)]
    img = cv2.resize(img, (img.shape[1] * SCALE, img.shape[0] * SCALE), interpolation=cv2.INTER_NEAREST)
    band = np.full((BAND, img.shape[1], 3), 24, np.uint8)
    stamp = film.executing[min(k, len(film.executing) - 1)]
    key = None if stamp is None else round(stamp, 6)
    mode = film.modes.get(key, "-") if key is not None else "hold"
    colour = MODE_COLOURS.get(mode, (200, 200, 200))
    done = k >= len(film.frames)
    t = film.times_s[min(k, len(film.times_s) - 1)] - film.times_s[0]
    cv2.putText(band, f"{film.method}  t={t:4.1f} s{'  (ended)' if done else ''}", (6, 17), cv2.FONT_HERSHEY_SIMPLEX,
                0.5, (255, 255, 255), 1, cv2.LINE_AA)  # fmt: skip
    age = film.ages_ms.get(key) if key is not None else None
    cv2.rectangle(band, (6, 25), (18, 37), colour, -1)
    cv2.putText(band, f"{mode}" + (f"  age {age:.0f} ms" if age is not None else ""), (24, 36),
                cv2.FONT_HERSHEY_SIMPLEX, 0.45, colour, 1, cv2.LINE_AA)  # fmt: skip
    return np.concatenate([band, img], axis=0)


def write_video(films: list[EpisodeFilm], path: Path, fps: float) -> Path:
    """The films side by side (a shorter one holds its last frame), H.264 at the control rate."""
    import av

    length = max(len(f.frames) for f in films)
    first = np.concatenate([_labelled(f, 0) for f in films], axis=1)
    with av.open(str(path), "w") as container:
        stream = container.add_stream("libx264", rate=Fraction(fps).limit_denominator(1001))
        stream.width, stream.height, stream.pix_fmt = first.shape[1], first.shape[0], "yuv420p"
        for k in range(length):
            frame = np.concatenate([_labelled(f, k) for f in films], axis=1)
            container.mux(stream.encode(av.VideoFrame.from_ndarray(np.ascontiguousarray(frame), format="rgb24")))
        container.mux(stream.encode())
    return path


def write_figures(films: list[EpisodeFilm], out_dir: Path) -> list[Path]:
    """modes.png and ages.png (matplotlib's Agg canvas, no display)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9, 1.2 + 1.6 * len(films)), dpi=100, layout="constrained")
    axes = fig.subplots(len(films), 1, sharex=True, squeeze=False)[:, 0]
    for ax, film in zip(axes, films):
        stamps = sorted(film.modes)
        t = np.array(stamps) - (stamps[0] if stamps else 0.0)
        colours = [np.array(MODE_COLOURS.get(film.modes[s], (0, 0, 0))) / 255 for s in stamps]
        ax.scatter(t, [film.decode_ms.get(s, np.nan) for s in stamps], c=colours, s=8)
        ax.set_ylabel(f"{film.method}\ndecode ms")
    for mode, rgb in MODE_COLOURS.items():
        axes[0].scatter([], [], c=[np.array(rgb) / 255], s=8, label=mode)
    axes[0].legend(loc="upper right", ncol=4, fontsize=8)
    axes[-1].set_xlabel("simulation time of the decoded frame (s)")
    fig.savefig(out_dir / "modes.png")

    fig = Figure(figsize=(9, 3.2), dpi=100, layout="constrained")
    ax_age, ax_dec = fig.subplots(1, 2, sharey=True)
    for film in films:
        ax_age.hist(list(film.ages_ms.values()), bins=30, alpha=0.6, label=film.method)
        ax_dec.hist(list(film.decode_ms.values()), bins=30, alpha=0.6, label=film.method)
    ax_age.set_xlabel("frame-to-command age (ms): what the arm waits")
    ax_dec.set_xlabel("decode step (ms): the decoder alone")
    ax_age.set_ylabel("decoded frames")
    ax_age.legend()
    fig.savefig(out_dir / "ages.png")
    return [out_dir / "modes.png", out_dir / "ages.png"]
