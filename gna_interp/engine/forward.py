"""The chunk runner and the plan runner: a plan's forwards, the logits read at its reads only, the scores collected.

:func:`read_chunks` runs one forward per :class:`~gna_interp.engine.layout.Chunk` (hooks and an intervention around
it) and yields the logits at the chunk's distinct reads; :func:`run_plan` runs a whole plan that way (packed rows, or
with ``share_prefix=True`` each prompt once and every row continued from its KV cache) and fills a
:class:`ScoreTable`. :func:`~gna_interp.tasks.evaluate`, the head scans and discovery all collect their scores in a
:class:`ScoreTable`, whichever way they computed the hidden states (a full forward here; a replay of the last blocks
in :mod:`gna_interp.engine.replay`).
"""

from __future__ import annotations

import math
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, Callable, ContextManager, Iterable, Iterator, Sequence

import torch
from jaxtyping import Float, Int
from torch import Tensor

from gna_interp.engine.layout import Chunk, layout_chunks
from gna_interp.engine.plan import CandidateScores, Method, Scorable, ScoringPlan, Target, plan_scoring
from gna_interp.engine.unembed import log_softmax_rows, read_logprobs
from gna_interp.errors import InputError
from gna_interp.models.model import Hooks, Model, TokenBatch
from gna_interp.options import Options, options
from gna_interp.progress import tqdm

__all__ = ["ChunkContext", "ChunkHooks", "ChunkReads", "RunOptions", "ScoreTable", "read_chunks", "run_plan",
           "score_candidates"]

ChunkHooks = Hooks | Callable[[Chunk], Hooks]
"""Forward hooks for a plan's chunks: one list ``[(hook name, fn), ...]`` for every chunk (a
:data:`~gna_interp.models.model.Hooks`), or a callable ``Chunk -> hooks`` for hooks that need to know
which sample sits where."""
ChunkContext = Callable[[Chunk], ContextManager[Any]]
"""What runs around one chunk's forward (e.g. ``lambda chunk: applied(model, [PatternMask(masks_for(chunk))])``)."""

class ScoreTable:
    """Candidate scores of a whole plan, filled chunk by chunk (one table per run or ablation)."""

    def __init__(self, plan: ScoringPlan) -> None:
        self.plan = plan
        n_s, n_c = len(plan.samples), max(plan.n_candidates)
        self.scores = torch.full((n_s, n_c), -math.inf, dtype=torch.float64)
        self.n_tokens = torch.zeros((n_s, n_c), dtype=torch.long)
        self._t_sample = torch.tensor([t.sample for t in plan.targets], dtype=torch.long)
        self._t_cand = torch.tensor([t.cand for t in plan.targets], dtype=torch.long)
        self._t_len = torch.tensor([len(t.tokens) for t in plan.targets], dtype=torch.long)
        self.n_forwards = 0

    def add(self, chunk: Chunk, read_logprobs: Float[Tensor, " n_reads"]) -> None:
        """Record a chunk's log-probs at its reads (as laid out in ``chunk``); counts one forward."""
        targets = torch.unique(chunk.read_target)
        sums = torch.zeros(len(self.plan.targets), dtype=torch.float64)
        sums.index_add_(0, chunk.read_target, read_logprobs.detach().double().cpu())
        s, c = self._t_sample[targets], self._t_cand[targets]
        self.scores[s, c] = sums[targets]
        self.n_tokens[s, c] = self._t_len[targets]
        self.n_forwards += 1

    def put(self, t: Target, logp: Float[Tensor, "n_tokens vocab"]) -> None:
        """Record one target from ``logp[j]``, the next-token distribution that predicts ``t.tokens[j]``."""
        lp = logp[torch.arange(len(t.tokens)), torch.tensor(t.tokens, device=logp.device)].sum()
        self.scores[t.sample, t.cand] = lp.double().cpu()
        self.n_tokens[t.sample, t.cand] = len(t.tokens)

    def result(self) -> CandidateScores:
        """The filled table as :class:`CandidateScores`."""
        return CandidateScores(self.plan.samples, self.scores.clone(), self.n_tokens.clone(),
                               self.plan.method, self.n_forwards)


@dataclass(frozen=True)
class ChunkReads:
    """One chunk's forward as :func:`read_chunks` yields it: the ``logits`` at the chunk's distinct read positions
    (:func:`distinct_reads`), read ``i`` at ``logits[inverse[i]]``."""

    chunk: Chunk
    logits: Float[Tensor, "n_distinct vocab"]
    inverse: Int[Tensor, " n_reads"]

    @property
    def at_reads(self) -> Float[Tensor, "n_reads vocab"]:
        """The logits at every read, in the chunk's read order."""
        return self.logits[self.inverse.to(self.logits.device)]

    def logprobs(self) -> Float[Tensor, " n_reads"]:
        """Log-probability of each read's token (``chunk.read_tok``), for :meth:`ScoreTable.add`."""
        return read_logprobs(self.logits, self.chunk.read_tok, self.inverse)


def read_chunks(model: Model, chunks: Iterable[Chunk], hooks: ChunkHooks = (),
                intervention: ChunkContext | None = None) -> Iterator[ChunkReads]:
    """The chunk runner: for each chunk, one forward without gradients with ``hooks`` (a list, or ``Chunk -> list``)
    inside the chunk's ``intervention`` (a context manager, e.g. a pattern mask), the model's head applied at the
    distinct read positions only (:meth:`Model.read_logits <gna_interp.models.model.Model.read_logits>`: the
    vocabulary is paid once per distinct read)."""
    for chunk in chunks:
        rows, pos, inverse = chunk.reads
        with intervention(chunk) if intervention is not None else nullcontext():
            logits = model.read_logits(chunk.batch, rows, pos, hooks(chunk) if callable(hooks) else hooks)
        yield ChunkReads(chunk, logits, inverse)


def _run_rows(model: Model, plan: ScoringPlan, table: ScoreTable, batch_size: int, fwd_hooks: ChunkHooks,
              bar: Any, pack: bool = False) -> None:
    """Every row in full (prompt + fed tokens), ``batch_size`` rows per forward (one row per forward
    for ``per_candidate``), logits only at the distinct read positions; with ``pack``, each
    sample's rows as one tree-masked sequence (:func:`layout_chunks`), ``batch_size`` samples per forward."""
    chunks = layout_chunks(plan, 1 if plan.method == "per_candidate" else batch_size, pack=pack)
    bar.reset(total=len(chunks))
    for read in read_chunks(model, chunks, fwd_hooks):
        table.add(read.chunk, read.logprobs())
        bar.update()


def _run_shared_prefix(model: Model, plan: ScoringPlan, acc: ScoreTable, batch_size: int,
                       fwd_hooks: Sequence[tuple[Any, Callable]], bar: Any) -> None:
    """Prompts once (``batch_size`` per forward, KV cache kept), then the rows' fed tokens continue
    from their prompt's cache, ``batch_size`` rows per forward."""
    rows_of: dict[int, list[int]] = {}
    for r_id, r in enumerate(plan.rows):
        rows_of.setdefault(r.sample, []).append(r_id)
    by_row: dict[int, list[Target]] = {}
    for t in plan.targets:
        by_row.setdefault(t.row, []).append(t)
    chunks = [list(range(k, min(k + batch_size, len(plan.samples)))) for k in range(0, len(plan.samples), batch_size)]
    bar.reset(total=len(chunks))
    for samples in chunks:
        batch = TokenBatch.left_padded([plan.prompt_ids[i] for i in samples], plan.pad_id, plan.device)
        logits, cache = model.run_with_hooks(batch, fwd_hooks, return_type="logits_and_cache", logits_to_keep=1)
        acc.n_forwards += 1
        first = log_softmax_rows(logits[:, -1])
        where = {s: k for k, s in enumerate(samples)}
        cont = [r for s in samples for r in rows_of.get(s, ()) if plan.rows[r].n_fed > 0]
        for r_id in (r for s in samples for r in rows_of.get(s, ()) if plan.rows[r].n_fed == 0):
            for t in by_row.get(r_id, ()):
                acc.put(t, first[where[t.sample]][None])
        for k in range(0, len(cont), batch_size):
            part = [plan.rows[r] for r in cont[k: k + batch_size]]
            idx = torch.tensor([where[r.sample] for r in part], device=batch.ids.device)
            n_fed = max(r.n_fed for r in part)
            ids = torch.full((len(part), n_fed), int(batch.ids[0, -1]), dtype=torch.long, device=batch.ids.device)
            # (right padding, masked out: any id will do)
            mask = torch.zeros((len(part), n_fed), dtype=torch.long, device=batch.ids.device)
            for j, r in enumerate(part):
                ids[j, : r.n_fed] = torch.tensor(r.ids[r.prompt_len:])
                mask[j, : r.n_fed] = 1
            more = model.continue_from(ids, torch.cat([batch.attention_mask[idx], mask], 1), cache, fwd_hooks, rows=idx)
            acc.n_forwards += 1
            more = log_softmax_rows(more.flatten(0, 1)).view(more.shape)
            for j, (r_id, r) in enumerate(zip(cont[k: k + batch_size], part)):
                for t in by_row.get(r_id, ()):
                    logp = torch.cat([first[where[r.sample]][None], more[j, : r.n_fed]], 0)
                    acc.put(t, logp[: len(t.tokens)])
        bar.update()


@options
class RunOptions(Options):
    """How a plan's forwards are run, apart from what they compute.

    Attributes:
        progress: show a progress bar (None: the function's default -- off for :func:`run_plan` and
            :func:`score_candidates`, on for :func:`~gna_interp.tasks.evaluate`).
        desc: the bar's label.
        share_prefix: how a sample's several rows are run (:func:`run_plan`): None packs them where the model
            allows it, True continues them from the prompt's KV cache, False runs every row in full.
    """

    progress: bool | None = None
    desc: str | None = None
    share_prefix: bool | None = None


@torch.no_grad()
def run_plan(model: Model, plan: ScoringPlan, batch_size: int = 16, fwd_hooks: ChunkHooks = (),
             config: RunOptions | None = None, **overrides: Any) -> CandidateScores:
    """Run the forwards of ``plan`` (``batch_size`` sequences each) and collect every candidate's score;
    ``config`` (:class:`RunOptions`) or keyword ``overrides`` of its fields: ``progress``, ``desc``,
    ``share_prefix``.

    By default (``share_prefix=None``) a sample with several rows is packed into one tree-masked sequence
    on models that allow it (``plan.packs``: the prompt is run once per sample, in one forward per
    batch); ``share_prefix=True`` instead runs each prompt once and continues the candidates from its KV
    cache; ``False`` runs every row in full. The scores are the same. ``fwd_hooks`` are TransformerLens
    hooks applied to every forward; pass a callable ``Chunk -> hooks`` for hooks that need to know which
    sample sits where (this runs full rows, never packed or from a shared prefix).
    """
    cfg = RunOptions.build(config, **overrides)
    progress, desc, share_prefix = bool(cfg.progress), cfg.desc, cfg.share_prefix
    if batch_size < 1:
        raise InputError(f"batch_size must be >= 1, got {batch_size}")
    plan.check_model(model)
    if share_prefix and not model.splits_prefix_cache:
        raise InputError(f"share_prefix=True needs an attention-only model; {model.name} has "
                         f"{sorted(set(model.layer_kinds()))} blocks. Leave share_prefix unset")
    if share_prefix and (callable(fwd_hooks) or plan.method == "per_candidate"):
        raise InputError("share_prefix=True cannot be combined with position-aware (callable) hooks or "
                         "method='per_candidate'; leave share_prefix unset")
    # by default the prompt is paid once per sample by packing its rows into one sequence (one forward
    # per batch, no cache copies); one row per sample needs neither packing nor a shared prefix
    pack = share_prefix is None and not callable(fwd_hooks) and plan.packs
    table = ScoreTable(plan)
    with tqdm(desc=desc or "scoring", unit="batch", disable=not progress, leave=False) as bar:
        if share_prefix:
            _run_shared_prefix(model, plan, table, batch_size, fwd_hooks, bar)  # type: ignore[arg-type]
        else:
            _run_rows(model, plan, table, batch_size, fwd_hooks, bar, pack=pack)
    return table.result()


def score_candidates(model: Model, samples: Sequence[Scorable], method: Method = "auto", batch_size: int = 16,
                     fwd_hooks: ChunkHooks = (), config: RunOptions | None = None, **overrides: Any) -> CandidateScores:
    """Plan and run the scoring of ``samples`` in one go (see :func:`plan_scoring`, :func:`run_plan`; ``config``
    and ``overrides`` as there)."""
    return run_plan(model, plan_scoring(model, samples, method), batch_size, fwd_hooks, config, **overrides)
