"""Published LIBERO figures that an `heisd-libero eval-libero` report is read against (numbers only).

HeiSD (arXiv 2603.17573) and Spec-VLA (arXiv 2507.22424) measured OpenVLA-7B on a GPU; this
project's reports measure another model on other hardware, so only the ratios and the success
gap to each one's own `ar` compare, never the milliseconds or the success rates themselves.
"""

from __future__ import annotations

import math
from typing import Any

_H, _S = "HeiSD paper (OpenVLA-7B, A100)", "Spec-VLA paper (OpenVLA-7B, GPU)"
PUBLISHED = {
    # suite: (source, method, success, speedup vs ar, accept length or None)
    "libero_object": [(_H, "ar", 0.712, 1.00, None), (_H, "specvla (their re-run)", 0.624, 1.10, 3.91),
                      (_H, "heisd", 0.710, 2.45, 4.94), (_S, "specvla (relaxed)", 0.850, 1.38, 2.38)],
    "libero_goal": [(_H, "ar", 0.770, 1.00, None), (_H, "specvla (their re-run)", 0.710, 1.23, 3.63),
                    (_H, "heisd", 0.730, 2.38, 4.75), (_S, "specvla (relaxed)", 0.744, 1.42, 2.94)],
    "libero_spatial": [(_H, "ar", 0.828, 1.00, None), (_H, "specvla (their re-run)", 0.804, 1.26, 3.80),
                       (_H, "heisd", 0.780, 1.90, 4.83), (_S, "specvla (relaxed)", 0.858, 1.28, 2.14)],
    "libero_10": [(_H, "ar", 0.544, 1.00, None), (_H, "specvla (their re-run)", 0.462, 1.13, 3.63),
                  (_H, "heisd", 0.470, 1.79, 4.96), (_S, "specvla (relaxed)", 0.550, 1.22, 2.10)],
}


def paper_heisd_speedup(suite: str) -> float | None:
    """The HeiSD paper's heisd speedup over its own `ar` on `suite` (mean step), None for a suite it did not run."""
    return next((x for src, m, _, x, _ in PUBLISHED.get(suite, []) if src == _H and m == "heisd"), None)


HARDWARE = ("Published rows: OpenVLA-7B (bf16) on a datacenter GPU, where one LLM forward is ~14 ms; "
            "this run: the mini VLA on {threads} CPU thread(s) of this machine. Compare speedups over each "
            "one's own `ar` and success gaps to it, not step times or absolute success.")


def _f(x: Any) -> str:
    return "n/a" if x is None or (isinstance(x, float) and not math.isfinite(x)) else f"{x:.2f}"


def md_anchors(report: dict[str, Any]) -> list[str]:
    """The published rows of the report's suite beside this run's ar / specvla / heisd (none for other suites)."""
    meta = report.get("_meta", {})
    rows = PUBLISHED.get(str(meta.get("suite", "")))
    if not rows:
        return []
    out = ["## Against the published figures", "",
           "| source | method | success | speedup vs ar (mean) | accept length |", "|---|---|---|---|---|"]
    out += [f"| {src} | {m} | {s:.1%} | {x:.2f}x | {_f(al)} |" for src, m, s, x, al in rows]
    for m in ("ar", "specvla", "heisd"):
        r = report.get(m)
        if r:
            out.append(f"| this run | {m} | {r['success_rate']:.1%} ({r['episodes']} ep.) | "
                       f"{_f(r.get('speedup_vs_ar'))}x | {_f(r.get('accept_length'))} |")
    return out + ["", HARDWARE.format(threads=meta.get("threads", "?")), ""]
