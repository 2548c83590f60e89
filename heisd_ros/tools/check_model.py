"""heisd check-model: load a policy checkpoint and check that it behaves as HeiSD needs.

Usage:
    heisd check-model DIR [--unnorm-key KEY] [--device cpu|cuda] [--dtype float32|bfloat16|float16]
                      [--images N] [--steps N] [--drafter DIR] [--instruction TEXT] [--threads N]
                      [--min-differing F] [--tie-tolerance X] [--json FILE]

DIR is an OpenVLA checkpoint in the published layout or a VLA saved by heisd (`heisd-libero train-vla`),
loaded as the node loads it (`models.loader.load_policy_model`, with its state prior if it has one).
Behaviour checks, each printed with pass or FAIL:

  images     the `ar` actions of N frames (flat, dark, bright, gradients, checkerboard, then noise):
             how many of the N(N-1)/2 pairs differ; passes when at least --min-differing of them do
             (a model whose vision does not reach the LLM gives every frame one action). The VLA is
             judged alone: a state prior sees the same state for every frame and is left out here
  drafter    strict drafter decoding gives `ar`'s tokens on every frame; the drafter is --drafter or
             an untrained EAGLE head built for the model's LLM, whose drafts verification must reject
  retrieval  strict retrieval from an in-memory database holding every frame's `ar` tokens, every
             second frame's shifted by 3 bins, gives `ar`'s tokens (verification corrects those)
  heisd      heisd with strict acceptance and no verify-skip (drafter steps until the pose window
             fills, then retrieval steps) gives `ar`'s tokens
  actions    every decoded action is finite, made of action tokens, and un-normalises inside the
             statistics of --unnorm-key ([q01, q99] per normalised dimension, gripper -1 or +1)

In bfloat16 and float16 a tree forward rounds differently from a one-token forward, so where the two
best action logits are nearly tied a strict method may pick the other one. A difference whose logit
margin (one teacher-forced forward) is within --tie-tolerance counts as a near-tie, reported, not failed.

Timing: `ar`, `drafter` and `heisd` (as checked) take --steps control steps each on --device, in
turns over the frames, after one warm-up round: mean, median and p95 step (ms), LLM forwards per
step, speedup = mean `ar` step / mean step. An untrained drafter's drafts are rejected, so its steps
are slower than `ar`'s: give --drafter for the speed a trained one reaches. heisd's database holds
these very frames, so its figure is a best case.

Exit status: 0 every check passed, 1 a check failed, 2 DIR, --drafter or --unnorm-key could not be loaded.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from heisd_ros.assembly import PolicyParts, assemble_decoders
from heisd_ros.core.config import (
    AcceptanceConfig,
    DecoderConfig,
    FusedMetricConfig,
    SourceChoiceConfig,
    StoreConfig,
    VerifySkipConfig,
)
from heisd_ros.core.engine import HybridDecoder, embed_views, prompt_patches
from heisd_ros.core.errors import (
    ConfigError,
    DatabaseError,
    ModelLoadError,
    UnknownTaskError,
)
from heisd_ros.core.types import GRIPPER_INDEX, Observation, StepStats
from heisd_ros.core.verifier import TargetSession
from heisd_ros.pipeline.figures import distribution
from heisd_ros.pipeline.outputs import git_revision, write_json

VIEWS = ("agentview", "wrist")
EE_POS = np.array([0.1, 0.0, 0.2])
GRIPPER_GAP_M = 0.04
TIE_TOLERANCE = {"float32": 1e-3, "float16": 0.1, "bfloat16": 0.5}
"""Default --tie-tolerance per dtype: logit differences that rounding alone produces between a
tree forward and a one-token forward (float32: essentially none)."""
SHIFT_BINS = 3
TIMED = ("ar", "drafter", "heisd")


@dataclass
class Check:
    """One behaviour check's outcome: a line of the table, an entry of the JSON report."""

    name: str
    passed: bool | None
    """None: skipped (detail says why)."""
    detail: str
    figures: dict = field(default_factory=dict)


@dataclass
class Session:
    """The loaded policy, the frames it is checked on and every step decoded so far."""

    vla: object
    prior: object
    drafter: torch.nn.Module
    args: argparse.Namespace
    observations: list[Observation]
    steps: list[tuple[np.ndarray, StepStats]] = field(default_factory=list)

    def decoder(self, method: str, store=None, with_prior: bool = True) -> HybridDecoder:
        """A decoder of `method` on the loaded policy (heisd: its strict form, see the module doc)."""
        cfg = DecoderConfig(method=method, views=VIEWS, device=self.args.device, dtype=self.args.dtype,
                            unnorm_key=self.args.unnorm_key)
        if method == "heisd":  # strict: every token verified, retrieval whenever the pose window is full
            cfg = dataclasses.replace(
                cfg, acceptance=AcceptanceConfig(max_token_bias_bins=0, max_group_bias_bins=0),
                verify_skip=VerifySkipConfig(enabled=False), source_choice=SourceChoiceConfig(enabled=False),
                fused_metric=FusedMetricConfig(tau=-1.0))
        parts = PolicyParts(self.vla, self.prior if with_prior else None, self.drafter, store)
        return assemble_decoders(parts, {method: cfg})[method]

    def step(self, decoder: HybridDecoder, obs: Observation) -> StepStats:
        action, st = decoder.step(obs)
        self.steps.append((action, st))
        return st


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="heisd check-model", description=__doc__.split("\n")[0],
                                epilog="Exit status: 0 all checks passed, 1 a check failed, 2 load error.")
    p.add_argument("model", help="checkpoint directory (OpenVLA layout, or a VLA saved by heisd)")
    p.add_argument("--unnorm-key", default="", help="dataset statistics that un-normalise actions ('' = the model's own)")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ...")
    p.add_argument("--dtype", default="float32", choices=sorted(TIE_TOLERANCE))
    p.add_argument("--images", type=int, default=8, help="frames the checks decode (>= 2)")
    p.add_argument("--steps", type=int, default=20, help="timed steps per method (0: no timing)")
    p.add_argument("--drafter", default="", help="a trained drafter directory ('' = an untrained one)")
    p.add_argument("--instruction", default="pick up the red bowl")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = torch's default)")
    p.add_argument("--min-differing", type=float, default=0.5, help="share of frame pairs that must differ")
    p.add_argument("--tie-tolerance", type=float, default=None,
                   help="logit margin below which a strict method's different token is a near-tie "
                        "(default by dtype: " + ", ".join(f"{k} {v}" for k, v in TIE_TOLERANCE.items()) + ")")
    p.add_argument("--json", default="", help="write the report here")
    return p


def frames(n: int, hw: tuple[int, int]) -> list[np.ndarray]:
    """`n` distinct RGB frames of size `hw`: flat grey, dark, bright, two colour gradients, a
    checkerboard, then seeded noise."""
    h, w = hw
    yy, xx = np.mgrid[0:h, 0:w]
    yy, xx = yy / max(h - 1, 1), xx / max(w - 1, 1)
    board = ((xx * 8).astype(int) + (yy * 8).astype(int)) % 2
    structured = [np.full((h, w, 3), 128.0), np.full((h, w, 3), 20.0), np.full((h, w, 3), 235.0),
                  np.stack([xx, yy, 1 - xx], -1) * 255, np.stack([1 - yy, xx * yy, yy], -1) * 255,
                  np.repeat(board[..., None], 3, -1) * 255.0]
    rng = np.random.default_rng(0)
    out = [f.astype(np.uint8) for f in structured[:n]]
    while len(out) < n:
        out.append(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))
    return out


def observations(images: list[np.ndarray], instruction: str) -> list[Observation]:
    """One observation per frame: the frame as primary view, its mirror image as the wrist view."""
    return [Observation({VIEWS[0]: img, VIEWS[1]: np.ascontiguousarray(img[:, ::-1])}, instruction, EE_POS.copy(),
                        gripper_gap=GRIPPER_GAP_M) for img in images]


def check_images(tokens: list[tuple[int, ...]], min_share: float, note: str = "") -> Check:
    n = len(tokens)
    pairs = n * (n - 1) // 2
    differ = sum(tokens[i] != tokens[j] for i in range(n) for j in range(i + 1, n))
    need = int(np.ceil(min_share * pairs))
    return Check("images", differ >= need and differ > 0,
                 f"{differ} of {pairs} frame pairs give different actions (need {need}){note}",
                 {"pairs": pairs, "differing_pairs": differ, "distinct_actions": len(set(tokens))})


@torch.inference_mode()
def tie_margin(s: Session, obs: Observation, prefix: tuple[int, ...], a: int, b: int) -> float:
    """|logit(a) - logit(b)| of the target predicting the action after `prefix` (with the state
    prior's bias, as the decoders see it), from one teacher-forced forward."""
    vla = s.vla
    _, patches = embed_views(vla, [obs.images[v] for v in VIEWS[:vla.prompt_views]])
    prompt = vla.prompt_embeds(obs.instruction, vla.projector(prompt_patches(vla, patches)), state=obs.ee_pos,
                               gripper_gap=obs.gripper_gap)[0]
    head = vla.action_head_weight()
    target = TargetSession(vla.language_model, head)
    chain = torch.cat([prompt, target.token_embeds(list(prefix))]) if prefix else prompt
    logits = (target.forward(chain).hidden[0] @ head.T).float()
    bias = s.prior.bias(obs.instruction, obs.ee_pos, obs.gripper_gap) if s.prior is not None else None
    if bias is not None:
        logits = logits + bias[len(prefix)].to(logits.device)
    first = vla.action_tokenizer.first_token_id
    return abs(float(logits[a - first] - logits[b - first]))


def compare(s: Session, name: str, runs: list[tuple[Observation, tuple, StepStats]], tolerance: float,
            note: str) -> Check:
    """A strict method's tokens against `ar`'s: equal, a near-tie (first difference within
    `tolerance`), or a mismatch."""
    equal, ties, worst, modes = 0, 0, 0.0, {}
    for obs, ref, st in runs:
        modes[st.mode] = modes.get(st.mode, 0) + 1
        if st.tokens == ref:
            equal += 1
            continue
        i = next(k for k, (x, y) in enumerate(zip(ref, st.tokens)) if x != y)
        margin = tie_margin(s, obs, ref[:i], ref[i], st.tokens[i])
        worst = max(worst, margin)
        ties += margin <= tolerance
    n = len(runs)
    detail = f"{equal} of {n} steps equal ar"
    if ties:
        detail += f", {ties} near-tie(s)"
    if n - equal - ties:
        detail += f", {n - equal - ties} MISMATCH(ES) (largest margin {worst:.3g})"
    mode_text = ", ".join(f"{m} {c}" for m, c in sorted(modes.items()))
    return Check(name, equal + ties == n, f"{detail}; {note}; modes: {mode_text}",
                 {"steps": n, "equal": equal, "near_ties": ties, "modes": modes, "largest_margin": worst})


def shifted(tokens: tuple[int, ...], first: int, end: int) -> tuple[int, ...]:
    """Every token moved SHIFT_BINS bins, staying inside the action ids [first, end)."""
    return tuple(t + SHIFT_BINS if t + SHIFT_BINS < end else t - SHIFT_BINS for t in tokens)


def build_store(s: Session, reference: list[tuple]):
    """An in-memory Qdrant with one point per frame: its `ar` tokens, every second frame's shifted."""
    from heisd_ros.store.factory import make_store
    from heisd_ros.store.schema import DemoPoint

    vla = s.vla
    tok = vla.action_tokenizer
    db = make_store(StoreConfig(backend="local"), obs_dim=vla.query_dim * len(VIEWS), feat_dim=vla.hidden_size,
                    create=True)
    rng = np.random.default_rng(0)
    points = []
    for i, (obs, ref) in enumerate(zip(s.observations, reference)):
        with torch.inference_mode():
            query = embed_views(vla, [obs.images[v] for v in VIEWS])[0]
        tokens = shifted(ref, tok.first_token_id, tok.vocab_size) if i % 2 else ref
        feat = rng.normal(size=vla.hidden_size).astype(np.float32)
        points.append(DemoPoint(dataset="check", task=obs.task_key, instruction=obs.instruction, episode=i, step=0,
                                obs=query, feat=feat, feat_prev=feat, action=np.zeros(7), action_tokens=tokens,
                                ee_pos=obs.ee_pos, success=True))
    db.upsert(points)
    return db


def check_actions(s: Session) -> Check:
    stats = s.vla.stats(s.args.unnorm_key or None)
    lo, hi = np.minimum(stats.q01, stats.q99), np.maximum(stats.q01, stats.q99)
    bad = []
    for action, st in s.steps:
        a = np.asarray(action, dtype=np.float64)
        other = ~stats.mask
        other[GRIPPER_INDEX] = False
        ok = (np.all(np.isfinite(a)) and bool(s.vla.action_tokenizer.is_action_token(np.asarray(st.tokens)).all())
              and np.all((a[stats.mask] >= lo[stats.mask] - 1e-6) & (a[stats.mask] <= hi[stats.mask] + 1e-6))
              and np.all(np.abs(a[other]) <= 1.0 + 1e-6) and abs(a[GRIPPER_INDEX]) == 1.0)
        if not ok:
            bad.append({"tokens": list(st.tokens), "action": a.tolist()})
    key = s.args.unnorm_key or "the model's default"
    detail = f"{len(s.steps) - len(bad)} of {len(s.steps)} actions finite, action tokens, inside [q01, q99] of {key}"
    return Check("actions", not bad, detail, {"actions": len(s.steps), "bad": bad[:5]})


def behaviour_checks(s: Session, tolerance: float) -> tuple[list[Check], dict]:
    """Every check, and the decoders the timing reuses."""
    ar = s.decoder("ar")
    reference = [s.step(ar, obs).tokens for obs in s.observations]
    alone = reference
    if s.prior is not None:
        vla_only = s.decoder("ar", with_prior=False)
        alone = [s.step(vla_only, obs).tokens for obs in s.observations]
    checks = [check_images(alone, s.args.min_differing, "; the VLA without its state prior" if s.prior else "")]
    drafter = s.decoder("drafter")
    runs = [(obs, ref, s.step(drafter, obs)) for obs, ref in zip(s.observations, reference)]
    kind = f"drafter {s.args.drafter}" if s.args.drafter else "untrained drafter"
    checks.append(compare(s, "drafter", runs, tolerance, kind))
    decoders = {"ar": ar, "drafter": drafter}
    try:
        store = build_store(s, reference)
    except (ImportError, DatabaseError) as err:
        for name in ("retrieval", "heisd"):
            checks.append(Check(name, None, f"skipped: no in-memory database ({err})"))
        checks.append(check_actions(s))
        return checks, decoders
    retrieval = s.decoder("retrieval", store)
    runs = [(obs, ref, s.step(retrieval, obs)) for obs, ref in zip(s.observations, reference)]
    checks.append(compare(s, "retrieval", runs, tolerance, f"{len(reference) // 2} drafts shifted {SHIFT_BINS} bins"))
    heisd = s.decoder("heisd", store)
    runs = []
    for obs, ref in zip(s.observations, reference):
        heisd.reset(obs.instruction)
        runs += [(obs, ref, s.step(heisd, obs)) for _ in range(3)]  # 2 without a pose window, then retrieval
    checks.append(compare(s, "heisd", runs, tolerance, "strict acceptance, no verify-skip"))
    checks.append(check_actions(s))
    decoders["heisd"] = heisd
    return checks, decoders


def time_methods(s: Session, decoders: dict, steps: int) -> dict:
    """--steps timed control steps per method, the methods taking turns step by step."""
    times: dict[str, list[float]] = {m: [] for m in decoders}
    forwards: dict[str, list[int]] = {m: [] for m in decoders}
    n = len(s.observations)
    for i in range(steps + 1):
        obs = s.observations[i % n]
        for method, dec in decoders.items():
            st = s.step(dec, obs)
            if i:  # the first round warms caches and kernels
                times[method].append(st.latency_ms["total"])
                forwards[method].append(st.llm_forwards)
    out = {}
    for method in decoders:
        d = distribution(times[method])
        out[method] = {"steps": steps, "mean_step_ms": d["mean"], "median_step_ms": d["median"],
                       "p95_step_ms": d["p95"], "forwards_per_step": float(np.mean(forwards[method])),
                       "speedup_vs_ar": distribution(times["ar"])["mean"] / d["mean"]}
    return out


def load(args: argparse.Namespace) -> tuple[object, object, torch.nn.Module]:
    """(VLA, state prior or None, drafter); ModelLoadError / UnknownTaskError when that fails."""
    from heisd_ros.core.drafter import EagleDrafter, load_drafter
    from heisd_ros.models.dtypes import DTYPES
    from heisd_ros.models.loader import load_model
    from heisd_ros.models.spec import ModelSpec

    vla, prior = load_model(ModelSpec(args.model, args.dtype, args.device))
    vla.stats(args.unnorm_key or None)  # an unknown or missing key names the known ones
    config = vla.language_model.config
    if args.drafter:
        drafter = load_drafter(args.drafter, config, DTYPES[args.dtype])
    else:
        torch.manual_seed(0)
        drafter = EagleDrafter(config).to(DTYPES[args.dtype])
    return vla, prior, drafter.to(vla.device).eval()


def _model_type(directory: str) -> str:
    """config.json's model_type ('openvla', 'heisd_vla'); read after a successful load."""
    return str(json.loads((Path(directory) / "config.json").read_text()).get("model_type"))


def print_report(report: dict) -> None:
    m = report["model"]
    print(f"heisd check-model {m['directory']}: {m['model_type']}, {m['dtype']} on {m['device']}, "
          f"unnorm_key {m['unnorm_key'] or '(default)'}, {m['drafter']}")
    print(f"{'check':<10} {'result':<7} detail")
    for c in report["checks"]:
        result = "skip" if c["passed"] is None else "pass" if c["passed"] else "FAIL"
        print(f"{c['name']:<10} {result:<7} {c['detail']}")
    if report["timing"]:
        print(f"\n{'method':<9} {'steps':>5} {'mean ms':>9} {'median ms':>10} {'p95 ms':>8} {'LLM fwd/step':>13} "
              f"{'speedup':>8}")
        for method, t in report["timing"].items():
            print(f"{method:<9} {t['steps']:>5} {t['mean_step_ms']:>9.2f} {t['median_step_ms']:>10.2f} "
                  f"{t['p95_step_ms']:>8.2f} {t['forwards_per_step']:>13.2f} {t['speedup_vs_ar']:>7.2f}x")
    print(f"\n{'all checks passed' if report['passed'] else 'a check FAILED'}")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.images < 2 or args.steps < 0:
        print("heisd check-model: --images must be >= 2 and --steps >= 0", file=sys.stderr)
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        vla, prior, drafter = load(args)
    except (ModelLoadError, UnknownTaskError, ConfigError) as err:
        hint = " (--unnorm-key)" if isinstance(err, UnknownTaskError) else ""
        print(f"heisd check-model: cannot load {args.model}: {err}{hint}", file=sys.stderr)
        return 2
    tolerance = TIE_TOLERANCE[args.dtype] if args.tie_tolerance is None else args.tie_tolerance
    hw = getattr(vla, "input_hw", (224, 224))
    s = Session(vla, prior, drafter, args, observations(frames(args.images, hw), args.instruction))
    checks, decoders = behaviour_checks(s, tolerance)
    timing = time_methods(s, {m: decoders[m] for m in TIMED if m in decoders}, args.steps) if args.steps else {}
    if args.steps:
        checks[-1] = check_actions(s)  # the timed steps' actions too
    report = {
        "model": {"directory": args.model, "model_type": _model_type(args.model), "device": str(vla.device),
                  "dtype": args.dtype, "unnorm_key": args.unnorm_key, "state_prior": prior is not None,
                  "drafter": f"drafter {args.drafter}" if args.drafter else "untrained drafter"},
        "checks": [dataclasses.asdict(c) for c in checks],
        "timing": timing,
        "passed": all(c.passed is not False for c in checks),
        "_meta": {"images": args.images, "tie_tolerance": tolerance, "instruction": args.instruction,
                  "threads": torch.get_num_threads(), "torch": torch.__version__, "machine": platform.machine(),
                  "git_revision": git_revision()},
    }
    print_report(report)
    if args.json:
        write_json(args.json, report)
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
