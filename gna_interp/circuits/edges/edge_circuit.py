"""Edge circuits: a task's scores when only a chosen set of edges of the model's whole graph carries the model's
activations, every other edge carrying its sender's ablated value -- the faithfulness of a circuit of edges.

**The graph** (the nodes of :mod:`gna_interp.circuits.edges.edge_screen`). Senders: the embeddings (``embed``), every
head, every MLP (``MLP{l}``). Receiver inputs: each head's ``q``/``k``/``v``/``other``
(:meth:`~gna_interp.models.mixer.MixerAdapter.receiver_inputs`), where channels that several heads share are one
input read by all of them (a grouped-query KV group's ``k``/``v``, a Mamba-2 group's ``B``/``C``; named by its heads,
``L5H0+L5H1+L5H2.k``), every MLP's input (``MLP{l}``) and the answer ``logits``. An edge (:class:`~gna_interp.models.graph.Edge`) joins a
sender to a later receiver input at one class of positions: ``items`` (the tokens of the lines or options),
``decision`` (the last prompt token and the answer tokens), ``other`` (every other token); the three partition the
tokens. Edges into the logits are read at the decision (positions ``all``).

**Definition** (the circuit evaluation of ACDC and of the MIB benchmark, with mean or zero ablation). A sender
``S`` writes ``w_S`` into the residual stream in the run being made (a head ``z_S W_O[:, S]ᵀ``, an MLP its output,
the embeddings the first block's input) and ``w̄_S`` when ablated (the head's mean or zero replacement through
``W_O``; an MLP's or the embeddings' mean over the reference prompts' real tokens, or zero). With circuit ``C``, the
receiver input ``r`` reads at position ``p`` of class ``c`` ::

    x_r[p] = Σ_S ( w_S[p] if (S -> r @ c) ∈ C else w̄_S[p] )  (+ the biases, which every reader keeps)

i.e. ``B + Σ_{(S -> r @ c) ∈ C} (w_S - w̄_S)`` with ``B`` the stream with every sender ablated. Every node computes
its output from its own inputs so read, so a change flows on through every later edge the circuit keeps. All edges
kept is the intact model; no edge kept, the model with every head, MLP and the embeddings ablated.

How it runs: block by block from the clean prefix (:mod:`gna_interp.engine.replay`). For block ``l``: one run of the
block on stacked copies of the distinct receiver streams, stopped once the input projections have fired, gives
each receiver input its channels (receiver inputs that read the same senders at the same positions read the same
stream and share a copy: leaving one edge out runs two copies at its receiver's layer and one elsewhere); one run of
the block on the current stream overwrites them, records the heads' outputs and gives the MLP its own input at the
stream before it (``hook_resid_mid``, which feeds the MLP's norm and not the residual sum). Once every receiver input
still to be read keeps every edge into it (leaving one edge out: every block after its receiver's), each reads the
run's own stream, and the remaining blocks run as the model's own forward.

**Blocks that normalise or scale what they add** (Gemma-2/3 and OLMo-2 post-norms, Granite's residual
multiplier). Such a block adds ``f(y)`` of its mixers' summed output ``y = Σ_h o_h`` and ``g(m)`` of its MLP's
output ``m``. Receiver input ``r`` reads from it ``f(Σ_h o_h^r)``, ``o_h^r`` head ``h``'s output where ``h -> r``
is kept at the position's class and ``ō_h`` where not -- f of the receiver's own combination, not a sum of per-head
writes. A multiplier is linear (``f(y) = s·y``): the writes ``w_S = s·o_S`` add up as above. A norm is not: with
``ȳ`` the mixers' output with every head ablated (``B`` holds ``f(ȳ)``), the block adds to ``r``'s stream
``D_P = f(ȳ + Σ_h (P_h · m) ⊙ (o_h - ō_h)) - f(ȳ)``, ``P`` the input's keep-pattern over the block's heads; many
inputs share a pattern (every head kept, or none, which adds nothing), and f runs once per distinct pattern of each
block and batch. An MLP is one sender: ``w_S = g(m)``, ``w̄_S = g(m̄)`` with ``m̄`` its mean or zero output. The maps
are the bridge's (its ``ln1_post`` / ``ln2_post`` norms, its ``residual_contribution_scale``), checked against what
every block adds on two rows of the first batch (:attr:`~gna_interp.engine.replay.PlanRunner.probe`); a block they
do not reproduce (mixers side by side, each with its own multiplier, as in Falcon-H1) is refused with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Collection, Sequence

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from gna_interp.circuits.edges.block_io import (PostMap, direct_reads, edge_replay, input_channels, overwrite, post_maps,
                                                reproduces)
from gna_interp.circuits.edges.paths import PathPatcher, linear_write
from gna_interp.circuits.edges.whole_circuit import WholeEdge
from gna_interp.engine.unembed import head_logprobs, output_head
from gna_interp.engine.replay import KeyTap, KeyValues
from gna_interp.errors import InputError, UnsupportedArchitectureError
from gna_interp.interventions.ablation import AblationMethod, flat_channels
from gna_interp.models.graph import (CLASSES, EMBED, LOGITS, Edge, Node, ReceiverInput, mlp_name, node_kind,
                                     read_order, receiver_inputs, receiver_nodes, sender_names, write_order)
from gna_interp.models.heads import HeadRef
from gna_interp.models.mixer import HeadSite, InputSite
from gna_interp.models.model import Model
from gna_interp.tasks.base import Task
from gna_interp.engine.forward import ScoreTable
from gna_interp.engine.layout import Chunk
from gna_interp.engine.plan import CandidateScores

__all__ = ["EdgeCircuit", "whole_circuit"]

SCOPES: tuple[str, ...] = ("heads", "all")
SUPPORTED = "edge_circuit.refusal"  # Model.facts key: why edge circuits cannot run on the model ("" where they can)
POSTS = "edge_circuit.posts"  # Model.facts key: each block's checked maps from its mixers' and MLP's outputs
SPARE = 6  # finished passes' sender rows kept for the next pass, one block per shape (_Rows.give_back)
FEW = 0.25  # a stream sum copies the rows of the senders it reads where they are fewer than this share of them


def _stream_key(keep: Tensor | None, filled: int) -> bytes:
    """What a receiver input's stream depends on at its layer: which of the first ``filled`` senders (those that
    have written) reach it at which position classes; receivers with equal keys read equal streams (no kept
    edge: ``base``; every edge kept: the run's own stream)."""
    return b"" if keep is None else b"k" + keep[:filled].to(torch.bool).numpy().tobytes()


class EdgeCircuit:
    """Scores of a task with only sets of edges (:class:`~gna_interp.models.graph.Edge`) kept (the rest ablated):
    :meth:`run`.

    ``method``: ``mean`` (the senders' mean over ``reference``'s prompts, default the task) or ``zero``; ``task``
    may be a :class:`~gna_interp.circuits.edges.paths.PathPatcher` of the task (its batches, clean prefixes,
    method, reference and replacements are used).
    ``senders``: ``heads`` (default) -- a circuit is a set of edges out of heads, and the edges out of the
    embeddings and the MLPs always carry their activations, as in the node form of faithfulness, which keeps them --
    or ``all`` (every edge may be left out: with mean ablation every position class and the embeddings then matter
    at once, and small circuits keep little)."""

    def __init__(self, model: Model, task: Task | PathPatcher, method: AblationMethod = "mean", reference: Any = None,
                 batch_size: int = 8, senders: str = "heads") -> None:
        from gna_interp.models.model import check_model

        check_model(model)
        if senders not in SCOPES:
            raise InputError(f"senders must be one of {SCOPES} (which edges a circuit may leave out), got {senders!r}")
        if method not in ("zero", "mean"):
            raise InputError(f"an edge circuit ablates the edges outside it by 'zero' or 'mean', got {method!r}")
        if isinstance(task, PathPatcher):  # a patcher of the same task handed in: its prefixes and replacements
            if task.model is not model:
                raise InputError(f"this PathPatcher was made for {task.model.name}, not for {model.name}")
            method, reference = task.method, task.reference
        elif method == "mean" and reference is None:
            reference = task
        self.model, self.method = model, method
        try:
            self.pp = task if isinstance(task, PathPatcher) else PathPatcher(model, task, method, reference, batch_size)
            self.heads = model.heads()
            self.posts = self._check_blocks()
            self.inputs = [i for i in receiver_inputs(model, shared=True, strict=True) if i.heads]
        except UnsupportedArchitectureError as e:
            model.facts[SUPPORTED] = str(e)
            raise
        model.facts[SUPPORTED] = ""
        self._input_of = {(h.name, i.input): i.name for i in self.inputs for h in i.heads}
        self.senders = sender_names(model)
        self._index = {s: i for i, s in enumerate(self.senders)}
        self.scope = senders
        self._fixed = [] if senders == "all" else [i for i, n in enumerate(self.senders) if node_kind(n) != "head"]
        self.repl = {r.site.head: r for r in self.pp.replaced(self.heads)}
        self._reference, self._kept_means = reference, None  # the stream means, computed when first read
        self._bars: dict[str, Tensor] = {}
        self._out_weights: dict[int, Tensor | None] = {}  # per layer: its heads' output weights stacked
        self._spare: dict[tuple[int, ...], Tensor] = {}  # a finished pass's rows, by shape, for the next pass
        self._scratch = _Scratch()  # the passes' gathers, products and stream sums, one block each
        self._layout()

    @staticmethod
    def refusal(model: Model) -> str | None:
        """Why edge circuits cannot run on ``model``'s blocks (``""`` where they can), as the first
        :class:`EdgeCircuit` made for it learnt; None before one was made."""
        return model.facts.get(SUPPORTED)

    # ---- the graph ------------------------------------------------------------------------
    def _layout(self) -> None:
        """Per layer: its heads (and their sites), its heads' receiver inputs, its MLP's hooks; per block that
        normalises its mixers' output (f has a norm): its output projections (``_projections``) and the receiver inputs
        that read after it (``_after``, whose keys are those blocks); ``_summed``: which senders' rows a stream sums
        (all but the heads of such blocks and the senders every circuit keeps, whose writes are in every pass's ``B``
        already; None where that is every sender)."""
        model = self.model
        self._sites = {h: model.head_site(h) for h in self.heads}
        self._mlp_hooks = {l: (model.mixed_stream_hook(l), model.mlp_hook(l, "out")) for l in range(model.n_layers)
                           if model.mlp_hook(l, "out")}
        self._layer_heads: dict[int, list[HeadRef]] = {}
        self._inputs_at: dict[int, list[ReceiverInput]] = {}
        for h in self.heads:
            self._layer_heads.setdefault(h.layer, []).append(h)
        for i in self.inputs:
            self._inputs_at.setdefault(i.layer, []).append(i)
        self._direct = direct_reads(model, self.pp.probe,
                                    {l: {x.hook for i in inputs for x in i.sites} for l, inputs in self._inputs_at.items()})
        normed = [l for l in self._layer_heads if self.posts[l][0].norm is not None]
        self._projections = {l: _projections(model, l) for l in normed}
        self._after = {l: [r for r in self.receivers() if self._reads_at[r] > l] for l in normed}
        fixed = set(self._fixed)
        summed = [0.0 if i in fixed or (node_kind(s) == "head" and Node.parse(s).layer in self._after) else 1.0
                  for i, s in enumerate(self.senders)]
        self._summed = None if min(summed) == 1.0 else torch.tensor(summed, device=model.device)
        # the senders a pass never writes a row for (its write is in B or in a block's table): the ones no stream sums
        self._unwritten = torch.tensor([i for i, v in enumerate(summed) if v == 0.0], dtype=torch.long,
                                       device=model.device)

    def _check_blocks(self) -> dict[int, tuple[PostMap, PostMap]]:
        """Per block, its maps from its mixers' summed output and from its MLP's output to the stream
        (:func:`post_maps`), each checked on the runner's probe rows against what the block adds: ``f(y)`` against
        ``hook_resid_mid - hook_resid_pre``, ``g(m)`` against ``hook_resid_post - hook_resid_mid``. A block they do not
        reproduce, or whose MLP reads its mixers' output with no hook between them, is refused with the reason.
        Checked once per model (the maps are kept in ``Model.facts``)."""
        model = self.model
        if POSTS in model.facts:
            return model.facts[POSTS]
        for layer in range(model.n_layers):
            if model.mlp_hook(layer, "out") and model.mixed_stream_hook(layer) == model.block_output_hook(layer):
                raise UnsupportedArchitectureError(
                    f"an edge circuit gives each MLP its own input at the stream before it, but block {layer} of "
                    f"{model.name} has no hook there (its MLP reads the block's input): the MLP input cannot be "
                    f"separated from the mixer's")
        mixers = {h.layer: [model.io_hook(p, "out") for p in _projections(model, h.layer)] for h in self.heads}
        names = {n for hooks in mixers.values() for n in hooks}
        for layer in range(model.n_layers):
            names |= {model.block_input_hook(layer), model.mixed_stream_hook(layer), model.block_output_hook(layer),
                      model.mlp_hook(layer, "out") or model.block_output_hook(layer)}
        batch = self.pp.probe_batch
        _, cache = model.run_with_cache(batch, names_filter=lambda n: n in names)
        real = batch.attention_mask.bool().to(model.device)
        maps = {layer: post_maps(model, layer) for layer in range(model.n_layers)}
        for layer, (f, g) in maps.items():
            pre, mid = cache[model.block_input_hook(layer)], cache[model.mixed_stream_hook(layer)]
            out, mlp = cache[model.block_output_hook(layer)], model.mlp_hook(layer, "out")
            parts = [("mixers'", f, sum(cache[n] for n in mixers[layer]), mid - pre)] if layer in mixers else []
            parts += [("MLP's", g, cache[mlp], out - mid)] if mlp else []
            for what, fn, y, added in parts:
                if not reproduces(fn(y)[real], added[real], model.dtype):
                    raise UnsupportedArchitectureError(
                        f"an edge circuit reads how block {layer} of {model.name} adds its {what} output to the "
                        f"stream -- as is, through the norm after it or times the block's residual multiplier -- but "
                        f"none of these reproduces what it adds (mixers side by side, each under its own "
                        f"multiplier?); use the node form (gna.faithfulness) or path patching")
        model.facts[POSTS] = maps
        return maps

    def receivers(self) -> list[str]:
        """Every receiver input's name, in layer order (MLP inputs after their block's heads, the logits last)."""
        if not hasattr(self, "_receivers"):
            names = [(i.layer, 0, i.name) for i in self.inputs]
            names += [(layer, 1, mlp_name(layer)) for layer in range(self.model.n_layers)
                      if self.model.mlp_hook(layer, "in")]
            self._receivers = [n for _, _, n in sorted(names)] + [LOGITS]
            self._reads_at = {r: self._receiver_layer(r) for r in self._receivers}
            self._writes_at = {s: write_order(s) for s in self.senders}
        return list(self._receivers)

    def _receiver_layer(self, receiver: str) -> float:
        return read_order(receiver, self.model.n_layers)

    def wires(self) -> list[Edge]:
        """Every edge of the graph: each sender -> each later receiver input, at each position class."""
        out = []
        for r in self.receivers():
            rl = self._reads_at[r]
            nodes, inp = receiver_nodes(r)
            receiver = "+".join(nodes)
            for s in self.senders:
                if self._writes_at[s] < rl and self._index[s] not in self._fixed:
                    out += [Edge.made(s, receiver, inp, "all")] if r == LOGITS else \
                        [Edge.made(s, receiver, inp, c) for c in CLASSES]
        return out

    def check(self, wire: Edge) -> Edge:
        """``wire`` if it is an edge of this model's graph, else :class:`InputError` saying why."""
        if not isinstance(wire, Edge):
            raise InputError(f"an edge circuit is a collection of Edge(sender, receiver, input, positions), got "
                             f"{type(wire).__name__}")
        if wire.sender not in self._index:
            raise InputError(f"unknown sender {wire.sender!r} in {wire.name}; senders are 'embed', head names and "
                             f"'MLP<layer>'")
        if self._index[wire.sender] in self._fixed:
            raise InputError(f"{wire.name}: with senders={self.scope!r} the edges out of the embeddings and the MLPs "
                             f"are always kept; EdgeCircuit(..., senders='all') lets a circuit leave them out")
        self.receivers()
        if wire.reads not in self._reads_at:
            raise InputError(f"unknown receiver input {wire.reads!r} in {wire.name}; e.g. "
                             f"{', '.join(self.receivers()[:3])} (EdgeCircuit.receivers() lists them)")
        want = ("all",) if wire.direct else CLASSES
        if wire.positions not in want:
            raise InputError(f"{wire.name}: positions must be one of {want}")
        if self._writes_at[wire.sender] >= self._reads_at[wire.reads]:
            raise InputError(f"{wire.name}: the sender must write before the receiver reads")
        return wire

    def from_screen(self, table: pd.DataFrame) -> pd.DataFrame:
        """The screened edges (:class:`~gna_interp.circuits.edges.edge_screen.EdgeScreen` rows) as wires with their
        scores (``wire``, ``sender``, ``receiver``, ``positions``, ``score``), largest ``|score|`` first (an edge
        whose first-order estimate is negative can still be one the circuit needs once the rest is ablated: ordered
        by ``|score|``, the zoo Mamba-2's smallest edge circuit is 58 edges, by signed score the whole graph); the
        rows of the heads that share an input (a KV group) add up, as the gradient through a shared input is the sum
        over its readers."""
        unknown = sorted(set(table["sender"]) - set(self._index))
        if unknown:
            raise InputError(f"the edge table names senders {', '.join(unknown[:3])} that {self.model.name} does not "
                             f"have (a screen of another model?)")
        fixed = {self.senders[i] for i in self._fixed}
        t = table[~table["sender"].isin(fixed)]
        direct, mlp = (t["receiver"] == LOGITS).to_numpy(), (t["input"] == "mlp").to_numpy()
        shared = {f"{h}.{inp}": name for (h, inp), name in self._input_of.items()}
        head_reads = (t["receiver"] + "." + t["input"].astype(str)).map(shared)
        reads = np.where(direct, LOGITS, np.where(mlp, t["receiver"], head_reads))
        self.receivers()
        bad = np.flatnonzero(~pd.Series(reads).isin(list(self._reads_at)).to_numpy())
        if len(bad):
            row = t.iloc[bad[0]]
            raise InputError(f"the edge table's row {row['sender']} -> {row['receiver']}.{row['input']} reads an input "
                             f"{self.model.name} does not have (a screen of another model?)")
        df = pd.DataFrame({"sender": t["sender"].to_numpy(), "receiver": reads,
                           "positions": np.where(direct, "all", t["positions"]), "score": t["score"].astype(float)})
        df = df.groupby(["sender", "receiver", "positions"], as_index=False, sort=False)["score"].sum()
        late = df["sender"].map(self._writes_at) >= df["receiver"].map(self._reads_at)
        if late.any():
            row = df[late].iloc[0]
            raise InputError(f"the edge table's row {row['sender']} -> {row['receiver']}: the sender must write before "
                             f"the receiver reads")
        parts = {r: receiver_nodes(r) for r in df["receiver"].unique()}
        df["wire"] = [Edge.made(s, "+".join(parts[r][0]), parts[r][1], p)
                      for s, r, p in zip(df["sender"], df["receiver"], df["positions"])]
        order = df["score"].abs().sort_values(ascending=False, kind="stable").index
        return df.loc[order].reset_index(drop=True)

    # ---- running --------------------------------------------------------------------------
    @property
    def _means(self) -> dict[str, Tensor]:
        """The embeddings' and MLPs' mean outputs (:meth:`_stream_means`; none for ``zero``), computed when a pass
        first reads them: a screen that verifies nothing never runs their forward."""
        if self._kept_means is None:
            self._kept_means = self._stream_means(self._reference) if self.method == "mean" else {}
        return self._kept_means

    def _stream_means(self, reference: Any) -> dict[str, Tensor]:
        """The embeddings' and every MLP's mean output over the reference prompts' real tokens
        (:meth:`~gna_interp.models.model.Model.mean_activations`: the screen and the edge curve of one run share
        them)."""
        model = self.model
        names = {EMBED: model.block_input_hook(0)}
        names.update({mlp_name(l): model.mlp_hook(l, "out") for l in range(model.n_layers) if model.mlp_hook(l, "out")})
        means = model.mean_activations(reference, list(names.values()))
        return {k: means[h] for k, h in names.items()}

    def _stacked(self, layer: int) -> Tensor | None:
        """Block ``layer``'s heads' columns of their output projections, stacked (``[heads, width, d_model]``), or
        None where its heads have channels of different widths."""
        if layer not in self._out_weights:
            heads = self._layer_heads[layer]
            widths = {self._sites[h].stop - self._sites[h].start for h in heads}
            self._out_weights[layer] = None if len(widths) != 1 else torch.stack(
                [self.model.output_projection(h)[:, self._sites[h].columns].T for h in heads])
        return self._out_weights[layer]

    def _deltas(self, layer: int, zs: dict[HeadRef, Tensor]) -> Float[Tensor, "heads flat width"]:
        """Each head of block ``layer``'s ``z - z̄``, flat over batch and position, in the stacked weights' dtype."""
        heads = self._layer_heads[layer]
        w = self._stacked(layer)
        b, p = zs[heads[0]].shape[:2]
        return torch.stack([zs[h] - self.repl[h].like(zs[h]) for h in heads]).to(w.dtype).reshape(len(heads), b * p, -1)

    def _head_writes(self, layer: int, zs: dict[HeadRef, Tensor]) -> Float[Tensor, "heads batch pos d_model"]:
        """Each head of block ``layer``'s ``(z - z̄) W_O[:, S]ᵀ`` (:func:`~gna_interp.circuits.edges.paths.linear_write`),
        in one batched product where the block's heads have channels of one width (their weights stacked once)."""
        heads = self._layer_heads[layer]
        w = self._stacked(layer)
        if w is None:
            return torch.stack([linear_write(self.model, self.repl[h], zs[h]) for h in heads])
        b, p = zs[heads[0]].shape[:2]
        return torch.bmm(self._deltas(layer, zs), w).view(len(heads), b, p, -1)

    def _post(self, sender: str) -> PostMap:
        """The map from an MLP's output to the stream (its block's ``g``); the identity for the embeddings."""
        return PostMap() if sender == EMBED else self.posts[Node.parse(sender).layer][1]

    def _ablated(self, sender: str, like: Tensor) -> Tensor:
        """``w̄_S = g(ȳ)`` of an MLP or the embeddings: its block's map of its mean output (``mean``) or of zero."""
        if sender not in self._bars:
            y = self._means[sender] if self.method == "mean" else torch.zeros_like(like[0, 0], dtype=torch.float32)
            self._bars[sender] = self._post(sender)(y.to(like.device)).float()
        return self._bars[sender]

    def _removed(self, sender: str, y: Tensor) -> Tensor:
        """``w_S - w̄_S = g(y) - g(ȳ)`` of an MLP or the embeddings (``y`` its output in the run)."""
        return self._post(sender)(y) - self._ablated(sender, y)

    def _keep(self, kept: Collection[Edge]) -> dict[str, Tensor]:
        """Per receiver input: ``[senders, 3]`` (which position classes each sender reaches it at); the senders
        that are always kept reach every receiver."""
        keep: dict[str, Tensor] = {}
        if self._fixed:
            for r in self.receivers():
                keep[r] = torch.zeros(len(self.senders), len(CLASSES))
                keep[r][self._fixed] = 1.0
        for w in kept:
            self._mark(keep, w, 1.0)
        return keep

    def _mark(self, keep: dict[str, Tensor], wire: Edge, value: float) -> None:
        """Set ``wire`` (checked) to ``value`` (1: kept, 0: left out) in the keep map ``keep``, at its position
        class (every class for an edge into the logits); a receiver missing from ``keep`` starts with nothing kept."""
        self.check(wire)
        k = keep.setdefault(wire.reads, torch.zeros(len(self.senders), len(CLASSES)))
        k[self._index[wire.sender], slice(None) if wire.positions == "all" else CLASSES.index(wire.positions)] = value

    def chunk_logprobs(self, index: int, kept: Collection[Edge]) -> Float[Tensor, " n_reads"]:
        """Log-probabilities at the reads of batch ``index`` (``self.pp.chunks[index]``) with only ``kept``
        carrying activations."""
        return self._chunk(index, self._keep(kept))

    def _chunk(self, index: int, keep: dict[str, Tensor], start: "_Start | None" = None,
               record: "_Record | None" = None) -> Tensor:
        """Read log-probs of chunk ``index`` with only the kept wires carrying activations: block by block, each
        receiver input of the block from its own stream (:meth:`_Pass.inputs`), then the block itself
        (:meth:`_Pass.hooks`, :meth:`_Pass.moved`) through :func:`~gna_interp.circuits.edges.block_io.edge_replay`;
        from ``start`` (a recorded pass that agrees with ``keep`` before its layer and column), or from the first
        block, recording the pass into ``record`` where given. From the first block after which every
        receiver input reads the run's own stream (:meth:`_plain_from`) the rest is the model's own forward, run as is."""
        run = _Pass(self, index, keep, start, record)
        plain = self._plain_from(keep) if record is None else self.model.n_layers
        run.x = edge_replay(self.model, run.prefix, start.layer if start is not None else 0, plain, run.hooks,
                            hidden=run.x, keys=run.tap, moved=run.moved)
        if record is not None:
            record.states[self.model.n_layers] = (run.x, run.base, run.filled)
            assert all(part.split == 0 for part in run.buf)
            record.buf = run.buf
            record.kv = run.tap.kv if run.tap is not None and sorted(run.tap.kv) == list(range(self.model.n_layers)) \
                else None
        out = run.logprobs()
        if record is None and not torch.is_grad_enabled():  # a differentiated pass's rows stay its graph's
            for part in run.buf:
                part.give_back(self._spare)
        return out

    def _plain_from(self, keep: dict[str, Tensor]) -> int:
        """The first block from which every receiver input (the logits among them) keeps every edge into it
        (:meth:`_keep`'s map ``keep``): each reads the run's own stream, so no input is overwritten and no write need
        be recorded -- the blocks from there are the model's own forward (leaving one edge out: every block after
        its receiver's). ``n_layers`` where the logits read anything else."""
        self.receivers()
        if not hasattr(self, "_before"):  # per receiver input: how many senders (in write order) write before it
            writes = sorted(self._writes_at[s] for s in self.senders)
            self._before = {r: sum(w < self._reads_at[r] for w in writes) for r in self._receivers}
        partial = [self._reads_at[r] for r in self._receivers
                   if (k := keep.get(r)) is None or not bool(k[:self._before[r]].all())]
        last = max(partial, default=-1.0)
        return self.model.n_layers if last >= self.model.n_layers else int(last) + 1

    def _scores(self, keep: dict[str, Tensor]) -> CandidateScores:
        """Scores of the task over every chunk with ``keep`` (:meth:`_keep`)."""
        table = ScoreTable(self.pp.plan)
        for i, chunk in enumerate(self.pp.chunks):
            table.add(chunk, self._chunk(i, keep))
        return table.result()

    def _record(self, index: int) -> "_Record":
        """An empty record for a pass of chunk ``index`` (keys and values kept where its blocks continue a cache)."""
        return _Record(kv={} if KeyValues.supported(self.model, self.pp.prefixes.get(index)) else None)

    def _changed(self, reference: dict[str, Tensor], changes: Sequence[Collection[Edge]], keep: bool,
                 records: "list[_Record] | None" = None) -> list[CandidateScores]:
        """Scores with each of ``changes`` kept (``keep``) or left out on top of the circuit ``reference`` (a
        :meth:`_keep` map): per batch, one recorded pass of ``reference`` (``records``: those of a pass before,
        :meth:`run_recorded`), then each change from the first block whose inputs it touches (the blocks before read
        what the reference's read). Blocks that normalise their mixers' output keep patterns of their own per
        circuit, so there every change runs from the first block."""
        variants, starts = [], []
        for edges in changes:
            k = {r: reference[r].clone() for r in {w.reads for w in edges} if r in reference}
            k = {**reference, **k}  # the receivers a change touches get copies of their own
            for w in edges:
                self._mark(k, w, 1.0 if keep else 0.0)
            variants.append((k, {w.positions for w in edges}))
            starts.append(0 if self._after else min((int(self._reads_at[w.reads]) for w in edges),
                                                     default=self.model.n_layers))
        tables = [ScoreTable(self.pp.plan) for _ in variants]
        for i, chunk in enumerate(self.pp.chunks):
            rec = None if not any(starts) else records[i] if records is not None else self._record(i)
            if rec is not None and records is None:
                self._chunk(i, reference, record=rec)
            by_class = _classes(self.pp.masks(chunk)) if rec is not None and rec.kv is not None else None
            for table, (k, classes), first in zip(tables, variants, starts):
                start = _Start(first, rec, _column(chunk, by_class, classes)) if first and rec is not None else None
                table.add(chunk, self._chunk(i, k, start))
        return [t.result() for t in tables]

    @torch.no_grad()
    def run(self, sets: Sequence[Collection[Edge]]) -> list[CandidateScores]:
        """Scores of the task with only each element of ``sets`` (a collection of wires) kept."""
        if isinstance(sets, (Edge, str)) or not isinstance(sets, Sequence):
            raise InputError(f"sets must be a list of wire collections, got {type(sets).__name__}")
        return [self._scores(self._keep(kept)) for kept in sets]

    @torch.no_grad()
    def run_without(self, sets: Sequence[Collection[Edge]]) -> list[CandidateScores]:
        """Scores of the task with every edge kept except those of each element of ``sets``: the exact effect of
        leaving out one edge (or a few), any sender and receiver (an MLP's, the embeddings'). Each set runs from
        the first block that reads one of its edges, on the intact model's pass before it."""
        if isinstance(sets, (Edge, str)) or not isinstance(sets, Sequence):
            raise InputError(f"sets must be a list of wire collections, got {type(sets).__name__}")
        every = {r: torch.ones(len(self.senders), len(CLASSES)) for r in self.receivers()}
        return self._changed(every, sets, keep=False)

    @torch.no_grad()
    def run_recorded(self, kept: Collection[Edge]) -> "tuple[CandidateScores, list[_Record] | None]":
        """Scores of the task with only ``kept`` carrying activations (:meth:`run`), and each batch's pass recorded
        (None where changes run from the first block anyway): :meth:`run_left_out` of the same circuit starts its
        members from these instead of a pass of its own."""
        keep = self._keep(kept)
        if self._after:
            return self._scores(keep), None
        table, records = ScoreTable(self.pp.plan), []
        for i, chunk in enumerate(self.pp.chunks):
            records.append(self._record(i))
            records[-1].keep = keep
            table.add(chunk, self._chunk(i, keep, record=records[-1]))
        return table.result(), records

    @torch.no_grad()
    def run_left_out(self, circuit: Collection[Edge], members: Sequence[Edge],
                     records: "list[_Record] | None" = None) -> list[CandidateScores]:
        """Scores of the task with only ``circuit`` kept, less each of ``members`` in turn (its own contribution
        to the circuit), each run from the first block that reads the member, on the circuit's pass before it
        (``records``: the circuit's own from :meth:`run_recorded`, else one pass now; those of another circuit, or
        of another model's or task's batches, are refused)."""
        keep = self._keep(circuit)
        if records is not None and (len(records) != len(self.pp.chunks) or any(
                r.keep is None or r.keep.keys() != keep.keys() or any(not torch.equal(r.keep[k], v)
                                                                       for k, v in keep.items()) for r in records)):
            raise InputError("run_left_out's records are not this circuit's passes on these batches: pass the "
                             "records run_recorded returned for the same circuit, or none")
        return self._changed(keep, [[w] for w in members], keep=False, records=records)

    def clean(self) -> CandidateScores:
        """Scores of the intact model."""
        return self.pp.clean()


def _projections(model: Model, layer: int) -> list[str]:
    """The bridge paths of block ``layer``'s mixers' output projections (whose output comes before any post-norm or
    scale); :class:`UnsupportedArchitectureError` where the bridge has no hook on one of them."""
    out = []
    for spec in (s for s in model.layers if s.layer == layer and s.supported):
        name = model.mixer_output_hook(layer, spec.kind)
        if name is None:
            raise UnsupportedArchitectureError(
                f"an edge circuit reads what block {layer} of {model.name} adds off its {spec.kind} mixer's output, "
                f"but the bridge has no hook on that mixer's output projection ({spec.hf_class})")
        out.append(name.rsplit(".", 1)[0])
    return out


def _pattern(keep: Tensor | None, rows: list[int]) -> bytes | None:
    """A receiver input's keep-pattern over the senders ``rows`` (which of them reach it at which position class);
    None where it keeps none of them."""
    if keep is None:
        return None
    part = keep[rows].to(torch.bool)
    return part.numpy().tobytes() if bool(part.any()) else None


@dataclass
class _Table:
    """One block that normalises its mixers' summed output before adding it (``f``), per keep-pattern ``P`` over
    its heads (the senders ``rows``): what it adds to a stream beyond ``f(ȳ)``,
    ``D_P = f(ȳ + Σ_h (P_h · classes) ⊙ δ_h) - f(ȳ)`` (``ȳ``: its mixers' output with every head ablated,
    ``δ_h = o_h - ō_h``); ``every``: the pattern of every head kept."""

    rows: list[int]
    delta: dict[bytes, Tensor]
    every: bytes

    def term(self, keep: Tensor | None, full: bool) -> Tensor | None:
        """What the block adds to the stream of a receiver input that keeps ``keep``, beyond its part of the stream
        with every sender ablated (``D_P``) or, with ``full``, of the run's own stream (``D_P - D_every``); None
        for nothing."""
        key = _pattern(keep, self.rows)
        if full:
            return None if key == self.every else (0 if key is None else self.delta[key]) - self.delta[self.every]
        return None if key is None else self.delta[key]


@dataclass
class _Record:
    """One batch's pass under a circuit, recorded so that passes agreeing with it before some block start there:
    ``states[l]`` the run's stream, ``B`` and the senders filled before block ``l``; ``buf`` (per position class)
    every sender's ``w_S - w̄_S`` once the pass ends (a sender's row is written once, before any block reads it; a
    pass started from the record reads the rows before it from here and writes its own from there on); ``kv``
    each attention block's keys and values (``{}`` until the pass records them; None where the model's blocks do not
    continue a cache: :class:`~gna_interp.engine.replay.KeyValues`), so that a pass that agrees with it before some
    position runs only the positions from there; ``keep``: the circuit recorded (its :meth:`EdgeCircuit._keep` map),
    set by :meth:`EdgeCircuit.run_recorded`."""

    states: dict[int, tuple[Tensor, Tensor, int]] = field(default_factory=dict)
    buf: list["_Rows"] | None = None
    kv: dict[int, tuple[Tensor, Tensor]] | None = field(default_factory=dict)
    keep: dict[str, Tensor] | None = None


@dataclass(frozen=True)
class _Start:
    """Where a pass starts on a recorded one: block ``layer``, positions ``column..`` (the earlier positions, and
    every position before ``layer``, read what ``record`` read)."""

    layer: int
    record: _Record
    column: int = 0


def _column(chunk: Chunk, by_class: Float[Tensor, "classes batch pos"] | None, classes: set[str]) -> int:
    """The first position of ``chunk`` at which a change of edges at position ``classes`` can alter the pass (its
    first position of one of them, over the batch; never after the chunk's first read): before it every position
    reads what the recorded pass read. 0 where the record holds no keys and values to continue from (``by_class``,
    the chunk's positions by class, None), or where a change reaches every position (an edge into the logits)."""
    if by_class is None or "all" in classes:
        return 0
    hit = by_class[[CLASSES.index(c) for c in classes]].bool().any(dim=0).any(dim=0).nonzero()
    first = int(hit[0]) if len(hit) else 0
    reads = chunk.reads[1]
    return min(first, int(reads.min())) if len(reads) else first


def _grouped(classes: Float[Tensor, "classes batch pos"]) -> tuple[Tensor, list[int]]:
    """The positions (flat over batch and position) grouped by class: ``order``, class ``c``'s at
    ``order[bounds[c]:bounds[c + 1]]`` (ascending), then the positions of no class; a pass's ``buf[c]`` holds class
    ``c``'s rows, contiguous, so that one product per class sums every stream of a layer."""
    cls = torch.full(classes.shape[1:], len(CLASSES), dtype=torch.long, device=classes.device)
    for c in reversed(range(len(CLASSES))):
        cls[classes[c].bool()] = c
    order = torch.argsort(cls.flatten(), stable=True)
    return order, [0] + torch.bincount(cls.flatten(), minlength=len(CLASSES) + 1).cumsum(0).tolist()


def _classes(masks: dict[str, Tensor]) -> Float[Tensor, "classes batch pos"]:
    """A chunk's positions by class (:data:`CLASSES`, which partition them), from its masks (``items`` over
    ``decision``: a decision position inside an item counts as an item's)."""
    return torch.stack([masks["items"], masks["decision"] & ~masks["items"], masks["other"]]).float()


class _Rows:
    """The senders' ``w_S - w̄_S`` at one position class's positions, a row per sender: rows ``0..split`` read from
    a recorded pass (``shared``, never written: a pass started from a record writes only the senders after it),
    the rest this pass's own (``own``, zeros until written)."""

    def __init__(self, n: int, positions: int, d: int, device: Any, unwritten: Tensor, shared: Tensor | None = None,
                 split: int = 0, spare: dict[tuple[int, ...], Tensor] | None = None) -> None:
        self.shared, self.split = shared, split
        # every row is written before a product reads it, but those of ``unwritten`` (senders whose write is in ``B``
        # or in a block's table), which must read zero (a product's zero coefficient times garbage may be NaN); the
        # rows of a finished pass (``spare``, by shape) are taken over as they are: a fresh block's pages cost their
        # faults on every pass (gna_interp.allocator)
        full = (n, positions, d)
        whole = spare.pop(full, None) if spare is not None else None
        if whole is None or whole.device != torch.device(device):
            whole = torch.empty(full, dtype=torch.float32, device=device)
        self._whole, self.own = whole, whole[:n - split]
        self.own[unwritten[unwritten >= split] - split] = 0.0

    def give_back(self, spare: dict[tuple[int, ...], Tensor]) -> None:
        """Leave this pass's rows to the next pass (``spare``: one block of each shape, of the :data:`SPARE` shapes
        given back last -- a batch's three classes, of both batch sizes)."""
        spare.pop(tuple(self._whole.shape), None)
        spare[tuple(self._whole.shape)] = self._whole
        while len(spare) > SPARE:
            spare.pop(next(iter(spare)))

    def rows(self, first: int, count: int) -> Tensor:
        """The rows of the senders ``first .. first + count - 1`` (``[count, positions, d]``, contiguous), to be
        written in place."""
        assert first >= self.split, "a pass started from a record writes only the senders after it"
        return self.own[first - self.split:first - self.split + count]

    def put(self, row: int, value: Tensor) -> None:
        """Write sender ``row``'s values (``[positions, d]``)."""
        assert row >= self.split, "a pass started from a record writes only the senders after it"
        self.own[row - self.split] = value

    def put_rows(self, first: int, values: Tensor) -> None:
        """Write the values of the senders ``first, first + 1, ...`` (``[senders, positions, d]``)."""
        assert first >= self.split, "a pass started from a record writes only the senders after it"
        self.own[first - self.split:first - self.split + len(values)] = values

    def product(self, k: Float[Tensor, "streams n"], n: int, used: Tensor | None, scratch: "_Scratch"
                ) -> Float[Tensor, "streams flat"]:
        """``k @ rows[:n]`` flattened, or over the rows ``used`` alone (``k``'s columns still indexed by sender; their
        rows gathered into ``scratch``), into ``scratch``'s block for it (read it before the next product)."""
        split = min(self.split, n)
        if used is not None:
            mine = used >= split
            pieces = [(k[:, used[~mine]], self.shared, used[~mine]) if self.shared is not None and (~mine).any()
                      else None, (k[:, used[mine]], self.own, used[mine] - self.split) if mine.any() else None]
        else:
            pieces = [(k[:, :split], self.shared[:split], None) if split else None,
                      (k[:, split:n], self.own[:n - split], None) if n > split else None]
        kept = not torch.is_grad_enabled()  # a differentiated pass makes its own blocks
        out = None
        for coef, src, idx in (x for x in pieces if x is not None):
            rows = src if idx is None else torch.index_select(src, 0, idx) if not kept else torch.index_select(
                src, 0, idx, out=scratch.take("gather", (len(idx), *src.shape[1:]), src.device))
            rows = rows.reshape(rows.shape[0], -1)
            if out is None:
                out = torch.mm(coef, rows) if not kept else torch.mm(
                    coef, rows, out=scratch.take("product", (coef.shape[0], rows.shape[1]), rows.device))
            else:
                out = out + torch.mm(coef, rows) if not kept else out.addmm_(coef, rows)
        assert out is not None
        return out


class _Scratch:
    """Blocks of float32 memory lent by name (a gather of sender rows, a product, a sum of streams), each kept for
    the next use of that name: a block made afresh costs its page faults every time (:mod:`gna_interp.allocator`).
    A block's contents last until its name is taken again."""

    def __init__(self) -> None:
        self.blocks: dict[str, Tensor] = {}

    def take(self, name: str, shape: tuple[int, ...], device: Any) -> Tensor:
        """A ``shape`` view of block ``name`` (grown where too small)."""
        n = int(np.prod(shape))
        block = self.blocks.get(name)
        if block is None or block.numel() < n or block.device != torch.device(device):
            block = self.blocks[name] = torch.empty(n, dtype=torch.float32, device=device)
        return block[:n].view(shape)


class _Pass:
    """One chunk's forward under one circuit (``keep``: :meth:`EdgeCircuit._keep`), block by block. ``x``: the run's
    own stream (every edge kept); ``base``: the stream with every sender ablated but those every circuit keeps
    (``B``); ``buf[c]``: ``w_S - w̄_S`` at the positions of class ``c`` (:class:`_Rows`) of the senders that have
    written and add linearly (the first ``filled`` senders, in sender order; zero rows for the heads of a normalising
    block and for the senders in ``B``); ``tables``: the normalising blocks' :class:`_Table`. A pass started at a
    column (:class:`_Start`) holds the positions from there only (``column``), and its blocks read the earlier
    positions' keys and values from the record (``tap``); a pass that ``record``s keeps its blocks' own in ``tap``."""

    def __init__(self, ec: EdgeCircuit, index: int, keep: dict[str, Tensor], start: _Start | None = None,
                 record: _Record | None = None) -> None:
        self.ec, self.keep, self.tables, self.record = ec, keep, [], record
        self._ran: tuple[dict[HeadRef, Tensor], dict[str, Tensor], dict[str, Tensor]] = ({}, {}, {})
        self.chunk, self.prefix = ec.pp.chunks[index], ec.pp.prefixes.get(index)
        every = _classes(ec.pp.masks(self.chunk))
        self.column = start.column if start is not None else 0
        self.classes = every[:, :, self.column:]
        self.tap = KeyTap() if record is not None and record.kv is not None else None
        self.order, self.bounds = _grouped(self.classes)
        d = self.prefix.hidden(0).shape[-1]
        sizes = [hi - lo for lo, hi in zip(self.bounds, self.bounds[1:len(CLASSES) + 1])]
        if start is not None:  # where a recorded pass stood before block start.layer: its first rows shared
            x, base, self.filled = start.record.states[start.layer]
            self.x, self.base = x[:, self.column:], base[:, self.column:]
            assert start.record.buf is not None
            shared = [rec.own for rec in start.record.buf]
            if self.column:  # the record's rows at the positions from the column on, and its keys and values before
                assert start.record.kv is not None
                order, bounds = _grouped(every)
                width = every.shape[2]
                shared = [rows[:self.filled, (order[lo:hi] % width >= self.column).nonzero().flatten()]
                          for rows, lo, hi in zip(shared, bounds, bounds[1:])]
                self.tap = KeyTap({layer: (k[..., :self.column, :], v[..., :self.column, :])
                                   for layer, (k, v) in start.record.kv.items() if layer >= start.layer})
            self.buf = [_Rows(len(ec.senders), size, d, self.x.device, ec._unwritten, rows, self.filled, ec._spare)
                        for rows, size in zip(shared, sizes)]
            return
        self.x = self.prefix.hidden(0)
        self.buf = [_Rows(len(ec.senders), size, d, self.x.device, ec._unwritten, spare=ec._spare) for size in sizes]
        self.filled = 1
        if 0 in ec._fixed:  # kept by every circuit: part of B
            self.base = self.x
            return
        removed = ec._removed(EMBED, self.x)
        self._put(0, removed)
        self.base = self.x - removed.float().to(self.x.dtype)

    def _put(self, row: int, value: Tensor) -> None:
        """Write sender ``row``'s ``w_S - w̄_S`` (``[batch, pos, d]``) into ``buf``, each class's positions in turn."""
        flat = value.reshape(-1, value.shape[-1])
        for c, part in enumerate(self.buf):
            part.put(row, flat[self.order[self.bounds[c]:self.bounds[c + 1]]])

    def _put_rows(self, rows: list[int], values: Tensor) -> None:
        """Write the ``w_S - w̄_S`` of the senders ``rows`` (consecutive; ``values`` ``[senders, batch, pos, d]``)
        into ``buf``: one gather per class."""
        if rows != list(range(rows[0], rows[0] + len(rows))):
            for r, value in zip(rows, values):
                self._put(r, value)
            return
        flat = values.reshape(len(rows), -1, values.shape[-1])
        for c, part in enumerate(self.buf):
            part.put_rows(rows[0], flat[:, self.order[self.bounds[c]:self.bounds[c + 1]]])

    def stream(self, name: str, n: int, full: Tensor) -> Tensor:
        """Receiver input ``name``'s stream (:meth:`streams`)."""
        return self.streams([name], n, full)[0]

    def streams(self, names: Sequence[str], n: int, full: Tensor) -> list[Tensor]:
        """Each receiver input's stream of ``names`` from the first ``n`` senders and the tables so far:
        ``B + Σ_{kept} m_c ⊙ δ_S + Σ_blocks D_P``, or, where fewer linear senders are left out than kept,
        ``full - Σ_{left out} m_c ⊙ δ_S + Σ_blocks (D_P - D_every)`` (``full``: the stream as the run wrote it).
        The sums of all of them are one product per position class over ``buf``."""
        summed = self.ec._summed
        lin = None if summed is None else summed[:n, None]
        coefs, forms, summed = [], [], []
        for name in names:
            keep = self.keep.get(name)
            if keep is None:
                forms.append(None)
                continue
            k = keep[:n].to(self.classes.device, self.classes.dtype)
            kept = k if lin is None else k * lin
            left = 1 - k if lin is None else (1 - k) * lin
            n_kept, n_left = int(kept.any(dim=1).sum()), int(left.any(dim=1).sum())
            full_form = n_left < n_kept
            forms.append(full_form)
            if (n_left if full_form else n_kept):
                summed.append(len(forms) - 1)
                coefs.append(left if full_form else kept)
        sums = dict(zip(summed, self._sums(torch.stack(coefs)))) if coefs else {}
        out = []
        for j, (name, full_form) in enumerate(zip(names, forms)):
            if full_form is None:
                out.append(self.base)
                continue
            origin = full if full_form else self.base
            got = origin if j not in sums else (origin - sums[j].to(origin.dtype) if full_form
                                                else origin + sums[j].to(origin.dtype))
            for t in self.tables:
                term = t.term(self.keep[name], full_form)
                got = got if term is None else got + term.to(got.dtype)
            out.append(got)
        return out

    def _sums(self, k: Float[Tensor, "streams senders 3"]) -> Float[Tensor, "streams batch pos d"]:
        """``Σ_S (k[r, S] · classes) ⊙ buf[S]`` for each stream ``r``: per position class, one product of the
        streams' coefficients with the first ``n`` senders' rows of ``buf[c]`` (contiguous, read in place), or with a
        copy of the rows of the senders some stream reads where they are fewer than :data:`FEW` of them, scattered into
        the class's positions; the copy, the products and the sums are the circuit's kept blocks (:class:`_Scratch`),
        read before the next call."""
        r, n = k.shape[:2]
        b, p, d = self.x.shape
        used = k.any(dim=2).any(dim=0).nonzero().flatten()
        few = len(used) < n * FEW
        out = self.ec._scratch.take("sums", (r, b * p, d), self.x.device).zero_() if not torch.is_grad_enabled() \
            else torch.zeros(r, b * p, d, dtype=torch.float32, device=self.x.device)
        for c, part in enumerate(self.buf):
            lo, hi = self.bounds[c], self.bounds[c + 1]
            if hi > lo and bool(k[:, :, c].any()):
                got = part.product(k[:, :, c], n, used if few else None, self.ec._scratch)
                out.index_copy_(1, self.order[lo:hi], got.view(r, hi - lo, d))
        return out.view(r, b, p, d)

    def inputs(self, layer: int) -> dict[str, list[tuple[slice, InputSite, Tensor]]]:
        """Per input hook of block ``layer``, each receiver input's channels there computed from its own stream: one
        run of the block on the distinct streams stacked, stopped once the input projections have fired (receiver
        inputs with equal keys (:func:`_stream_key`) read one copy). Inputs that read the run's own stream are left
        to the block, which computes them from it."""
        ec = self.ec
        slot: dict[bytes, int] = {}
        where, names = {}, []
        for i in ec._inputs_at.get(layer, []):
            key = _stream_key(self.keep.get(i.name), self.filled)
            if key not in slot:
                slot[key] = len(names)
                names.append(i.name)
            where[i.name] = slot[key]
        streams = self.streams(names, self.filled, self.x)
        copies = [j for j, st in enumerate(streams) if st is not self.x]
        renumber = {j: n for n, j in enumerate(copies)}
        where = {name: renumber[j] for name, j in where.items() if j in renumber}
        streams = [streams[j] for j in copies]
        inputs = [i for i in ec._inputs_at.get(layer, []) if i.name in where]
        if not inputs:
            return {}
        wanted: list[list[InputSite]] = [[] for _ in streams]  # each copy's sites, the inputs reading it in turn
        for i in inputs:
            wanted[where[i.name]].extend(i.sites)
        channels = input_channels(ec.model, self.prefix, layer, streams, wanted, ec._direct.get(layer),
                                  keys=self.tap if self.column else None)
        put: dict[str, list[tuple[slice, InputSite, Tensor]]] = {}
        for sites, values in zip(wanted, channels):
            for site, value in zip(sites, values):
                put.setdefault(site.hook, []).append((slice(None), site, value))
        return put

    def hooks(self, layer: int) -> list[tuple[str, Any]]:
        """The hooks of block ``layer``'s run on ``x`` (recorded first into the pass's record, where it keeps one):
        its heads' input channels overwritten by each receiver input's own (:meth:`inputs`), its heads' and mixers'
        outputs recorded and its MLP reading its own stream at the stream before it (:meth:`mixed` moves past the
        mixers there)."""
        ec = self.ec
        if self.record is not None:
            self.record.states[layer] = (self.x, self.base, self.filled)
        zs: dict[HeadRef, Tensor] = {}
        ios: dict[str, Tensor] = {}
        got: dict[str, Tensor] = {}
        self._ran = (zs, ios, got)

        def mid(v: Tensor, hook: Any = None) -> Tensor:
            self.mixed(layer, v, zs, ios)
            return self.stream(mlp_name(layer), self.filled, v).to(v.dtype)

        def mlp_out(v: Tensor, hook: Any = None) -> Tensor:
            got["mlp"] = v.detach()
            return v

        fns = _recording({h: ec._sites[h] for h in ec._layer_heads.get(layer, [])}, zs, ios,
                         ec._projections.get(layer, []))
        fns += [(name, overwrite(entries)) for name, entries in self.inputs(layer).items()]
        if layer in ec._mlp_hooks:
            fns += list(zip(ec._mlp_hooks[layer], (mid, mlp_out)))
        return fns

    def moved(self, layer: int, y: Tensor) -> None:
        """Move past block ``layer`` (``y``: its output): past its MLP -- its ``w_S - w̄_S`` into ``buf``, its ``w̄_S``
        into ``B`` -- or, in a block without one, past its mixers (:meth:`mixed`)."""
        ec = self.ec
        zs, ios, got = self._ran
        if layer in ec._mlp_hooks:
            name, row = mlp_name(layer), ec._index[mlp_name(layer)]
            if row in ec._fixed:  # kept by every circuit: its whole write is part of B
                self.base = self.base + ec._post(name)(got["mlp"]).to(self.base.dtype)
            else:
                self._put(row, ec._removed(name, got["mlp"]))
                self.base = self.base + ec._ablated(name, got["mlp"]).to(self.base.dtype)
            self.filled = row + 1
        else:
            self.mixed(layer, y, zs, ios)
        self.x = y

    def mixed(self, layer: int, v: Tensor, zs: dict[HeadRef, Tensor], ios: dict[str, Tensor]) -> None:
        """Move past block ``layer``'s mixers (``v``: the run's stream once they have written; ``zs``: the heads'
        channels; ``ios``: its output projections' inputs and outputs where it normalises them). Where the block adds
        ``f(y) = s·y``: each head's ``δ_h = f(o_h - ō_h)`` into ``buf``, and ``B += f(ȳ) = (v - x) - Σ_h δ_h``;
        where f normalises: ``B += f(ȳ)`` (:meth:`_all_ablated`) and the block's :class:`_Table`."""
        ec = self.ec
        heads = ec._layer_heads.get(layer, [])
        f = ec.posts[layer][0]
        rows = [ec._index[h.name] for h in heads]
        self.filled = max(rows, default=self.filled - 1) + 1
        if not heads:
            self.base = self.base + (v - self.x)
            return
        if layer not in ec._after:  # f is linear
            self.base = self.base + (v - self.x) - self._linear_writes(layer, rows, zs, f.scale).to(v.dtype)
            return
        delta = ec._head_writes(layer, zs).float()
        y = sum(ios[ec.model.io_hook(path, "out")] for path in ec._projections[layer]).float()
        bar = self._all_ablated(layer, ios)
        f_bar = f(bar).float()
        self.tables.append(self._table(layer, rows, delta, y, bar, f_bar))
        self.base = self.base + f_bar.to(self.base.dtype)

    def _linear_writes(self, layer: int, rows: list[int], zs: dict[HeadRef, Tensor], scale: float
                       ) -> Float[Tensor, "batch pos d_model"]:
        """Put block ``layer``'s heads' ``δ_h = s·(z_h - z̄_h) W_O[:, h]ᵀ`` into ``buf`` (its senders ``rows``) and
        return their sum: where the heads' weights stack in float32 and their rows follow one another, one batched
        product from the heads' channels taken in class order into a block the circuit keeps, copied class by class
        into the rows (no ``[heads, batch, pos, d_model]`` block made afresh and gathered), and the sum one product
        over every head's channels."""
        ec = self.ec
        w = ec._stacked(layer)
        x = self.x
        if w is None or w.dtype != torch.float32 or rows != list(range(rows[0], rows[0] + len(rows))) \
                or torch.is_grad_enabled():
            written = ec._head_writes(layer, zs) * scale if scale != 1.0 else ec._head_writes(layer, zs)
            self._put_rows(rows, written)
            return written.sum(0)
        z = ec._deltas(layer, zs)  # [heads, b * p, width]
        y = torch.bmm(z[:, self.order], w, out=ec._scratch.take("writes", (len(rows), len(self.order), w.shape[-1]),
                                                                 w.device))  # positions in class order
        if scale != 1.0:
            y.mul_(scale)
        for c, part in enumerate(self.buf):
            lo, hi = self.bounds[c], self.bounds[c + 1]
            if hi > lo:
                part.rows(rows[0], len(rows)).copy_(y[:, lo:hi])
        total = z.transpose(0, 1).reshape(z.shape[1], -1) @ w.reshape(-1, w.shape[-1])
        return (total * scale if scale != 1.0 else total).view(*x.shape[:2], -1)

    def _all_ablated(self, layer: int, ios: dict[str, Tensor]) -> Tensor:
        """``ȳ``: block ``layer``'s mixers' summed output with every head ablated -- each output projection run on its
        input with every head's channels replaced (exact where ``y - Σ_h (o_h - ō_h)`` would leave rounding noise
        for the norm to blow up, as zero ablation's ``ȳ = 0``)."""
        ec, total = self.ec, torch.zeros(())
        for path in ec._projections[layer]:
            hook_in = ec.model.io_hook(path, "in")
            z = ios[hook_in].flatten(2).clone()  # [b, p, heads, d] at some bridges' hook
            for h in ec._layer_heads[layer]:
                site = ec._sites[h]
                if site.hook == hook_in:
                    flat_channels(z, site)[..., site.columns] = ec.repl[h].like(z)
            total = total + ec.model.hf_module(path)(z).float()
        return total

    def _table(self, layer: int, rows: list[int], delta: Tensor, y: Tensor, bar: Tensor, f_bar: Tensor) -> _Table:
        """The :class:`_Table` of block ``layer`` (its heads ``rows``, their ``δ_h`` stacked, its mixers' output ``y``
        in the run and ``ȳ`` with every head ablated): ``D_P`` for each distinct pattern of the receiver inputs that
        read after the block, f run once per pattern (in stacks of 32)."""
        f = self.ec.posts[layer][0]
        every = torch.ones(len(rows), len(CLASSES), dtype=torch.bool).numpy().tobytes()
        table = _Table(rows, {every: f(y).float() - f_bar}, every)
        wanted: dict[bytes, Tensor] = {}
        for r in self.ec._after[layer]:
            key = _pattern(self.keep.get(r), rows)
            if key is not None and key not in table.delta:
                wanted.setdefault(key, self.keep[r][rows])
        keys = list(wanted)
        for s in range(0, len(keys), 32):
            part = torch.stack([wanted[k] for k in keys[s:s + 32]]).to(self.classes.device, self.classes.dtype)
            coef = torch.einsum("phc,cbq->phbq", part, self.classes)
            mixed = bar + torch.einsum("phbq,hbqd->pbqd", coef, delta)
            table.delta.update(zip(keys[s:s + 32], f(mixed).float() - f_bar))
        return table

    def logprobs(self) -> Tensor:
        """Read log-probs of the chunk from the logits' stream."""
        rows, pos, inverse = self.chunk.reads
        dev = self.x.device
        final = self.stream(LOGITS, self.filled, self.x)
        return head_logprobs(output_head(self.ec.model), final[rows.to(dev), pos.to(dev) - self.column],
                             self.chunk.read_tok, inverse.to(dev))


def _recording(sites: dict[HeadRef, HeadSite], zs: dict[HeadRef, Tensor], ios: dict[str, Tensor],
               projections: list[str]) -> list[tuple[str, Any]]:
    """Hooks that record the channels of each head of ``sites`` into ``zs`` and the input and output of each of
    ``projections`` (bridge paths) into ``ios``, by hook name."""
    def record(head: HeadRef, site: HeadSite) -> Any:
        def hook(v: Tensor, hook: Any = None) -> Tensor:
            zs[head] = flat_channels(v.detach(), site)[..., site.columns]
            return v
        return hook

    def keep(name: str) -> Any:
        def hook(v: Tensor, hook: Any = None) -> Tensor:
            ios[name] = v.detach()
            return v
        return hook

    names = [Model.io_hook(p, end) for p in projections for end in ("in", "out")]
    return [(site.hook, record(h, site)) for h, site in sites.items()] + [(name, keep(name)) for name in names]


def whole_circuit(fx: Any, scores: dict[Edge, float] | None = None, roles: dict[str, str] | None = None,
                  n_layers: int | None = None) -> dict[str, Any] | None:
    """The smallest edge circuit of an edge faithfulness curve (:func:`~gna_interp.circuits.search.sufficiency.edge_faithfulness`)
    as the report's graph reads it (``circuit.json``'s ``whole``): ``kept`` with its interval ``low``-``high``,
    ``nodes`` (``name``, ``kind`` head / mlp / embed / logits, ``layer``, ``role``) and ``edges`` (``sender``,
    ``receiver`` a node, ``input`` q / k / v / other / mlp / logits, ``positions``, ``score`` each wire's screen
    score (``fx.scores``), ``effect`` the edge's own contribution within the circuit where measured
    (minimality), ``low``/``high`` None). An input shared by several heads (a KV group) is drawn into each of them
    that the circuit keeps as a sender (else into the first). None when no ranked circuit keeps the threshold."""
    if fx.smallest is None:
        return None
    res = next(r for s, _, _, r in fx.points if s == "smallest")
    lo, hi = fx.interval(res)
    scores = scores or {}
    alive = {w.sender for w in fx.smallest}
    roles = roles or {}
    edges = []
    for w in fx.smallest:
        names, inp = receiver_nodes(w.reads)
        targets = [(h, inp) for h in ([h for h in names if h in alive] or names[:1])]
        effect = fx.minimality.get(w)
        for receiver, inp in targets:
            edges.append(WholeEdge(w.sender, receiver, inp, w.positions, score=_finite(scores.get(w)),
                                   effect=_finite(effect)).to_dict())
    nodes = {n: Node.parse(n) for e in edges for n in (e["sender"], e["receiver"])}
    last = n_layers if n_layers is not None else 1 + max(
        [x.layer for x in nodes.values() if x.layer is not None], default=0)

    def node(name: str) -> dict[str, Any]:
        x = nodes[name]
        return {"name": name, "kind": x.kind, "layer": last if x.layer is None else x.layer,
                "role": roles.get(name, "") if x.kind == "head" else ""}

    names = list(dict.fromkeys(n for e in edges for n in (e["sender"], e["receiver"])))
    return {"metric": fx.metric, "method": fx.method, "threshold": fx.threshold, "kept": _finite(fx.fraction(res)),
            "low": _finite(lo), "high": _finite(hi), "n_edges": len(fx.smallest),
            "nodes": [node(n) for n in names], "edges": edges}


def _finite(v: Any) -> float | None:
    """``v`` as a float, or None where it is missing or not finite (JSON has no NaN)."""
    if v is None:
        return None
    f = float(v)
    return f if f == f and abs(f) != float("inf") else None
