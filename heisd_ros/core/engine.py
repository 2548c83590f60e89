"""HybridDecoder: one control step of HeiSD and of every baseline (docs/design.md §2).

    step(obs): fused metric -> source (core/source_choice.py: the kinematic boundary, then what
               verification has cost this episode) -> vision (one batch: every view if the
               step retrieves, else the prompt's views)
               retrieval: Top-K -> verify-skip?  -> sequence tree fused into the prefill -> accept
               drafter:   prefill -> EAGLE-2 tree -> verify -> accept ... until 7 tokens
               -> detokenize -> (action, StepStats)

Baselines are switches of the same engine: `ar`, `drafter` (strict D-SD), `specvla`
(D-SD + token-relaxed acceptance), `retrieval` (Top-1 chain fused into the prefill, strict,
no skip, AR continuation), `heisd` (all of the above).

The engine reaches the model only through `core.model_api.VLA`, an optional state prior only
through `core.model_api.ActionPrior`, and the database only through `core.store_api.DemoStore`.
"""

from __future__ import annotations

import math
import time
from contextlib import contextmanager

import numpy as np
import torch

from heisd_ros.core.acceptance import AcceptanceRule, TreeAcceptance, make_rule, walk_tree
from heisd_ros.core.config import DecoderConfig, require
from heisd_ros.core.drafter import DrafterSession, EagleDrafter
from heisd_ros.core.drafter_block import FusedDrafterBlock
from heisd_ros.core.errors import DatabaseError, InvalidObservationError, UnknownTaskError
from heisd_ros.core.gripper import GripperDebounce
from heisd_ros.core.kinematics import FusedMetric
from heisd_ros.core.model_api import VLA, ActionPrior, DecoderInputs
from heisd_ros.core.source_choice import REASON_METHOD, SourceChoice, SourceDecision
from heisd_ros.core.store_api import DemoStore
from heisd_ros.core.traced import ShapeTracedModule
from heisd_ros.core.tree import DraftTree, chain_tree, sequence_tree
from heisd_ros.core.types import ACTION_DIM, GRIPPER_INDEX, Hit, Observation, StepStats
from heisd_ros.core.verifier import TargetSession
from heisd_ros.core.verify_skip import VerifySkipPolicy

NEEDS_DRAFTER = ("drafter", "specvla", "heisd")
NEEDS_STORE = ("retrieval", "heisd")


def embed_views(vla: VLA, images: list[np.ndarray], backbone=None,
                query_views: int | None = None) -> tuple[np.ndarray, torch.Tensor]:
    """Backbone on all views in one batch -> (retrieval query [Q*C] unit norm, patches [V, N, C]).

    The query is the per-view mean over patches of the first `query_views` views (None: all),
    concatenated and L2-normalised (docs/design.md §2); database builders call this too, so stored
    and live queries are the same function. `backbone`: a callable standing in for
    `vla.vision_backbone` (the decoder's traced copy).
    """
    patches = (backbone or vla.vision_backbone)(vla.preprocess(images))
    pooled = patches[:query_views].float().mean(dim=1).flatten()
    return (pooled / pooled.norm().clamp_min(1e-12)).cpu().numpy(), patches


def prompt_patches(vla: VLA, patches: torch.Tensor) -> torch.Tensor:
    """Patch features of all views [V, N, C] -> the ones the prompt reads [V_prompt * N, C]."""
    n = vla.prompt_views
    if patches.shape[0] < n:
        raise InvalidObservationError(f"the model's prompt reads {n} views, the policy gives {patches.shape[0]}")
    return patches[:n].flatten(0, 1)


class _StepDecode:
    """Token state of one control step: fixed tokens, the features that produced them, caches."""

    def __init__(self, target: TargetSession, drafter: DrafterSession | None, prompt: torch.Tensor) -> None:
        self.target = target
        self.drafter = drafter
        self.prompt = prompt  # [P, D]
        self.tokens: list[int] = []
        self.producers: list[torch.Tensor] = []  # lm_head input that produced each fixed token
        self.tokens_per_forward: list[int] = []
        self._pair_feats: list[torch.Tensor] = []  # drafter pairs not yet given to the drafter
        self._pair_embeds: list[torch.Tensor] = []

    @property
    def remaining(self) -> int:
        return ACTION_DIM - len(self.tokens)

    def forward(self, tree: DraftTree | None, rule: AcceptanceRule, vocab_size: int) -> TreeAcceptance:
        """One target forward (the prefill if nothing is cached yet), acceptance and cache commit."""
        prefill = self.target.length == 0
        chain = self.prompt if prefill else self.target.token_embeds([self.tokens[-1]])
        start = len(self.tokens)
        res = self.target.forward(chain, tree, action_index=start)
        if tree is not None and len(tree):
            draft_bins = vocab_size - np.asarray(tree.tokens)
            acc = walk_tree(tree, int(res.bins[0]), res.bins[1:].cpu().numpy(), draft_bins, start, rule)
        else:
            acc = TreeAcceptance([], int(res.bins[0]))
        self.target.commit(acc.nodes)
        node_hidden = [res.hidden[1 + n] for n in acc.nodes]
        fixed = [tree.tokens[n] for n in acc.nodes] if acc.nodes else []
        if acc.bonus_bin is not None:
            fixed.append(vocab_size - acc.bonus_bin)
        self.producers += ([res.hidden[0]] + node_hidden)[: len(fixed)]
        self.tokens += fixed
        self.tokens_per_forward.append(len(fixed))
        # Drafter pairs (f_i, e_{i+1}) over the positions this forward committed; the last pair is
        # the pending token's, so the drafter's output for it roots the next draft tree.
        if acc.bonus_bin is not None:
            feats = list(res.chain_hidden) + node_hidden
            nexts = list(chain[1:]) + list(self.target.token_embeds(fixed))
            self._pair_feats += feats
            self._pair_embeds += nexts
        return acc

    def draft(self, depth: int, cfg) -> DraftTree:
        """EAGLE-2 tree below the pending token (one drafter call commits the unseen pairs and
        yields the tree's root; then one call per further depth)."""
        root = self.drafter.extend(torch.stack(self._pair_feats), torch.stack(self._pair_embeds))
        self._pair_feats, self._pair_embeds = [], []
        return self.drafter.expand(root, depth, cfg, action_index=len(self.tokens))


class HybridDecoder:
    """`step(observation) -> (action, StepStats)` for one of the methods in `config.METHODS`.

    `state_prior`: an optional bias over the action bins from the robot's state, added to the
    logits every method takes its argmax over, so AR and speculative methods still agree."""

    def __init__(self, vla: VLA, cfg: DecoderConfig, store: DemoStore | None = None,
                 drafter: EagleDrafter | None = None, state_prior: ActionPrior | None = None) -> None:
        require(cfg.method not in NEEDS_DRAFTER or drafter is not None, f"method {cfg.method!r} needs a drafter")
        require(cfg.method not in NEEDS_STORE or store is not None, f"method {cfg.method!r} needs a database")
        require(len(cfg.views) >= vla.prompt_views,
                 f"the model's prompt reads {vla.prompt_views} views (primary first); views {list(cfg.views)} has fewer")
        self.vla = vla
        self.cfg = cfg
        self.backbone = ShapeTracedModule(vla.vision_backbone, cfg.vision_runtime)  # same outputs, less time
        self.store = store
        self.drafter = drafter
        # the drafter's inference forward on weights fused once (a call per draft depth, few ops)
        self.drafter_block = FusedDrafterBlock(drafter, cfg.llm_linear) if drafter is not None and cfg.method in NEEDS_DRAFTER else None
        self.state_prior = state_prior
        self.stats_norm = vla.stats(cfg.unnorm_key or None)
        self.vocab_size = vla.action_tokenizer.vocab_size
        self.head = vla.action_head_weight()
        self.metric = FusedMetric(cfg.fused_metric)
        self.skip = VerifySkipPolicy(cfg.verify_skip)
        self.source_choice = SourceChoice(cfg.source_choice)
        self.query_views = cfg.query_view_count
        self.gripper = GripperDebounce(cfg.gripper_hold_steps)
        self.strict = make_rule("strict", cfg.acceptance)
        self.drafter_rule = make_rule("token" if cfg.method == "specvla" else "strict", cfg.acceptance)
        self.retrieval_rule = make_rule(cfg.acceptance.retrieval_rule if cfg.method == "heisd" else "strict",
                                        cfg.acceptance)
        self.instruction: str | None = None
        self.f_live: np.ndarray | None = None
        self.last_verified_tokens: tuple[int, ...] | None = None
        """The tokens the most recent verified (not skipped) step executed, this episode."""
        self.last_gripper_token: int | None = None
        self.last_query: np.ndarray | None = None
        self.profile = False
        """Synchronise the device at the end of every timed stage, so that on a GPU each stage's
        time is its own (`heisd bench --profile`). Off, a step's total is still exact (its tokens
        reach the host), but a stage's time is what the host waited in it."""

    @property
    def reads_finger_gap(self) -> bool:
        """Whether every observation must carry `gripper_gap` (the model's state token or the
        state prior reads it)."""
        return self.vla.reads_gripper_gap or self.state_prior is not None

    @property
    def inputs(self) -> DecoderInputs:
        vla = self.vla
        return DecoderInputs(views=tuple(self.cfg.views), reads_finger_gap=self.reads_finger_gap,
                             image_hw=tuple(vla.input_hw), max_positions=int(vla.max_positions),
                             instruction_tokens=vla.instruction_tokens, prompt_length=vla.prompt_length)

    def known_tasks(self) -> list[str]:
        if self.store is None:
            return []
        try:
            return list(self.store.tasks())
        except DatabaseError:
            return []

    # -- episode -------------------------------------------------------------------------------
    def reset(self, instruction: str | None = None) -> None:
        """Start a new episode: clears the trajectory window, the skip state and the source costs."""
        self.instruction = instruction
        self.metric.reset()
        self.skip.reset_episode()
        self.source_choice.reset()
        self.f_live = None
        self.last_verified_tokens = None
        self.last_gripper_token = None
        self.gripper.reset()

    def episode_feedback(self, success: bool) -> None:
        """Alg. 1's online stage: the episode's result moves the verify-skip thresholds where the
        deployment turns it on (verify_skip.online); otherwise they stay the point's, as measured."""
        if self.skip.cfg.online:
            self.skip.feedback(bool(success))

    def restore_operating_point(self) -> None:
        """Undo every episode feedback: the verify-skip thresholds the configuration gives (an
        evaluation starts each episode here, so no episode depends on the ones before it)."""
        self.skip.restore_configured()

    def close(self) -> None:
        """Release the database (embedded Qdrant holds a file lock until closed)."""
        if self.store is not None:
            self.store.close()

    def health(self) -> tuple[bool, str]:
        if self.store is None:
            return True, "no database"
        return self.store.health()

    # -- the control step ----------------------------------------------------------------------
    @torch.inference_mode()
    def prepare_vision(self) -> None:
        """Build the backbone's graph for every batch a step of this decoder can run (the prompt's
        views; with a database, also the views a retrieving step embeds), so that no timed step
        pays for an export or a trace. Graphs are shared per process: only the first decoder of
        a model builds them."""
        h, w = self.vla.input_hw
        counts = {self._views_embedded(False)} | ({self._views_embedded(True)} if self.store is not None else set())
        for n in sorted(counts):
            self.backbone(self.vla.preprocess([np.zeros((h, w, 3), dtype=np.uint8)] * n))

    def _views_embedded(self, all_views: bool) -> int:
        """How many leading views a step's vision embeds (`_vision`)."""
        n = max(self.query_views, self.vla.prompt_views) if all_views else self.vla.prompt_views
        return min(n, len(self.cfg.views))

    def step(self, obs: Observation) -> tuple[np.ndarray, StepStats]:
        self._validate(obs)
        if obs.instruction != self.instruction:
            self.reset(obs.instruction)
            self._check_task(obs.task_key)
        st = StepStats(method=self.cfg.method)
        lat = st.latency_ms
        t0 = time.perf_counter()
        with torch.inference_mode():
            self.metric.push(np.asarray(obs.ee_pos, dtype=np.float64))
            f = self.metric.value()
            st.fused_metric = math.nan if f is None else float(f)
            source = self._choose_source(st.fused_metric)
            st.source_reason = source.reason
            query, patches = self._vision(obs, lat, all_views=source.retrieval)
            hits = self._maybe_retrieve(obs, query, st, lat) if source.retrieval else []
            decode = None
            if hits:
                decode = self._retrieval_mode(obs, hits, patches, st, lat)
                st.strict = decode is not None and self.retrieval_rule.lossless and self.drafter_rule.lossless
            else:
                st.mode = "ar" if self.cfg.method == "ar" else "drafter"
                decode = self._new_decode(obs, patches, lat)
                self._finish(decode, st, lat)
                st.strict = self.drafter_rule.lossless
        with self._timed(lat, "detokenize"):
            tokens = np.asarray(st.tokens)
            action = self.stats_norm.unnormalise(self.vla.action_tokenizer.decode(tokens))
        if not np.all(np.isfinite(action)):
            raise InvalidObservationError(f"decoded action is not finite: {action}")
        if decode is not None:
            self.f_live = torch.stack(decode.producers).float().mean(0).cpu().numpy()
            self.last_verified_tokens = st.tokens
        self.last_gripper_token = int(tokens[GRIPPER_INDEX])
        # hold_steps 0 passes the (already binary) command through unchanged
        action[GRIPPER_INDEX], st.gripper_held = self.gripper(float(action[GRIPPER_INDEX]))
        self.skip.record(st.skipped)
        lat["total"] = (time.perf_counter() - t0) * 1e3
        if self.cfg.method == "heisd":
            self.source_choice.record(st)
        return action, st

    # -- stages --------------------------------------------------------------------------------
    def _choose_source(self, f: float) -> SourceDecision:
        """Whether this step queries the database, and why (decided before vision: F needs only
        the pose). heisd: the kinematic boundary, then the costs verification has shown."""
        if self.cfg.method != "heisd":
            return SourceDecision(self.cfg.method in NEEDS_STORE, REASON_METHOD)
        return self.source_choice.decide(f, self.cfg.fused_metric.tau)

    def _vision(self, obs: Observation, lat: dict, all_views: bool) -> tuple[np.ndarray | None, torch.Tensor]:
        """(retrieval query, the prompt views' patch features [V*N, C]).

        Only a step that queries the database embeds the views the query pools
        (`retrieval.query_views`, all by default); any other step runs the backbone on the views
        the prompt reads (the primary one for OpenVLA), so `ar` and drafter-mode steps do not pay
        for a camera only retrieval uses (the query is then None). The projector runs only when
        the LLM does (`_new_decode`), so a skipped step pays for vision and retrieval alone."""
        n = self._views_embedded(all_views)
        with self._timed(lat, "vision"):
            query, patches = embed_views(self.vla, [obs.images[v] for v in self.cfg.views[:n]], self.backbone,
                                         self.query_views)
        if not all_views:
            query = None
        self.last_query = query
        return query, prompt_patches(self.vla, patches)

    def _maybe_retrieve(self, obs: Observation, query: np.ndarray, st: StepStats, lat: dict) -> list[Hit]:
        with self._timed(lat, "retrieval"):
            try:
                if not self.store.has_task(obs.task_key):
                    if self.cfg.unknown_task == "error":
                        raise UnknownTaskError(f"task {obs.task_key!r} has no demonstrations in the database")
                    st.fallback = "task not in database"
                    return []
                k = 1 if self.cfg.method == "retrieval" else self.cfg.retrieval.top_k
                pool = self.cfg.retrieval.position_pool
                if pool:
                    timing: dict[str, float] = {}
                    hits = self.store.search_near(query, obs.task_key, k, np.asarray(obs.ee_pos, dtype=np.float64),
                                                  pool, timing)
                    for part, ms in timing.items():
                        lat[f"retrieval_{part}"] = ms
                else:
                    hits = self.store.search(query, obs.task_key, k)
            except UnknownTaskError:
                raise
            except DatabaseError as err:  # documented fallback: decode without retrieval
                st.fallback = f"database fault: {err}"
                return []
        if hits:
            st.retrieval_score = float(hits[0].score)
        return hits

    def _retrieval_mode(self, obs, hits: list[Hit], patches, st: StepStats, lat: dict) -> _StepDecode | None:
        st.mode = "retrieval"
        if self.cfg.method == "heisd" and self.cfg.verify_skip.enabled:
            for i, hit in enumerate(hits):
                verdict = self.skip.decide(self.f_live, hit, np.asarray(obs.ee_pos), self.last_gripper_token,
                                           hits, self.last_verified_tokens)
                if i == 0 or verdict.skip:
                    st.skip_check, st.skip_similarity = verdict.reason, verdict.similarity
                    st.skip_spread_bins, st.skip_from_verified_bins = verdict.spread_bins, verdict.from_verified_bins
                if verdict.skip:
                    st.mode, st.skipped, st.tokens = "skip", True, tuple(int(t) for t in hit.action_tokens)
                    return None
        with self._timed(lat, "draft"):
            drafts = [tuple(int(t) for t in h.action_tokens) for h in hits]
            if self.cfg.method == "heisd":
                tree = sequence_tree(drafts, max_nodes=self.cfg.retrieval.max_tree_nodes)
            else:
                tree = chain_tree(drafts[0])
        decode = self._new_decode(obs, patches, lat)
        with self._timed(lat, "verify"):
            decode.forward(tree, self.retrieval_rule, self.vocab_size)
        self._finish(decode, st, lat)
        return decode

    def _new_decode(self, obs, patches: torch.Tensor, lat: dict) -> _StepDecode:
        with self._timed(lat, "projector"):
            visual = self.vla.projector(patches)
        with self._timed(lat, "prompt"):
            prompt = self.vla.prompt_embeds(obs.instruction, visual, state=obs.ee_pos,
                                            gripper_gap=obs.gripper_gap)[0]
            bias = self._prior_bias(obs)
        target = TargetSession(self.vla.language_model, self.head, logit_bias=bias)
        drafter = None
        if self.drafter_block is not None:
            drafter = DrafterSession(self.drafter_block, self.vla.get_input_embeddings(), self.head,
                                     self.vla.action_tokenizer.first_token_id, logit_bias=bias)
        return _StepDecode(target, drafter, prompt)

    def _prior_bias(self, obs: Observation) -> torch.Tensor | None:
        """The state prior's bias for this observation [7, 256] (None: no prior, or not this task)."""
        if self.state_prior is None:
            return None
        return self.state_prior.bias(obs.instruction, obs.ee_pos, obs.gripper_gap)

    def _finish(self, decode: _StepDecode, st: StepStats, lat: dict) -> None:
        """Complete the step to 7 tokens: AR for `ar`/`retrieval`, drafter SD otherwise."""
        use_drafter = decode.drafter is not None
        # A lossless rule accepts a drafted token only where it equals the target's own, and every
        # forward already yields the target's token after the accepted path (the bonus): the last
        # missing token is never worth drafting, so the tree stops one level short of it.
        spare = 1 if self.drafter_rule.lossless else 0
        while decode.remaining > 0:
            tree = None
            depth = min(self.cfg.drafter_tree.depth, decode.remaining - spare)
            if use_drafter and decode.tokens and depth > 0:
                with self._timed(lat, "draft"):
                    tree = decode.draft(depth, self.cfg.drafter_tree)
            with self._timed(lat, "verify"):
                decode.forward(tree, self.drafter_rule, self.vocab_size)
        st.tokens = tuple(decode.tokens)
        st.llm_forwards = decode.target.forwards
        st.tokens_per_forward = decode.tokens_per_forward
        st.forward_ms = decode.target.forward_ms
        lat["forward"] = sum(st.forward_ms)
        lat["accept"] = max(lat.get("verify", 0.0) - lat["forward"], 0.0)

    def task_problem(self, task: str) -> str:
        if self.cfg.method not in NEEDS_STORE or self.cfg.unknown_task != "error":
            return ""
        try:
            known = self.store.has_task(task)
        except DatabaseError:
            return ""  # a database fault is handled per step (fallback to drafter mode)
        return "" if known else f"task {task!r} has no demonstrations in the database"

    def _check_task(self, task: str) -> None:
        """Fail at the first step of an episode, not at its first retrieval, for an unknown task."""
        problem = self.task_problem(task)
        if problem:
            self.instruction = None  # so the next step checks again
            raise UnknownTaskError(problem)

    def _validate(self, obs: Observation) -> None:
        missing = [v for v in self.cfg.views if v not in obs.images]
        if missing:
            raise InvalidObservationError(f"missing view(s) {missing}; expected {list(self.cfg.views)}")
        pos = np.asarray(obs.ee_pos, dtype=np.float64) if obs.ee_pos is not None else np.empty(0)
        if pos.shape != (3,) or not np.all(np.isfinite(pos)):
            raise InvalidObservationError(f"end-effector position must be 3 finite numbers, got {obs.ee_pos!r}")
        if not isinstance(obs.instruction, str) or not obs.instruction.strip():
            raise InvalidObservationError("instruction is empty")

    @contextmanager
    def _timed(self, lat: dict, stage: str):
        t = time.perf_counter()
        try:
            yield
        finally:
            # Kernels run asynchronously: without the wait, a stage's GPU work is billed to the
            # stage that next reads a result on the host. The wait itself stalls the launch queue
            # once per stage (per forward in drafter mode), so only profiling pays for it.
            if self.profile and self.vla.device.type == "cuda":
                torch.cuda.synchronize()
            lat[stage] = lat.get(stage, 0.0) + (time.perf_counter() - t) * 1e3
