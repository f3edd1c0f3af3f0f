"""A plan's rows laid out as batches (:class:`Chunk`): who sits where, and which positions a metric reads.

Attention-only models pack each sample's rows into one sequence under a tree-shaped attention mask (the prompt's
cost is paid once, not once per candidate; :func:`layout_chunks`); SSMs and hybrids (whose caches cannot be split and
continued) run full rows, left-padded. Every chunk lists its reads, and :attr:`Chunk.reads` the distinct positions
among them (:func:`distinct_reads`), so the vocabulary is paid once per distinct read.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Sequence

import torch
from jaxtyping import Int
from torch import Tensor

from gna_interp.engine.plan import Row, ScoringPlan
from gna_interp.errors import InputError
from gna_interp.models.model import TokenBatch

__all__ = ["Chunk", "distinct_reads", "layout_chunks", "row_chunks", "whole_samples"]


@dataclass(frozen=True)
class Chunk:
    """One forward's rows and what the metric reads from it.

    Attributes:
        row_ids: plan row indices, in batch order; ``rows`` the rows themselves.
        batch: their tokens, left-padded, with the attention mask (``pad[i]`` padding tokens in front
            of row ``i``, so its sample's prompt position ``p`` sits at ``pad[i] + p``).
        read_row, read_pos: batch row and position of each read (position ``p`` predicts token ``p+1``).
        read_tok: the token whose log-probability is read there.
        read_target: index into ``plan.targets`` that the read contributes to.
    """

    row_ids: tuple[int, ...]
    rows: tuple[Row, ...]
    batch: TokenBatch
    read_row: Int[Tensor, " n_reads"]
    read_pos: Int[Tensor, " n_reads"]
    read_tok: Int[Tensor, " n_reads"]
    read_target: Int[Tensor, " n_reads"]

    @functools.cached_property
    def reads(self) -> tuple[Int[Tensor, " n_distinct"], Int[Tensor, " n_distinct"], Int[Tensor, " n_reads"]]:
        """The distinct ``(row, position)`` pairs among the reads and each read's pair (:func:`distinct_reads`),
        worked out once per chunk however often it is run or replayed."""
        return distinct_reads(self.read_row, self.read_pos)

    def stacked_reads(self, copies: int) -> tuple[Int[Tensor, " n"], Int[Tensor, " n"], Int[Tensor, " n_all"]]:
        """:attr:`reads` of ``copies`` copies of the batch stacked along the rows (copy ``g``'s rows offset by
        ``g * size``): what :func:`distinct_reads` gives for the stacked reads, without sorting them again."""
        rows, pos, inverse = self.reads
        b, n = self.size, rows.shape[0]
        return (torch.cat([rows + g * b for g in range(copies)]), pos.repeat(copies),
                torch.cat([inverse + g * n for g in range(copies)]))

    @property
    def size(self) -> int:
        """Sequences in the batch (one per row, or one per sample when packed)."""
        return int(self.batch.ids.shape[0])

    @property
    def pad(self) -> Int[Tensor, " row"]:
        return self.batch.pad.cpu()

    @property
    def n_tokens(self) -> int:
        return int(self.batch.ids.numel())


def row_chunks(plan: "ScoringPlan", batch_size: int) -> list[list[int]]:
    """The plan's row indices batched for full forwards: longest rows first, ``batch_size`` per chunk."""
    order = sorted(range(len(plan.rows)), key=lambda r: (-len(plan.rows[r].ids), r))
    return [order[k: k + batch_size] for k in range(0, len(order), batch_size)]


def layout_chunks(plan: ScoringPlan, batch_size: int, pack: bool | None = None) -> list[Chunk]:
    """Batch ``plan``'s rows (longest first, ``batch_size`` per forward) and list every read, on ``plan.device``; the
    plan carries all the layout needs (:func:`for_model`), so no model is asked.

    ``pack`` (default ``plan.packs``, :func:`for_model`) lays each sample out as *one* sequence: its prompt once, then the
    fed tokens of all its rows as a tree (a token per distinct prefix, at the position it has in its
    row), under an attention mask that lets every token see the prompt and its own branch only
    (:class:`~gna_interp.models.model.TokenBatch` ``tree``). Every read then equals the read of the
    unpacked row, but the prompt is paid once per sample instead of once per row; ``batch_size``
    counts samples.
    """
    if not isinstance(plan, ScoringPlan):
        raise InputError(f"layout_chunks takes a ScoringPlan (from plan_scoring, which lays it out for its model), "
                         f"got {type(plan).__name__}: layout_chunks(plan, batch_size)")
    if batch_size < 1:
        raise InputError(f"batch_size must be >= 1, got {batch_size}")
    by_row: dict[int, list[int]] = {}
    for t_idx, t in enumerate(plan.targets):
        by_row.setdefault(t.row, []).append(t_idx)
    packed = plan.packs if pack is None else pack
    laid = _packed_layouts(plan, batch_size, by_row) if packed else _row_layouts(plan, batch_size, by_row)
    return [_chunk(plan, one) for one in laid]


@dataclass
class _Layout:
    """One chunk in token space: its plan rows, the sequences its batch left-pads, every read (batch row, position,
    token, target) and, packed, the tree mask and position ids (see :class:`~gna_interp.models.model.TokenBatch`)."""

    row_ids: list[int]
    seqs: list[Sequence[int]]
    reads: tuple[list[int], list[int], list[int], list[int]]
    tree: Tensor | None = None
    positions: Tensor | None = None


def _chunk(plan: ScoringPlan, laid: _Layout) -> Chunk:
    """The :class:`Chunk` of ``laid``, its tensors on ``plan.device``."""
    batch = TokenBatch.left_padded(laid.seqs, plan.pad_id, plan.device)
    if laid.tree is not None:
        assert laid.positions is not None
        batch = TokenBatch(batch.ids, batch.attention_mask, laid.tree.to(plan.device), laid.positions.to(plan.device))
    return Chunk(tuple(laid.row_ids), tuple(plan.rows[r] for r in laid.row_ids), batch,
                 *(torch.tensor(v, dtype=torch.long) for v in laid.reads))


def _row_layouts(plan: ScoringPlan, batch_size: int, by_row: dict[int, list[int]]) -> list[_Layout]:
    """Each row as one left-padded sequence (:func:`row_chunks`)."""
    out = []
    for row_ids in row_chunks(plan, batch_size):
        rows = [plan.rows[r] for r in row_ids]
        width = max(len(r.ids) for r in rows)
        rr, pp, tt, gg = [], [], [], []
        for k, (r_id, r) in enumerate(zip(row_ids, rows)):
            for t_idx in by_row.get(r_id, ()):
                for j, tok in enumerate(plan.targets[t_idx].tokens):
                    rr.append(k)
                    pp.append(width - len(r.ids) + r.prompt_len - 1 + j)
                    tt.append(tok)
                    gg.append(t_idx)
        out.append(_Layout(row_ids, [r.ids for r in rows], (rr, pp, tt, gg)))
    return out


def _packed_layouts(plan: ScoringPlan, batch_size: int, by_row: dict[int, list[int]]) -> list[_Layout]:
    """Each sample's rows as one tree-masked sequence (see :func:`layout_chunks`)."""
    rows_of: dict[int, list[int]] = {}
    for r_id, r in enumerate(plan.rows):
        rows_of.setdefault(r.sample, []).append(r_id)
    seqs = []  # per sample: (token ids, parent of each fed node, depth of each node, node of each fed prefix)
    for i in range(len(plan.samples)):
        n = len(plan.prompt_ids[i])
        node: dict[tuple[int, ...], int] = {(): -1}
        toks, parent, depth = [], [], []
        for r_id in rows_of.get(i, ()):
            fed = plan.rows[r_id].ids[n:]
            for j in range(1, len(fed) + 1):
                if fed[:j] not in node:
                    node[fed[:j]] = len(toks)
                    toks.append(fed[j - 1])
                    parent.append(node[fed[:j - 1]])
                    depth.append(j)
        seqs.append((list(plan.prompt_ids[i]) + toks, parent, depth, node))
    order = sorted(range(len(seqs)), key=lambda i: (-len(seqs[i][0]), i))
    out = []
    for part in (order[k: k + batch_size] for k in range(0, len(order), batch_size)):
        # a packed row may be longer than the context while each of its branches fits (plan_scoring checked)
        width = max(len(seqs[i][0]) for i in part)
        tree = torch.zeros((len(part), width, width), dtype=torch.bool)
        positions = torch.zeros((len(part), width), dtype=torch.long)
        row_ids, rr, pp, tt, gg = [], [], [], [], []
        for k, i in enumerate(part):
            ids_all, parent, depth, node = seqs[i]
            n = len(plan.prompt_ids[i])
            pad = width - len(ids_all)
            tree[k].fill_diagonal_(True)
            tree[k, pad:pad + n, pad:pad + n] = torch.tril(torch.ones(n, n, dtype=torch.bool))
            tree[k, pad + n:, pad:pad + n] = True
            positions[k, pad:pad + n] = torch.arange(n)  # as the bridge numbers a left-padded row: from 0
            for q in range(len(parent)):
                positions[k, pad + n + q] = n - 1 + depth[q]
                a = q
                while a >= 0:
                    tree[k, pad + n + q, pad + n + a] = True
                    a = parent[a]
            for r_id in rows_of.get(i, ()):
                row_ids.append(r_id)
                fed = plan.rows[r_id].ids[n:]
                for t_idx in by_row.get(r_id, ()):
                    for j, tok in enumerate(plan.targets[t_idx].tokens):
                        at = node[fed[:j]]
                        rr.append(k)
                        pp.append(pad + n - 1 if at < 0 else pad + n + at)
                        tt.append(tok)
                        gg.append(t_idx)
        out.append(_Layout(row_ids, [seqs[i][0] for i in part], (rr, pp, tt, gg), tree, positions))
    return out


def whole_samples(chunks: Sequence[Chunk]) -> bool:
    """Whether every sample's rows sit in a single chunk (so per-sample metrics can be read chunk by chunk)."""
    seen: set[int] = set()
    for c in chunks:
        mine = {r.sample for r in c.rows}
        if mine & seen:
            return False
        seen |= mine
    return True


def distinct_reads(rows: Int[Tensor, " n_reads"], pos: Int[Tensor, " n_reads"]
                   ) -> tuple[Int[Tensor, " n_distinct"], Int[Tensor, " n_distinct"], Int[Tensor, " n_reads"]]:
    """The distinct ``(row, position)`` pairs among the reads and, per read, the index of its pair: candidates that
    share a prefix are read at one position (the prompt's last token reads every candidate's first token), so the
    unembedding and the log-normaliser are paid once per distinct position, not once per read."""
    key = torch.stack([rows.long(), pos.long()], 1)
    uniq, inverse = torch.unique(key, dim=0, return_inverse=True)
    return uniq[:, 0], uniq[:, 1], inverse
