"""`heisd calibrate`: fused-metric normalisation and tau, verify-skip min_S and O_dist (docs/design.md §5, §6).

Usage:
    heisd calibrate --model artifacts/mini_vla --db artifacts/mini_db --demos artifacts/demos/libero_object \
        --out artifacts/mini_calibration.json [--plots DIR] [--bags DIR | --lerobot DIR] [--map ...]
        [--dataset NAME] [--tasks 0-9] (the source flags given to build-db: heisd_ros/tools/source_args.py)
        [--neighbours 5] [--max-points 4000] [--seed 0] [--threads 1] [--unnorm-key KEY] [--center-crop]
        [--tau-rule balanced|cost] [--step-costs-from EVAL_LOG | --step-costs-ms D,RP,RF]
        [--pin-tau T] [--pin-min-similarity S] [--pin-max-consecutive-skips N]
        [--closed-loop EVAL_LOG [--closed-loop-method ar]]

Reads every point of the database (`heisd build-db --out`) and runs
`heisd_ros.pipeline.calibration.calibrate` on them, with the VLA's *live* features: for each demo step the
mean lm_head input of the VLA's own greedy AR decoding of the previous step (what the online
verify-skip rule compares against a hit's `feat_prev`). Those need the demos' images (through the
train-vla feature cache; the greedy decodes train-drafter cached are reused): pass the same
source flags (`--demos` / `--bags` / `--lerobot`, `--map`, `--dataset`, ...) as to build-db.

Writes the calibration file the node loads (`apply_calibration`), and with `--plots DIR` (needs
matplotlib): `skip_similarity_distance.png` (similarity vs distance of retrieval pairs, pass rate
per similarity bin, min_S and O_dist) and `fused_metric_pass_fail.png` (F of steps where one of the
Top-K retrieval drafts passes the sequence-relaxed check vs where all fail, and tau).

tau: `--tau-rule balanced` (default) separates passing from failing steps;
`--tau-rule cost` picks the threshold with the least expected step time, weighing the measured
step times of drafter mode and of retrieval mode when its drafts pass or fail
(`--step-costs-from` an eval-libero log, or `--step-costs-ms`). Given costs, both taus and their
expected step times are recorded in the file's meta either way.

`--closed-loop` normalises F on the policy's own motion instead of the demonstrations': the
end-effector paths of the `ar` episodes of an eval-libero log (run at calibration init states,
never the evaluation's). Either way the file's meta records F's distribution along the demos and,
given a log, along the closed loop (share exactly 0, quantiles): the tau candidates of a
calibration run.

`--pin-tau` / `--pin-min-similarity` replace the fitted tau / min_S by a chosen value (and turn
verify-skip on), `--pin-max-consecutive-skips` sets N_max: an operating point picked from
closed-loop runs rather than from the offline pass rates. The fitted values stay in the file's
meta (`pinned`), and the plots show the pinned ones.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from heisd_ros.pipeline.calibration import TAU_RULES
from heisd_ros.core.config import VerifySkipConfig
from heisd_ros.core.errors import CalibrationError, ConfigError, MissingDependencyError
from heisd_ros.pipeline.optional import optional_dependency
from heisd_ros.pipeline.sources import EpisodeSources, SourceOptions

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CalibrateConfig:
    model: str = "artifacts/mini_vla"
    db: str = "artifacts/mini_db"
    demos: str = ""
    bags: str = ""
    lerobot: str = ""
    dataset: str = ""
    source_options: SourceOptions = field(default_factory=SourceOptions)
    """How bags and LeRobot datasets are read: as given to build-db."""
    out: str = "artifacts/mini_calibration.json"
    plots: str = ""
    collection: str = "heisd_demos"
    tasks: tuple[int, ...] | None = None
    """HDF5 or LeRobot task indices given to build-db, if any."""
    cache_dir: str = ""
    """Feature cache of train-vla (default: <model>_features)."""
    neighbours: int = 5
    max_points: int = 4000
    seed: int = 0
    threads: int = 1
    dtype: str = "float32"
    """Model dtype for the live features: the one the database was built with and the policy runs in."""
    unnorm_key: str = ""
    """The dataset of the model's action statistics, as given to build-db."""
    center_crop: bool = False
    """OpenVLA's 90 % centre crop, as given to build-db and used by the policy."""
    tau_rule: str = "balanced"
    step_costs_from: str = ""
    """eval-libero log to measure step costs from (`libero_runs.step_costs`)."""
    step_costs_ms: tuple[float, ...] = ()
    """drafter, retrieval-pass, retrieval-fail step times in ms (instead of a log)."""
    pin_tau: float | None = None
    """Use this tau instead of the fitted one (0 = retrieval mode on every step)."""
    pin_min_similarity: float | None = None
    """Use this verify-skip min_S instead of the fitted one (turns verify-skip on)."""
    pin_max_consecutive_skips: int | None = None
    """Write this N_max (skips in a row) into the file instead of the node's configured one."""
    closed_loop: str = ""
    """eval-libero log whose `closed_loop_method` episodes normalise F (instead of the demos)."""
    closed_loop_method: str = "ar"
    base_point: str = ""
    """Operating-point file the fit starts from: every setting the fit does not produce (retrieval
    pool and views, source choice, gripper hold, acceptance bounds, skip checks) is kept from it.
    '' = the decoder's defaults, retrieval pooling the views the database was built with."""
    progress: bool = True

    def __post_init__(self) -> None:
        if self.pin_tau is not None and not (np.isfinite(self.pin_tau) and self.pin_tau >= 0):
            raise ConfigError(f"pin_tau must be finite and >= 0, got {self.pin_tau}")
        skip_pins = {k: v for k, v in (("min_similarity", self.pin_min_similarity),
                                       ("max_consecutive_skips", self.pin_max_consecutive_skips)) if v is not None}
        VerifySkipConfig(**skip_pins)  # the node's own range checks (ConfigError)
        if self.neighbours < 1 or self.max_points < 1 or self.threads < 1:
            raise ConfigError("neighbours, max_points and threads must be >= 1")
        if self.dtype not in ("float32", "bfloat16"):
            raise ConfigError(f"dtype must be float32 or bfloat16, got {self.dtype!r}")
        if self.tau_rule not in TAU_RULES:
            raise ConfigError(f"tau_rule must be one of {TAU_RULES}, got {self.tau_rule!r}")
        if self.step_costs_ms and len(self.step_costs_ms) != 3:
            raise ConfigError("step_costs_ms takes three values: drafter, retrieval-pass, retrieval-fail")
        if self.tau_rule == "cost" and not (self.step_costs_from or self.step_costs_ms):
            raise ConfigError("--tau-rule cost needs --step-costs-from or --step-costs-ms")
        if self.has_sources:
            EpisodeSources.of(self)  # options that fit the sources (ConfigError)

    @property
    def has_sources(self) -> bool:
        return bool(self.demos or self.bags or self.lerobot)

    def costs(self):
        from heisd_ros.pipeline.calibration import StepCosts
        from heisd_ros.pipeline.libero_runs import step_costs

        if self.step_costs_ms:
            return StepCosts(*self.step_costs_ms)
        return step_costs(self.step_costs_from) if self.step_costs_from else None


def live_prev_features(vla, points: list, refs: list, cache, greedy, progress: bool) -> dict:
    """{(task, episode, step): the VLA's live feature at step - 1} for the episodes in `points`."""
    from heisd_ros.pipeline.features import own_examples

    stored = {(p.dataset, p.episode) for p in points}
    wanted = [r for r in refs if (r.dataset, r.episode) in stored]
    examples, live = own_examples(vla, wanted, cache, greedy, "live features", progress)
    out = {}
    start = 0
    for ref, feats in zip(wanted, live):
        task = examples[start].instruction
        for t in range(1, len(feats)):
            out[(task, ref.episode, t)] = feats[t - 1]
        start += len(feats)
    return out


def write_plots(calib: dict, directory: str | Path) -> list[str]:
    """The two calibration plots as PNG under `directory`; returns their paths."""
    with optional_dependency("heisd calibrate --plots"):
        import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    meta, skip, fused = calib["meta"], calib["verify_skip"], calib["fused_metric"]
    curve = meta["skip_curve"]
    edges = np.asarray(curve["bin_edges"])
    centres = 0.5 * (edges[:-1] + edges[1:])
    count = np.asarray(curve["count"], float)
    mean_d = np.asarray(curve["mean_distance_m"], float)
    rate = np.asarray(curve["pass_rate"], float)
    ok = count > 0
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    sc = ax1.scatter(centres[ok], mean_d[ok], c=rate[ok], s=20 + 180 * count[ok] / count.max(), cmap="RdYlGn",
                     vmin=0, vmax=1, edgecolors="k", linewidths=0.4)
    fig.colorbar(sc, ax=ax1, label="pass rate (sequence-relaxed)")
    ax1.set_xlabel("similarity S = cos(f_live, feat_prev)")
    ax1.set_ylabel("mean end-effector distance d (m)")
    ax1.set_title("retrieval pairs: similarity vs distance\n(marker size = pairs in bin)")
    ax2.plot(centres[ok], rate[ok], "o-", color="C0", label="pass rate per bin")
    ax2.axhline(0.95, color="grey", ls=":", label="95% target")
    ax2.set_ylim(-0.02, 1.02)
    ax2.set_xlabel("similarity S")
    ax2.set_ylabel("pass rate")
    ax2.set_title("verify-skip calibration")
    for ax in (ax1, ax2):
        if skip.get("enabled"):
            ax.axvline(skip["min_similarity"], color="C3", ls="--", label=f"min_S = {skip['min_similarity']:.3f}")
    if skip.get("enabled"):
        ax1.axhline(skip["max_distance_m"], color="C1", ls="--", label=f"O_dist = {skip['max_distance_m'] * 100:.1f} cm")
    if ax1.get_legend_handles_labels()[0]:
        ax1.legend(loc="best", fontsize=8)
    ax2.legend(loc="best", fontsize=8)
    fig.tight_layout()
    p1 = d / "skip_similarity_distance.png"
    fig.savefig(p1, dpi=110)
    plt.close(fig)

    f = np.asarray(meta["retrieval_pass_rate_by_f"]["f"], float)
    passed = np.asarray(meta["retrieval_pass_rate_by_f"]["passed"], bool)
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    bins = np.linspace(0, max(1.0, float(f.max()) if f.size else 1.0), 31)
    ax.hist(f[passed], bins=bins, alpha=0.6, color="C2", label=f"a Top-K draft passes ({passed.sum()})")
    ax.hist(f[~passed], bins=bins, alpha=0.6, color="C3", label=f"all Top-K drafts fail ({(~passed).sum()})")
    ax.axvline(fused["tau"], color="k", ls="--", label=f"tau = {fused['tau']:.3f}")
    ax.set_xlabel("fused metric F (retrieval mode when F >= tau)")
    ax.set_ylabel("steps")
    ax.set_title("F for passing vs failing retrieval drafts (leave-one-episode-out)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    p2 = d / "fused_metric_pass_fail.png"
    fig.savefig(p2, dpi=110)
    plt.close(fig)
    return [str(p1), str(p2)]


def run(cfg: CalibrateConfig) -> dict:
    from heisd_ros.pipeline.calibration import apply_calibration, calibrate, complete_point, save_calibration
    from heisd_ros.pipeline.outputs import file_digest
    from heisd_ros.pipeline.closed_loop import read_trajectories
    from heisd_ros.core.config import DecoderConfig, FusedMetricConfig, RetrievalConfig, StoreConfig
    from heisd_ros.pipeline.features import FeatureCache, GreedyCache
    from heisd_ros.models.loader import load_model
    from heisd_ros.models.spec import ModelSpec
    from heisd_ros.store.factory import make_store
    from heisd_ros.store.manifest import manifest_path, read_manifest
    from heisd_ros.pipeline.outputs import git_revision

    torch.set_num_threads(cfg.threads)
    t0 = time.perf_counter()
    spec = ModelSpec(cfg.model, cfg.dtype, "cpu", cfg.unnorm_key, cfg.center_crop)
    # live features of the model loaded as the database's was (its manifest records how)
    spec.check_database(read_manifest(cfg.db), cfg.db)
    vla, prior = load_model(spec)
    store = make_store(StoreConfig(backend="edge", path=cfg.db, collection=cfg.collection))
    try:
        points = list(store.scroll())
    finally:
        store.close()
    if not points:
        raise CalibrationError(f"the database at {cfg.db} holds no points")
    live_prev = None
    t_live = time.perf_counter()
    if cfg.has_sources:
        cache_dir = cfg.cache_dir or str(Path(cfg.model)) + "_features"
        cache = FeatureCache(cache_dir, vla)
        greedy = GreedyCache(cache_dir, vla, cfg.model, state_prior=prior, center_crop=cfg.center_crop)
        refs = EpisodeSources.of(cfg).refs()
        live_prev = live_prev_features(vla, points, refs, cache, greedy, cfg.progress)
    else:
        log.warning("no --demos/--bags/--lerobot: similarities use the stored feat vectors, not live features")
    live_s = time.perf_counter() - t_live
    t_cal = time.perf_counter()
    closed_loop = read_trajectories(cfg.closed_loop, cfg.closed_loop_method) if cfg.closed_loop else None
    calib = calibrate(points, FusedMetricConfig(), neighbours=cfg.neighbours, max_points=cfg.max_points,
                      seed=cfg.seed, live_prev=live_prev, tau_rule=cfg.tau_rule, step_costs=cfg.costs(),
                      closed_loop=closed_loop)
    pin_operating_point(calib, cfg.pin_tau, cfg.pin_min_similarity, cfg.pin_max_consecutive_skips)
    calib["meta"].update(
        command="heisd calibrate", config=dataclasses.asdict(cfg), seed=cfg.seed, git_revision=git_revision(),
        live_features=len(live_prev) if live_prev is not None else 0,
        seconds={"live_features": live_s, "calibrate": time.perf_counter() - t_cal, "total": time.perf_counter() - t0},
    )
    if cfg.plots:
        try:
            calib["meta"]["plots"] = write_plots(calib, cfg.plots)
        except MissingDependencyError as err:
            log.warning("no plots: %s", err)
    # the whole operating point: the fitted values on the base point (or on the defaults, retrieval
    # pooling the views the database was built with)
    manifest = read_manifest(cfg.db) or {}
    base = (apply_calibration(DecoderConfig(), cfg.base_point) if cfg.base_point else
            DecoderConfig(retrieval=RetrievalConfig(query_views=int(manifest.get("query_views", 0)))))
    calib = complete_point(calib, base, chosen_from={"kind": "demonstrations", "db_path": cfg.db,
                                                     "db_manifest_digest": file_digest(str(manifest_path(cfg.db)))})
    save_calibration(calib, cfg.out)
    applied = apply_calibration(DecoderConfig(), cfg.out)
    if applied.fused_metric.tau != calib["fused_metric"]["tau"]:
        raise CalibrationError(f"{cfg.out} does not apply to a DecoderConfig")
    return calib


def pin_operating_point(calib: dict, tau: float | None, min_similarity: float | None,
                        max_consecutive_skips: int | None = None) -> None:
    """Replace the fitted tau / min_S (and N_max) by chosen values, keeping the fitted ones in meta["pinned"]."""
    pinned = {}
    if tau is not None:
        pinned["tau"] = {"fitted": calib["fused_metric"]["tau"], "pinned": float(tau)}
        calib["fused_metric"]["tau"] = float(tau)
    if min_similarity is not None:
        vs = calib["verify_skip"]
        pinned["min_similarity"] = {"fitted": vs["min_similarity"], "pinned": float(min_similarity),
                                    "fitted_enabled": vs["enabled"]}
        vs["min_similarity"], vs["enabled"] = float(min_similarity), True
    if max_consecutive_skips is not None:
        pinned["max_consecutive_skips"] = {"pinned": int(max_consecutive_skips)}
        calib["verify_skip"]["max_consecutive_skips"] = int(max_consecutive_skips)
    if pinned:
        calib["meta"]["pinned"] = pinned


def build_parser() -> argparse.ArgumentParser:
    from heisd_ros.tools.source_args import add_source_arguments

    d = CalibrateConfig()
    p = argparse.ArgumentParser(prog="heisd calibrate", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=d.model, help="VLA directory")
    p.add_argument("--db", default=d.db, help="database directory (heisd build-db --out)")
    p.add_argument("--out", default=d.out, help="calibration file to write")
    p.add_argument("--plots", default="", help="directory for PNG plots (needs matplotlib)")
    p.add_argument("--collection", default=d.collection)
    p.add_argument("--cache-dir", default=d.cache_dir, help="feature cache (default: <model>_features)")
    p.add_argument("--neighbours", type=int, default=d.neighbours)
    p.add_argument("--max-points", type=int, default=d.max_points)
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--threads", type=int, default=d.threads)
    p.add_argument("--dtype", default=d.dtype, choices=("float32", "bfloat16"),
                   help="model dtype for live features (as given to build-db and the policy)")
    p.add_argument("--unnorm-key", default="", help="dataset of the model's action statistics (as given to build-db)")
    p.add_argument("--center-crop", action="store_true", help="OpenVLA's 90 %% centre crop (as given to build-db)")
    p.add_argument("--tau-rule", default=d.tau_rule, choices=TAU_RULES)
    p.add_argument("--step-costs-from", default="", help="eval-libero log (.jsonl/.jsonl.gz) to measure step costs from")
    p.add_argument("--step-costs-ms", default="", help="drafter,retrieval-pass,retrieval-fail step times in ms")
    p.add_argument("--pin-tau", type=float, default=None, help="use this tau instead of the fitted one")
    p.add_argument("--pin-min-similarity", type=float, default=None,
                   help="use this verify-skip min_S instead of the fitted one (turns verify-skip on)")
    p.add_argument("--pin-max-consecutive-skips", type=int, default=None,
                   help="write this N_max (verify-skips in a row) into the calibration file")
    p.add_argument("--closed-loop", default="", help="eval-libero log (.jsonl/.jsonl.gz) whose episodes normalise F")
    p.add_argument("--closed-loop-method", default=d.closed_loop_method, help="the method of those episodes")
    p.add_argument("--base-point", default="", help="operating-point file whose other settings the new point keeps "
                                                    "(default: the decoder's defaults)")
    p.add_argument("--no-progress", dest="progress", action="store_false")
    add_source_arguments(p)  # the sources build-db read, for the live features
    return p


def main(argv: list[str] | None = None) -> int:
    from heisd_ros.tools.args import parse_tasks
    from heisd_ros.tools.source_args import pop_options

    args = vars(build_parser().parse_args(argv))
    args["tasks"] = parse_tasks(args["tasks"])
    args["step_costs_ms"] = tuple(float(x) for x in args["step_costs_ms"].split(",") if x.strip())
    options = pop_options(args)
    cfg = CalibrateConfig(**args, source_options=options)
    c = run(cfg)
    fm, vs, meta = c["fused_metric"], c["verify_skip"], c["meta"]
    print(f"calibrate: tau {fm['tau']:.3f}, verify-skip {'on' if vs['enabled'] else 'off'} "
          f"(min_S {vs['min_similarity']:.4f}, O_dist {vs['max_distance_m'] * 100:.2f} cm), "
          f"{meta['n_pairs']} pairs, pass rate {meta['pass_rate']:.2f}, {meta['seconds']['total']:.0f} s -> {cfg.out}")
    for source in ("demonstrations", "closed_loop"):
        f = meta.get(f"f_{source}")
        if f and f["steps"]:
            q = ", ".join(f"q{k} {v:.4f}" for k, v in f["quantiles"].items())
            fitted = ", normalised on these" if meta["normalisation_from"] == source else ""
            print(f"  F along the {source.replace('_', ' ')} ({f['steps']} steps{fitted}): "
                  f"{f['zero_share']:.0%} exactly 0, {q}")
    if "expected_step_ms" in meta:
        e = meta["expected_step_ms"]
        print(f"  tau rule {meta['tau_rule']}: balanced tau {meta['tau_balanced']:.3f} (expected step {e['balanced']:.1f} ms), "
              f"cost tau {meta['tau_cost']:.3f} (expected step {e['cost']:.1f} ms)")
    return 0
