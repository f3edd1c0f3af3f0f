"""Path patching: how much of a task's metric flows from one head (the *sender*) along one path -- into one input
of a later head (the *receiver*) or straight to the answer logits.

**Definition** (zero ablation; ``mean`` / ``resample`` replace the sender's output by that value instead). The
sender ``S`` writes ``o_S = z_S W_O[:, S]ᵀ`` into the residual stream (``z_S`` its channels at
:meth:`~gna_interp.models.model.Model.head_site`, ``W_O`` its layer's output projection). Removing ``S`` along an
edge changes what *one consumer* reads and nothing else:

- **head edge** ``S -> R.input @ positions``: the receiver ``R`` (a later layer) computes its ``input`` (``q``,
  ``k``, ``v`` or ``other``: where it reads it is its kind's :meth:`~gna_interp.models.mixer.MixerAdapter.receiver_inputs`)
  from ``x_r - m ⊙ o_S`` instead of its block's clean input ``x_r``, where ``m`` selects the ``positions``
  (``summary``: the segments' summary tokens; ``items``: every token of the segments (the dictionary lines or the
  options); ``decision``: the last prompt token and every answer token after it; ``other``: every other real
  token (the instructions, the query before the decision): ``items``, ``decision`` and ``other`` partition the
  tokens; ``all``). Its other inputs, every other head of its layer and everything else reading the stream see ``x_r``.
  ``R``'s output recomputed that way replaces its output in the forward, and its change flows on through the
  later layers as usual. For grouped-query attention the receiver's K/V group is recomputed but only the one query
  head's output is used; for a Mamba-2 head the group's ``B``/``C`` change and the other heads' scan outputs are put
  back before the gated norm (:meth:`~gna_interp.models.mixer.MixerAdapter.receiver_isolation`).
- **direct edge** ``S -> logits``: the final norm and unembedding read ``h_N - m ⊙ o_S`` at the scored positions.
- **the embeddings and the MLPs.** A sender may be ``embed`` (its write: the stream entering block 0, less its mean
  over the reference's real tokens under ``mean``) or ``MLP{l}`` (its write: ``g(y) - g(ȳ)``, ``y`` the MLP's output,
  ``ȳ`` its mean or zero, ``g`` what its block applies before adding it -- a post-norm, a residual multiplier --
  checked against what the block adds); a receiver may be ``MLP{l}``, which reads the stream before it
  (``hook_resid_mid``, which feeds the MLP's norm alone) less its edges' writes.

Several edges removed together are one *set*: its receivers each read their inputs from ``x_r`` (their block's
clean input) minus their own edges' writes, and the receivers of one layer are recomputed together (one gated
norm for a Mamba-2 layer), unless two of them read a shared channel (a KV group, a ``B``/``C`` group) from
different streams. ``S`` removed from every input of every later head of a model
whose MLPs write nothing, plus the direct edge, is the plain ablation of ``S`` (tested).

How it runs (every number through the one scoring engine, :mod:`gna_interp.engine`): the clean prefix of
each batch (:mod:`gna_interp.engine.replay`), one clean replay from the earliest layer involved that records
the senders' outputs, the receivers' input projections, the final residual stream and (where the model's blocks
take them, :class:`~gna_interp.engine.replay.KeyValues`) every later block's clean keys and values; per receiver
layer two single-block runs, each stopped once it has what it was run for (the receivers' inputs from their patched
streams, then their outputs assembled from them); and stacked replays of the later blocks (sets of direct edges
need none: they read the clean final stream). A receiver's output is clean before the first position it reads a
patched stream at (attention only looks back), so a replay starts there: from the decision for ``q@decision``
sets, from the first line for ``items``, the earlier positions' keys and values being the clean ones. The effect
of an edge is ``metric(intact) - metric(patched)`` with a paired bootstrap interval over samples
(:class:`PathEffects`).

**The write through a norm or multiplier.** Where a block adds its mixer's output as is, the sender's write is
``o_S``. Where it normalises or scales it first (Gemma-2/3 and OLMo-2 post-norms, Granite's and Falcon-H1's
multipliers, Falcon-H1's attention and Mamba-2 side by side), the write is what removing ``S`` changes in the
block's contribution, the other heads held at their clean values: ``W_S = f(Σ_h o_h) - f(Σ_{h≠S} o_h)`` with f the
block's map from its mixers' outputs to the stream -- computed exactly, from one run of the block with ``S``
replaced, read at the stream before the block's MLP (``hook_resid_mid``; no linearisation). Receivers read their
inputs through their block's own pre-norm, as the block computes them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Sequence

import pandas as pd
import torch
from jaxtyping import Bool, Float
from torch import Tensor

from gna_interp.circuits.edges.block_io import (Direct, PostMap, direct_reads, edge_replay, flat, input_channels,
                                                overwrite, post_maps, read_block, reproduces)
from gna_interp.circuits.scan.result import results_from_json, results_to_json
from gna_interp.engine.unembed import head_logprobs, output_head
from gna_interp.engine.replay import KeyValues, PlanRunner, Prefix, replay
from gna_interp.bootstrap import N_BOOTSTRAP, interval, paired_bootstrap
from gna_interp.constants import PATH_EFFECTS_JSON
from gna_interp.errors import InputError, UnsupportedArchitectureError
from gna_interp.html_repr import fmt
from gna_interp.interventions.ablation import AblationMethod, Replacement, ablation_hooks, flat_channels
from gna_interp.models.graph import EMBED, LOGITS, POSITIONS, Edge, Node, mlp_name, node_kind
from gna_interp.models.heads import HeadRef
from gna_interp.models.mixer import InputSite
from gna_interp.models.model import Model
from gna_interp.options import Options, check_int, check_level, check_n_boot, options
from gna_interp.results import Result
from gna_interp.tasks.base import Task
from gna_interp.engine.metrics import Results, get_metric, results
from gna_interp.engine.forward import ScoreTable
from gna_interp.engine.layout import Chunk
from gna_interp.engine.plan import CandidateScores
from gna_interp.tasks.segments import segments_of

EFFECTS_FORMAT = "path_effects"  # the on-disk format of PathEffects.save
STREAMS = "paths.streams"  # Model.facts key: why edges out of the embeddings or of or into MLPs cannot be measured

__all__ = ["LOGITS", "POSITIONS", "Edge", "PathEffects", "PathPatcher", "path_effects"]


def linear_write(model: Model, r: Replacement, z: Float[Tensor, "b p w"]) -> Float[Tensor, "b p d_model"]:
    """``(z - replacement) W_O[:, S]ᵀ``: what replacing the head of ``r`` (its channels ``z`` at its site) takes out
    of its output projection's output (:func:`write_of` with the model's weight)."""
    return write_of(model.output_projection(r.site.head)[:, r.site.columns], r, z)


def write_of(w: Float[Tensor, "d_model w"], r: Replacement, z: Float[Tensor, "b p w"]) -> Float[Tensor, "b p d_model"]:
    """``(z - replacement) wᵀ``, ``w`` the head's columns of its output projection (:func:`linear_write`)."""
    return (z - r.like(z)).to(w.dtype) @ w.T


def check_edge(model: Model, edge: Edge) -> Edge:
    """``edge`` with its nodes validated against ``model`` (the edge's own meaning is checked when it is made) and
    within path patching's reach -- from the embeddings, a head or an MLP into one head's input, an MLP or the
    logits; :class:`InputError` / :class:`HeadError` saying what is wrong otherwise."""
    if not isinstance(edge, Edge):
        raise InputError(f"an edge must be an Edge(sender, receiver, input, positions), got {type(edge).__name__}")
    if not edge.direct and edge.receiver_head is None and edge.input != "mlp":
        raise InputError(f"path patching measures an edge into one head's input, an MLP or the logits, not "
                         f"{edge.name}: an input several heads share is left out whole by an edge circuit "
                         f"(EdgeCircuit.run_without)")
    for name in (edge.sender,) if edge.direct else (edge.sender, edge.receiver):
        node = Node.parse(name)
        if node.kind == "head":
            model.check_head(node.head)
        elif node.kind == "mlp" and (node.layer >= model.n_layers or model.mlp_hook(node.layer, "out") is None):
            raise InputError(f"{edge.name}: {model.name} has no {name} (layers 0-{model.n_layers - 1}; a block "
                             f"without an MLP has none)")
    return edge


def _receiver_layer(edge: Edge) -> int:
    """The layer of ``edge``'s receiver (a head or an MLP; not the logits)."""
    head = edge.receiver_head
    return head.layer if head is not None else int(Node.parse(edge.receiver).layer or 0)


def _less(x: Float[Tensor, "b p d_model"], edges: Sequence[Edge], masks: dict[str, Tensor],
          writes: dict[str, Tensor]) -> Float[Tensor, "b p d_model"]:
    """The stream ``x`` less each of ``edges``' sender's write at the edge's positions (``masks``): what a receiver
    reads with those edges removed."""
    s = x.clone()
    for e in edges:
        s = s - masks[e.positions][..., None].to(s.dtype) * writes[e.sender].to(s.dtype)
    return s


@dataclass
class _Clean:
    """What one clean replay of a chunk recorded: hook values (flat ``[b, p, w]``) and the final residual stream; and,
    filled in once per chunk, the chunk's position masks and every sender's write."""

    values: dict[str, Tensor]
    final: Tensor
    keys: KeyValues | None = None  # the clean keys and values, for replays of the later positions only
    masks: dict[str, Tensor] = field(default_factory=dict)
    writes: dict[str, Tensor] = field(default_factory=dict)  # sender name -> its write


def _added_key(layer: int) -> str:
    """Where a clean pass's values keep what block ``layer`` added to the stream besides its MLP (no hook name)."""
    return f"added@{layer}"


def _write_key(layer: int, kind: str) -> str:
    """Where a clean pass's values keep the output of block ``layer``'s ``kind`` output projection (no hook name)."""
    return f"write@{layer}:{kind}"


class PathPatcher(PlanRunner):
    """Scores of a task with sets of edges removed (:func:`path_effects` reads effects off them).

    ``method`` / ``reference`` are :func:`~gna_interp.interventions.ablation.ablate`'s: what replaces a sender's
    output along its edges. Sets are replayed in stacks of :func:`~gna_interp.engine.replay.default_stack` copies.
    The set-up (plan, chunks, clean prefixes, replacements) is :class:`~gna_interp.engine.replay.PlanRunner`'s; path
    patching needs the replays, so a model they do not reproduce is refused.
    """

    WHO = "path patching"

    def __init__(self, model: Model, task: Task, method: AblationMethod = "zero", reference: Any = None,
                 batch_size: int = 16) -> None:
        if not isinstance(task, Task):
            raise InputError(f"path patching needs a Task (with segments for 'summary' positions), got "
                             f"{type(task).__name__}")
        if method == "resample":
            raise InputError("path patching takes method 'zero' or 'mean' (a resampled sender output is aligned per "
                             "forward, which a replay of stacked copies does not keep)")
        model.check_runnable()
        scaled = model.scaled_blocks()
        if scaled:
            raise UnsupportedArchitectureError(
                f"path patching needs a residual stream that is the sum of what each part writes, but block(s) "
                f"{', '.join(map(str, scaled))} of {model.name} multiply the whole stream (layer_scalar); a sender's "
                f"write has no single value along its paths there")
        super().__init__(model, task, method, reference, batch_size)
        if self.prefixes is None:
            raise UnsupportedArchitectureError(f"path patching replays blocks from recorded inputs: {self.mismatch}")
        self.task = task
        self._summaries = self._summary_positions()
        self._masks: dict[int, tuple[Chunk, dict[str, Tensor]]] = {}  # id(chunk) -> (chunk, its masks)
        self._as_is: dict[int, bool] = {}  # layer -> its block adds its mixer's output as is
        self._direct_map: dict[int, Direct] | None = None

    @cached_property
    def suffix(self) -> bool:
        """Whether suffix replays reproduce the model (:meth:`~gna_interp.engine.replay.KeyValues.supported`; read
        before any hook is attached: the check runs the model)."""
        return KeyValues.supported(self.model, self.prefixes.get(0))

    # ---- positions ------------------------------------------------------------------------
    def _summary_positions(self) -> list[tuple[list[int], list[int]]]:
        """Per sample: the summary tokens and every token of its segments (prompt positions)."""
        out = []
        for i, seg in enumerate(segments_of(self.model.tokenizer, self.plan.samples)):
            n = len(self.plan.prompt_ids[i])
            if seg.n_tokens != n:
                raise InputError(f"sample {i}: its segments cover {seg.n_tokens} tokens but the scored prompt has {n}; "
                                 f"summary positions cannot be placed")
            out.append((seg.summaries, [p for sp in seg.items for p in range(sp.start, sp.stop)]))
        return out

    def masks(self, chunk: Chunk) -> dict[str, Bool[Tensor, "batch pos"]]:
        """Position masks of ``chunk``'s rows: ``summary`` (every item's summary token), ``items`` (every token of the
        items), ``decision`` (the last prompt token and the answer tokens fed after it), ``other`` (every real token
        in neither) and ``all`` (every real token). Computed once per chunk; do not modify them."""
        kept = self._masks.get(id(chunk))
        if kept is not None and kept[0] is chunk:
            return kept[1]
        masks = self._chunk_masks(chunk)
        self._masks[id(chunk)] = (chunk, masks)
        return masks

    def _chunk_masks(self, chunk: Chunk) -> dict[str, Bool[Tensor, "batch pos"]]:
        b, width = chunk.batch.ids.shape
        sample_of = [-1] * b
        for r, t in zip(chunk.read_row.tolist(), chunk.read_target.tolist()):
            sample_of[r] = self.plan.targets[t].sample
        summary = torch.zeros(b, width, dtype=torch.bool)
        items = torch.zeros(b, width, dtype=torch.bool)
        decision = torch.zeros(b, width, dtype=torch.bool)
        pads = chunk.pad.tolist()
        for k, i in enumerate(sample_of):
            if i < 0:
                continue
            n = len(self.plan.prompt_ids[i])
            summary[k, [pads[k] + p for p in self._summaries[i][0]]] = True
            items[k, [pads[k] + p for p in self._summaries[i][1]]] = True
            decision[k, pads[k] + n - 1:] = True
        dev = self.model.device
        real = chunk.batch.attention_mask.bool()
        return {"summary": summary.to(dev), "items": items.to(dev), "decision": decision.to(dev),
                "other": (real & ~items & ~decision).to(dev), "all": real.to(dev)}

    # ---- pieces ---------------------------------------------------------------------------
    def _direct(self) -> dict[int, Direct]:
        """The layers whose receiver input sites are plain projections (:func:`~gna_interp.circuits.edges.block_io.
        direct_reads`, over the inputs of every head that can receive): there a patched stream computes only its
        receiver's channels."""
        if self._direct_map is None:
            model, sites = self.model, {}
            for h in model.heads():
                spec = model.layer_spec(h.layer, h.kind)
                try:
                    inputs = spec.adapter.receiver_inputs(model, spec, h)
                except UnsupportedArchitectureError:  # a kind that receives no path patches (Mamba-1 channels)
                    continue
                for ss in inputs.values():
                    sites.setdefault(h.layer, set()).update(x.hook for x in ss)
            self._direct_map = direct_reads(model, self.probe, sites)
        return self._direct_map

    def _replacement(self, head: HeadRef) -> Replacement:
        """What replaces ``head``'s output (checked against the model the first time only)."""
        known = self._repl.get(head)
        return known if known is not None else self.replaced([head])[0]

    def _write(self, head: HeadRef, z: Float[Tensor, "b p w"]) -> Float[Tensor, "b p d_model"]:
        """What removing ``head`` takes out of the residual stream where its block adds its mixer's output as is:
        ``o_S = (z_S - replacement) W_O[:, S]ᵀ``."""
        return linear_write(self.model, self._replacement(head), z)

    def _classify(self, layer: int, values: dict[str, Tensor]) -> None:
        """Record once per layer whether block ``layer`` adds its mixer's output projection to the stream as is
        (one mixer, nothing between it and the stream): then a sender's write is ``o_S``; else it is measured
        exactly by :meth:`_exact_writes`."""
        if layer in self._as_is:
            return
        mixers = [s for s in self.model.layers if s.layer == layer and s.supported]
        added = values[_added_key(layer)]
        as_is = False
        out = values.get(_write_key(layer, mixers[0].kind)) if len(mixers) == 1 else None
        if out is not None:
            as_is = reproduces(out, added, self.model.dtype)
        self._as_is[layer] = as_is

    def _exact_writes(self, prefix: Prefix, layer: int, senders: list[HeadRef]
                      ) -> dict[HeadRef, Float[Tensor, "b p d_model"]]:
        """Each sender's write where block ``layer`` normalises or scales its mixers' output before adding it:
        ``W_S = f(Σ_h o_h) - f(Σ_{h≠S} o_h)``, f the block's map from its mixers' outputs to the stream, the other
        heads at their clean values -- read off one run of the block on ``1 + len(senders)`` stacked copies (copy 0
        clean, copy ``j`` with sender ``j`` replaced as under ablation), at the stream before the block's MLP."""
        model, b = self.model, prefix.batch_size
        stream = model.mixed_stream_hook(layer)
        mlp_in = model.mlp_hook(layer, "in") if stream == model.block_output_hook(layer) else None
        hooks = [h for j, s in enumerate(senders)
                 for h in ablation_hooks([self._replacement(s)], rows=slice((j + 1) * b, (j + 2) * b))]
        names = [stream] + ([mlp_in] if mlp_in else [])
        got = read_block(model, prefix, layer, names, 1 + len(senders), hooks)
        missing = [n for n in names if n not in got]
        if missing:
            raise UnsupportedArchitectureError(f"path patching reads {missing[0]!r} to measure what block {layer} of "
                                               f"{model.name} writes, but that hook never fired")
        if mlp_in:  # no hook between the mixers and the MLP: the MLP must not read the mixers' output
            x = got[mlp_in]
            if not all(torch.equal(x[:b], x[j * b:(j + 1) * b]) for j in range(1, 1 + len(senders))):
                raise UnsupportedArchitectureError(
                    f"path patching cannot separate what block {layer} of {model.name} writes from its MLP: the MLP "
                    f"reads the mixers' output and the bridge has no hook on the stream between them")
        y = got[stream]
        return {s: y[:b] - y[(j + 1) * b:(j + 2) * b] for j, s in enumerate(senders)}

    def _clean_pass(self, prefix: Prefix, senders: set[HeadRef], receivers: set[HeadRef], start: int,
                    extra: Sequence[str] = ()) -> _Clean:
        """One clean replay from ``start``: senders' outputs, receivers' input projections, isolation hooks, the
        hooks ``extra``, the final stream, and what each sender layer adds to the stream (for :meth:`_classify`)."""
        model, values = self.model, {}
        hooks: dict[str, Any] = {}

        def keep(name: str, key: str | None = None) -> None:
            def hook(x: Tensor, hook: Any = None) -> Tensor:
                values[key or name] = flat(x).detach().clone()
                return x
            hooks.setdefault(name, []).append((key or name, hook))

        for s in senders:
            keep(model.head_site(s).hook)
        for name in extra:
            keep(name)
        for r in receivers:
            spec = model.layer_spec(r.layer, r.kind)
            for sites in spec.adapter.receiver_inputs(model, spec, r).values():
                for site in sites:
                    keep(site.hook)
            iso = spec.adapter.receiver_isolation(model, spec, r)
            if iso is not None:
                keep(iso.hook)
        unchecked = sorted({s.layer for s in senders if s.layer not in self._as_is})
        for layer in unchecked:
            for spec in (s for s in model.layers if s.layer == layer and s.supported):
                out_hook = model.mixer_output_hook(layer, spec.kind)
                if out_hook is not None:
                    keep(out_hook, _write_key(layer, spec.kind))
            stream, mlp_out = model.mixed_stream_hook(layer), model.mlp_hook(layer, "out")
            for name in (model.block_input_hook(layer), stream,
                         mlp_out if stream == model.block_output_hook(layer) else None):
                if name:
                    keep(name)
        fns = [(name, fn) for name, fs in hooks.items() for _, fn in fs]
        suffix = self.suffix  # before the hooks
        with model.hooks(fns):
            keys, final = KeyValues.record(model, prefix, start) if suffix else (None, replay(model, prefix, start))
        missing = [name for name, fs in hooks.items() for key, _ in fs if key not in values]
        if missing:
            raise UnsupportedArchitectureError(f"path patching: the hook {missing[0]!r} of {model.name} never fired "
                                               f"in a forward, so it cannot be read or patched")
        for layer in unchecked:
            stream, mlp_out = model.mixed_stream_hook(layer), model.mlp_hook(layer, "out")
            added = values[stream] - values[model.block_input_hook(layer)]
            if stream == model.block_output_hook(layer) and mlp_out:
                added = added - values[mlp_out]
            values[_added_key(layer)] = added
            self._classify(layer, values)
        return _Clean(values, final, keys)

    def _copies(self, items: list[tuple[int, HeadRef, dict[str, list[Edge]]]]
                ) -> list[tuple[int, dict[HeadRef, dict[str, list[Edge]]]]]:
        """The receivers of one layer grouped into assembly copies: the receivers of one set share a copy unless
        two of them read a shared channel (a GQA group's K/V, a Mamba-2 group's B/C) from different streams."""
        model = self.model
        copies: list[tuple[int, dict[HeadRef, dict[str, list[Edge]]], dict[tuple[str, int], frozenset]]] = []
        for g, r, by_input in items:
            spec = model.layer_spec(r.layer, r.kind)
            reads = {}
            for inp, sites in spec.adapter.receiver_inputs(model, spec, r).items():
                stream = frozenset((e.sender, e.positions) for e in by_input.get(inp, ()))
                for site in sites:
                    for c in range(site.start, site.stop):
                        reads[(site.hook, c)] = stream
            for cg, members, used in copies:
                if cg == g and all(used.get(k, v) == v for k, v in reads.items()):
                    members[r] = by_input
                    used.update(reads)
                    break
            else:
                copies.append((g, {r: by_input}, dict(reads)))
        return [(g, members) for g, members, _ in copies]

    def _isolation(self, copies: list[tuple[int, dict[HeadRef, Any]]], specs: dict[HeadRef, Any]
                   ) -> dict[str, dict[int, list[InputSite]]]:
        """Per isolation hook and copy, the receivers' sites whose channels stay patched (the other heads' are put
        back to their clean values; :meth:`MixerAdapter.receiver_isolation`)."""
        isolate: dict[str, dict[int, list[InputSite]]] = {}
        for n, (_, members) in enumerate(copies):
            for r in members:
                iso = specs[r].adapter.receiver_isolation(self.model, specs[r], r)
                if iso is not None:
                    isolate.setdefault(iso.hook, {}).setdefault(n, []).append(iso)
        return isolate

    def _receiver_outputs(self, prefix: Prefix, layer: int, clean: _Clean, writes: dict[str, Tensor],
                          masks: dict[str, Tensor], items: list[tuple[int, HeadRef, dict[str, list[Edge]]]]
                          ) -> dict[tuple[int, HeadRef], Tensor]:
        """Outputs ``z'`` of the receivers of ``layer``, one per ``(set, receiver, {input: edges})`` item.

        Run 1 computes every patched input's projection from its own stream ``x_r - Σ m ⊙ o_S``; run 2 feeds the
        clean stream, overwrites the receivers' input channels with those (one copy per group of :meth:`_copies`),
        puts the other heads back at the isolation hook and reads the receivers' output channels."""
        model, b = self.model, prefix.batch_size
        x = prefix.hidden(layer)
        copies = self._copies(items)
        specs = {r: model.layer_spec(r.layer, r.kind) for _, r, _ in items}
        inputs = {r: specs[r].adapter.receiver_inputs(model, specs[r], r) for r in specs}
        streams, where = [], []  # where[j] = (copy, receiver, input)
        for n, (_, members) in enumerate(copies):
            for r, by_input in members.items():
                for inp, edges in by_input.items():
                    streams.append(_less(x, edges, masks, writes))
                    where.append((n, r, inp))
        channels = input_channels(model, prefix, layer, streams, [inputs[r][inp] for _, r, inp in where],
                                  self._direct().get(layer))
        by_hook: dict[str, list[tuple[slice, InputSite, Tensor]]] = {}
        for (n, r, inp), values in zip(where, channels):
            for site, value in zip(inputs[r][inp], values):
                by_hook.setdefault(site.hook, []).append((slice(n * b, (n + 1) * b), site, value))

        isolate = self._isolation(copies, specs)

        def restore(entries: dict[int, list[InputSite]], name: str) -> Any:
            def hook(v: Tensor, hook: Any = None) -> Tensor:
                out = v.clone(memory_format=torch.contiguous_format)
                chans = flat(out)
                base = clean.values[name].to(chans.dtype)
                for n, isos in entries.items():
                    rows = chans[n * b:(n + 1) * b]
                    keep = torch.zeros(rows.shape[-1], dtype=torch.bool, device=rows.device)
                    for iso in isos:
                        keep[iso.columns] = True
                    rows.copy_(torch.where(keep, rows, base))
                return out
            return hook

        sites = {r: model.head_site(r) for r in specs}
        hooks = [(name, overwrite(entries)) for name, entries in by_hook.items()]
        hooks += [(name, restore(entries, name)) for name, entries in isolate.items()]
        got = read_block(model, prefix, layer, sorted({s.hook for s in sites.values()}), len(copies), hooks)
        result = {}
        for n, (g, members) in enumerate(copies):
            for r in members:
                site = sites[r]
                result[(g, r)] = flat_channels(got[site.hook], site)[n * b:(n + 1) * b, :, site.columns]
        return result

    def _run_chunk(self, index: int, sets: list[list[Edge]], every: list[list[Edge]] | None = None,
                   cache: dict[int, _Clean] | None = None) -> list[Tensor]:
        """Read log-probs of chunk ``index`` under each set (the clean pass covers the heads of ``every`` set and is
        kept in ``cache``, so stacked groups of one call share it)."""
        chunk, prefix = self.chunks[index], self.prefixes.get(index)
        clean = self._chunk_clean(index, sets if every is None else every, cache)
        final, column = self._patched(prefix, chunk, clean, sets)
        return self._read(chunk, prefix.batch_size, clean, sets, final, column)

    def _chunk_clean(self, index: int, every: list[list[Edge]], cache: dict[int, _Clean] | None) -> _Clean:
        """The clean pass of chunk ``index`` over the nodes of ``every`` set, with the chunk's masks and each sender's
        write (exact where its block does not add it as is); taken from, or kept in, ``cache``."""
        clean = cache.get(index) if cache is not None else None
        if clean is not None:
            return clean
        model, prefix = self.model, self.prefixes.get(index)
        names = {e.sender for es in every for e in es}
        senders = {Node.parse(n).head for n in names if node_kind(n) == "head"}
        streams = sorted(n for n in names if node_kind(n) != "head")  # the embeddings and MLPs
        receivers = {e.receiver_head for es in every for e in es if e.receiver_head is not None}
        mlps = {_receiver_layer(e) for es in every for e in es if e.input == "mlp"}
        layers = [h.layer for h in senders | receivers] + [max(0, Node.parse(n).layer or 0) for n in streams]
        clean = self._clean_pass(prefix, senders, receivers, min(layers + list(mlps)),
                                 self._stream_hooks(streams, mlps))
        clean.masks = self.masks(self.chunks[index])
        exact: dict[int, list[HeadRef]] = {}
        for s in sorted(senders):
            if not self._as_is[s.layer]:
                exact.setdefault(s.layer, []).append(s)
                continue
            site = model.head_site(s)
            clean.writes[s.name] = self._write(s, flat_channels(clean.values[site.hook], site)[..., site.columns])
        for layer, heads in exact.items():
            clean.writes.update((h.name, w) for h, w in self._exact_writes(prefix, layer, heads).items())
        clean.writes.update(self._stream_writes(streams, clean.values))
        if cache is not None:
            cache[index] = clean
        return clean

    # ---- the embeddings and MLPs ------------------------------------------------------------
    def _output_hook(self, sender: str) -> str:
        """The hook of what the embeddings (the stream entering block 0) or an MLP (its output) write."""
        node = Node.parse(sender)
        hook = self.model.block_input_hook(0) if node.kind == "embed" else self.model.mlp_hook(int(node.layer or 0),
                                                                                                 "out")
        assert hook is not None
        return hook

    def _mid(self, layer: int, what: str) -> str:
        """The stream before block ``layer``'s MLP, which feeds the MLP's norm alone
        (:meth:`~gna_interp.models.model.Model.mixed_stream_hook`); :class:`UnsupportedArchitectureError` where the
        bridge has no hook there (the MLP reads the block's input)."""
        mid = self.model.mixed_stream_hook(layer)
        if mid == self.model.block_output_hook(layer):
            raise UnsupportedArchitectureError(
                f"path patching {what} MLP{layer} of {self.model.name} at the stream before it, but the bridge has no "
                f"hook there (its MLP reads the block's input): measure edges between heads instead")
        return mid

    def _stream_hooks(self, streams: Sequence[str], mlps: set[int]) -> list[str]:
        """The hooks a clean pass records for the embeddings' and MLPs' writes (``streams``: each sender's output,
        and for an MLP the streams around it, to check its block's map) and for the MLPs of ``mlps`` that receive
        (the stream each reads)."""
        hooks = [self._output_hook(n) for n in streams]
        for n in streams:
            if n != EMBED:
                layer = int(Node.parse(n).layer or 0)
                hooks += [self._mid(layer, "reads what"), self.model.block_output_hook(layer)]
        return hooks + [self._mid(layer, "feeds") for layer in sorted(mlps)]

    def stream_refusal(self) -> str:
        """Why path patching cannot measure the edges out of the embeddings and out of or into the MLPs of the model
        (``""`` where it can): a block whose MLP has no stream of its own before it, or whose map of its MLP's output
        to the stream does not reproduce what it adds (checked once per model on the probe rows:
        :attr:`~gna_interp.engine.replay.PlanRunner.probe`)."""
        known = self.model.facts.get(STREAMS)
        if known is None:
            mlps = [mlp_name(l) for l in range(self.model.n_layers) if self.model.mlp_hook(l, "out")]
            try:
                hooks = self._stream_hooks(mlps, set())
                clean = self._clean_pass(self.probe, set(), set(), 0, hooks)
                for n in mlps:
                    self._check_stream(n, clean.values)
                known = ""
            except UnsupportedArchitectureError as e:
                known = str(e)
            self.model.facts[STREAMS] = known
        return known

    def _check_stream(self, sender: str, values: dict[str, Tensor]) -> tuple[PostMap, Tensor]:
        """The map ``g`` from the MLP ``sender``'s output to the stream (the identity for the embeddings) and ``g`` of
        its output in the clean pass ``values``, checked against what its block adds there."""
        y = values[self._output_hook(sender)]
        if sender == EMBED:
            return PostMap(), y
        layer = int(Node.parse(sender).layer or 0)
        g = post_maps(self.model, layer)[1]
        added = values[self.model.block_output_hook(layer)] - values[self._mid(layer, "reads what")]
        written = g(y)
        if not reproduces(written, added, self.model.dtype):
            raise UnsupportedArchitectureError(
                f"path patching reads what {sender} of {self.model.name} writes as its block's map of its output "
                f"(the norm after it, the residual multiplier), but that map does not reproduce what the block "
                f"adds; measure edges between heads instead")
        return g, written

    def _stream_writes(self, streams: Sequence[str], values: dict[str, Tensor]) -> dict[str, Tensor]:
        """Each of ``streams``' write ``g(y) - g(ȳ)`` (``y`` its clean output in ``values``, ``ȳ`` its mean over the
        reference's real tokens or zero, ``g`` its block's map to the stream: :func:`~gna_interp.circuits.edges.
        block_io.post_maps`, the identity for the embeddings); ``g(y)`` is checked against what the block adds."""
        if not streams:
            return {}
        hooks = {n: self._output_hook(n) for n in streams}
        means = self.model.mean_activations(self.reference, sorted(set(hooks.values()))) \
            if self.method == "mean" else {}
        out = {}
        for n, hook in hooks.items():
            g, written = self._check_stream(n, values)
            bar = means[hook].to(written.device, values[hook].dtype) if means else torch.zeros_like(values[hook][0, 0])
            out[n] = written - g(bar)
        return out

    def _patched(self, prefix: Prefix, chunk: Chunk, clean: _Clean, sets: list[list[Edge]]
                 ) -> tuple[Float[Tensor, "copies_batch pos d_model"], int]:
        """The final stream of each set's copy (stacked) with its receivers' outputs from their patched inputs, and
        the column the replay started at (the stream holds the positions from there: :meth:`_first_change`)."""
        by_layer: dict[int, list[tuple[int, HeadRef, dict[str, list[Edge]]]]] = {}
        mlp_in: dict[int, list[tuple[int, list[Edge]]]] = {}  # MLP receivers: per layer, (set, its edges into it)
        for g, es in enumerate(sets):
            per: dict[HeadRef, dict[str, list[Edge]]] = {}
            mine: dict[int, list[Edge]] = {}
            for e in es:
                if e.input == "mlp":
                    mine.setdefault(_receiver_layer(e), []).append(e)
                elif not e.direct:
                    per.setdefault(e.receiver_head, {}).setdefault(e.input, []).append(e)
            for r, by_input in per.items():
                by_layer.setdefault(r.layer, []).append((g, r, by_input))
            for layer, edges in mine.items():
                mlp_in.setdefault(layer, []).append((g, edges))
        z_new: dict[tuple[int, HeadRef], Tensor] = {}
        for layer, items in sorted(by_layer.items()):
            z_new.update(self._receiver_outputs(prefix, layer, clean, clean.writes, clean.masks, items))
        if not z_new and not mlp_in:
            return clean.final.repeat(len(sets), 1, 1), 0
        column = self._first_change(sets, clean.masks, chunk) if clean.keys is not None else 0
        b = prefix.batch_size
        by_hook: dict[int, dict[str, list[tuple[slice, Any, Tensor]]]] = {}  # per layer, per hook: its overwrites
        for (g, r), z in z_new.items():
            site = self.model.head_site(r)
            by_hook.setdefault(r.layer, {}).setdefault(site.hook, []).append(
                (slice(g * b, (g + 1) * b), site, z[:, column:]))
        for layer, items in mlp_in.items():  # an MLP reads its clean stream less its edges' writes
            hook = self.model.mixed_stream_hook(layer)
            x = clean.values[hook]
            for g, edges in items:
                s = _less(x, edges, clean.masks, clean.writes)
                by_hook.setdefault(layer, {}).setdefault(hook, []).append(
                    (slice(g * b, (g + 1) * b), InputSite(hook, 0, s.shape[-1]), s[:, column:]))
        tap, x = clean.keys.tap(min(by_hook), column, len(sets)) if column and clean.keys is not None else (None, None)
        final = edge_replay(self.model, prefix, min(by_hook), max(by_hook) + 1,
                            lambda layer: [(n, overwrite(e)) for n, e in by_hook.get(layer, {}).items()],
                            len(sets), x, tap)
        return final, column

    def _read(self, chunk: Chunk, b: int, clean: _Clean, sets: list[list[Edge]],
              final: Float[Tensor, "copies_batch pos d_model"], column: int) -> list[Tensor]:
        """Each set's read log-probs from its copy of the final stream (from ``column`` on), its direct edges'
        writes taken out there."""
        rows, pos, inverse = chunk.reads
        rows, pos = rows.to(final.device), pos.to(final.device)
        sels = []
        for g, es in enumerate(sets):
            sel = final[rows + g * b, pos - column]
            for e in es:
                if e.direct:
                    m = clean.masks[e.positions][rows, pos][:, None].to(sel.dtype)
                    sel = sel - m * clean.writes[e.sender][rows, pos].to(sel.dtype)
            sels.append(sel)
        n_at = rows.shape[0]
        inverse = inverse.to(final.device)
        logp = head_logprobs(output_head(self.model), torch.cat(sels), chunk.read_tok.repeat(len(sets)),
                             torch.cat([inverse + g * n_at for g in range(len(sets))]))
        return list(logp.split(chunk.read_tok.shape[0]))

    @staticmethod
    def _first_change(sets: list[list[Edge]], masks: dict[str, Tensor], chunk: Chunk) -> int:
        """The first position (column) at which a receiver of ``sets`` can read a patched stream: the stream is clean
        before it in every row (attention only looks back), so the replay may start there (never after a read)."""
        first = int(chunk.read_pos.min())
        for es in sets:
            for e in es:
                if not e.direct:
                    cols = masks[e.positions].any(dim=0).nonzero()
                    first = min(first, int(cols[0]) if len(cols) else first)
        return first

    # ---- public ---------------------------------------------------------------------------
    def adds_as_is(self) -> dict[int, bool]:
        """Per layer with heads: whether its block adds its mixer's output projection to the stream as is (one
        mixer, nothing in between), read off one clean replay of the probe rows."""
        every = set(self.model.heads())
        if any(h.layer not in self._as_is for h in every):
            self._clean_pass(self.probe, every, set(), min(h.layer for h in every))
        return dict(self._as_is)

    def clean(self) -> CandidateScores:
        """Scores of the intact model."""
        if self._clean is None:
            self._clean = self.prefixes.clean(self.plan)
        return self._clean

    @torch.no_grad()
    def run(self, sets: Sequence[Edge | Sequence[Edge]]) -> list[CandidateScores]:
        """Scores of the task with each element of ``sets`` (an edge, or edges removed together) removed."""
        groups = [[check_edge(self.model, e) for e in ([s] if isinstance(s, Edge) else list(s))] for s in sets]
        tables = [ScoreTable(self.plan) for _ in groups]
        # sets with a receiver replay the later blocks, stacked by the positions they patch (the decision alone: only
        # the later positions need replaying) and the layer their replay starts at, so that no copy replays blocks or
        # positions before its own receivers'; sets of direct edges only read the clean final stream
        def kind(g: int) -> int:
            heads = [e for e in groups[g] if not e.direct]
            return 2 if not heads else 0 if all(e.positions == "decision" for e in heads) else 1

        def start(g: int) -> int:
            return min((_receiver_layer(e) for e in groups[g] if not e.direct), default=self.model.n_layers)

        todo = sorted((g for g, es in enumerate(groups) if es), key=lambda g: (kind(g), start(g)))
        stacks: list[list[int]] = []
        for c in range(3):
            same = [g for g in todo if kind(g) == c]
            stacks += [same[k:k + self.stack] for k in range(0, len(same), self.stack)]
        every = [groups[g] for g in todo]
        for i, chunk in enumerate(self.chunks):
            cache: dict[int, _Clean] = {}
            for part in stacks:
                for g, logp in zip(part, self._run_chunk(i, [groups[g] for g in part], every, cache)):
                    tables[g].add(chunk, logp)
        clean = self.clean() if len(todo) < len(groups) else None
        return [tables[g].result() if groups[g] else clean for g in range(len(groups))]  # type: ignore[misc]


@dataclass
class PathEffects(Result):
    """Effects of edges (or sets of edges) on a task's metric: ``effect = metric(intact) - metric(patched)``, with
    a paired bootstrap interval over samples. Saves to one ``path_effects`` JSON file (:meth:`save` / :meth:`load`,
    a folder's ``path_effects.json``), tabulates (:meth:`to_frame`) and displays itself (:class:`Result`).

    Attributes:
        metric: the metric's name (``logit_diff``, ``accuracy``, ``logprob``).
        baseline: per-sample results of the intact model; ``patched[i]`` those with ``sets[i]`` removed.
        sets: the edge sets, in the order measured.
    """

    metric: str
    baseline: Results
    sets: list[list[Edge]]
    patched: list[Results]
    level: float = 0.95
    _ci: list[tuple[float, float]] = field(default_factory=list, repr=False)

    FORMAT = EFFECTS_FORMAT
    FILE = PATH_EFFECTS_JSON

    def effects(self) -> list[float]:
        """``metric(intact) - metric(patched)`` of each set."""
        m = get_metric(self.metric)
        return [m.value(self.baseline) - m.value(p) for p in self.patched]

    def intervals(self, n_boot: int = N_BOOTSTRAP) -> list[tuple[float, float]]:
        """Paired bootstrap interval (fixed seed) of each set's effect at :attr:`level`."""
        n_boot = check_n_boot(n_boot)
        if self._ci:
            return self._ci
        check_level(self.level)
        m = get_metric(self.metric)
        n = len(next(iter(self.baseline.values())))
        idx = paired_bootstrap(n, n_boot)
        base = m.resampled(self.baseline, idx).double()
        self._ci = [interval(base - m.resampled(p, idx).double(), self.level) for p in self.patched]
        return self._ci

    def to_frame(self) -> pd.DataFrame:
        """One row per set: ``edge`` (names joined by ``" + "``), ``sender``, ``receiver`` (``logits`` for a direct
        edge), ``input``, ``positions`` (those of the set's first edge), ``effect``, ``low``, ``high``."""
        rows = []
        for es, eff, (lo, hi) in zip(self.sets, self.effects(), self.intervals()):
            e = es[0] if es else None
            rows.append({"edge": " + ".join(x.name for x in es),
                         "sender": e.sender if e else "",
                         "receiver": e.receiver if e else "",
                         "input": e.input if e else "", "positions": e.positions if e else "",
                         "effect": eff, "low": lo, "high": hi})
        return pd.DataFrame(rows, columns=["edge", "sender", "receiver", "input", "positions", "effect", "low", "high"])

    def records(self) -> list[dict[str, Any]]:
        """:meth:`to_frame` as JSON-able rows (with each set's edges)."""
        out = []
        for es, row in zip(self.sets, self.to_frame().to_dict("records")):
            out.append({**row, "edges": [e.to_dict() for e in es],
                        **{k: (None if isinstance(row[k], float) and not math.isfinite(row[k]) else float(row[k]))
                           for k in ("effect", "low", "high")}})
        return out

    # ---- persistence -------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The metric, the interval level, the intact model's per-sample results and, per edge set, its edges
        (``sender``, ``receiver`` or null for a direct edge, ``input``, ``positions``) and its per-sample results,
        as JSON-able data (:meth:`from_dict` reads it back)."""
        return {"metric": self.metric, "level": self.level, "baseline": results_to_json(self.baseline),
                "sets": [{"edges": [_edge_to_dict(e) for e in es], "results": results_to_json(r)}
                         for es, r in zip(self.sets, self.patched)]}

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str = "path effects") -> "PathEffects":
        """The effects :meth:`to_dict` described; :class:`InputError` (naming ``where``) for a malformed body."""
        try:
            metric = get_metric(str(d["metric"])).name
            if not isinstance(d["sets"], list):
                raise TypeError(f"sets must be a list, got {type(d['sets']).__name__}")
            sets = [[Edge(e["sender"], e["receiver"], e["input"], e["positions"]) for e in s["edges"]]
                    for s in d["sets"]]
            patched = [_per_sample(s["results"], metric) for s in d["sets"]]
            out = cls(metric, _per_sample(d["baseline"], metric), sets, patched, check_level(d["level"]))
        except (KeyError, TypeError, ValueError) as e:  # OptionError, HeadError are ValueErrors
            raise InputError(f"{where}: not a path-effects document ({type(e).__name__}: {str(e)[:120]})") from None
        n = {len(v) for r in (out.baseline, *out.patched) for v in r.values()}
        if len(n) != 1 or 0 in n:
            raise InputError(f"{where}: per-sample lists differ in length or hold no sample ({sorted(n)})")
        return out

    # ---- display -----------------------------------------------------------------------------------
    def _repr_title(self) -> tuple[str, str]:
        n = len(next(iter(self.baseline.values()), []))
        return (f"Path effects on {self.metric}",
                f"{len(self.sets)} edge sets, {n} samples, {self.level:.0%} paired bootstrap intervals")

    def _repr_facts(self) -> list[tuple[str, Any]]:
        return [(f"{self.metric}, intact", fmt(get_metric(self.metric).value(self.baseline)))]


def _per_sample(d: Any, metric: str) -> Results:
    """Per-sample results read back from JSON: lists of the known kinds (booleans for ``correct``), holding what
    ``metric`` reads; :class:`InputError` otherwise."""
    from gna_interp.engine.metrics import RESULT_DTYPES
    from gna_interp.schemas import METRIC_KEYS

    lists = isinstance(d, dict) and all(k in RESULT_DTYPES and isinstance(v, list) for k, v in d.items())
    booleans = lists and all(isinstance(x, bool) for x in d.get("correct", []))
    if not booleans or not set(METRIC_KEYS[metric]) <= set(d):
        raise InputError(f"per-sample results must be lists ({', '.join(RESULT_DTYPES)}; correct of booleans) "
                         f"holding {', '.join(METRIC_KEYS[metric])} for the metric {metric}, got {str(d):.60}")
    return results_from_json(d)


def _edge_to_dict(e: Edge) -> dict[str, Any]:
    return {"sender": e.sender, "receiver": None if e.direct else e.receiver, "input": e.input,
            "positions": e.positions}


@options
class PathOptions(Options):
    """How :func:`path_effects` measures.

    Attributes:
        metric: the metric whose drop is the effect (``logit_diff``, ``accuracy``, ``logprob``).
        method, reference: the sender's write removed as under ``zero`` or ``mean`` ablation (and the mean's prompts).
        batch_size: prompts per forward.
    """

    metric: str = "logit_diff"
    method: AblationMethod = "zero"
    reference: Any = None
    batch_size: int = 16

    def validate(self) -> None:
        get_metric(self.metric)
        check_int("batch_size", self.batch_size, 1)


def path_effects(model: Model, task: Task, sets: Sequence[Edge | Sequence[Edge]], config: PathOptions | None = None,
                 *, patcher: PathPatcher | None = None, **overrides: Any) -> PathEffects:
    """Effect on the metric of removing each element of ``sets`` (an :class:`Edge` or edges together); ``config``: a
    :class:`PathOptions` or keyword overrides of its fields (``metric``, ``method``, ``reference``, ``batch_size``).

    Example: ``path_effects(m, task, [Edge("L16H2", "L18H6", "k", "summary")])``.
    Pass ``patcher`` to reuse one :class:`PathPatcher`'s clean prefixes across calls."""
    from gna_interp.models.model import check_model
    check_model(model)
    cfg = PathOptions.build(config, **overrides)
    metric = cfg.metric
    pp = patcher or PathPatcher(model, task, cfg.method, cfg.reference, cfg.batch_size)
    if isinstance(sets, Edge):  # one edge: one set
        sets = [sets]
    if not isinstance(sets, Sequence) or isinstance(sets, str):
        raise InputError(f"sets must be a list of edges or of lists of edges, got {type(sets).__name__}")
    groups = [[s] if isinstance(s, Edge) else list(s) for s in sets]
    scored = pp.run(groups)
    return PathEffects(str(metric), results(pp.clean()), [[check_edge(model, e) for e in es] for es in groups],
                       [results(s) for s in scored])
