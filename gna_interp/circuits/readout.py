"""Where a task's metric reads the model: a scoring plan's rows batched into forwards, and the few
(row, position, token) log-probabilities that make up every candidate's score.

:func:`gna_interp.tasks.plan_scoring` decides the rows (prompt + teacher-forced candidate tokens) and
targets; :func:`gna_interp.tasks.run_plan` runs them through full forwards. The fast head scans need
the same scores from hidden states they computed themselves, at only the positions the metric reads,
so this module lays the same chunks out (:func:`~gna_interp.tasks.scoring.row_chunks`, :meth:`Model.pad_ids`) and turns log-probs at the read
positions back into a :class:`~gna_interp.tasks.CandidateScores`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from jaxtyping import Float, Int
from torch import Tensor

from gna_interp.errors import InputError
from gna_interp.models.model import Model, TokenBatch
from gna_interp.tasks.scoring import CandidateScores, ScoringPlan, row_chunks

__all__ = ["ChunkLayout", "ScoreTable", "layout_chunks", "read_logprobs"]


@dataclass(frozen=True)
class ChunkLayout:
    """One forward's rows and what to read from it.

    Attributes:
        rows: plan row indices, in batch order.
        batch: their tokens, left-padded, with the attention mask.
        read_row, read_pos: batch row and position of each read (position ``p`` predicts token ``p+1``).
        read_tok: the token whose log-probability is read there.
        read_target: index into ``plan.targets`` that the read contributes to.
    """

    rows: tuple[int, ...]
    batch: TokenBatch
    read_row: Int[Tensor, " n_reads"]
    read_pos: Int[Tensor, " n_reads"]
    read_tok: Int[Tensor, " n_reads"]
    read_target: Int[Tensor, " n_reads"]

    @property
    def size(self) -> int:
        return len(self.rows)

    @property
    def n_tokens(self) -> int:
        return int(self.batch.ids.numel())


def layout_chunks(model: Model, plan: ScoringPlan, batch_size: int) -> list[ChunkLayout]:
    """Batch ``plan``'s rows (longest first, ``batch_size`` per forward) and list every read."""
    if batch_size < 1:
        raise InputError(f"batch_size must be >= 1, got {batch_size}")
    by_row: dict[int, list[int]] = {}
    for t_idx, t in enumerate(plan.targets):
        by_row.setdefault(t.row, []).append(t_idx)
    out = []
    for rows in row_chunks(plan, batch_size):
        batch = model.pad_ids([plan.rows[r].ids for r in rows])
        pads = batch.pad.tolist()
        rr, pp, tt, gg = [], [], [], []
        for k, r_id in enumerate(rows):
            r = plan.rows[r_id]
            for t_idx in by_row.get(r_id, ()):
                for j, tok in enumerate(plan.targets[t_idx].tokens):
                    rr.append(k)
                    pp.append(pads[k] + r.prompt_len - 1 + j)
                    tt.append(tok)
                    gg.append(t_idx)
        out.append(ChunkLayout(tuple(rows), batch, torch.tensor(rr, dtype=torch.long),
                               torch.tensor(pp, dtype=torch.long), torch.tensor(tt, dtype=torch.long),
                               torch.tensor(gg, dtype=torch.long)))
    return out


class ScoreTable:
    """Candidate scores of a whole plan, filled chunk by chunk (one table per ablation)."""

    def __init__(self, plan: ScoringPlan) -> None:
        self.plan = plan
        n_s, n_c = len(plan.samples), max(plan.n_candidates)
        self.scores = torch.full((n_s, n_c), -math.inf, dtype=torch.float64)
        self.n_tokens = torch.zeros((n_s, n_c), dtype=torch.long)
        self._t_sample = torch.tensor([t.sample for t in plan.targets], dtype=torch.long)
        self._t_cand = torch.tensor([t.cand for t in plan.targets], dtype=torch.long)
        self._t_len = torch.tensor([len(t.tokens) for t in plan.targets], dtype=torch.long)
        self.n_forwards = 0

    def add(self, chunk: ChunkLayout, read_logprobs: Float[Tensor, " n_reads"]) -> None:
        """Record a chunk's log-probs at its reads (as laid out in ``chunk``)."""
        targets = torch.unique(chunk.read_target)
        sums = torch.zeros(len(self.plan.targets), dtype=torch.float64)
        sums.index_add_(0, chunk.read_target, read_logprobs.detach().double().cpu())
        s, c = self._t_sample[targets], self._t_cand[targets]
        self.scores[s, c] = sums[targets]
        self.n_tokens[s, c] = self._t_len[targets]
        self.n_forwards += 1

    def result(self) -> CandidateScores:
        """The filled table as the task module's :class:`CandidateScores`."""
        return CandidateScores(self.plan.samples, self.scores.clone(), self.n_tokens.clone(),
                               self.plan.method, self.n_forwards)


def read_logprobs(logits: Float[Tensor, "n_reads vocab"], tokens: Int[Tensor, " n_reads"]) -> Float[Tensor, " n_reads"]:
    """Log-probability of each read's token (e.g. ``chunk.read_tok``) from the logits at the reads."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return logp.gather(-1, tokens.to(logp.device)[:, None])[:, 0]
