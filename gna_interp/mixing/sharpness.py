"""How sharp is a head's pattern? Entropy, top-1 mass and effective support size per query row.

The numbers behind the paper's claim that SSM Gather-and-Aggregate is smoother than attention's.
Each query row ``q`` of a pattern ``A[q, k]`` is read as a distribution over its *valid* keys
(``k ≤ q`` when ``causal``, and not padding)::

    p_k = |A[q, k]| / Σ_k' |A[q, k']|

Attention rows already are distributions (the absolute value is a no-op); SSM implicit attention
rows are signed and unnormalised, so ``p`` is the share of the row's total absolute weight that
each key carries (the same for ``form="exact"`` and ``"attention"`` up to the ``Δ_s`` column factor,
which does change ``p``: pick the form you mean and say which).

- ``entropy`` ``H = -Σ p_k log p_k`` in nats (0 = one key, ``log n`` = uniform over ``n`` keys);
- ``top1`` ``max_k p_k`` (and ``argmax``, the key that holds it);
- ``support`` ``exp(H)``, the effective number of keys (1 = one-hot, ``n`` = uniform over ``n``);
- ``n_keys`` the number of valid keys of the row; ``normalized_entropy`` ``H / log n_keys``.

Rows without weight (padding queries, all-zero rows) give NaN for every metric but ``n_keys``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import pandas as pd
import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from gna_interp.errors import InputError
from gna_interp.models.heads import HeadRef
from gna_interp.mixing.pattern_set import PatternSet

__all__ = ["FRAME_COLUMNS", "Sharpness", "row_distribution", "sharpness", "sharpness_frame"]

FRAME_COLUMNS = ("layer", "head", "kind", "name", "sample", "query", "token", "entropy", "top1", "argmax",
                 "support", "n_keys", "normalized_entropy")


@dataclass(frozen=True)
class Sharpness:
    """Per-row sharpness of a pattern ``[*batch, q, k]``; every field is ``[*batch, q]``."""

    entropy: Float[Tensor, "*batch q"]
    top1: Float[Tensor, "*batch q"]
    argmax: Int[Tensor, "*batch q"]
    support: Float[Tensor, "*batch q"]
    n_keys: Int[Tensor, "*batch q"]

    @property
    def normalized_entropy(self) -> Float[Tensor, "*batch q"]:
        """``entropy / log(n_keys)`` in [0, 1]; NaN for rows with fewer than two keys."""
        denom = torch.log(self.n_keys.to(self.entropy.dtype))
        return torch.where(self.n_keys > 1, self.entropy / denom.clamp_min(1e-12),
                           torch.full_like(self.entropy, math.nan))


def _valid_keys(pattern: Tensor, key_mask: Tensor | None, causal: bool) -> Tensor:
    q, k = pattern.shape[-2:]
    valid = torch.ones(q, k, dtype=torch.bool, device=pattern.device)
    if causal:
        valid = valid.tril(diagonal=k - q)  # queries are the last q of the k positions
    if key_mask is not None:
        km = torch.as_tensor(key_mask, device=pattern.device).bool()
        if km.shape[-1] != k:
            raise InputError(f"key_mask has {km.shape[-1]} keys but the pattern has {k}; pass [*batch, {k}]")
        try:
            valid = valid & km[..., None, :]
            torch.broadcast_shapes(valid.shape, pattern.shape)
        except RuntimeError as e:
            raise InputError(f"key_mask of shape {tuple(km.shape)} does not broadcast against the pattern's "
                             f"batch dimensions {tuple(pattern.shape[:-2])} (+ the key axis {k})") from e
    return valid.expand(pattern.shape)


def row_distribution(pattern: Float[Tensor, "*batch q k"], key_mask: Bool[Tensor, "*batch k"] | None = None,
                     causal: bool = True) -> Float[Tensor, "*batch q k"]:
    """``|A|`` restricted to the valid keys and normalised per row (all-zero rows stay zero)."""
    w = pattern.detach().abs().float() * _valid_keys(pattern, key_mask, causal)
    total = w.sum(-1, keepdim=True)
    return torch.where(total > 0, w / total.clamp_min(torch.finfo(w.dtype).tiny), w)


def sharpness(pattern: Float[Tensor, "*batch q k"], key_mask: Bool[Tensor, "*batch k"] | None = None,
              causal: bool = True) -> Sharpness:
    """Entropy, top-1 mass (and its key), effective support ``exp(H)`` and key count per query row.

    ``key_mask`` (1 = real token) broadcasts against ``pattern[..., 0, :]``: for a ``[batch, n, q, k]``
    stack pass ``attention_mask[:, None, :]``. ``causal`` keeps only keys ``k ≤ q``.
    """
    if pattern.dim() < 2:
        raise InputError(f"a pattern needs at least [q, k] dimensions, got shape {tuple(pattern.shape)}")
    valid = _valid_keys(pattern, key_mask, causal)
    w = pattern.detach().abs().float() * valid
    total = w.sum(-1)
    p = w / total.clamp_min(torch.finfo(w.dtype).tiny)[..., None]
    entropy = -torch.special.xlogy(p, p).sum(-1)
    top1, argmax = p.max(-1)
    empty = total <= 0
    nan = torch.full_like(entropy, math.nan)
    entropy = torch.where(empty, nan, entropy.clamp_min(0.0))
    return Sharpness(entropy=entropy, top1=torch.where(empty, nan, top1),
                     argmax=torch.where(empty, torch.full_like(argmax, -1), argmax),
                     support=torch.exp(entropy), n_keys=valid.sum(-1))


def sharpness_frame(pset: PatternSet, heads: Sequence[HeadRef | str] | None = None) -> pd.DataFrame:
    """One row per (head, sample, real query position) of a :class:`PatternSet`.

    Columns: ``layer, head, kind, name, sample, query`` (index among the sample's real tokens),
    ``token`` (the query token), ``entropy, top1, argmax`` (key index among the real tokens),
    ``support, n_keys, normalized_entropy``. Padding positions are dropped.
    """
    chosen = [HeadRef.parse(h) for h in heads] if heads is not None else list(pset.heads)
    if not chosen:
        return pd.DataFrame(columns=list(FRAME_COLUMNS))
    records: list[pd.DataFrame] = []
    for i, tokens in enumerate(pset.str_tokens):
        stats = sharpness(pset.sample(i, chosen))  # padding removed: [n, q, k]
        norm = stats.normalized_entropy
        n_q = len(tokens)
        for j, h in enumerate(chosen):
            records.append(pd.DataFrame({
                "layer": h.layer, "head": h.head, "kind": h.kind, "name": h.name, "sample": i,
                "query": range(n_q), "token": tokens,
                "entropy": stats.entropy[j].cpu().numpy(), "top1": stats.top1[j].cpu().numpy(),
                "argmax": stats.argmax[j].cpu().numpy(), "support": stats.support[j].cpu().numpy(),
                "n_keys": stats.n_keys[j].cpu().numpy(), "normalized_entropy": norm[j].cpu().numpy(),
            }))
    return pd.concat(records, ignore_index=True)[list(FRAME_COLUMNS)]
