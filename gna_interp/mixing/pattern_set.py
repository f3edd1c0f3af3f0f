"""`patterns(model, inputs, heads)`: per-head mixing matrices for every head kind from one forward.

Attention heads give their softmax pattern; SSM heads give their implicit attention. Each head
kind's adapter (:mod:`gna_interp.models.mixer`) names the hooks it needs cached and turns the cache
into ``[batch, n, q, k]`` for the requested heads of one layer.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from gna_interp.constants import PATTERNS_PT
from gna_interp.errors import HeadError, InputError
from gna_interp.models.heads import HeadRef
from gna_interp.models.mixer import PatternOptions
from gna_interp.models.model import Model, TokenBatch, check_model
from gna_interp.results import Result
from gna_interp.store import file_in, read_tensors, write_tensors


@dataclass
class PatternSet(Result):
    """Patterns of some heads on one batch.

    ``by_layer[(layer, kind)]`` is ``(heads, tensor [batch, n, q, k])``. Rows and columns at padding
    positions are zero; :meth:`sample` trims them away. ``str_tokens[b]`` label the real tokens of
    sample ``b`` (:meth:`Model.token_labels <gna_interp.models.model.Model.token_labels>`: from text, labels
    that cover the whole prompt, separators a tokenizer drops included); ``options`` how the patterns were read.
    Saves to one ``patterns`` tensor bundle (:meth:`save` / :meth:`load`, a folder's ``patterns.pt``); its tensors
    make it no JSON document (no :meth:`to_dict`), and its views are HTML (:func:`gna_interp.viz.attention_heads`),
    not a plotly figure.
    """

    FORMAT = "patterns"
    FILE = PATTERNS_PT
    DRAWN_BY = "gna_interp.viz.attention_heads(patterns) (an HTML view)"

    batch: TokenBatch
    str_tokens: list[list[str]]
    heads: list[HeadRef]
    by_layer: dict[tuple[int, str], tuple[list[HeadRef], Float[Tensor, "batch n q k"]]] = field(default_factory=dict)
    options: PatternOptions = field(default_factory=PatternOptions)

    def __getitem__(self, head: HeadRef | str) -> Float[Tensor, "batch q k"]:
        h = HeadRef.parse(head)
        entry = self.by_layer.get((h.layer, h.kind))
        if entry is None or h not in entry[0]:
            raise HeadError(f"{h.name} is not in this pattern set; it holds {[x.name for x in self.heads]}")
        return entry[1][:, entry[0].index(h)]

    def __contains__(self, head: object) -> bool:
        try:
            self[head]  # type: ignore[index]
            return True
        except HeadError:
            return False

    def stack(self, heads: Sequence[HeadRef | str] | None = None) -> Float[Tensor, "batch n q k"]:
        """Patterns of ``heads`` (default: all, in order) stacked on dim 1 (on the first one's device: the layers of
        a model placed over several GPUs leave their patterns on their own device)."""
        pats = [self[h] for h in (heads if heads is not None else self.heads)]
        return torch.stack([p.to(pats[0].device) for p in pats], dim=1)

    def sample(self, i: int, heads: Sequence[HeadRef | str] | None = None) -> Float[Tensor, "n q k"]:
        """Sample ``i``'s patterns with the padding positions removed: ``[n, q_real, k_real]``."""
        keep = self.batch.attention_mask[i].bool()
        pat = self.stack(heads)[i]
        return pat[:, keep][:, :, keep]

    @property
    def metrics(self) -> dict[str, Any]:
        """``n_heads``, ``n_samples``, ``max_tokens`` and the options the patterns were read with."""
        return {"n_heads": len(self.heads), "n_samples": len(self.str_tokens),
                "max_tokens": int(self.batch.ids.shape[1]), **self.options.to_dict()}

    def __repr__(self) -> str:
        names = [h.name for h in self.heads[:_NAMED]]
        more = f", +{len(self.heads) - _NAMED}" if len(self.heads) > _NAMED else ""
        return (f"PatternSet({len(self.heads)} heads [{', '.join(names)}{more}], {len(self.str_tokens)} samples, "
                f"{int(self.batch.ids.shape[1])} positions, form={self.options.form!r})")

    def _repr_html_(self) -> str:
        """Jupyter's display: a shape summary (heads by layer, samples, tokens, options), never the tensors."""
        from gna_interp import html_repr

        lengths = [len(t) for t in self.str_tokens]
        facts = [("heads", f"{len(self.heads)}: " + ", ".join(h.name for h in self.heads[:_NAMED])
                  + (f" (+{len(self.heads) - _NAMED})" if len(self.heads) > _NAMED else "")),
                 ("samples", len(self.str_tokens)),
                 ("tokens per sample", f"{min(lengths)}-{max(lengths)} (padded to {int(self.batch.ids.shape[1])})"
                  if lengths else "–"),
                 ("options", ", ".join(f"{k}={v}" for k, v in self.options.to_dict().items()))]
        rows = [[layer, heads[0].adapter.title, len(heads), ", ".join(h.name for h in heads[:_NAMED])
                 + (f" (+{len(heads) - _NAMED})" if len(heads) > _NAMED else ""), str(list(pat.shape)), str(pat.dtype)
                 .removeprefix("torch."), str(pat.device)] for (layer, _), (heads, pat) in self.by_layer.items()]
        parts = [html_repr.title("PatternSet", f"{len(self.heads)} heads on {len(self.str_tokens)} samples"),
                 html_repr.facts(facts),
                 html_repr.table(["layer", "heads are", "n", "heads", "tensor [batch, n, q, k]", "dtype", "device"], rows)]
        if self.str_tokens:
            first = self.str_tokens[0]
            shown = " | ".join(repr(t) for t in first[:_TOKENS]) + (f" ... (+{len(first) - _TOKENS})"
                                                                     if len(first) > _TOKENS else "")
            parts.append(html_repr.facts([("sample 0 tokens", shown)]))
        return html_repr.block(parts)

    def to_frame(self) -> pd.DataFrame:
        """One row per head: ``name, layer, head, kind``."""
        return pd.DataFrame([{"name": h.name, "layer": h.layer, "head": h.head, "kind": h.kind} for h in self.heads])

    def to_state(self) -> dict[str, Any]:
        """Tensors and plain values that rebuild this set (see :meth:`from_state`)."""
        return {"heads": [h.name for h in self.heads], "str_tokens": self.str_tokens,
                "ids": self.batch.ids.cpu(), "attention_mask": self.batch.attention_mask.cpu(),
                "patterns": self.stack().cpu() if self.heads else torch.zeros(0), "options": self.options.to_dict()}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> "PatternSet":
        """The pattern set :meth:`to_state` described (its tensors' shapes must agree, its patterns be finite)."""
        heads = [HeadRef.parse(n) for n in state["heads"]]
        _check_shapes(state, heads)
        by_layer: dict[tuple[int, str], tuple[list[HeadRef], Tensor]] = {}
        for key in dict.fromkeys((h.layer, h.kind) for h in heads):
            idx = [i for i, h in enumerate(heads) if (h.layer, h.kind) == key]
            by_layer[key] = ([heads[i] for i in idx], state["patterns"][:, idx])
        return cls(TokenBatch(state["ids"], state["attention_mask"]), [list(t) for t in state["str_tokens"]], heads,
                   by_layer, PatternOptions(**state["options"]))

    def save(self, path: str | os.PathLike) -> Path:
        """Write this pattern set (tensors, tokens, heads, options) to ``path`` (a file, or a folder: its
        ``patterns.pt``) atomically; return the file. See :meth:`load`."""
        return write_tensors(file_in(path, self.FILE), self.FORMAT, self.to_state())

    @classmethod
    def load(cls, path: str | os.PathLike) -> "PatternSet":
        """Read a pattern set written by :meth:`save` (the file, or the folder holding its ``patterns.pt``; no model
        needed)."""
        return cls.from_state(read_tensors(file_in(path, cls.FILE), cls.FORMAT))


_NAMED = 6  # heads a pattern set names in its repr
_TOKENS = 16  # tokens of the first sample its HTML shows


def _check_shapes(state: dict[str, Any], heads: list[HeadRef]) -> None:
    ids, mask, pat = state["ids"], state["attention_mask"], state["patterns"]
    if ids.dim() != 2 or tuple(mask.shape) != tuple(ids.shape) or len(state["str_tokens"]) != ids.shape[0]:
        raise InputError(f"a pattern set's ids {tuple(ids.shape)}, attention mask {tuple(mask.shape)} and "
                         f"{len(state['str_tokens'])} token lists do not agree; the file was edited or is damaged")
    b, t = ids.shape
    if heads and (pat.dim() != 4 or tuple(pat.shape) != (b, len(heads), t, t)):
        raise InputError(f"a pattern set's patterns have shape {tuple(pat.shape)}, not [{b}, {len(heads)}, {t}, {t}] "
                         f"({b} sequences, {len(heads)} heads, {t} positions); the file was edited or is damaged")
    if heads and not bool(torch.isfinite(pat).all()):
        raise InputError("a pattern set's patterns hold NaN or infinite values; the file was edited or is damaged")


def patterns(model: Model, inputs: str | Sequence[str] | Tensor | TokenBatch,
             heads: str | HeadRef | Sequence[str | HeadRef] | None = None,
             options: PatternOptions | None = None, **overrides: Any) -> PatternSet:
    """Per-head patterns ``[batch, q, k]`` of ``heads`` (default: :meth:`Model.default_heads`).

    One forward with only the needed hooks cached, stopped after the last layer of ``heads``. Left padding is handled through the attention
    mask: the patterns of real tokens equal those of the unpadded prompt. The token labels (``str_tokens``) are
    :meth:`Model.token_labels <gna_interp.models.model.Model.token_labels>` of each text (of each row's ids when
    ids are given). ``options`` (a
    :class:`~gna_interp.models.mixer.PatternOptions`) or keyword overrides of its fields
    (``form="exact"``, ``group_reduce``, ``block_elems``, ``query_block``) say how SSM heads are read;
    an unknown keyword raises an error naming the closest option.
    """
    check_model(model)
    opts = PatternOptions.build(options, **overrides)
    batch = model.as_batch(inputs)
    wanted = model.default_heads() if heads is None else model.check_heads(heads)
    groups: dict[tuple[int, str], list[HeadRef]] = {}
    for h in wanted:
        groups.setdefault((h.layer, h.kind), []).append(h)
    specs = {key: model.layer_spec(*key) for key in groups}
    names = sorted({n for spec in specs.values() for n in spec.adapter.pattern_hooks(spec)})
    last = max(h.layer for h in wanted) + 1  # the blocks after the last wanted layer and the head are not run
    stop = {"stop_at_layer": last} if last < model.n_layers else {}
    _, cache = model.run_with_cache(batch, names_filter=lambda name: name in names, **stop)
    mask = batch.attention_mask.float()
    keep = mask[:, None, :, None] * mask[:, None, None, :]
    by_layer = {}
    for key, hs in groups.items():
        spec = specs[key]
        pat = spec.adapter.pattern(model, spec, cache, hs, batch, opts)
        by_layer[key] = (hs, pat * keep.to(pat.device))
    texts = [inputs] if isinstance(inputs, str) else list(inputs) if isinstance(inputs, (list, tuple)) else None
    str_tokens = [model.token_labels(t) for t in texts] if texts is not None else model.row_tokens(batch)
    return PatternSet(batch, str_tokens, wanted, by_layer, opts)
