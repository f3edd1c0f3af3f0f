"""`patterns(model, inputs, heads)`: per-head mixing matrices for every head kind from one forward.

Attention heads give their softmax pattern; SSM heads give their implicit attention (registered by
:mod:`gna_interp.patterns.ssm`). Each kind has a *provider*: the hook names it needs cached and a
function that turns the cache into ``[batch, n, q, k]`` for the requested heads of one layer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence

import torch
from jaxtyping import Float
from torch import Tensor

from gna_interp.errors import HeadError
from gna_interp.models.arch import LayerSpec
from gna_interp.models.heads import HeadRef
from gna_interp.models.model import Model, TokenBatch


class PatternProvider(Protocol):
    """How one head kind turns cached activations into per-head ``[batch, n, q, k]`` matrices."""

    def hook_names(self, model: Model, spec: LayerSpec) -> list[str]: ...

    def compute(self, model: Model, spec: LayerSpec, cache: Any, heads: list[HeadRef],
                batch: TokenBatch, **options: Any) -> Float[Tensor, "batch n q k"]: ...


PROVIDERS: dict[str, PatternProvider] = {}


def register_provider(kind: str, provider: PatternProvider) -> None:
    """Make ``patterns`` handle heads of ``kind`` with ``provider``."""
    PROVIDERS[kind] = provider


class AttentionProvider:
    """Softmax attention from ``blocks.{l}.attn.hook_pattern`` (query heads, GQA included)."""

    def hook_names(self, model: Model, spec: LayerSpec) -> list[str]:
        return [f"{spec.bridge_path}.hook_pattern"]

    def compute(self, model: Model, spec: LayerSpec, cache: Any, heads: list[HeadRef],
                batch: TokenBatch, **options: Any) -> Float[Tensor, "batch n q k"]:
        pattern = cache[f"{spec.bridge_path}.hook_pattern"]
        return pattern[:, [h.head for h in heads]].float()


register_provider("attn", AttentionProvider())


@dataclass
class PatternSet:
    """Patterns of some heads on one batch.

    ``by_layer[(layer, kind)]`` is ``(heads, tensor [batch, n, q, k])``. Rows and columns at padding
    positions are zero; :meth:`sample` trims them away. ``str_tokens[b]`` are the real tokens of
    sample ``b``.
    """

    batch: TokenBatch
    str_tokens: list[list[str]]
    heads: list[HeadRef]
    by_layer: dict[tuple[int, str], tuple[list[HeadRef], Float[Tensor, "batch n q k"]]] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)

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
        """Patterns of ``heads`` (default: all, in order) stacked on dim 1."""
        return torch.stack([self[h] for h in (heads if heads is not None else self.heads)], dim=1)

    def sample(self, i: int, heads: Sequence[HeadRef | str] | None = None) -> Float[Tensor, "n q k"]:
        """Sample ``i``'s patterns with the padding positions removed: ``[n, q_real, k_real]``."""
        keep = self.batch.attention_mask[i].bool()
        pat = self.stack(heads)[i]
        return pat[:, keep][:, :, keep]


DEFAULT_SSM1_GROUPS = 16


def default_heads(model: Model) -> list[HeadRef]:
    """Heads shown when none are named: every attention and Mamba-2 head; a Mamba-1 layer (thousands
    of channels) as ``DEFAULT_SSM1_GROUPS`` equal channel groups rather than one matrix per channel."""
    out = [h for h in model.heads() if h.kind in PROVIDERS and h.kind != "ssm1"]
    for spec in model.layers:
        if spec.kind == "ssm1" and "ssm1" in PROVIDERS:
            width = -(-spec.n_heads // DEFAULT_SSM1_GROUPS)
            out.extend(model.heads(kind="ssm1", channel_group=width, layers=[spec.layer]))
    return sorted(out, key=lambda h: h.layer)


def patterns(model: Model, inputs: str | Sequence[str] | Tensor | TokenBatch,
             heads: str | HeadRef | Sequence[str | HeadRef] | None = None,
             **options: Any) -> PatternSet:
    """Per-head patterns ``[batch, q, k]`` for ``heads`` (default: :func:`default_heads`).

    One forward with only the needed hooks cached. Left padding is handled through the attention
    mask: the patterns of real tokens equal those of the unpadded prompt. Extra ``options`` go to
    the providers (e.g. ``form=`` for SSM implicit attention).
    """
    batch = model.as_batch(inputs)
    if heads is None:
        wanted = default_heads(model)
    else:
        wanted = model.check_heads(heads)  # type: ignore[arg-type]
    missing = sorted({h.kind for h in wanted if h.kind not in PROVIDERS})
    if missing:
        raise HeadError(f"no pattern provider for head kind(s) {missing}; available: {sorted(PROVIDERS)}")
    groups: dict[tuple[int, str], list[HeadRef]] = {}
    for h in wanted:
        groups.setdefault((h.layer, h.kind), []).append(h)
    specs = {key: model.layer_spec(*key) for key in groups}
    names = sorted({n for key, spec in specs.items() for n in PROVIDERS[key[1]].hook_names(model, spec)})
    _, cache = model.run_with_cache(batch, names_filter=lambda name: name in names)
    mask = batch.attention_mask.float()
    keep = mask[:, None, :, None] * mask[:, None, None, :]
    by_layer = {}
    for key, hs in groups.items():
        pat = PROVIDERS[key[1]].compute(model, specs[key], cache, hs, batch, **options)
        by_layer[key] = (hs, pat * keep.to(pat.device))
    str_tokens = [model.to_str_tokens(ids[m.bool()]) for ids, m in zip(batch.ids, batch.attention_mask)]
    return PatternSet(batch, str_tokens, wanted, by_layer, dict(options))
