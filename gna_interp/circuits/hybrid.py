"""`plan_hybrid`: which attention heads a retrieval-guided hybrid keeps, and its inference memory.

A *retrieval-guided hybrid* (Bick, Xing & Gu; "Retrieval-Aware Distillation for Transformer-SSM
Hybrids") keeps the ``k`` attention heads a KV-retrieval ablation scan ranks highest and turns every
other attention head into a Mamba-2 head (one recurrent head per replaced query head, as in the
Llamba distillations of Llama). :func:`plan_hybrid` picks the kept heads for each ``k`` (the top ``k`` of
the scan's ranking; ``k`` is capped at the number of ranked heads) and counts, for each sequence length
``L``, batch 1, the bytes of what inference keeps per sequence:

==========================  =========================================================================
quantity                    bytes (``b`` = bytes per element of the dtype)
==========================  =========================================================================
full Transformer KV cache   ``sum over layers of kv_heads x head_dim x 2 (K and V) x L x b``
kept heads' KV cache        ``sum over the distinct (layer, kv_head) pairs of the kept heads of
                            head_dim x 2 x L x b``
replaced heads' SSM state   ``sum over replaced heads of head_dim x d_state x b`` (constant in ``L``)
replaced heads' conv state  ``sum over replaced heads of d_conv x (head_dim + 2 d_state) x b``
hybrid                      kept KV cache + SSM state + conv state
==========================  =========================================================================

Conventions (each a choice, stated so that the numbers can be checked by hand):

- **Grouped-query attention**: query head ``h`` of a layer with ``H`` query and ``G`` KV heads reads KV
  head ``h // (H / G)`` (Hugging Face's ``repeat_kv`` layout). A kept query head needs its KV head's
  whole cache, so the hybrid caches every *distinct* ``(layer, kv_head)`` pair among the kept heads: two
  kept heads of one group cost one KV head; a KV head whose query heads are all replaced is dropped.
- **Replaced head = one Mamba-2 head** with ``head_dim`` channels (the attention head's width) and state
  size ``d_state``: its recurrent state is ``head_dim x d_state`` elements. Default ``d_state = 64``
  (:data:`DEFAULT_D_STATE`): the state size of the Llamba models (Llamba-1B/3B/8B, Mamba-2 distillations of
  Llama-3.x whose heads map one to one onto the attention heads) -- the standard, conservative choice;
  the retrieval-aware distillation paper shrinks it 8x (``d_state = 8``) once the kept heads handle
  retrieval, which ``d_state=8`` reproduces.
- **Conv state**: Mamba-2 convolves its ``x``, ``B`` and ``C`` channels over the last ``d_conv`` positions
  (default ``d_conv = 4``, :data:`DEFAULT_D_CONV`, Mamba-2's kernel); a replaced head owns its
  ``head_dim`` x-channels and its own ``B`` and ``C`` (``d_state`` each, as in Llamba, where every head has
  its own B and C), so its conv state is ``d_conv x (head_dim + 2 d_state)`` elements (Hugging Face's
  Mamba-2 cache keeps ``d_conv`` positions). ``d_conv=0`` leaves the conv state out.
- **dtype**: every cache and state is counted in one dtype: by default the dtype the checkpoint was saved
  in (``config.json``'s ``torch_dtype``/``dtype``), else the dtype the model was loaded in
  (:attr:`HybridPlan.dtype_source` says which). Batch 1; activations and weights are not counted.
- **Units**: bytes, and MB = 10^6 bytes (not MiB). ``ratio`` = full KV cache / hybrid (above 1: the hybrid
  is smaller); at short ``L`` a large ``d_state`` can make the hybrid *larger* than the full cache.

Worked example, Llama-3.2-1B in bfloat16 (16 layers x 8 KV heads x head_dim 64): the full cache is
``16 x 8 x 64 x 2 x L x 2`` bytes = 4,194,304 B = 4.19 MB at ``L = 128`` and 67.11 MB at ``L = 2048`` (the
paper's 4.2 MB and 67 MB).

Head order: ``order="scan"`` (default) ranks by the scan (a :class:`~gna_interp.circuits.scan.HeadScan`, a
:class:`~gna_interp.circuits.search.circuit.Circuit` -- its scan's ranking, generic heads included --, a `gna scan`
folder, a ``scan.json`` file, or an explicit list of heads, best first); ``order="random"`` with a ``seed``
shuffles every attention head instead: **not retrieval-guided**, but the memory depends only on how many
heads and distinct KV heads are kept, so the table is still informative (e.g. for a meta-device config,
which has no weights to scan).
"""

from __future__ import annotations

import json
import math
import os
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import pandas as pd
import torch

from gna_interp.constants import CIRCUIT_JSON, HF_CONFIG, SCAN_JSON, result_files
from gna_interp.circuits.search.circuit import Circuit
from gna_interp.circuits.scan.result import HeadScan
from gna_interp.errors import InputError
from gna_interp.models.heads import HeadRef
from gna_interp.models.loading import dtype_name, parse_dtype
from gna_interp.models.registry import adapter
from gna_interp.models.model import Model
from gna_interp.options import Options, options
from gna_interp.store import file_in, read_json, records, write_json
from gna_interp.templates import Markup, render

DEFAULT_KS: tuple[int, ...] = (0, 5, 10, 20, 40)
DEFAULT_LENGTHS: tuple[int, ...] = (128, 2048, 4096)
DEFAULT_D_STATE = 64  # Llamba's Mamba-2 state size (see the module docstring)
DEFAULT_D_CONV = 4  # Mamba-2's convolution kernel
MB = 10**6
FORMAT = "hybrid_plan"
ORDERS = ("scan", "random")
COLUMNS = ["k", "kept", "replaced", "kv_heads_kept", "length", "full_kv_bytes", "kept_kv_bytes", "ssm_state_bytes",
           "conv_state_bytes", "hybrid_bytes", "full_mb", "hybrid_mb", "ratio", "kept_heads"]

__all__ = ["COLUMNS", "DEFAULT_D_CONV", "DEFAULT_D_STATE", "DEFAULT_KS", "DEFAULT_LENGTHS", "AttentionLayer", "HybridPlanConfig",
           "HybridPlan", "load_ranking", "plan_hybrid"]


@dataclass(frozen=True)
class AttentionLayer:
    """The shape of one attention layer: ``n_heads`` query heads, ``n_kv_heads`` KV heads, ``head_dim``."""

    layer: int
    n_heads: int
    n_kv_heads: int
    head_dim: int

    def kv_head(self, head: int) -> int:
        """The KV head query head ``head`` reads: ``head // (n_heads / n_kv_heads)``."""
        return head // (self.n_heads // self.n_kv_heads)


@dataclass
class HybridPlan:
    """Result of :func:`plan_hybrid`: the attention layout, the head ranking and the state settings; the
    memory table is computed from them (:meth:`to_frame`, one row per ``(k, length)``, columns
    :data:`COLUMNS`; :meth:`wide`, one row per ``k``).

    Attributes:
        model, architecture: the model's name and Hugging Face class.
        layers: every attention layer's shape.
        ranking: the heads in the order they are kept (best first).
        ks, lengths: kept-head counts and sequence lengths of the table.
        dtype, dtype_source: the dtype counted (``bfloat16`` ...) and where it came from.
        d_state, d_conv: the replaced heads' Mamba-2 state size and convolution width.
        order, seed: ``scan`` (retrieval-guided) or ``random`` (with its seed).
        source: what the ranking came from (the scan's model, task and metric, or ``random order``).
        notes: sentences about the plan (caps, scan and model mismatches).
    """

    model: str
    architecture: str
    layers: list[AttentionLayer]
    ranking: list[HeadRef]
    ks: list[int]
    lengths: list[int]
    dtype: str
    dtype_source: str
    d_state: int = DEFAULT_D_STATE
    d_conv: int = DEFAULT_D_CONV
    order: str = "scan"
    seed: int | None = None
    source: str = ""
    notes: list[str] = field(default_factory=list)

    # ---- shapes ---------------------------------------------------------------------------
    @property
    def bytes_per_element(self) -> int:
        return parse_dtype(self.dtype).itemsize

    @property
    def n_heads(self) -> int:
        """Attention query heads of the model."""
        return sum(s.n_heads for s in self.layers)

    @property
    def n_kv_heads(self) -> int:
        """KV heads of the model (GQA: fewer than query heads)."""
        return sum(s.n_kv_heads for s in self.layers)

    def kept(self, k: int) -> list[HeadRef]:
        """The heads kept as attention for ``k``: the first ``min(k, len(ranking))`` of the ranking."""
        return list(self.ranking[:max(0, min(k, len(self.ranking)))])

    # ---- the arithmetic -------------------------------------------------------------------
    def full_kv_bytes(self, length: int) -> int:
        """The full Transformer's KV cache: ``sum_layers kv_heads x head_dim x 2 x length x bytes``."""
        return sum(s.n_kv_heads * s.head_dim * 2 * length * self.bytes_per_element for s in self.layers)

    def memory(self, k: int, length: int) -> dict[str, Any]:
        """One row of :meth:`to_frame`: the hybrid keeping the top ``k`` heads, at sequence length ``length``."""
        b = self.bytes_per_element
        by_layer = {s.layer: s for s in self.layers}
        kept = self.kept(k)
        kept_set = set(kept)
        kv_pairs = {(h.layer, by_layer[h.layer].kv_head(h.head)) for h in kept}
        kept_kv = sum(by_layer[layer].head_dim * 2 * length * b for layer, _ in kv_pairs)
        replaced = [(s, h) for s in self.layers for h in range(s.n_heads) if HeadRef(s.layer, h) not in kept_set]
        state = sum(s.head_dim * self.d_state * b for s, _ in replaced)
        conv = sum(self.d_conv * (s.head_dim + 2 * self.d_state) * b for s, _ in replaced)
        full = self.full_kv_bytes(length)
        hybrid = kept_kv + state + conv
        return {"k": k, "kept": len(kept), "replaced": len(replaced), "kv_heads_kept": len(kv_pairs), "length": length,
                "full_kv_bytes": full, "kept_kv_bytes": kept_kv, "ssm_state_bytes": state, "conv_state_bytes": conv,
                "hybrid_bytes": hybrid, "full_mb": full / MB, "hybrid_mb": hybrid / MB,
                "ratio": full / hybrid if hybrid else math.inf, "kept_heads": ",".join(h.name for h in kept)}

    def to_frame(self) -> pd.DataFrame:
        """One row per ``(k, length)``, columns :data:`COLUMNS` (bytes exact; ``*_mb`` in 10^6 bytes;
        ``ratio`` = full / hybrid)."""
        return pd.DataFrame([self.memory(k, L) for k in self.ks for L in self.lengths], columns=COLUMNS)

    def wide(self) -> pd.DataFrame:
        """The paper's table: one row per ``k`` (and a first row ``full`` for the Transformer), the hybrid's MB
        and the full/hybrid ratio at each length."""
        df = self.to_frame()
        rows = [{"k": "full", "kept": self.n_heads, "kv_heads_kept": self.n_kv_heads, "replaced": 0,
                 **{f"L={L} MB": self.full_kv_bytes(L) / MB for L in self.lengths},
                 **{f"L={L} x": 1.0 for L in self.lengths}}]
        for k in self.ks:
            part = df[df["k"] == k].set_index("length")
            first = part.iloc[0]
            rows.append({"k": str(k), "kept": int(first["kept"]), "kv_heads_kept": int(first["kv_heads_kept"]),
                         "replaced": int(first["replaced"]),
                         **{f"L={L} MB": float(part.loc[L, "hybrid_mb"]) for L in self.lengths},
                         **{f"L={L} x": float(part.loc[L, "ratio"]) for L in self.lengths}})
        cols = ["k", "kept", "kv_heads_kept", "replaced"] + [c for L in self.lengths for c in (f"L={L} MB", f"L={L} x")]
        return pd.DataFrame(rows, columns=cols)

    # ---- display --------------------------------------------------------------------------
    def header(self) -> list[str]:
        """The title line, then one ``- ...`` line per setting and note (what :meth:`summary` prints first)."""
        dims = sorted({s.head_dim for s in self.layers})
        d = dims[0] if len(dims) == 1 else "/".join(map(str, dims))
        retrieval = "retrieval-guided, the top k of the " if self.order == "scan" else "NOT retrieval-guided: "
        return [f"Retrieval-guided hybrid plan: {self.model} ({self.architecture})",
                f"- {len(self.layers)} attention layers, {self.n_heads} query heads, {self.n_kv_heads} KV heads, "
                f"head_dim {d}; {self.dtype} ({self.bytes_per_element} bytes, {self.dtype_source}), batch 1",
                f"- kept heads: {retrieval}{self.source}",
                f"- a replaced head becomes a Mamba-2 head: state head_dim x d_state = {d} x {self.d_state}, conv "
                f"state d_conv x (head_dim + 2 d_state) = {self.d_conv} x ({d} + {2 * self.d_state}) elements; "
                f"constant in L",
                "- KV cache: kept heads' distinct (layer, KV head) pairs x head_dim x 2 (K, V) x L x bytes; "
                "MB = 10^6 bytes; x = full / hybrid"] + [f"- {n}" for n in self.notes]

    def table_text(self) -> str:
        """The wide table as aligned text (MB with 2 decimals, 3 significant digits below 1 MB; ratios with 2)."""
        w = self.wide()
        cells = [[str(c) for c in w.columns]]
        for _, r in w.iterrows():
            cells.append([_number(v) if isinstance(v, float) else str(v) for v in r])
        width = [max(len(row[i]) for row in cells) for i in range(len(cells[0]))]
        return "\n".join("  ".join(c.rjust(width[i]) for i, c in enumerate(row)) for row in cells)

    def summary(self) -> str:
        """The header lines, the memory table and the heads kept at each ``k``."""
        lines = self.header() + ["", self.table_text(), ""]
        for k in self.ks:
            kept = self.kept(k)
            more = f" ... (+{len(kept) - 12})" if len(kept) > 12 else ""
            lines.append(f"k={k}: {', '.join(h.name for h in kept[:12]) or '(none: every head is Mamba-2)'}{more}")
        return "\n".join(lines) + "\n"

    def wide_html(self) -> str:
        """:meth:`wide` as an HTML table (MB and ratios with 2 decimals)."""
        w = self.wide()
        return w.to_html(index=False, formatters={c: _number for c in w.columns if c.startswith("L=")})

    def _repr_html_(self) -> str:
        head = self.header()
        return render("summary_block.html", lead=head[0], items=[line[2:] for line in head[1:]], pre=None,
                      table=Markup(self.wide_html()))

    def __repr__(self) -> str:
        return (f"HybridPlan({self.model!r}, {self.n_heads} heads, {self.n_kv_heads} KV heads, ks={self.ks}, "
                f"lengths={self.lengths}, {self.dtype}, d_state={self.d_state}, order={self.order!r})")

    # ---- files ----------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The JSON-able plan (settings, layout, ranking) with its table under ``"table"``."""
        return {"model": self.model, "architecture": self.architecture,
                "layers": [vars(s) for s in self.layers], "ranking": [h.name for h in self.ranking],
                "ks": list(self.ks), "lengths": list(self.lengths), "dtype": self.dtype,
                "dtype_source": self.dtype_source, "bytes_per_element": self.bytes_per_element,
                "d_state": self.d_state, "d_conv": self.d_conv, "order": self.order, "seed": self.seed,
                "source": self.source, "notes": list(self.notes), "mb": MB,
                "table": records(self.to_frame())}

    def save(self, path: str | os.PathLike) -> Path:
        """Write the plan as a ``hybrid_plan`` JSON document (a folder gets ``hybrid_plan.json``)."""
        return write_json(file_in(path, result_files(FORMAT)[0]), FORMAT, self.to_dict())

    @classmethod
    def load(cls, path: str | os.PathLike) -> "HybridPlan":
        """Read a plan written by :meth:`save` or `gna hybrid plan` (a file or a folder holding ``hybrid_plan.json``)."""
        doc = read_json(file_in(path, result_files(FORMAT)[0]), FORMAT)
        return cls(doc["model"], doc["architecture"], [AttentionLayer(**s) for s in doc["layers"]],
                   [HeadRef.parse(n) for n in doc["ranking"]], list(doc["ks"]), list(doc["lengths"]), doc["dtype"],
                   doc["dtype_source"], int(doc["d_state"]), int(doc["d_conv"]), doc["order"], doc.get("seed"),
                   doc.get("source") or "", list(doc.get("notes") or []))


def _number(v: float) -> str:
    """2 decimals, or 3 significant digits below 1 (a tiny model's caches are fractions of a MB)."""
    return f"{v:.2f}" if abs(v) >= 1 or v == 0 else f"{v:.3g}"


# ---- inputs -----------------------------------------------------------------------------------
def load_ranking(scan: HeadScan | Circuit | str | os.PathLike | Sequence[HeadRef | str]) -> tuple[list[HeadRef], str, str]:
    """``(heads best first, what they came from, the scan's model name or "")`` of a scan, a circuit, a `gna scan`
    folder (``circuit.json`` or just ``scan.json``), a ``scan.json`` file (a string is a path) or an explicit list
    of heads."""
    if isinstance(scan, (str, os.PathLike)):
        p = Path(scan)
        if p.is_dir():
            if (p / CIRCUIT_JSON).is_file():
                scan = Circuit.load(p)
            elif (p / SCAN_JSON).is_file():
                scan = HeadScan.load(p / SCAN_JSON)
            else:
                raise InputError(f"{str(p)!r} holds neither circuit.json nor scan.json: pass the folder `gna scan --out "
                                 f"DIR` wrote, or its scan.json")
        elif p.is_file():
            scan = HeadScan.load(p)
        else:
            raise InputError(f"scan {str(p)!r} does not exist: pass a `gna scan` output folder or its scan.json")
    if isinstance(scan, Circuit):
        scan = scan.scan
    if isinstance(scan, HeadScan):
        ranked = [HeadRef.parse(n) for n in scan.to_frame()["name"]]
        return ranked, f"{scan.task} scan of {scan.model} ({scan.strategy}, {scan.method} ablation, metric " \
                       f"{scan.metric}; heads ranked by drop)", scan.model
    try:
        heads = [HeadRef.parse(h) for h in scan]
    except TypeError:
        raise InputError(f"scan must be a HeadScan, a Circuit, a `gna scan` folder, a scan.json file or a list of "
                         f"heads, got {type(scan).__name__}") from None
    return heads, "an explicit head ranking", ""


def _layout(model: Model) -> list[AttentionLayer]:
    """Every attention layer's shape; an error for a model that is not a Transformer."""
    other = sorted({s.kind if s.supported else f"unsupported ({s.hf_class})" for s in model.layers
                    if not (s.supported and adapter(s.kind).normalized_rows)})
    if other or not model.layers:
        raise InputError(f"plan_hybrid turns a Transformer's attention heads into Mamba-2 heads, but {model.name} has "
                         f"{', '.join(other) or 'no'} mixers besides attention; plan from a Transformer's scan")
    out = []
    for s in model.layers:
        if s.shared_by:
            raise InputError(f"layer {s.layer} of {model.name} shares its attention weights with layers {s.shared_by}; "
                             f"plan_hybrid needs one attention layer per block")
        if s.n_groups < 1 or s.n_heads % s.n_groups:
            raise InputError(f"layer {s.layer} of {model.name} has {s.n_heads} query heads and {s.n_groups} KV heads; "
                             f"the query heads must split evenly over the KV heads")
        out.append(AttentionLayer(s.layer, s.n_heads, s.n_groups, s.head_dim))
    return out


def saved_dtype(model: Model) -> torch.dtype | None:
    """The dtype ``model``'s checkpoint was saved in (``config.json``'s ``torch_dtype`` or ``dtype``), or None
    when the model was not loaded from a folder or the config names none (or a dtype gna_interp does not use)."""
    loc = Path(model.source.location) if model.source is not None else None
    conf = loc / HF_CONFIG if loc is not None and loc.is_dir() else None
    if conf is None or not conf.is_file():
        return None
    try:
        doc = json.loads(conf.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    name = doc.get("torch_dtype") or doc.get("dtype")
    try:
        return parse_dtype(name) if isinstance(name, str) else None
    except InputError:
        return None


def _positive(name: str, values: Sequence[int], minimum: int) -> list[int]:
    out = list(dict.fromkeys(values))  # each k / length once, in the order given
    bad = [v for v in out if isinstance(v, bool) or not isinstance(v, int) or v < minimum]
    if bad or not out:
        raise InputError(f"{name} must be a non-empty list of integers >= {minimum}, got {values!r}")
    return out


@options
class HybridPlanConfig(Options):
    """What :func:`plan_hybrid` counts.

    Attributes:
        ks: heads kept as attention (each ``k`` once, capped at the head count).
        lengths: sequence lengths, batch 1.
        d_state: state size of a replaced head's Mamba-2 head; d_conv: its convolution width counted in the
            conv state (0: left out).
        dtype: of the caches (None: the dtype the checkpoint was saved in, else the loaded dtype).
        order: ``scan`` (the scan's ranking) or ``random`` (every head shuffled with ``seed``).
    """

    ks: Sequence[int] = DEFAULT_KS
    lengths: Sequence[int] = DEFAULT_LENGTHS
    d_state: int = DEFAULT_D_STATE
    d_conv: int = DEFAULT_D_CONV
    dtype: str | torch.dtype | None = None
    order: str = "scan"
    seed: int | None = None


def plan_hybrid(model: Model, scan: HeadScan | Circuit | str | os.PathLike | Sequence[HeadRef | str] | None = None,
                config: HybridPlanConfig | None = None, **overrides: Any) -> HybridPlan:
    """Plan the retrieval-guided hybrids of a Transformer: for each ``k`` in ``ks`` the top ``k`` heads of the
    scan's ranking stay attention, the others become Mamba-2 heads; :meth:`HybridPlan.to_frame` gives the memory
    at each length (formulas and conventions: :mod:`gna_interp.circuits.hybrid`).

    ``model`` may be a meta-device model (shapes only). ``scan``: a HeadScan, a Circuit, a `gna scan` folder, a
    ``scan.json`` file or a list of heads best first (needed for ``order="scan"``); ``order="random"`` with a
    ``seed`` ranks every head at random instead (not retrieval-guided). ``config`` (:class:`HybridPlanConfig`)
    and keyword ``overrides`` of its fields: ``ks``, ``lengths``, ``d_state``, ``d_conv``, ``dtype``, ``order``,
    ``seed``.
    """
    cfg = HybridPlanConfig.build(config, **overrides)
    ks, lengths, d_state, d_conv, dtype, order, seed = cfg.ks, cfg.lengths, cfg.d_state, cfg.d_conv, cfg.dtype, \
        cfg.order, cfg.seed
    if order not in ORDERS:
        raise InputError(f"order must be one of {', '.join(ORDERS)}, got {order!r}")
    ks = _positive("ks", ks, 0)
    lengths = _positive("lengths", lengths, 1)
    d_state = _positive("d_state", [d_state], 1)[0]
    d_conv = _positive("d_conv", [d_conv], 0)[0]
    layers = _layout(model)
    all_heads = [HeadRef(s.layer, h) for s in layers for h in range(s.n_heads)]
    notes: list[str] = []
    if order == "random":
        if scan is not None:
            raise InputError("order='random' ranks the heads at random: pass no scan (or use order='scan')")
        if seed is None or isinstance(seed, bool) or not isinstance(seed, int):
            raise InputError(f"order='random' needs an integer seed (seed=N, --seed N) so the plan can be repeated, "
                             f"got {seed!r}")
        ranking = random.Random(seed).sample(all_heads, len(all_heads))
        source = (f"the first k of every attention head in a random order (seed {seed}); the memory depends only on "
                  f"how many heads and KV heads are kept")
    else:
        if scan is None:
            where = (f"{model.name} is loaded on the meta device (shapes only), so scan the checkpoint with weights "
                     f"(gna scan --model CHECKPOINT --out DIR) and pass that folder, or " if model.is_meta else
                     "run `gna scan --model M --out DIR` (or scan_heads) and pass it, or ")
            raise InputError(f"plan_hybrid needs a scan for the retrieval-guided order (the heads a KV-retrieval "
                             f"ablation scan ranks highest): {where}use order='random', seed=N (--order random --seed "
                             f"N): not retrieval-guided, but the memory depends only on how many heads are kept")
        if seed is not None:
            raise InputError("seed is only used with order='random'")
        ranking, source, scan_model = load_ranking(scan)
        attn = [h for h in ranking if h.adapter.normalized_rows]  # softmax attention: the heads with a KV cache
        if len(attn) < len(ranking):
            raise InputError(f"the scan ranks {len(ranking) - len(attn)} heads that are not attention heads "
                             f"(e.g. {next(h for h in ranking if not h.adapter.normalized_rows).name}); plan from a Transformer's scan")
        valid = set(all_heads)
        unknown = [h.name for h in ranking if h not in valid]
        if unknown:
            raise InputError(f"the scan names heads {model.name} does not have ({', '.join(unknown[:5])}"
                             f"{' ...' if len(unknown) > 5 else ''}): it was made on another model; scan this one")
        if len(set(ranking)) < len(ranking):
            raise InputError("the ranking names a head twice; each head may be ranked once")
        if scan_model and scan_model != model.name:
            notes.append(f"the scan was made on {scan_model!r}, the layout is {model.name!r}'s (same heads)")
        if len(ranking) < len(all_heads):
            notes.append(f"the scan ranks {len(ranking)} of the {len(all_heads)} heads; unranked heads are never kept")
    capped = sorted({k for k in ks if k > len(ranking)})
    if capped:
        notes.append(f"k={', '.join(map(str, capped))} capped at {len(ranking)} (" +
                     ("the model's head count)" if len(ranking) == len(all_heads) else "the heads the scan ranks)"))
    if dtype is not None:
        dt, dsrc = parse_dtype(dtype), "given"
    else:
        saved = saved_dtype(model)
        dt, dsrc = (saved, "the checkpoint's saved dtype") if saved is not None else (model.dtype, "the loaded dtype")
    return HybridPlan(model.name, model.architecture, layers, ranking, ks, lengths, dtype_name(dt), dsrc, d_state,
                      d_conv, order, seed if order == "random" else None, source, notes)
