"""`heisd-libero eval-libero`: two labels with the same decoder configuration decode the same steps.

Two variants of heisd with one configuration each get their own LiberoEnv and HybridDecoder of the
same (task, init state) and take turns at every control step in one process, so each sees other
timings (the other label's steps, the simulator, whatever else loads the machine). heisd's draft
source is chosen from what verification has cost counted in LLM forwards, never timed, so both
labels must log the same modes, forwards and tokens at every step.

Why this can fail: on the tiny LIBERO-shaped policy every step takes 7 forwards in either mode, but
the step times of the two modes overlap (about 20-40 ms each on the 2-core CI machine). The labels
route on single steps (smoothing 1.0, one retrieval step before comparing, a probe every second step
routed away), so from the 4th step on every source is chosen by comparing the last step of each
source; with a step's measured time as its cost, each label compared its own timing noise and the
two routes (the logged modes) parted, as they did on the code that timed steps. The test checks that
the run exercises that choice: steps with F defined (all above tau = -1) take both sources. Tokens
alone could not show it (strict decoding fixes the same tokens from either source); the modes can.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # end to end: closed-loop LIBERO episodes

from libero_policy import INSTRUCTION, build_libero_policy, require_libero  # noqa: E402

require_libero()  # headless rendering, or the module is skipped where LIBERO is not installed

from heisd_libero import eval_libero  # noqa: E402

MAX_STEPS = 20
"""2 steps without a full window (drafter), 1 learning (retrieval), 17 routed by the cost comparison
(with 10 the code that timed steps still gave both labels the same routes in about 1 run of 3)."""
SINGLE_STEP_ROUTING = "source_choice.smoothing=1.0,source_choice.min_retrieval_steps=1,source_choice.probe_every_steps=2"
"""The source choice at its most sensitive: every decision compares the last step of each source."""
VARIANTS = f"heisd_a=heisd:{SINGLE_STEP_ROUTING};heisd_b=heisd:{SINGLE_STEP_ROUTING}"
"""Two labels, one configuration."""
TIMES = {"ms", "fwd_ms", "cpu_ms", "sim_ms"}
"""What a step record measures rather than decides."""


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory) -> Path:
    return build_libero_policy(tmp_path_factory.mktemp("eval_policy"))


def _undefined(f) -> bool:
    return f is None or (isinstance(f, float) and math.isnan(f))


def test_twin_labels_decode_the_same_steps(policy_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "twins.json"
    args = ["--model", str(policy_dir / "model"), "--drafter", str(policy_dir / "drafter"),
            "--db", str(policy_dir / "db"), "--calibration", str(policy_dir / "calibration.json"),
            "--suite", "libero_object", "--tasks", "0", "--init-states", "40", "--methods", "heisd_a,heisd_b",
            "--variants", VARIANTS, "--max-steps", str(MAX_STEPS), "--camera-size", "64", "--threads", "1",
            "--no-shadow-ar", "--out", str(out), "--no-progress"]  # fmt: skip
    assert eval_libero.main(args) == 0
    episodes = [r for r in map(json.loads, out.with_suffix(".jsonl").read_text().splitlines()) if r["kind"] == "episode"]
    assert sorted((e["task"], e["init_state"], e["method"]) for e in episodes) == [(0, 40, "heisd_a"), (0, 40, "heisd_b")]
    runs = {e["method"]: e for e in episodes}
    first, twin = runs["heisd_a"], runs["heisd_b"]
    assert first["instruction"] == twin["instruction"] == INSTRUCTION
    assert len(first["steps"]) == MAX_STEPS  # the random policy does not succeed in 20 steps

    # the run exercises the cost-based choice: among the steps whose window is full (F defined,
    # above tau = -1), some retrieve and some were routed to the drafter
    modes = [s["mode"] for s in first["steps"]]
    routed = [s["mode"] for s in first["steps"] if not _undefined(s["F"])]
    assert len(routed) == MAX_STEPS - 2 and {"drafter", "retrieval"} <= set(routed), modes

    # step by step, everything decoding decided (and the simulator's answer to it) is the same
    assert [s["mode"] for s in twin["steps"]] == modes
    for a, b in zip(first["steps"], twin["steps"], strict=True):
        assert a["tokens"] == b["tokens"], (a["t"], a["tokens"], b["tokens"])
        assert {k: v for k, v in a.items() if k not in TIMES} == {k: v for k, v in b.items() if k not in TIMES}, a["t"]
    assert (first["success"], first["length"]) == (twin["success"], twin["length"])
