"""Configuration dataclasses: the single source of defaults for every component.

One frozen dataclass per component, every field documented and validated in `__post_init__`.
YAML files, ROS parameters and CLI flags all map onto these classes through `from_dict`/`to_dict`;
nothing is inferred from file names or environment variables.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, TypeVar

from heisd_ros.core.errors import ConfigError
from heisd_ros.core.files import read_capped_text

METHODS = ("ar", "drafter", "specvla", "retrieval", "heisd")
"""Decoding methods; the baselines are the same engine with switches (docs/design.md §2)."""

T = TypeVar("T")


def require(cond: bool, msg: str) -> None:
    """Raise ConfigError(msg) unless `cond`: the one check every config dataclass validates with."""
    if not cond:
        raise ConfigError(msg)


def topic_ok(name: str) -> bool:
    """A topic name a config may hold: non-empty, no whitespace, no empty segment (rclpy checks the rest)."""
    return bool(name) and not any(c.isspace() for c in name) and "//" not in name


@dataclass(frozen=True)
class AcceptanceConfig:
    """Thresholds of the acceptance rules, in action bins (docs/design.md §7)."""

    max_token_bias_bins: int = 15
    """Sequence-wise rule: every token of a group may differ from the target by at most this."""
    max_group_bias_bins: int = 30
    """Sequence-wise rule: the summed bias of a group may be at most this."""
    token_relaxed_bias_bins: int = 9
    """Token-level relaxed rule (SpecVLA baseline): per-token threshold h."""
    retrieval_rule: str = "sequence"
    """The rule `heisd` verifies retrieved drafts with: 'sequence' (the sequence-wise rule above),
    'token' (the per-token threshold h: the ablation of the sequence-wise rule) or 'strict'
    (lossless: the kinematic boundary alone). Other methods verify retrieved drafts strictly."""

    def __post_init__(self) -> None:
        require(self.retrieval_rule in ("sequence", "token", "strict"),
                "acceptance retrieval_rule must be 'sequence', 'token' or 'strict'")
        require(0 <= self.max_token_bias_bins <= 255, "max_token_bias_bins must be in [0, 255]")
        require(0 <= self.max_group_bias_bins <= 765, "max_group_bias_bins must be in [0, 765]")
        require(0 <= self.token_relaxed_bias_bins <= 255, "token_relaxed_bias_bins must be in [0, 255]")


@dataclass(frozen=True)
class DrafterTreeConfig:
    """EAGLE-2 dynamic draft tree (docs/design.md §2)."""

    depth: int = 6
    """Maximum draft depth (tokens ahead of the pending token)."""
    top_k: int = 2
    """Children expanded per frontier node, and frontier nodes kept per depth."""
    total_tokens: int = 12
    """Tree nodes kept after global re-ranking by cumulative log-probability."""
    min_path_prob: float = 0.1
    """Stop deepening once the best frontier path's drafter probability is below this (0 = always
    draft to `depth`). A deeper draft the verifier will almost surely reject only costs drafter
    calls and verification width; this keeps strict drafter SD from being slower than AR where
    the drafter is unsure. 0.1 is about the cost of a drafter call relative to a verification forward."""

    def __post_init__(self) -> None:
        require(1 <= self.depth <= 6, "drafter depth must be in [1, 6] (7 tokens per step)")
        require(0.0 <= self.min_path_prob < 1.0, "drafter min_path_prob must be in [0, 1)")
        require(1 <= self.top_k <= 32, "drafter top_k must be in [1, 32]")
        require(self.depth <= self.total_tokens <= 512, "total_tokens must be in [depth, 512]")


@dataclass(frozen=True)
class RetrievalConfig:
    """Retrieval drafts from the demonstration database (docs/design.md §2, §7)."""

    top_k: int = 5
    """Hits fetched per query (Top-K)."""
    max_tree_nodes: int = 32
    """Cap on sequence-tree nodes fused into the prefill forward. Every node widens that forward,
    so the cap bounds the cost of a verified retrieval step. Only whole branches are added, so a
    capped tree still holds complete candidates (which ones: docs/design.md §7)."""
    query_views: int = 0
    """How many leading views of `DecoderConfig.views` the retrieval query pools (0 = all). It
    must match the database: `heisd build-db --query-views N` records N in its manifest, and a
    policy left at 0 adopts the manifest's value. 1 (the primary view only) spares retrieval
    steps a backbone pass on the other views when the prompt reads only the primary one."""

    position_pool: int = 0
    """0 = off. Otherwise fetch this many hits by embedding similarity and keep the `top_k` whose
    recorded end-effector position is nearest the robot's (1 for `retrieval`). Neighbours by image
    embedding come from the right phase of a task but often from a hand a few centimetres away,
    whose action then steers the wrong way; a demonstration step taken where the hand is now is
    the better draft."""

    def __post_init__(self) -> None:
        require(1 <= self.top_k <= 64, "retrieval top_k must be in [1, 64]")
        require(self.position_pool == 0 or self.top_k <= self.position_pool <= 256,
                 "retrieval position_pool must be 0 (off) or in [top_k, 256]")
        require(7 <= self.max_tree_nodes <= 1024, "max_tree_nodes must be in [7, 1024]")
        require(0 <= self.query_views <= 16, "retrieval query_views must be in [0, 16] (0 = all views)")


@dataclass(frozen=True)
class FusedMetricConfig:
    """Kinematic fused metric F = alpha*Norm(R) + (1-alpha)*Norm(D) (docs/design.md §5)."""

    window_steps: int = 15
    """w: end-effector positions in the sliding window."""
    alpha: float = 0.5
    """Weight of Norm(R) against Norm(D)."""
    tau: float = 0.5
    """Boundary: F >= tau selects retrieval mode."""
    r_max_m: float = 10.0
    """Radius reported for collinear or stationary windows (a line has infinite radius), metres."""
    r_min_m: float = 0.0
    """Lower end of Norm(R), metres (calibrated)."""
    r_p95_m: float = 1.0
    """Min-max normalisation of R: values are clipped to [r_min_m, r_p95_m]."""
    d_min_m: float = 0.0
    """Lower end of Norm(D), metres (calibrated)."""
    d_p95_m: float = 0.3
    """Min-max normalisation of D (cumulative displacement over the window), metres."""
    stationary_tol_m: float = 1e-5
    """Windows whose extent is below this are stationary."""
    collinear_tol: float = 1e-3
    """Second principal extent / first principal extent below this counts as collinear."""

    def __post_init__(self) -> None:
        require(3 <= self.window_steps <= 1000, "window_steps must be in [3, 1000]")
        require(0.0 <= self.alpha <= 1.0, "alpha must be in [0, 1]")
        require(math.isfinite(self.tau), "tau must be finite")
        lengths = ("r_max_m", "r_min_m", "r_p95_m", "d_min_m", "d_p95_m", "stationary_tol_m", "collinear_tol")
        bad = [f"{n}={getattr(self, n)}" for n in lengths if not math.isfinite(getattr(self, n))]
        require(not bad, f"fused_metric values must be finite, got {', '.join(bad)}")
        require(self.r_max_m > 0, "r_max_m must be > 0")
        require(self.r_p95_m > self.r_min_m, "r_p95_m must exceed r_min_m")
        require(self.d_p95_m > self.d_min_m, "d_p95_m must exceed d_min_m")
        require(self.stationary_tol_m > 0 and self.collinear_tol > 0, "tolerances must be > 0")


@dataclass(frozen=True)
class VerifySkipConfig:
    """Adaptive verify-skip (docs/design.md §6)."""

    enabled: bool = True
    """Allow skipping verification of retrieval drafts (heisd only)."""
    min_similarity: float = 0.95
    """min_S: cosine similarity between the live feature and a hit's feat_prev needed to skip."""
    max_distance_m: float = 0.02
    """O_dist: end-effector distance to the hit's ee_pos allowed for a skip, metres."""
    max_consecutive_skips: int = 3
    """N_max: the live feature must be refreshed by a verified step at least this often."""
    gripper_lookahead_steps: int = 0
    """No skip when the hit's demonstration opens or closes the gripper within its next this many actions (0: off, <= 3)."""
    max_hit_spread_bins: int = 0
    """No skip unless the other Top-K hits agree with the hit: the median, over the other hits, of
    the position group's summed |delta bin| to the hit is at most this (0: off). Demonstrations that
    agree on the motion here say the state determines it, so the policy is likely to agree too."""
    max_bins_from_verified: int = 0
    """No skip unless the hit's position group is within this summed |delta bin| of the tokens the
    last verified step executed (0: off). The policy's motion changes little from one step to the
    next, so a demonstration action far from the last checked one is likely far from the policy's."""
    online: bool = False
    """Alg. 1's online stage: each episode's result moves min_S and O_dist (feedback_step,
    distance_shrink). Off (default), the thresholds stay the point's, as measured; on, unverified
    steps move an arm at thresholds nobody measured. A deployment's choice, never a point file's."""
    feedback_step: float = 0.005
    """Delta applied to min_S per episode result (with `online`)."""
    distance_shrink: float = 0.9
    """O_dist is multiplied by this after a failed episode."""
    min_similarity_bounds: tuple[float, float] = (0.5, 0.9999)
    """Clamp range of min_S under feedback and calibration."""
    max_distance_bounds_m: tuple[float, float] = (0.0, 0.2)
    """Clamp range of O_dist under feedback and calibration, metres."""
    state_path: str = ""
    """Where min_S/O_dist are persisted after feedback, and read back at start-up, with `online`
    ('' = not persisted)."""

    def __post_init__(self) -> None:
        lo, hi = self.min_similarity_bounds
        require(-1.0 <= lo <= hi <= 1.0, "min_similarity_bounds must satisfy -1 <= lo <= hi <= 1")
        require(lo <= self.min_similarity <= hi, "min_similarity outside min_similarity_bounds")
        dlo, dhi = self.max_distance_bounds_m
        require(0.0 <= dlo <= dhi, "max_distance_bounds_m must satisfy 0 <= lo <= hi")
        require(dlo <= self.max_distance_m <= dhi, "max_distance_m outside max_distance_bounds_m")
        require(0 <= self.max_consecutive_skips <= 100, "max_consecutive_skips must be in [0, 100]")
        require(0 <= self.max_hit_spread_bins <= 765 and 0 <= self.max_bins_from_verified <= 765,
                "max_hit_spread_bins and max_bins_from_verified must be in [0, 765] (0: off)")
        require(0 <= self.gripper_lookahead_steps <= 3,
                "gripper_lookahead_steps must be in [0, 3] (a database point stores its next 3 actions)")
        require(math.isfinite(self.feedback_step) and self.feedback_step >= 0,
                f"feedback_step must be finite and >= 0, got {self.feedback_step}")  # fmt: skip
        require(0.0 < self.distance_shrink <= 1.0, "distance_shrink must be in (0, 1]")


@dataclass(frozen=True)
class SourceChoiceConfig:
    """Adaptive draft source above the kinematic boundary (heisd only; docs/design.md §5).

    Per episode, exponential averages of what retrieval-mode steps (verified or skipped) and
    drafter-mode steps cost, counted in verification forwards; a step with F >= tau retrieves only
    while retrieval's average is no higher than the drafter's, with a retrieval probe every
    `probe_every_steps` steps routed away. Costs are counted, never timed: the same inputs route the
    same way on any machine under any load. A step's cost is its LLM forwards, plus
    `prefill_extra_forwards` for its first, plus the overhead of its mode; a skip costs
    `skip_cost_forwards`. The defaults are the mini VLA's measured stage times on a CPU expressed in
    its verification forwards (docs/design.md §5)."""

    enabled: bool = True
    """Learn the source online; False: every step with F >= tau retrieves (the kinematic boundary alone)."""
    smoothing: float = 0.2
    """Weight of the newest step in each exponential average, in (0, 1]. Step costs are bimodal (a
    skip against a verified step), so a larger weight routes on single steps."""
    min_retrieval_steps: int = 4
    """Retrieval-mode steps per episode before the averages are compared (until then F >= tau retrieves)."""
    probe_every_steps: int = 10
    """While retrieval costs more, every this-many-th step routed to the drafter retrieves instead,
    so a database that starts matching is noticed."""
    prefill_extra_forwards: float = 0.5
    """What a step's first forward (the prompt's prefill) costs beyond a later verification forward,
    in those forwards."""
    drafter_overhead_forwards: float = 0.7
    """What drafting (the drafter head's calls and tree building) adds to a drafter-mode step, in
    verification forwards."""
    retrieval_overhead_forwards: float = 0.9
    """What the retrieval query, the views only it reads and the sequence tree fused into the
    prefill add to a verified retrieval-mode step, in verification forwards."""
    skip_cost_forwards: float = 0.3
    """What a skipped step costs (the query and the views only it reads; no LLM forward), in
    verification forwards."""

    def __post_init__(self) -> None:
        require(0.0 < self.smoothing <= 1.0, "smoothing must be in (0, 1]")
        require(1 <= self.min_retrieval_steps <= 1000, "min_retrieval_steps must be in [1, 1000]")
        require(1 <= self.probe_every_steps <= 1000, "probe_every_steps must be in [1, 1000]")
        costs = (self.prefill_extra_forwards, self.drafter_overhead_forwards, self.retrieval_overhead_forwards,
                 self.skip_cost_forwards)
        require(all(math.isfinite(c) and 0.0 <= c <= 7.0 for c in costs),
                "prefill_extra_forwards, drafter_overhead_forwards, retrieval_overhead_forwards and "
                "skip_cost_forwards must be in [0, 7]")


@dataclass(frozen=True)
class StoreConfig:
    """Demonstration database (docs/design.md §4)."""

    backend: str = "edge"
    """'edge' (embedded Qdrant Edge, default), 'local' (qdrant-client local mode) or 'remote' (URL)."""
    path: str = ""
    """Directory of the embedded database ('' with backend 'local' = in memory)."""
    url: str = ""
    """Server or cluster URL for backend 'remote'."""
    collection: str = "heisd_demos"
    """Collection name (one per embodiment/dataset)."""
    api_key_env: str = "QDRANT_API_KEY"
    """Name of the environment variable holding the API key (the key itself never appears in config)."""
    api_key_file: str = ""
    """File whose first line is the API key (e.g. a mounted secret); read at connect time and used
    instead of api_key_env. '' = use api_key_env. The key is never logged."""
    tls_ca_cert: str = ""
    """CA bundle (PEM) that verifies the server's TLS certificate; needs an https:// url.
    '' = the system's certificate store."""
    timeout_s: float = 0.2
    """Deadline of each read request to a remote server (search, count), seconds; below the
    watchdog's spare time at 10 Hz (factor 3: 0.2 s), so an outage costs one slow step, not a trip."""
    write_timeout_s: float = 30.0
    """Deadline of writes and administration on a remote server (upsert batches, creating the
    collection or a shard key), which legitimately take longer than a search, seconds."""
    hnsw_m: int = 16
    """HNSW graph degree."""
    hnsw_ef_construct: int = 100
    """HNSW build-time candidate list size."""
    exact_search_below: int = 20000
    """Partitions with fewer points are searched exactly."""
    shard_by_task: bool = False
    """Backend 'remote' only: make the task Qdrant's custom shard key (one shard per task, created on
    first upsert; queries select the task's shard). qdrant-client local mode cannot shard."""
    task_cache_ttl_s: float = 5.0
    """How long per-task point counts (has_task, partition size) are trusted before the database is
    asked again; upserts through the same store refresh them at once. 0 = always ask."""
    feat_on_disk: bool = False
    """Create the collection with feat/feat_prev memory-mapped from disk rather than held in RAM.
    They are never searched, only returned with the Top-K hits, so this trades a few page reads per
    query for most of the memory of a large database (docs/scaling.md). Existing collections keep theirs."""
    replication_factor: int = 1
    """Backend 'remote' (cluster): copies of every shard, passed when the collection and each task's
    shard key are created (existing collections keep theirs). 1 = no replica."""
    reconnect_backoff_s: float = 0.5
    """After a database fault the decoder runs without retrieval and retries after this delay,
    doubling it after every failed retry (the control step never waits for the database)."""
    reconnect_max_backoff_s: float = 30.0
    """Upper bound of the retry delay, seconds."""
    search_threads: int = 1
    """Backend 'edge': threads of the shard's search pool. 1 runs a query on the calling thread, so
    its CPU time is the step's own; a pool hands the query to threads that must first be scheduled,
    which on a machine whose cores are busy is a wait. Mini database (24,212 points), Top-20 query,
    1 against Edge's default: 0.89 / 0.99 ms mean idle, 0.92 / 1.26 ms (p95 1.00 / 3.12) with every
    core busy, 1.26 / 1.38 ms with caches evicted between queries (benchmarks/search_pool.json).
    0 = Qdrant's default (one per CPU)."""

    def __post_init__(self) -> None:
        require(self.backend in ("edge", "local", "remote"), f"unknown store backend {self.backend!r}")
        require(not self.shard_by_task or self.backend == "remote", "shard_by_task needs backend 'remote'")
        require(0 <= self.exact_search_below <= 10**9, "exact_search_below must be in [0, 1e9]")
        require(math.isfinite(self.task_cache_ttl_s) and self.task_cache_ttl_s >= 0,
                f"task_cache_ttl_s must be finite and >= 0, got {self.task_cache_ttl_s}")  # fmt: skip
        require(self.backend != "remote" or bool(self.url), "backend 'remote' needs a url")
        require(self.backend != "edge" or bool(self.path), "backend 'edge' needs a path")
        require(0 < self.timeout_s <= 3600, "timeout_s must be in (0, 3600]")
        require(0 < self.write_timeout_s <= 3600, "write_timeout_s must be in (0, 3600]")
        require(4 <= self.hnsw_m <= 512 and 4 <= self.hnsw_ef_construct <= 100_000,
                f"HNSW parameters out of range: hnsw_m {self.hnsw_m} must be in [4, 512], hnsw_ef_construct "
                f"{self.hnsw_ef_construct} in [4, 100000]")  # fmt: skip
        require(1 <= self.replication_factor <= 16, "replication_factor must be in [1, 16]")
        require(self.replication_factor == 1 or self.backend == "remote", "replication_factor needs backend 'remote'")
        require(0 < self.reconnect_backoff_s <= self.reconnect_max_backoff_s <= 3600,
                 "reconnect delays must satisfy 0 < reconnect_backoff_s <= reconnect_max_backoff_s <= 3600")
        require(not self.tls_ca_cert or self.url.startswith("https://"), "tls_ca_cert needs an https:// url")
        require(0 <= self.search_threads <= 256, "search_threads must be in [0, 256] (0 = Qdrant's default)")


@dataclass(frozen=True)
class DecoderConfig:
    """The HybridDecoder: method switch plus the components it uses."""

    method: str = "heisd"
    """One of ar, drafter, specvla, retrieval, heisd."""
    views: tuple[str, ...] = ("agentview", "wrist")
    """Camera views in the order the model and the database expect them; the first is primary."""
    device: str = "cpu"
    """torch device of the model and drafter ('cpu', 'cuda', 'cuda:1')."""
    dtype: str = "float32"
    """Model dtype: float32, bfloat16 or float16."""
    acceptance: AcceptanceConfig = field(default_factory=AcceptanceConfig)
    drafter_tree: DrafterTreeConfig = field(default_factory=DrafterTreeConfig)
    retrieval: RetrievalConfig = field(default_factory=RetrievalConfig)
    fused_metric: FusedMetricConfig = field(default_factory=FusedMetricConfig)
    verify_skip: VerifySkipConfig = field(default_factory=VerifySkipConfig)
    source_choice: SourceChoiceConfig = field(default_factory=SourceChoiceConfig)
    unknown_task: str = "error"
    """A task without database entries: 'error' (UnknownTaskError) or 'drafter' (decode without retrieval)."""
    unnorm_key: str = ""
    """Which entry of the model's dataset statistics un-normalises actions ('' = the model's default)."""
    center_crop: bool = False
    """OpenVLA's 90 % centre crop of every frame before the model (the LIBERO fine-tunes were trained
    with it). The database must have been built the same way (build-db --center-crop)."""
    gripper_hold_steps: int = 0
    """Debounce: the executed gripper command changes only after this many consecutive steps ask
    for the change (0 = every step's own command, as OpenVLA). For policies whose gripper token
    chatters (heisd_ros/core/gripper.py)."""
    vision_runtime: str = "openvino"
    """How the vision backbone runs (heisd_ros/core/traced.py): 'openvino' or 'onnxruntime'
    (exported once per input shape; float32 on the CPU, else 'torchscript'; 'openvino' hands over
    to 'onnxruntime' where it cannot run), 'torchscript' (a frozen trace) or 'eager'. The same
    features within float rounding: every method of a run uses the same one."""
    llm_linear: str = "auto"
    """The linear kernel of the LLM's decoder layers (heisd_ros/models/packed_linear.py) and of the
    drafter (core/drafter_block.py): 'onednn' (weights packed once for products of several rows;
    float32 on the CPU, else torch's), 'torch', or 'auto': packed where oneDNN is measured faster
    than torch's kernel on the model's own weights at load (which one wins depends on the processor;
    heisd_ros/core/onednn.py). The same logits within float rounding; where packing wins, prefills,
    verifications and drafting take less time, at the cost of a second copy of those weights."""

    def __post_init__(self) -> None:
        require(self.unknown_task in ("error", "drafter"), "unknown_task must be 'error' or 'drafter'")
        require(self.method in METHODS, f"unknown method {self.method!r}; choose one of {METHODS}")
        require(len(self.views) >= 1, "at least one view is required")
        require(len(set(self.views)) == len(self.views), "view names must be unique")
        require(self.retrieval.query_views <= len(self.views),
                 f"retrieval.query_views {self.retrieval.query_views} exceeds the {len(self.views)} views")
        require(self.dtype in ("float32", "bfloat16", "float16"), f"unsupported dtype {self.dtype!r}")
        require(0 <= self.gripper_hold_steps <= 100, "gripper_hold_steps must be in [0, 100]")
        require(self.vision_runtime in ("openvino", "onnxruntime", "torchscript", "eager"),
                f"vision_runtime must be 'openvino', 'onnxruntime', 'torchscript' or 'eager', got {self.vision_runtime!r}")
        require(self.llm_linear in ("auto", "onednn", "torch"),
                f"llm_linear must be 'auto', 'onednn' or 'torch', got {self.llm_linear!r}")

    @property
    def query_view_count(self) -> int:
        """How many leading views the retrieval query pools (`retrieval.query_views`, 0 = all)."""
        return self.retrieval.query_views or len(self.views)

    def with_method(self, method: str) -> "DecoderConfig":
        return dataclasses.replace(self, method=method)


# ---------------------------------------------------------------------------------------------
# dict / YAML mapping


def from_dict(cls: type[T], data: Mapping[str, Any] | None) -> T:
    """Build dataclass `cls` from a (nested) mapping; unknown keys are a ConfigError."""
    data = dict(data or {})
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(data) - names)
    if unknown:
        raise ConfigError(f"{cls.__name__}: unknown keys {unknown}; known: {sorted(names)}")
    kwargs: dict[str, Any] = {}
    for name, value in data.items():
        hint = hints[name]
        if dataclasses.is_dataclass(hint) and isinstance(value, Mapping):
            kwargs[name] = from_dict(hint, value)
        elif typing.get_origin(hint) is tuple and isinstance(value, (list, tuple)):
            kwargs[name] = tuple(value)
        else:
            kwargs[name] = value
    try:
        return cls(**kwargs)
    except TypeError as err:
        raise ConfigError(f"{cls.__name__}: {err}") from err


def to_dict(obj: Any) -> dict[str, Any]:
    """Plain-data view of a config dataclass (tuples become lists so it dumps to YAML/JSON)."""

    def plain(value: Any) -> Any:
        if isinstance(value, (tuple, list)):
            return [plain(v) for v in value]
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items()}
        return value

    return plain(dataclasses.asdict(obj))


def load_yaml(cls: type[T], path: str | Path, section: str | None = None) -> T:
    """Load `cls` from a YAML file, optionally from one top-level section of it."""
    import yaml

    try:
        data = yaml.safe_load(read_capped_text(path, ConfigError)) or {}
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as err:
        raise ConfigError(f"cannot read config {path}: {err}") from err
    if section is not None:
        data = data.get(section, {})
    if not isinstance(data, Mapping):
        raise ConfigError(f"config {path}: expected a mapping, got {type(data).__name__}")
    return from_dict(cls, data)
