"""Score every candidate continuation of every sample, sharing forwards instead of one per candidate.

A candidate's score is the sum of the log-probabilities of its tokens given the prompt (the official
KV-retrieval scorer). Candidate tokens are those that ``prompt + candidate`` adds to the prompt's
tokens, so a leading space is tokenized in context (``" A"`` for BPE, ``"▁A"`` for SentencePiece).

To score candidate ``c = (t1..tL)`` the model must be fed ``prompt + t1..t(L-1)``. These *rows* are
deduplicated per sample: a row that is a prefix of another is dropped, its log-probs are read from
the longer one. Single-token candidates therefore share one row (first-token scoring); multi-token
ones are teacher-forced behind the shared prompt, the rows of many samples batched together:

- attention-only models pack each sample's rows into one sequence under a tree-shaped attention mask
  (the prompt's cost is paid once, not once per candidate; :func:`layout_chunks`), or, with
  ``share_prefix=True``, run each prompt once and continue every row from its KV cache;
- SSMs and hybrids (whose caches cannot be split and continued) run full rows, left-padded,
  with logits only at the positions that are read (:meth:`Model.read_logits
  <gna_interp.models.model.Model.read_logits>`: the vocabulary is paid once per distinct read).

Methods:

- ``auto`` (default): exact, as above;
- ``first_token``: score only each candidate's first token (one row per sample; the candidates'
  first tokens must differ), the usual letter-scoring shortcut;
- ``per_candidate``: the official protocol, one forward of ``prompt + candidate`` per candidate
  (for timing and reference; same scores as ``auto``).

This is the one scoring engine: :func:`evaluate`, the head scans and discovery all lay a plan's rows
out as chunks (:func:`layout_chunks`), read log-probabilities only at the positions the metric
reads (:func:`read_logprobs`) and collect them in a :class:`ScoreTable`, whichever way they computed
the hidden states (a full forward here; a replay of the last blocks in a scan).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace
from contextlib import nullcontext
from typing import Any, Callable, ContextManager, Iterable, Iterator, Literal, Sequence

import pandas as pd
import torch
from jaxtyping import Float, Int
from torch import Tensor
from gna_interp.progress import tqdm

from gna_interp.errors import InputError
from gna_interp.models.model import Hooks, Model, TokenBatch
from gna_interp.options import Options, options
from gna_interp.tasks.sample import Sample
from gna_interp.tasks.metrics import ACCURACY, LOGIT_DIFF, raw

Method = Literal["auto", "first_token", "per_candidate"]
METHODS: tuple[str, ...] = ("auto", "first_token", "per_candidate")


@dataclass(frozen=True)
class Row:
    """One sequence to feed: a sample's prompt tokens plus ``fed`` continuation tokens."""

    sample: int
    ids: tuple[int, ...]
    prompt_len: int

    @property
    def n_fed(self) -> int:
        return len(self.ids) - self.prompt_len


@dataclass(frozen=True)
class Target:
    """Where candidate ``cand`` of ``sample`` is read: its ``tokens``, predicted along row ``row``."""

    sample: int
    cand: int
    row: int
    tokens: tuple[int, ...]


@dataclass(frozen=True)
class ScoringPlan:
    """Tokenized rows and targets for a list of samples under one model's tokenizer (reusable), and how that model
    (named ``model``) lays them out (:func:`for_model`): ``pad_id`` pads a row, ``packs`` says whether
    :func:`layout_chunks` packs each sample's rows into one tree-masked sequence by default, ``device`` is where
    the model reads its tokens. :func:`layout_chunks` needs nothing else; :meth:`check_model` refuses a model the
    layout would be wrong for."""

    samples: tuple[Sample, ...]
    rows: tuple[Row, ...]
    targets: tuple[Target, ...]
    method: str
    prompt_ids: tuple[tuple[int, ...], ...]
    pad_id: int = 0
    packs: bool = False
    model: str = ""
    device: str = "cpu"

    @property
    def n_candidates(self) -> list[int]:
        return [len(s.candidates) for s in self.samples]

    @property
    def n_row_tokens(self) -> int:
        """Tokens fed when every row is run in full (prompt repeated per row)."""
        return sum(len(r.ids) for r in self.rows)

    @property
    def n_shared_tokens(self) -> int:
        """Tokens fed when the prompts are run once and the rows continue from their cache."""
        return sum(map(len, self.prompt_ids)) + sum(r.n_fed for r in self.rows)

    @functools.cached_property
    def longest_row(self) -> int:
        """Tokens in the plan's longest row (prompt + fed tokens): what must fit the context, and what packing is
        judged on."""
        return max(len(r.ids) for r in self.rows)

    def check_model(self, model: Model) -> None:
        """Refuse ``model`` when this plan's layout (:func:`for_model`) would be wrong for it: another pad token,
        packing that ``model`` does not honour (a plan that does not pack is right for every model), or tokens
        on another device."""
        if (self.pad_id != model.pad_id or self.device != str(model.device)
                or (self.packs and not model.packs_rows_up_to(self.longest_row))):
            raise InputError(f"this scoring plan was laid out for {self.model or 'another model'} on {self.device}, "
                             f"whose padding, packing or device {model.name} on {model.device} does not share; lay it "
                             f"out for this model: for_model(model, plan) (or plan_scoring(model, samples) again)")

    def describe(self) -> str:
        n_c = sum(self.n_candidates)
        return f"{len(self.samples)} samples, {n_c} candidates -> {len(self.rows)} rows ({self.method})"


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


ChunkHooks = Hooks | Callable[[Chunk], Hooks]
"""Forward hooks for a plan's chunks: one list ``[(hook name, fn), ...]`` for every chunk (a
:data:`~gna_interp.models.model.Hooks`), or a callable ``Chunk -> hooks`` for hooks that need to know
which sample sits where."""
Intervention = Callable[[Chunk], ContextManager[Any]]
"""What runs around one chunk's forward (e.g. ``lambda chunk: mask_pattern(model, masks_for(chunk))``)."""

__all__ = ["HEAD_VALUES", "METHODS", "VOCAB_BLOCK", "CandidateScores", "Chunk", "ChunkHooks", "ChunkReads",
           "Intervention", "Method", "Row", "RunOptions", "ScoreTable", "ScoringPlan", "Target", "combine_lse",
           "distinct_reads", "layout_chunks", "for_model", "log_normaliser", "log_softmax_rows", "plan_scoring",
           "read_chunks", "read_logprobs", "row_chunks", "row_pieces", "row_step", "run_plan", "score_candidates",
           "vocab_step", "whole_samples"]


def _candidate_tokens(tokenizer: Any, prompt_ids: list[int], prompt: str, cands: Sequence[str],
                      index: int) -> list[tuple[int, ...]]:
    joint = tokenizer([prompt + c for c in cands])["input_ids"]
    out = []
    n = len(prompt_ids)
    for c, ids in zip(cands, joint):
        ids = list(ids)
        if ids[:n] != prompt_ids:
            raise InputError(
                f"sample {index}: candidate {c!r} merges with the end of the prompt into one token "
                f"(prompt ends {prompt[-20:]!r}), so it cannot be scored as a continuation; end the prompt "
                f"on a token boundary (e.g. move a shared leading space from the candidates into the prompt)"
            )
        tail = tuple(ids[n:])
        if not tail:
            raise InputError(f"sample {index}: candidate {c!r} tokenizes to nothing after the prompt; "
                             f"give every candidate some text the tokenizer keeps")
        out.append(tail)
    return out


def plan_scoring(model: Model, samples: Sequence[Sample], method: Method = "auto") -> ScoringPlan:
    """Tokenize ``samples`` and decide the rows to feed; raises :class:`InputError` for bad input."""
    if method not in METHODS:
        raise InputError(f"unknown scoring method {method!r}; choose one of {METHODS}")
    samples = tuple(samples)
    if not samples:
        raise InputError("no samples to score")
    tok = model.tokenizer
    prompt_ids = [list(ids) for ids in tok([s.prompt for s in samples])["input_ids"]]
    rows: list[Row] = []
    targets: list[Target] = []
    for i, (s, p_ids) in enumerate(zip(samples, prompt_ids)):
        if not p_ids:
            raise InputError(f"sample {i}: the prompt tokenizes to nothing; pass non-empty text")
        cand_toks = _candidate_tokens(tok, p_ids, s.prompt, s.candidates, i)
        for c, t in zip(s.candidates, cand_toks):
            model.check_known(t, c, what=f"sample {i}: candidate {c!r}")
        if method == "first_token":
            firsts = [t[0] for t in cand_toks]
            if len(set(firsts)) != len(firsts):
                shared = sorted({s.candidates[j] for j, f in enumerate(firsts) if firsts.count(f) > 1})
                raise InputError(f"sample {i}: candidates {shared} share their first token, so first-token "
                                 f"scoring cannot tell them apart; use method='auto'")
            cand_toks = [t[:1] for t in cand_toks]
        longest = max(len(p_ids) + len(t) - (method != "per_candidate") for t in cand_toks)
        if model.n_ctx and longest > model.n_ctx:
            raise InputError(
                f"sample {i}: prompt plus candidate is {longest} tokens but {model.name} has a context of "
                f"{model.n_ctx} tokens; shorten the prompt (fewer dictionary pairs) or pick a longer-context model"
            )
        if method == "per_candidate":
            for j, t in enumerate(cand_toks):
                targets.append(Target(i, j, len(rows), t))
                rows.append(Row(i, tuple(p_ids) + t, len(p_ids)))
            continue
        fed = [t[:-1] for t in cand_toks]
        keep = sorted({f for f in fed if not any(len(g) > len(f) and g[: len(f)] == f for g in fed)})
        base = len(rows)
        rows.extend(Row(i, tuple(p_ids) + f, len(p_ids)) for f in keep)
        for j, (f, t) in enumerate(zip(fed, cand_toks)):
            r = next(k for k, g in enumerate(keep) if g[: len(f)] == f)
            targets.append(Target(i, j, base + r, t))
    return for_model(model, ScoringPlan(samples, tuple(rows), tuple(targets), method,
                                        tuple(tuple(p) for p in prompt_ids)))


def for_model(model: Model, plan: ScoringPlan) -> ScoringPlan:
    """``plan`` with how ``model`` lays it out: its pad token, and whether it packs (some sample needs several rows
    and every mixer of ``model`` honours a tree-shaped attention mask for rows this long: attention-only models;
    with a sliding window, rows shorter than it, :meth:`~gna_interp.models.model.Model.packs_rows_up_to`). The
    prompts are checked for text outside the vocabulary (:func:`plan_scoring` checks the candidates) and the rows to
    fit the context and the vocabulary."""
    for s, ids in zip(plan.samples, plan.prompt_ids):
        if s.prompt:  # a plan in token space (the lm-eval harness's) has no text to check
            model.check_known(ids, s.prompt)
    longest = plan.longest_row
    model.check_length(longest)  # every row fits the context, packed or not (a packed sequence may not)
    model.check_ids(torch.tensor([[min(min(r.ids) for r in plan.rows), max(max(r.ids) for r in plan.rows)]]))
    packs = plan.method != "per_candidate" and len(plan.rows) > len(plan.samples) and model.packs_rows_up_to(longest)
    return replace(plan, pad_id=model.pad_id, packs=packs, model=model.name, device=str(model.device))


@dataclass
class CandidateScores:
    """Scores of every candidate of every sample.

    ``scores[i, j]`` is the summed log-prob of candidate ``j`` of sample ``i`` (``-inf`` beyond the
    sample's candidates); ``n_tokens[i, j]`` its token count (0 for padding entries).
    """

    samples: tuple[Sample, ...]
    scores: Float[Tensor, "sample cand"]
    n_tokens: Int[Tensor, "sample cand"]
    method: str
    n_forwards: int

    @property
    def gold(self) -> Int[Tensor, "sample"]:
        return torch.tensor([s.gold for s in self.samples])

    @property
    def pred(self) -> Int[Tensor, "sample"]:
        return self.scores.argmax(-1)

    @property
    def correct(self) -> Tensor:
        return self.pred == self.gold

    @property
    def gold_score(self) -> Float[Tensor, "sample"]:
        return self.scores.gather(1, self.gold[:, None])[:, 0]

    @property
    def best_other(self) -> Float[Tensor, "sample"]:
        """Best score among the non-gold candidates (``-inf`` when there is a single candidate)."""
        others = self.scores.scatter(1, self.gold[:, None], -math.inf)
        return others.max(-1).values

    @property
    def logit_diff(self) -> Float[Tensor, "sample"]:
        """Gold minus best other score; for single-token candidates exactly the logit difference."""
        return self.gold_score - self.best_other

    @property
    def gold_prob(self) -> Float[Tensor, "sample"]:
        """Probability the model gives the gold continuation (product over its tokens)."""
        return self.gold_score.exp()

    @property
    def metrics(self) -> dict[str, float]:
        """``accuracy``, mean ``logit_diff``, mean ``gold_prob``, ``chance``, ``n_samples``."""
        n_c = (self.n_tokens > 0).sum(-1).float()
        from_scores = raw(self)
        return {"accuracy": ACCURACY.value(from_scores),
                "logit_diff": LOGIT_DIFF.value(from_scores),
                "gold_prob": self.gold_prob.mean().item(),
                "chance": (1 / n_c).mean().item(),
                "n_samples": len(self.samples)}

    def to_frame(self) -> pd.DataFrame:
        """Per-sample table: ``sample, gold, pred, correct, answer, predicted, gold_score, best_other,
        logit_diff, gold_prob, n_candidates`` and the sample's ``meta``."""
        pred, gold = self.pred.tolist(), self.gold.tolist()
        rows = []
        for i, s in enumerate(self.samples):
            rows.append({"sample": i, "gold": gold[i], "pred": pred[i], "correct": pred[i] == gold[i],
                         "answer": s.answer, "predicted": s.candidates[pred[i]],
                         "gold_score": self.gold_score[i].item(), "best_other": self.best_other[i].item(),
                         "logit_diff": self.logit_diff[i].item(), "gold_prob": self.gold_prob[i].item(),
                         "n_candidates": len(s.candidates), **dict(s.meta)})
        return pd.DataFrame(rows)


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
    if plan.packs if pack is None else pack:
        return _packed_chunks(plan, batch_size, by_row)
    out = []
    for row_ids in row_chunks(plan, batch_size):
        rows = tuple(plan.rows[r] for r in row_ids)
        batch = TokenBatch.left_padded([r.ids for r in rows], plan.pad_id, plan.device)
        pads = batch.pad.tolist()
        rr, pp, tt, gg = [], [], [], []
        for k, (r_id, r) in enumerate(zip(row_ids, rows)):
            for t_idx in by_row.get(r_id, ()):
                for j, tok in enumerate(plan.targets[t_idx].tokens):
                    rr.append(k)
                    pp.append(pads[k] + r.prompt_len - 1 + j)
                    tt.append(tok)
                    gg.append(t_idx)
        out.append(Chunk(tuple(row_ids), rows, batch, torch.tensor(rr, dtype=torch.long),
                         torch.tensor(pp, dtype=torch.long), torch.tensor(tt, dtype=torch.long),
                         torch.tensor(gg, dtype=torch.long)))
    return out


def _packed_chunks(plan: ScoringPlan, batch_size: int, by_row: dict[int, list[int]]) -> list[Chunk]:
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
        padded = TokenBatch.left_padded([seqs[i][0] for i in part], plan.pad_id, plan.device)
        width = padded.ids.shape[1]
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
        batch = TokenBatch(padded.ids, padded.attention_mask, tree.to(plan.device), positions.to(plan.device))
        out.append(Chunk(tuple(row_ids), tuple(plan.rows[r] for r in row_ids), batch, torch.tensor(rr, dtype=torch.long),
                         torch.tensor(pp, dtype=torch.long), torch.tensor(tt, dtype=torch.long),
                         torch.tensor(gg, dtype=torch.long)))
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


VOCAB_BLOCK: dict[str, int] = {"cpu": 2048}  # vocabulary columns per log-sum-exp block, by device type (else 32768)


def vocab_step(device: torch.device) -> int:
    """Columns of one vocabulary block on ``device`` (:data:`VOCAB_BLOCK`; 32768 where not listed)."""
    return VOCAB_BLOCK.get(torch.device(device).type, 32768)


HEAD_VALUES: dict[str, int] = {"cpu": 1 << 24}  # logits alive at once in a head computed by rows, by device type
# (else 1 << 27): the rows of one piece times the vocabulary columns it spans


def row_step(device: torch.device, columns: int) -> int:
    """Rows of one piece of a head that spans ``columns`` vocabulary columns on ``device``: at most
    :data:`HEAD_VALUES` logits (``1 << 27`` where not listed) live at once, at least one row."""
    return max(1, HEAD_VALUES.get(torch.device(device).type, 1 << 27) // max(1, columns))


def row_pieces(n_rows: int, at: Int[Tensor, " n_reads"], rows: int
               ) -> Iterator[tuple[int, int, Int[Tensor, " n_piece_reads"]]]:
    """Consecutive pieces ``start..stop-1`` of ``n_rows`` rows, ``rows`` at a time, each with the indices of the reads
    ``i`` whose row ``at[i]`` lies in it (pieces no read falls in are skipped)."""
    for start in range(0, n_rows, rows):
        stop = min(n_rows, start + rows)
        mine = ((at >= start) & (at < stop)).nonzero()[:, 0]
        if mine.numel():
            yield start, stop, mine


def combine_lse(parts: Sequence[Float[Tensor, " n"]]) -> Float[Tensor, " n"]:
    """The log-normaliser from the log-sum-exps of consecutive vocabulary blocks, combined in float64."""
    return torch.logsumexp(torch.stack(list(parts), -1).double(), -1)


def log_normaliser(logits: Float[Tensor, "n vocab"]) -> Float[Tensor, " n"]:
    """``logsumexp`` of each row (float64), summed block by block (:func:`vocab_step` columns in float32, the blocks
    combined in float64): the same sums, in the same order, as the blockwise head of the replays
    (:func:`gna_interp.engine.unembed.head_logprobs`), so scores from full logits and from replays differ only by the
    logits' own rounding."""
    step = vocab_step(logits.device)
    return combine_lse([torch.logsumexp(logits[:, k:k + step].float(), -1) for k in range(0, logits.shape[-1], step)])


def read_logprobs(logits: Float[Tensor, "n vocab"], tokens: Int[Tensor, " n_reads"],
                  inverse: Int[Tensor, " n_reads"] | None = None) -> Float[Tensor, " n_reads"]:
    """Log-probability (float32) of each read's token (e.g. ``chunk.read_tok``) from the logits at the reads, or --
    with ``inverse`` from :func:`distinct_reads` -- from the logits at the distinct read positions (read ``i`` is at
    ``logits[inverse[i]]``); the normaliser is :func:`log_normaliser`'s."""
    tok = tokens.to(logits.device)
    at = inverse.to(logits.device) if inverse is not None else torch.arange(tok.shape[0], device=logits.device)
    lse = log_normaliser(logits.detach())
    if logits.requires_grad:  # the value above with one logsumexp's gradient (sliced blocks under autograd would
        fast = torch.logsumexp(logits.float(), -1).double()  # write a whole zero row per block in the backward)
        lse = fast + (lse - fast).detach()
    return (logits[at, tok].double() - lse[at]).float()


def log_softmax_rows(logits: Float[Tensor, "n vocab"]) -> Float[Tensor, "n vocab"]:
    """``log_softmax`` of each row (float32) with :func:`log_normaliser`'s normaliser."""
    return (logits.double() - log_normaliser(logits)[:, None]).float()


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
                intervention: Intervention | None = None) -> Iterator[ChunkReads]:
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


def score_candidates(model: Model, samples: Sequence[Sample], method: Method = "auto", batch_size: int = 16,
                     fwd_hooks: ChunkHooks = (), config: RunOptions | None = None, **overrides: Any) -> CandidateScores:
    """Plan and run the scoring of ``samples`` in one go (see :func:`plan_scoring`, :func:`run_plan`; ``config``
    and ``overrides`` as there)."""
    return run_plan(model, plan_scoring(model, samples, method), batch_size, fwd_hooks, config, **overrides)
