"""Prefix reuse: capture every block's clean input once, then re-run only blocks ``L..N-1``.

Ablating a head of layer ``L`` cannot change blocks ``0..L-1``. One clean forward records, with a
forward pre-hook (``with_kwargs=True``) on each bridge block, the arguments the model's own loop
passes to it (hidden states, masks, position embeddings; KV/SSM caches are dropped). A replay feeds
block ``L`` its recorded input and chains ``L..N-1`` from there, with the caller's hooks active;
several ablations share one replay by stacking copies of the batch (every recorded tensor whose
first dimension is the batch is repeated). Only the final norm and unembedding of the positions the
metric reads are computed.

The bridge's ``start_at_layer`` still runs the earlier blocks internally, hence this module.
:func:`verify_replay` checks, once per model and batch shape, that a replay from block 0 reproduces
the bridge's own logits (it would not for a model that does work between its blocks).

On top of it: :class:`Prefixes` keeps the clean prefix of every batch of a scoring plan,
:func:`replay_scores` scores several head sets (each removed together) in one stacked replay, each set's
copies joining it at the set's earliest layer, and :class:`SetAblation` is what the ablation curve, the knowledge
twin, the control and the pairwise interactions use: a task's scores with any set of heads removed, the clean
prefix captured once, many sets stacked in one replay (:meth:`SetAblation.run_many`; a full forward per set where
replays do not reproduce the model). Inside :func:`shared_prefixes` (as
during :func:`~gna_interp.circuits.discover`), every stage that asks :func:`prefixes_for` the prefixes of the same
model and the same chunks gets one :class:`Prefixes`: a task's clean pass is paid once per run, not once per stage.
"""

from __future__ import annotations

import hashlib
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Callable, Iterator, Sequence

import torch
from jaxtyping import Float, Int
from torch import Tensor
from transformers.cache_utils import DynamicCache

from gna_interp.engine.unembed import at_reads, final_logits, head_logprobs, logit_atol, output_head
from gna_interp.errors import InputError
from gna_interp.interventions.ablation import (AblationMethod, HeadAblation, Replacement, ablation_hooks, check_method,
                                              replacements, stacked_ablation_hooks)
from gna_interp.interventions.base import Intervention, check_interventions
from gna_interp.models.heads import HeadRef
from gna_interp.models.mixer import Hook
from gna_interp.models.model import Model, TokenBatch
from gna_interp.engine.forward import ChunkReads, ScoreTable, read_chunks
from gna_interp.engine.layout import Chunk, distinct_reads, layout_chunks
from gna_interp.engine.plan import CandidateScores, ScoringPlan, plan_of
from gna_interp.engine.unembed import read_logprobs

__all__ = ["Interventions", "KeyValues", "PlanRunner", "Prefix", "Prefixes", "ReplayMismatch", "SetAblation", "Trail",
           "capture", "default_stack", "nested_scores", "prefixes_for", "recording", "replay", "replay_scores",
           "shared_prefixes", "trail_scores", "verify_replay"]

DEFAULT_PREFIX_BYTES = 2 << 30
Interventions = Sequence[Intervention] | Callable[[Chunk], Sequence[Intervention]]
"""What :meth:`PlanRunner.run_under` applies: a list of :class:`~gna_interp.interventions.Intervention` values for
every forward, or a callable ``Chunk -> list`` for values written in one chunk's coordinates (e.g. pattern masks of
that chunk's rows)."""
PROBE_ROWS = 2  # rows of a runner's probe batch (PlanRunner.probe): what per-model checks of the blocks run on
VERIFY_READS = 64  # reads Prefixes.verify compares at most (each costs three rows of logits over the vocabulary)


class ReplayMismatch(RuntimeError):
    """Replaying the recorded block inputs does not reproduce the model's forward."""


@dataclass
class Prefix:
    """Clean per-block inputs of one batch: ``inputs[i] = (args, kwargs)`` of block ``i``, and what the clean forward
    read (:func:`capture`): ``logprobs``, the clean log-probability of each read's token (a chunk's prefix: no
    vocabulary-wide row is kept), or ``logits``, the bridge's clean logits -- ``[batch, pos, vocab]``, or those at
    the reads' distinct positions (:func:`~gna_interp.engine.layout.distinct_reads`; read ``i`` is at
    ``logits[inverse[i]]``)."""

    batch_size: int
    inputs: list[tuple[tuple[Any, ...], dict[str, Any]]]
    logits: Float[Tensor, "batch pos vocab"] | Float[Tensor, "n_distinct vocab"] | None = None
    inverse: Int[Tensor, " n_reads"] | None = None  # with reads: read i's row of ``logits``
    logprobs: Float[Tensor, " n_reads"] | None = None

    def hidden(self, layer: int) -> Float[Tensor, "batch pos d_model"]:
        """The residual stream entering block ``layer``."""
        args, kwargs = self.inputs[layer]
        return args[0] if args else kwargs["hidden_states"]


def _strip_caches(args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict[str, Any]]:
    """A block's recorded arguments without KV caches (positional ones included: GPT-2's block takes its cache
    second): a replay must neither read nor grow the clean run's cache."""
    from transformers.cache_utils import Cache

    out = {}
    for k, v in kwargs.items():
        if isinstance(v, Cache):
            v = None
        elif k == "use_cache":
            v = False
        out[k] = v
    return tuple(None if isinstance(a, Cache) else a for a in args), out


@contextmanager
def recording(model: Model, batch_size: int) -> Iterator[list[Prefix]]:
    """Inside the block, the forward of a batch of ``batch_size`` rows records every block's input arguments
    (detached, without caches); on exit the yielded list holds its :class:`Prefix` (what the forward read is left for
    the caller to set). Used by :func:`capture` and by attribution's forward, whose clean pass is the same."""
    inputs: dict[int, tuple[tuple[Any, ...], dict[str, Any]]] = {}
    handles = []
    out: list[Prefix] = []
    try:
        for i, block in enumerate(model.blocks()):
            def pre(_mod: Any, args: tuple, kwargs: dict, i: int = i) -> None:
                kept = tuple(a.detach() if isinstance(a, Tensor) else a for a in args)
                inputs[i] = _strip_caches(kept, {k: v.detach() if isinstance(v, Tensor) else v
                                                 for k, v in kwargs.items()})

            handles.append(block.register_forward_pre_hook(pre, with_kwargs=True))
        yield out
    finally:
        for h in handles:
            h.remove()
    if len(inputs) != model.n_layers:
        raise RuntimeError(f"only {len(inputs)} of {model.n_layers} blocks of {model.name} ran in the forward pass")
    out.append(Prefix(batch_size, [inputs[i] for i in range(model.n_layers)]))


@torch.no_grad()
def capture(model: Model, batch: TokenBatch, reads: tuple[Tensor | None, ...] | None = None,
            tokens: Int[Tensor, " n_reads"] | None = None) -> Prefix:
    """One clean forward of ``batch`` recording every block's input arguments. Without ``reads`` it keeps the logits
    of every position. ``reads`` are ``(rows, positions)`` (their distinct pairs are taken,
    :func:`~gna_interp.engine.layout.distinct_reads`) or ``(rows, positions, inverse)`` already distinct with where each
    read is among them (a chunk's :attr:`~gna_interp.engine.layout.Chunk.reads`; inverse None: the reads as they
    are); with them it keeps the logits at the distinct positions or, given ``tokens`` (the token each read scores,
    e.g. ``chunk.read_tok``), only each read's clean log-probability, from the residual stream entering the final norm
    through the blockwise head (:func:`~gna_interp.engine.unembed.head_logprobs`): the vocabulary is never held for all
    the reads at once."""
    if reads is not None and len(reads) == 2:
        reads = distinct_reads(*reads)
    logits = inverse = logprobs = None
    with recording(model, int(batch.ids.shape[0])) as got:
        if reads is None:
            logits = model.forward(batch)
        else:
            rows, pos, inverse = reads
            hidden = model.final_residual(batch) if tokens is not None else None
            if hidden is not None:
                logprobs = head_logprobs(output_head(model), at_reads(hidden, rows, pos), tokens, inverse)
            else:
                logits = model.read_logits(batch, rows, pos)
                if tokens is not None:  # a model without a hook before its final norm: its own logits
                    logprobs, logits = read_logprobs(logits, tokens, inverse), None
    prefix = got[0]
    prefix.logits, prefix.inverse, prefix.logprobs = logits, inverse, logprobs
    return prefix


def _repeat(value: Any, batch: int, times: int) -> Any:
    if times == 1:
        return value
    if isinstance(value, Tensor):
        # batch-major tensors: [batch, ...], or [batch * heads, ...] (BLOOM's ALiBi bias [batch * heads, 1, k])
        if value.dim() >= 2 and value.shape[0] == batch or value.dim() >= 3 and value.shape[0] % batch == 0:
            return value.repeat(times, *([1] * (value.dim() - 1)))
        return value
    if isinstance(value, tuple):
        return tuple(_repeat(v, batch, times) for v in value)
    if isinstance(value, list):
        return [_repeat(v, batch, times) for v in value]
    return value


def replay(model: Model, prefix: Prefix, start: int, copies: int = 1,
           hidden: Float[Tensor, "copies_batch pos d_model"] | None = None,
           stop: int | None = None, keys: "KeyTap | None" = None) -> Float[Tensor, "copies_batch pos d_model"]:
    """Run blocks ``start..stop-1`` (default: to the last block) from the clean input of block ``start`` (or from
    ``hidden``, already stacked), on ``copies`` stacked copies of the batch (rows ``c*B..(c+1)*B-1`` are copy
    ``c``); returns the output of block ``stop - 1``.

    With ``keys`` (a :class:`KeyTap`), the attention blocks read and write their keys and values there: with a
    ``front``, ``hidden`` holds the positions from the tap's ``column`` on, the earlier positions' keys and values
    the front's; with none, the tap records each block's. Hooks the caller has attached (e.g. an ablation on some
    copies' rows) fire as in a full forward. Gradients flow when the caller enables them.
    """
    x = _repeat(prefix.hidden(start), prefix.batch_size, copies) if hidden is None else hidden
    return _run_blocks(model, prefix, range(start, len(prefix.inputs) if stop is None else stop), x, copies,
                       keys.column if keys is not None else 0, keys)


def _run_blocks(model: Model, prefix: Prefix, layers: range, x: Tensor, copies: int, column: int = 0,
                keys: Any = None) -> Tensor:
    """Chain ``layers`` from ``x`` with the recorded arguments (from ``column`` on, and ``keys`` as the attention
    cache, when given: see :class:`KeyValues`)."""
    b, blocks = prefix.batch_size, model.blocks()
    width = int(prefix.hidden(0).shape[1])
    for i in layers:
        args, kwargs = prefix.inputs[i]
        if keys is not None:
            args, kwargs = _from_column(args, kwargs, b, width, column)
            kwargs = {**kwargs, "past_key_values": keys}
        kwargs = {k: _repeat(v, b, copies) for k, v in kwargs.items()}
        if args:
            rest = tuple(_repeat(a, b, copies) for a in args[1:])
            out = blocks[i](x, *rest, **kwargs)
        else:
            out = blocks[i](**{**kwargs, "hidden_states": x})
        x = out[0] if isinstance(out, (tuple, list)) else out
    return x


class _NoSuffix(Exception):
    """A recorded block argument whose positions cannot be told apart: the block cannot run on a suffix."""


def _slice_from(value: Any, b: int, width: int, column: int) -> Any:
    """``value`` (a recorded block argument) restricted to the query positions ``column..``: a ``[b, 1, q, k]`` mask
    loses its first ``column`` query rows, a ``[b, pos, ...]`` tensor (position ids and embeddings; ``b`` may be 1,
    one row for the whole batch) and a ``[pos]`` tensor (cache positions) their first ``column`` positions; anything
    else that has a dimension of the sequence's width raises :class:`_NoSuffix`."""
    if isinstance(value, (tuple, list)):
        return type(value)(_slice_from(v, b, width, column) for v in value)
    if not isinstance(value, Tensor):
        return value
    shape = tuple(value.shape)
    if value.dim() == 4 and shape[0] in (b, 1) and shape[2] == shape[3] == width:
        return value[:, :, column:]
    if value.dim() >= 2 and shape[0] in (b, 1) and shape[1] == width:  # 1: one row for the batch (rotary tables)
        return value[:, column:]
    if value.dim() == 1 and shape[0] == width:
        return value[column:]
    if width in shape:
        raise _NoSuffix(f"a block argument of shape {shape}")
    return value


def _from_column(args: tuple, kwargs: dict[str, Any], b: int, width: int, column: int
                 ) -> tuple[tuple, dict[str, Any]]:
    if any(a is not None for a in args[1:]):
        raise _NoSuffix("positional block arguments besides the hidden states")
    return args, {k: _slice_from(v, b, width, column) for k, v in kwargs.items() if k != "past_key_values"}


class KeyTap(DynamicCache):
    """An attention cache that records each block's keys and values (``front`` None) or puts ``front``'s before
    them (a replay of the later positions; ``front[layer]``: that block's keys and values of the earlier
    positions)."""

    def __init__(self, front: dict[int, tuple[Tensor, Tensor]] | None = None) -> None:
        super().__init__()
        self.front = front
        self.kv: dict[int, tuple[Tensor, Tensor]] = {}
        # the positions the front holds: a replay on this tap runs the positions from there
        self.column = int(next(iter(front.values()))[0].shape[-2]) if front else 0

    def update(self, key_states: Tensor, value_states: Tensor, layer_idx: int, *args: Any, **kwargs: Any
               ) -> tuple[Tensor, Tensor]:
        if self.front is None:
            if layer_idx in self.kv:
                raise _NoSuffix(f"layer {layer_idx} updated its cache twice")
            self.kv[layer_idx] = (key_states.detach(), value_states.detach())
            return key_states, value_states
        k, v = self.front[layer_idx]
        return torch.cat([k, key_states], dim=-2), torch.cat([v, value_states], dim=-2)


SUFFIX_OK = "replay.suffix"  # Model.facts key: whether replays run on a recorded key-value cache reproduce it


class KeyValues:
    """The clean keys and values of every attention block from ``start`` on, recorded by one clean replay
    (:meth:`record`), so that a later replay whose change starts at position ``column`` runs only the positions
    ``column..`` (:meth:`replay_from`): the earlier positions' keys and values are the clean ones.

    The suffix replay is used only for models whose every block from ``start`` is an attention block reading the
    cache, checked once per model against a plain replay of the last two blocks (:meth:`supported`)."""

    def __init__(self, prefix: Prefix, start: int, kv: dict[int, tuple[Tensor, Tensor]]) -> None:
        self.prefix, self.start, self.kv = prefix, start, kv

    @classmethod
    def record(cls, model: Model, prefix: Prefix, start: int) -> tuple["KeyValues | None", Tensor]:
        """Replay blocks ``start..`` cleanly (with the caller's hooks), recording keys and values where the model
        allows suffix replays (:meth:`supported`; check it before attaching hooks); returns them (None where it does
        not) and the last block's output."""
        if cls.supported(model, prefix):
            try:
                kv, final = _tapped(model, prefix, start)
            except _NoSuffix:  # a block unlike the last two (a hybrid's): plain replays only
                return None, replay(model, prefix, start)
            return (cls(prefix, start, kv) if kv is not None else None), final
        return None, replay(model, prefix, start)

    def replay_from(self, model: Model, layer: int, column: int, copies: int = 1
                    ) -> Float[Tensor, "copies_batch suffix d_model"]:
        """Blocks ``layer..`` (``layer >= start``) on the positions ``column..`` of ``copies`` stacked copies, the
        earlier positions' keys and values clean; hooks see (and must write) tensors of those positions only."""
        tap, x = self.tap(layer, column, copies)
        return _run_blocks(model, self.prefix, range(layer, model.n_layers), x, copies, column, tap)

    def tap(self, layer: int, column: int, copies: int = 1
            ) -> tuple["KeyTap", Float[Tensor, "copies_batch suffix d_model"]]:
        """What a replay of blocks ``layer..`` on the positions ``column..`` of ``copies`` stacked copies starts from:
        a :class:`KeyTap` holding the earlier positions' clean keys and values, and block ``layer``'s clean input at
        the positions from ``column`` on (pass both to :func:`replay`)."""
        if layer < self.start:
            raise InputError(f"keys and values were recorded from block {self.start}, not {layer}")
        b = self.prefix.batch_size
        front = {i: (_repeat(k[..., :column, :], b, copies), _repeat(v[..., :column, :], b, copies))
                 for i, (k, v) in self.kv.items() if i >= layer}
        return KeyTap(front), _repeat(self.prefix.hidden(layer)[:, column:], b, copies)

    @staticmethod
    def supported(model: Model, prefix: Prefix) -> bool:
        """Whether suffix replays reproduce ``model`` (checked once per model, on ``prefix``'s last two blocks)."""
        if SUFFIX_OK not in model.facts:
            model.facts[SUFFIX_OK] = _check_suffix(model, prefix)
        return model.facts[SUFFIX_OK]


def _tapped(model: Model, prefix: Prefix, start: int) -> tuple[dict[int, tuple[Tensor, Tensor]] | None, Tensor]:
    """A clean replay of blocks ``start..`` recording their keys and values: those (None unless every block recorded
    its own) and the last block's output. Raises :class:`_NoSuffix` for arguments a suffix cannot slice."""
    tap = KeyTap()
    final = _run_blocks(model, prefix, range(start, model.n_layers), prefix.hidden(start), 1, 0, tap)
    return (tap.kv if sorted(tap.kv) == list(range(start, model.n_layers)) else None), final


@torch.no_grad()
def _check_suffix(model: Model, prefix: Prefix) -> bool:
    start = max(0, model.n_layers - 2)
    column = int(prefix.hidden(0).shape[1]) // 2
    try:
        kv, full = _tapped(model, prefix, start)
        if kv is None or column < 1:
            return False
        part = KeyValues(prefix, start, kv).replay_from(model, start, column)
    except (_NoSuffix, TypeError, ValueError, RuntimeError, AttributeError, IndexError):
        return False  # a family whose blocks take the cache another way: plain replays only
    scale = float(full.abs().max())
    return bool(part.shape == full[:, column:].shape and
                (part - full[:, column:]).abs().max().item() <= logit_atol(model.dtype, scale))


@torch.no_grad()
def verify_replay(model: Model, batch: TokenBatch, rows: Int[Tensor, " n"], pos: Int[Tensor, " n"],
                  atol: float | None = None) -> float:
    """Capture ``batch`` (keep it small: two rows do), replay it from block 0 as two stacked copies and
    return the largest deviation from the bridge's own logits at the reads ``(rows, pos)`` (distinct ones are the
    cheapest); raises :class:`ReplayMismatch` above ``atol`` (default :func:`~gna_interp.engine.unembed.logit_atol` of
    the model's dtype)."""
    prefix = capture(model, batch, (rows, pos, None))
    hidden = replay(model, prefix, 0, copies=2)
    b = prefix.batch_size
    assert prefix.logits is not None
    want = prefix.logits.float()
    if atol is None:
        atol = logit_atol(model.dtype, want.abs().max().item())
    worst = 0.0
    for c in range(2):
        got = final_logits(output_head(model), hidden, rows + c * b, pos).float()
        worst = max(worst, (got - want).abs().max().item())
    if not worst <= atol:
        raise ReplayMismatch(
            f"replaying the blocks of {model.name} from their recorded inputs does not reproduce its forward "
            f"(max logit deviation {worst:.3g} > {atol:.3g}); the model does work between its blocks, so the fast exact "
            f"scan cannot be used for it"
        )
    return worst


VERIFIED = "replay.verified"  # Model.facts key: the kinds of attention mask (tree or not) replays reproduce


class Prefixes:
    """Clean prefixes of every chunk of a plan, kept while they fit in ``max_bytes``, recomputed otherwise."""

    def __init__(self, model: Model, chunks: list[Chunk], max_bytes: int = DEFAULT_PREFIX_BYTES) -> None:
        self.model, self.chunks = model, chunks
        d = int(getattr(model.cfg, "d_model", 0) or 0)
        need = sum(c.n_tokens for c in chunks) * d * model.n_layers * 4
        self.keep = need <= max_bytes
        self._store: dict[int, Prefix] = {}

    def verify(self) -> None:
        """Check that replays reproduce the model (on the first and last row of the first batch, at a spread of at most
        :data:`VERIFY_READS` of their reads), once per model and kind of attention mask (packed trees or plain rows);
        raises :class:`ReplayMismatch` otherwise."""
        c = self.chunks[0]
        kind = c.batch.tree is not None
        done = self.model.facts.setdefault(VERIFIED, set())
        if kind in done:
            return
        pick = torch.tensor(sorted({0, c.size - 1}))
        rows, pos, _ = c.reads
        sel = torch.isin(rows, pick).nonzero()[:, 0]
        if sel.numel() > VERIFY_READS:  # a spread of the reads: the check holds no more than these logit rows
            sel = sel[torch.linspace(0, sel.numel() - 1, VERIFY_READS).round().long()]
        verify_replay(self.model, c.batch.select(pick), torch.searchsorted(pick, rows[sel]), pos[sel])
        done.add(kind)

    def put(self, i: int, prefix: Prefix) -> None:
        """Keep ``prefix`` as chunk ``i``'s (recorded by another clean forward of it, e.g. attribution's), when the
        prefixes are kept at all."""
        if self.keep:
            self._store.setdefault(i, prefix)

    def has(self, i: int) -> bool:
        """Whether chunk ``i``'s prefix is kept already."""
        return i in self._store

    def get(self, i: int) -> Prefix:
        """The clean prefix of chunk ``i`` (captured now unless kept from before)."""
        if i in self._store:
            return self._store[i]
        self.verify()
        c = self.chunks[i]
        p = capture(self.model, c.batch, c.reads, c.read_tok)
        if self.keep:
            self._store[i] = p
        return p

    def clean(self, plan: ScoringPlan) -> CandidateScores:
        """The intact model's scores of ``plan`` (whose chunks these are), from the prefixes' logits."""
        table = ScoreTable(plan)
        for i, chunk in enumerate(self.chunks):
            prefix = self.get(i)
            table.add(chunk, _clean_logprobs(prefix, chunk))
        return table.result()


def _clean_logprobs(prefix: Prefix, chunk: Chunk) -> Float[Tensor, " n_reads"]:
    """The clean log-probability of each of ``chunk``'s reads, from its prefix."""
    if prefix.logprobs is not None:
        return prefix.logprobs
    assert prefix.logits is not None
    return read_logprobs(prefix.logits, chunk.read_tok, prefix.inverse)


def default_stack(model: Model, chunks: Sequence[Chunk], max_prefix_bytes: int = DEFAULT_PREFIX_BYTES) -> int:
    """Copies of a batch to stack in one replay of ``chunks``: :func:`~gna_interp.models.estimate.replay_stack` for the
    largest chunk (on CPU at most 2,048 tokens a replay; on CUDA sized to the free memory, less the clean prefixes
    :class:`Prefixes` keeps within ``max_prefix_bytes``)."""
    from gna_interp.models.estimate import replay_stack

    values = sum(c.n_tokens for c in chunks) * int(getattr(model.cfg, "d_model", 0) or 0) * model.n_layers
    kept = values * 4 <= max_prefix_bytes  # Prefixes' own rule (4 bytes a value)
    reads = max(-(-len(c.read_pos) // c.size) for c in chunks)
    return replay_stack(model, max(c.size for c in chunks), max(int(c.batch.ids.shape[1]) for c in chunks),
                        reads=reads, reserve_bytes=values * model.dtype.itemsize if kept else 0)


_SHARED: list[dict[tuple[int, int, str], Prefixes]] = []


@contextmanager
def shared_prefixes() -> Iterator[None]:
    """Inside the block, :func:`prefixes_for` hands out one :class:`Prefixes` per model and chunk layout (released
    on exit), so the stages of one run share their clean passes."""
    _SHARED.append({})
    try:
        yield
    finally:
        _SHARED.pop()


def _layout_key(chunks: Sequence[Chunk]) -> str:
    """A digest of everything a prefix and a read depend on: tokens, masks, positions and the reads."""
    h = hashlib.sha256()
    for c in chunks:
        b = c.batch
        for t in (b.ids, b.attention_mask, b.tree, b.positions, c.read_row, c.read_pos, c.read_tok, c.read_target):
            h.update(b"-" if t is None else f"{tuple(t.shape)}{t.dtype}".encode() + t.detach().cpu().numpy().tobytes())
    return h.hexdigest()


def prefixes_for(model: Model, chunks: list[Chunk], max_bytes: int = DEFAULT_PREFIX_BYTES) -> Prefixes:
    """The clean prefixes of ``chunks``: new ones, or inside :func:`shared_prefixes` the ones already handed out for
    the same model and an identical layout (their chunks are equal to ``chunks``)."""
    if not _SHARED:
        return Prefixes(model, chunks, max_bytes)
    key = (id(model), max_bytes, _layout_key(chunks))
    cache = _SHARED[-1]
    if key not in cache:
        cache[key] = Prefixes(model, chunks, max_bytes)
    return cache[key]


@torch.no_grad()
def replay_scores(model: Model, plan: ScoringPlan, prefixes: Prefixes, sets: Sequence[Sequence[Replacement]]
                  ) -> list[CandidateScores]:
    """Scores of ``plan`` with each of ``sets`` removed (each set's heads together), all sets stacked as copies of
    every batch in one replay per chunk. A set joins the stack at the earliest layer it touches (the copy enters
    there with the clean prefix's residual stream), so each set runs only the blocks from its earliest head on,
    as it would alone; a set of no heads reads the clean scores. Numbers equal a replay of each set alone to float
    noise (the blocks see a larger batch)."""
    if not any(sets):
        clean = prefixes.clean(plan)
        return [clean for _ in sets]
    n_layers = model.n_layers
    starts = [min((r.site.head.layer for r in group), default=n_layers) for group in sets]
    live = sorted((g for g in range(len(sets)) if starts[g] < n_layers), key=lambda g: starts[g])  # stack order
    joins = sorted({starts[g] for g in live})
    n = len(live)
    tables = [ScoreTable(plan) for _ in sets]
    for i, chunk in enumerate(prefixes.chunks):
        prefix = prefixes.get(i)
        b = prefix.batch_size
        x: Tensor | None = None
        with model.hooks(stacked_ablation_hooks([sets[g] for g in live], b)):
            for a, z in zip(joins, joins[1:] + [n_layers]):  # copies of the sets starting at ``a`` join there
                have = 0 if x is None else int(x.shape[0]) // b
                copies = sum(starts[g] <= a for g in live)
                fresh = _repeat(prefix.hidden(a), b, copies - have)
                x = fresh if x is None else torch.cat([x, fresh])
                x = replay(model, prefix, a, copies=copies, hidden=x, stop=z)
        assert x is not None
        rows, pos, inverse = chunk.stacked_reads(n)
        logp = head_logprobs(output_head(model), at_reads(x, rows, pos), chunk.read_tok.repeat(n), inverse)
        per = logp.shape[0] // n
        for k, g in enumerate(live):
            tables[g].add(chunk, logp[k * per:(k + 1) * per])
        if n < len(sets):
            clean = _clean_logprobs(prefix, chunk)
            for g in range(len(sets)):
                if starts[g] >= n_layers:
                    tables[g].add(chunk, clean)
    return [t.result() for t in tables]


@torch.no_grad()
def nested_scores(model: Model, plan: ScoringPlan, prefixes: Prefixes, sets: Sequence[Sequence[Replacement]]
                  ) -> list[CandidateScores]:
    """Scores of ``plan`` with each of ``sets`` removed, where each set contains the one before it (e.g. the first
    ``j`` heads of one order, ``j = 1, 2, ...``). Each set's replay starts at the earliest layer of the heads it
    adds, from the residual stream the previous sets' replays left there (the blocks before that layer see the
    same heads removed), so a chain pays the blocks from each added head on, not from the set's earliest head.
    Numbers equal :func:`replay_scores` of each set alone."""
    n_layers = model.n_layers
    steps: list[tuple[list[Replacement], int]] = []
    for k, group in enumerate(sets):
        before = {r.site.head for r in sets[k - 1]} if k else set()
        heads = {r.site.head for r in group}
        if not before <= heads:
            raise InputError(f"nested_scores needs each set to contain the one before it; set {k} drops "
                             f"{sorted(h.name for h in before - heads)}")
        added = [r.site.head.layer for r in group if r.site.head not in before]
        steps.append((list(group), min(added) if added else n_layers))
    tables = [ScoreTable(plan) for _ in sets]
    for i, chunk in enumerate(prefixes.chunks):
        prefix = prefixes.get(i)
        rows, pos, inverse = chunk.reads
        logp = _clean_logprobs(prefix, chunk)  # the intact model's
        state: dict[int, Tensor] = {}  # residual entering a layer a later step starts at, under the latest set
        for k, (group, start) in enumerate(steps):
            if start < n_layers:  # (else the set adds nothing: the previous scores)
                x = state[start] if start in state else prefix.hidden(start)
                keep = sorted({s for _, s in steps[k + 1:] if start < s < n_layers})
                with model.hooks(ablation_hooks(group)):
                    for a, b in zip([start] + keep, keep + [n_layers]):
                        x = replay(model, prefix, a, hidden=x, stop=b)
                        if b < n_layers:
                            state[b] = x
                logp = head_logprobs(output_head(model), at_reads(x, rows, pos), chunk.read_tok, inverse)
            tables[k].add(chunk, logp)
    return [t.result() for t in tables]


@dataclass
class Trail:
    """One removed set's replay kept block by block (:func:`trail_scores`): its ``scores`` and, per chunk, the
    residual stream entering each block from ``first`` on (the blocks before it read the clean stream); ``streams``
    None where the prefixes are not kept either (:attr:`Prefixes.keep`). A set containing ``heads`` starts from it
    at the earliest layer of the heads it adds; a set of one head more is a circuit's member left out. ``prefixes``:
    the batches it replayed (a trail of others is never read)."""

    heads: frozenset[HeadRef]
    first: int
    streams: list[list[Tensor]] | None
    scores: CandidateScores
    prefixes: "Prefixes | None" = None

    def hidden(self, index: int, prefix: Prefix, layer: int) -> Float[Tensor, "batch pos d_model"]:
        """The stream entering block ``layer`` of chunk ``index`` (``prefix``: its clean prefix) under this set."""
        assert self.streams is not None
        return prefix.hidden(layer) if layer < self.first else self.streams[index][layer - self.first]


@torch.no_grad()
def trail_scores(model: Model, plan: ScoringPlan, prefixes: Prefixes, removed: Sequence[Replacement],
                 start: Trail | None = None) -> Trail:
    """Scores of ``plan`` with ``removed`` ablated, kept as a :class:`Trail`. From ``start`` (the trail of a set
    that ``removed`` contains) the replay begins at the earliest layer of the heads ``removed`` adds, on the stream
    ``start`` holds there; else at the earliest layer of ``removed``. Numbers equal :func:`replay_scores` of the set
    alone."""
    n_layers = model.n_layers
    heads = frozenset(r.site.head for r in removed)
    if start is not None and (start.streams is None or start.prefixes is not prefixes or not start.heads <= heads):
        start = None
    begin = min((h.layer for h in heads - (start.heads if start is not None else frozenset())), default=n_layers)
    if start is not None and begin >= n_layers:
        return Trail(heads, start.first, start.streams, start.scores, prefixes)
    first = begin if start is None else min(begin, start.first)
    table = ScoreTable(plan)
    streams: list[list[Tensor]] = []
    for i, chunk in enumerate(prefixes.chunks):
        prefix = prefixes.get(i)
        if begin >= n_layers:  # nothing removed: the intact model
            table.add(chunk, _clean_logprobs(prefix, chunk))
            streams.append([])
            continue
        kept = start.streams[i][:max(0, begin - start.first)] if start is not None and start.streams else []
        x = start.hidden(i, prefix, begin) if start is not None else prefix.hidden(begin)
        own = []
        with model.hooks(ablation_hooks(list(removed))):
            for layer in range(begin, n_layers):
                own.append(x)
                x = replay(model, prefix, layer, hidden=x, stop=layer + 1)
        if prefixes.keep:
            streams.append(list(kept) + own)
        rows, pos, inverse = chunk.reads
        table.add(chunk, head_logprobs(output_head(model), at_reads(x, rows, pos), chunk.read_tok, inverse))
    return Trail(heads, first, streams if prefixes.keep else None, table.result(), prefixes)


@torch.no_grad()
def added_scores(model: Model, plan: ScoringPlan, prefixes: Prefixes, base: Sequence[Replacement],
                 extras: Sequence[Replacement], trail: Trail | None = None) -> list[CandidateScores]:
    """Scores of ``plan`` with ``base`` removed and then with ``base`` plus each of ``extras`` (one head more each):
    ``len(extras) + 1`` results, ``base`` alone first. The base's replay is kept block by block (``trail``: its
    :class:`Trail` from before, else :func:`trail_scores` now) and each extra replays from its own layer only (e.g.
    a circuit's heads left out one at a time). Numbers equal :func:`replay_scores` of each set alone."""
    if trail is None or trail.prefixes is not prefixes or trail.heads != frozenset(r.site.head for r in base):
        trail = trail_scores(model, plan, prefixes, base)
    tables = [ScoreTable(plan) for _ in extras]
    for i, chunk in enumerate(prefixes.chunks):
        prefix = prefixes.get(i)
        rows, pos, inverse = chunk.reads
        for table, extra in zip(tables, extras):
            start = extra.site.head.layer
            if trail.streams is None:  # (prefixes too large to keep: nor is the base's stream) from the clean one
                start = min(start, trail.first)
            x = trail.hidden(i, prefix, start) if trail.streams is not None else None
            with model.hooks(ablation_hooks([*base, extra])):
                x = replay(model, prefix, start, hidden=x)
            table.add(chunk, head_logprobs(output_head(model), at_reads(x, rows, pos), chunk.read_tok, inverse))
    return [trail.scores] + [t.result() for t in tables]


@dataclass(frozen=True)
class Replays:
    """How a runner scores its sets: ``replay`` (False: one full forward per set, never a recorded prefix); ``stack``,
    the copies one replay stacks (None: :func:`default_stack`); ``pack``, how the plan's rows are laid out (None: as
    the plan allows; False: plain left-padded rows, whose reference rows align with a forward's rows);
    ``max_prefix_bytes``, the memory the clean prefixes may take."""

    replay: bool = True
    stack: int | None = None
    pack: bool | None = None
    max_prefix_bytes: int = DEFAULT_PREFIX_BYTES


FORWARDS = Replays(replay=False)  # a runner of full forwards only


class PlanRunner:
    """A task's plan on one model, laid out once, with the clean prefix of every chunk recorded once and checked to be
    replayable: the set-up every runner of interventions shares (:class:`SetAblation` for head sets,
    :class:`~gna_interp.circuits.edges.paths.PathPatcher` for edge sets).

    ``task`` is a :class:`~gna_interp.tasks.base.Task` or a :class:`ScoringPlan` (:attr:`WHO` names the runner in the
    error for anything else); ``method`` and ``reference`` are :func:`~gna_interp.interventions.ablation.ablate`'s
    (replacements are computed once per head and reused: :meth:`replaced`); ``replays`` how sets are run
    (:class:`Replays`; rows are always laid out plain under resampling).
    :attr:`store` holds the clean prefixes (None for :data:`FORWARDS`: a runner of full forwards only);
    :attr:`prefixes` is the same once checked to replay the model, else None (:attr:`mismatch` says why).

    :meth:`run_under` scores the task under any list of intervention values (:mod:`gna_interp.interventions`):
    head ablations replay the later blocks where they can, anything else runs full forwards.
    """

    WHO = "this runner"  # how errors name the runner

    def __init__(self, model: Model, task: Any, method: AblationMethod = "zero", reference: Any = None,
                 batch_size: int = 16, replays: Replays | None = None) -> None:
        check_method(method, reference)  # before the task is planned
        r = Replays() if replays is None else replays
        if not isinstance(r, Replays):
            raise InputError(f"replays must be a Replays (or None), got {type(r).__name__}")
        self.plan = plan_of(model, task, who=self.WHO)
        self.model, self.method, self.reference = model, method, reference
        self.batch_size, self.max_prefix_bytes = batch_size, r.max_prefix_bytes
        self.replay, self.pack = r.replay, False if method == "resample" else r.pack
        self._stack: int | None = None
        if r.stack is not None:
            self.stack = r.stack
        self._repl: dict[HeadRef, Replacement] = {}
        self._clean: CandidateScores | None = None
        self.store: Prefixes | None = prefixes_for(model, self.chunks, r.max_prefix_bytes) if r.replay else None
        self.prefixes: Prefixes | None = None
        self.mismatch: ReplayMismatch | None = None
        if self.store is not None:
            try:
                self.store.verify()
                self.prefixes = self.store
            except ReplayMismatch as e:
                self.mismatch = e

    @cached_property
    def probe(self) -> Prefix:
        """The clean prefix of the first chunk's :data:`PROBE_ROWS` longest rows (:attr:`probe_batch`): what the
        checks of how the model's blocks work read (a property of the blocks, not of the rows; each runs once per
        model and keeps its answer in ``Model.facts``), at a fraction of a batch's cost."""
        return capture(self.model, self.probe_batch)

    @cached_property
    def probe_batch(self) -> TokenBatch:
        """The first chunk's :data:`PROBE_ROWS` rows with the most real tokens, in their order."""
        batch = self.chunks[0].batch
        rows = batch.attention_mask.sum(1).argsort(descending=True, stable=True)[:PROBE_ROWS]
        return batch.select(rows.sort().values)

    @cached_property
    def chunks(self) -> list[Chunk]:
        """The plan's chunks as replays run them (:func:`~gna_interp.engine.layout.layout_chunks`), laid out once."""
        return layout_chunks(self.plan, self.batch_size, pack=self.pack)

    @property
    def fast(self) -> bool:
        """Whether sets are scored by replaying the later blocks (else one full forward per set)."""
        return self.prefixes is not None

    @property
    def stack(self) -> int:
        """Sets replayed together: the ``stack`` given, else :func:`default_stack` of the chunks (1 without replays)."""
        if self._stack is None:
            self._stack = default_stack(self.model, self.chunks, self.max_prefix_bytes) if self.replay else 1
        return self._stack

    @stack.setter
    def stack(self, value: int) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InputError(f"stack must be an integer >= 1, got {value!r}")
        self._stack = value

    def run_under(self, interventions: Interventions) -> CandidateScores:
        """The task's scores with ``interventions`` applied (:data:`Interventions`; none: the intact model). Head
        ablations alone replay the blocks from their earliest layer on (:func:`replay_scores`, where the runner
        replays); anything else runs one full forward per chunk with every value's hooks -- packed rows where no value
        depends on positions (:attr:`~gna_interp.interventions.Intervention.positional`), else plain rows. Numbers
        equal ``run_plan`` inside :func:`~gna_interp.interventions.applied` to float noise (exactly, for full
        forwards: :meth:`reads_under`)."""
        if not callable(interventions):
            values = check_interventions(interventions)
            if self.prefixes is not None and all(isinstance(v, HeadAblation) and (not v.positional or self.pack is False)
                                                 for v in values):
                replaced = [r for v in values for r in self._replacements(v)]
                return replay_scores(self.model, self.plan, self.prefixes, [replaced])[0]
            interventions = values
        table = ScoreTable(self.plan)
        for read in self.reads_under(interventions):
            table.add(read.chunk, read.logprobs())
        return table.result()

    def reads_under(self, interventions: Interventions, on_layout: Callable[[int], Any] | None = None
                    ) -> Iterator[ChunkReads]:
        """One full forward per chunk of the plan with ``interventions`` applied, yielding the logits at the chunk's
        reads (:func:`~gna_interp.engine.forward.read_chunks`): for callers that read more than scores. The chunks are
        packed as the plan allows unless the values depend on positions (or are given per chunk); ``on_layout`` is
        called with their number once they are laid out (e.g. a progress bar's ``reset``)."""
        fixed = None if callable(interventions) else check_interventions(interventions)
        plain = fixed is None or self.pack is False or any(v.positional for v in fixed)
        chunks = layout_chunks(self.plan, 1 if self.plan.method == "per_candidate" else self.batch_size,
                               pack=False if plain else None)
        if on_layout is not None:
            on_layout(len(chunks))

        @contextmanager
        def around(chunk: Chunk) -> Iterator[None]:
            values = fixed if fixed is not None else check_interventions(interventions(chunk))  # type: ignore[operator]
            with ExitStack() as stack:
                stack.enter_context(self.model.hooks(self._hooks(values, stack)))
                yield

        yield from read_chunks(self.model, chunks, intervention=around)

    def _replacements(self, value: HeadAblation) -> list[Replacement]:
        """``value``'s replacements: the runner's own (computed once per head) when it ablates with the runner's method
        and reference, else the value's."""
        if value.method == self.method and value.reference is self.reference:
            return self.replaced(list(value.heads))
        return value.replacements(self.model)

    def _hooks(self, values: Sequence[Intervention], stack: ExitStack) -> list[Hook]:
        """The forward hooks of ``values``, in order."""
        return [h for v in values for h in (ablation_hooks(self._replacements(v)) if isinstance(v, HeadAblation)
                                            else v.hooks(self.model, stack))]

    def replaced(self, heads: Sequence[HeadRef | str]) -> list[Replacement]:
        """What replaces each of ``heads`` (checked against the model, duplicates dropped), computed once per head
        (a mean: every head's at once, from one pass over the reference)."""
        parsed = list(dict.fromkeys(self.model.check_heads(list(heads)))) if heads else []
        missing = [h for h in parsed if h not in self._repl]
        if missing and self.method == "mean":  # one forward over the reference gives every head's mean
            missing = [h for h in self.model.heads() if h not in self._repl]
        if missing:
            self._repl.update({r.site.head: r for r in replacements(self.model, missing, self.method, self.reference)})
        return [self._repl[h] for h in parsed]


class SetAblation(PlanRunner):
    """A task's scores with sets of heads removed together: the clean prefix of every batch is captured
    once and each set re-runs only the blocks from its earliest layer on (:func:`replay_scores`), many sets
    stacked in one replay (:meth:`run_many`); where replays do not reproduce the model (or with :data:`FORWARDS`),
    each set costs one full forward of the task instead. Under resampling the rows are laid out plain, as a full
    forward lays them out, so that each row meets the same reference row either way. Numbers equal ``ablate`` +
    ``run_plan`` to float noise. Arguments as :class:`PlanRunner`'s.
    """

    WHO = "SetAblation"

    @classmethod
    def of(cls, model: Model, task: Any, method: AblationMethod = "zero",
           reference: Any = None, batch_size: int = 16) -> "SetAblation":
        """``task`` itself when it is a runner made for ``model`` (handed in to reuse its clean prefixes), else a new
        runner for it. A runner made for another model is refused: it measures its own model, whose numbers would
        then carry ``model``'s name."""
        if not isinstance(task, SetAblation):
            return cls(model, task, method, reference, batch_size)
        if task.model is not model:
            raise InputError(f"this SetAblation was made for {task.model.name}, not for the model given "
                             f"({model.name}); make it with SetAblation(model, task, ...)")
        return task

    def on(self, task: Any, *, replay: bool | None = None, pack: bool | None = None) -> "SetAblation":
        """A runner like this one (model, method, reference, sizes; ``replay`` and ``pack`` unless given) on another
        task or plan -- e.g. a subset of the samples -- sharing the replacements computed so far."""
        other = SetAblation(self.model, task, self.method, self.reference, self.batch_size, Replays(
            self.replay if replay is None else replay, self._stack, self.pack if pack is None else pack,
            self.max_prefix_bytes))
        other._repl = self._repl
        return other

    def clean(self) -> CandidateScores:
        """Scores of the intact model."""
        if self._clean is None:
            self._clean = self.run([])
        return self._clean

    def run_nested(self, sets: Sequence[Sequence[HeadRef | str]]) -> list[CandidateScores]:
        """Scores with each of ``sets`` removed, each set containing the one before it (e.g. the first ``j`` heads
        of a ranking): the same numbers as :meth:`run` of each, for less (:func:`nested_scores`)."""
        replaced = [self.replaced(s) for s in sets]
        if self.prefixes is not None:
            return nested_scores(self.model, self.plan, self.prefixes, replaced)
        return [self.run(s) for s in sets]

    def run_trail(self, heads: Sequence[HeadRef | str], start: Trail | None = None) -> Trail:
        """Scores with ``heads`` removed, the replay kept block by block (:func:`trail_scores`; ``start``: the trail
        of a set ``heads`` contains, replayed on from the earliest layer of the heads added). Without fast replays,
        :meth:`run`'s scores and no streams."""
        replaced = self.replaced(heads)
        if self.prefixes is None:
            return Trail(frozenset(r.site.head for r in replaced), self.model.n_layers, None, self.run(heads))
        return trail_scores(self.model, self.plan, self.prefixes, replaced, start)

    def run_added(self, base: Sequence[HeadRef | str], extras: Sequence[HeadRef | str], trail: Trail | None = None
                  ) -> list[CandidateScores]:
        """Scores with ``base`` removed, then with ``base`` and each of ``extras`` removed (``len(extras) + 1``
        results): each extra replays from its own layer, from the base's residual stream there
        (:func:`added_scores`; ``trail``: the base's own from :meth:`run_trail` on this runner's batches, read
        instead of replaying it; without fast replays every set is run)."""
        replaced, more = self.replaced(base), self.replaced(extras)
        if len(more) != len(list(extras)):
            raise InputError("run_added takes distinct extra heads")
        inside = {r.site.head for r in replaced} & {r.site.head for r in more}
        if inside:
            raise InputError(f"run_added's extras must be outside the base set; {sorted(h.name for h in inside)} "
                             f"are in both")
        if self.prefixes is not None:
            return added_scores(self.model, self.plan, self.prefixes, replaced, more, trail)
        return [self.run(list(base))] + [self.run([*base, h]) for h in extras]

    def run_many(self, sets: Sequence[Sequence[HeadRef | str]]) -> list[CandidateScores]:
        """Scores with each of ``sets`` removed (each set's heads together), in the order given: the numbers of
        :meth:`run` of each, with the sets replayed :attr:`stack` at a time as stacked copies of every batch
        (:func:`replay_scores`; the sets sorted by their earliest layer, so the copies of one replay join it close
        together). Without fast replays, one full forward per set."""
        replaced = [self.replaced(s) for s in sets]
        if self.prefixes is None:
            return [self.run(s) for s in sets]
        n_layers = self.model.n_layers
        order = sorted(range(len(sets)), key=lambda g: min((r.site.head.layer for r in replaced[g]), default=n_layers))
        out: list[CandidateScores | None] = [None] * len(sets)
        for k in range(0, len(order), self.stack):
            part = order[k:k + self.stack]
            for g, scores in zip(part, replay_scores(self.model, self.plan, self.prefixes, [replaced[g] for g in part])):
                out[g] = scores
        assert all(o is not None for o in out)
        return out  # type: ignore[return-value]

    def run(self, heads: Sequence[HeadRef | str]) -> CandidateScores:
        """Scores with ``heads`` removed together (none: the intact model): :meth:`run_under` of their
        :class:`~gna_interp.interventions.HeadAblation`."""
        return self.run_under([HeadAblation(tuple(heads), self.method, self.reference)])
