"""`Model`: a TransformerBridge plus what gna_interp needs to know about its heads."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

import torch
from jaxtyping import Float, Int
from torch import Tensor

from gna_interp.errors import HeadError, InputError
from gna_interp.models.arch import LayerSpec, detect_layers
from gna_interp.models.heads import HeadRef, parse_heads
from gna_interp.models.loading import ResolvedSpec


@dataclass
class TokenBatch:
    """Token ids and the matching attention mask (1 = real token, 0 = padding)."""

    ids: Int[Tensor, "batch pos"]
    attention_mask: Int[Tensor, "batch pos"]

    @property
    def padded(self) -> bool:
        return bool((self.attention_mask == 0).any())

    @property
    def pad(self) -> Int[Tensor, "batch"]:
        """Padding tokens in front of each row (the offset of its first real token, left padding)."""
        return (self.attention_mask == 0).sum(1)


class Model:
    """A loaded model: the TransformerLens bridge (``.bridge``), its tokenizer and its head layout.

    Tokenisation follows the Hugging Face tokenizer's own special-token policy, so ids equal what
    the plain HF model would be fed.
    """

    def __init__(self, bridge: Any, tokenizer: Any, source: ResolvedSpec | None = None) -> None:
        self.bridge = bridge
        self.tokenizer = tokenizer
        self.source = source
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token or tokenizer.unk_token
        self.layers: list[LayerSpec] = detect_layers(bridge)
        # keys a zoo model was trained with (its card's "keys"); tasks for it must draw keys from these
        self.kv_words: tuple[str, ...] | None = None
        self._by_layer_kind = {(s.layer, s.kind): s for s in self.layers if s.kind != "unsupported"}

    # ---- identity -------------------------------------------------------------------------
    @property
    def hf_model(self) -> torch.nn.Module:
        """The raw Hugging Face model inside the bridge (weights are shared, not copied)."""
        return self.bridge.original_model

    @property
    def cfg(self) -> Any:
        return self.bridge.cfg

    @property
    def name(self) -> str:
        return self.source.spec if self.source else str(getattr(self.cfg, "model_name", "model"))

    @property
    def device(self) -> torch.device:
        return next(self.hf_model.parameters()).device

    @property
    def n_layers(self) -> int:
        return len(self.bridge.blocks)

    @property
    def n_ctx(self) -> int:
        return int(getattr(self.cfg, "n_ctx", 0) or 0)

    @property
    def architecture(self) -> str:
        return type(self.hf_model).__name__

    def __repr__(self) -> str:
        counts = Counter(s.kind for s in self.layers)
        return f"Model({self.name!r}, {self.architecture}, layers={self.n_layers}, mixers={dict(counts)})"

    # ---- heads ----------------------------------------------------------------------------
    def layer_kinds(self) -> list[str]:
        """Mixer kind of each block, e.g. ``['ssm2', 'attn', 'ssm2']``; ``'ssm2+unsupported'`` when a
        block holds two mixers and one of them is not supported."""
        kinds: list[list[str]] = [[] for _ in range(self.n_layers)]
        for s in self.layers:
            kinds[s.layer].append(s.kind)
        return ["+".join(k) for k in kinds]

    def unsupported(self) -> list[LayerSpec]:
        """Token mixers gna_interp cannot analyse (RWKV time-mix, short convolutions, unbridged attention...)."""
        return [s for s in self.layers if s.kind == "unsupported"]

    def layer_spec(self, layer: int, kind: str) -> LayerSpec:
        """The mixer of ``kind`` in block ``layer``; a clear error if there is none."""
        if not 0 <= layer < self.n_layers:
            raise HeadError(f"layer {layer} is out of range: {self.name} has layers 0..{self.n_layers - 1}")
        spec = self._by_layer_kind.get((layer, kind))
        if spec is None:
            raise HeadError(
                f"layer {layer} of {self.name} has no {kind!r} mixer (it has: {self.layer_kinds()[layer]})"
            )
        return spec

    def heads(self, kind: str | None = None, channel_group: int = 1, layers: Iterable[int] | None = None) -> list[HeadRef]:
        """Every head of every supported mixer, in layer order.

        ``kind`` filters to ``attn``/``ssm2``/``ssm1``; ``channel_group=k`` groups k consecutive
        Mamba-1 channels into one unit (the last group may be narrower); ``layers`` restricts blocks.
        """
        if channel_group < 1:
            raise HeadError(f"channel_group must be >= 1, got {channel_group}")
        wanted = set(layers) if layers is not None else None
        out: list[HeadRef] = []
        for s in self.layers:
            if s.kind == "unsupported" or (kind is not None and s.kind != kind):
                continue
            if wanted is not None and s.layer not in wanted:
                continue
            if s.kind == "ssm1" and channel_group > 1:
                out.extend(HeadRef(s.layer, c, "ssm1", min(channel_group, s.n_heads - c))
                           for c in range(0, s.n_heads, channel_group))
            else:
                out.extend(HeadRef(s.layer, h, s.kind) for h in range(s.n_heads))  # type: ignore[arg-type]
        return out

    def check_head(self, head: HeadRef | str) -> HeadRef:
        """Parse and validate one head against this model; raise :class:`HeadError` if it does not exist."""
        h = HeadRef.parse(head)
        spec = self.layer_spec(h.layer, h.kind)
        if h.head + h.width > spec.n_heads:
            unit = {"attn": "query heads", "ssm2": "SSM heads", "ssm1": "channels"}[h.kind]
            raise HeadError(
                f"{h.name} is out of range: layer {h.layer} of {self.name} has {spec.n_heads} {unit} "
                f"(valid indices 0..{spec.n_heads - 1})"
            )
        return h

    def check_heads(self, heads: str | HeadRef | Sequence[str | HeadRef]) -> list[HeadRef]:
        """:meth:`check_head` over a comma-separated string or a list."""
        return [self.check_head(h) for h in parse_heads(heads)]

    # ---- tokens ---------------------------------------------------------------------------
    def tokenize(self, texts: str | Sequence[str], padding_side: str = "left") -> TokenBatch:
        """Tokenise one prompt or a batch (padded on ``padding_side``), checking the context length."""
        batch = [texts] if isinstance(texts, str) else list(texts)
        if not batch:
            raise InputError("no prompt given: pass a string or a non-empty list of strings")
        enc = self.tokenizer(batch, return_tensors="pt", padding=True, padding_side=padding_side)
        ids, mask = enc["input_ids"], enc["attention_mask"]
        if ids.shape[1] == 0:
            raise InputError("the prompt tokenizes to nothing; pass non-empty text")
        for row, keep, text in zip(ids.tolist(), mask.tolist(), batch):
            self.check_known([t for t, k in zip(row, keep) if k], text)
        self.check_length(ids.shape[1])
        return TokenBatch(ids.to(self.device), mask.to(self.device))

    def check_known(self, ids: Sequence[int], text: str) -> None:
        """Raise :class:`InputError` if ``text`` (tokenised to ``ids``) holds words outside the vocabulary."""
        unk = getattr(self.tokenizer, "unk_token_id", None)
        if unk is None or unk not in ids or str(self.tokenizer.unk_token) in text:
            return
        known = set(self.tokenizer.get_vocab())
        words = sorted({w for w in re.findall(r"[A-Za-z]+", text) if w not in known and f" {w}" not in known})
        hint = (f"; this model was trained on the keys in model.kv_words ({len(self.kv_words)} words): build tasks "
                f"with KVRetrieval(..., words=model.kv_words)" if self.kv_words else "")
        raise InputError(f"the prompt holds text outside {self.name}'s vocabulary (it becomes "
                         f"{self.tokenizer.unk_token!r}): {words[:8] or text[:60]!r}{hint}")

    def check_length(self, n_tokens: int) -> None:
        """Raise :class:`InputError` if ``n_tokens`` exceeds the model's context."""
        if self.n_ctx and n_tokens > self.n_ctx:
            raise InputError(
                f"prompt is {n_tokens} tokens long but {self.name} has a context of {self.n_ctx} tokens; "
                f"shorten the prompt (fewer dictionary pairs / samples) or pick a longer-context model"
            )

    def to_tokens(self, texts: str | Sequence[str]) -> Int[Tensor, "batch pos"]:
        """Token ids only (left-padded for a batch); use :meth:`tokenize` when you need the mask."""
        return self.tokenize(texts).ids

    def to_str_tokens(self, ids: Int[Tensor, "pos"] | Sequence[int]) -> list[str]:
        """Token strings of one sequence, as the tokenizer decodes each id on its own."""
        ids = ids.tolist() if isinstance(ids, Tensor) else list(ids)
        return [self.tokenizer.decode([i]) for i in ids]

    def as_batch(self, inputs: str | Sequence[str] | Tensor | TokenBatch,
                 attention_mask: Tensor | None = None) -> TokenBatch:
        """Normalise text, ids or a :class:`TokenBatch` into a :class:`TokenBatch` on the model's device."""
        if isinstance(inputs, TokenBatch):
            return inputs
        if isinstance(inputs, Tensor):
            ids = inputs if inputs.dim() == 2 else inputs.unsqueeze(0)
            self.check_length(ids.shape[1])
            mask = torch.ones_like(ids) if attention_mask is None else attention_mask.reshape(ids.shape)
            return TokenBatch(ids.to(self.device), mask.to(self.device))
        return self.tokenize(inputs)

    def pad_ids(self, seqs: Sequence[Sequence[int]]) -> TokenBatch:
        """Left-pad lists of token ids into one :class:`TokenBatch` (padding masked out)."""
        if not seqs:
            raise InputError("no token sequences given")
        pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        width = max(len(x) for x in seqs)
        ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(seqs), width), dtype=torch.long)
        for k, x in enumerate(seqs):
            ids[k, width - len(x):] = torch.tensor(list(x), dtype=torch.long)
            mask[k, width - len(x):] = 1
        return self.as_batch(ids, mask)

    # ---- running --------------------------------------------------------------------------
    def _forward_kwargs(self, batch: TokenBatch) -> dict[str, Any]:
        return {"attention_mask": batch.attention_mask} if batch.padded else {}

    @torch.no_grad()
    def forward(self, inputs: str | Sequence[str] | Tensor | TokenBatch) -> Float[Tensor, "batch pos vocab"]:
        """Logits of the bridge for text, ids or a TokenBatch (padding handled through the mask)."""
        batch = self.as_batch(inputs)
        return self.bridge(batch.ids, return_type="logits", **self._forward_kwargs(batch))

    def run_with_cache(self, inputs: str | Sequence[str] | Tensor | TokenBatch,
                       names_filter: Callable[[str], bool] | Sequence[str] | str | None = None,
                       **kwargs: Any) -> tuple[Float[Tensor, "batch pos vocab"], Any]:
        """Bridge ``run_with_cache`` with the padding mask applied; returns ``(logits, cache)``."""
        batch = self.as_batch(inputs)
        with torch.no_grad():
            return self.bridge.run_with_cache(batch.ids, names_filter=names_filter,
                                              **self._forward_kwargs(batch), **kwargs)

    def run_with_hooks(self, inputs: str | Sequence[str] | Tensor | TokenBatch,
                       fwd_hooks: Sequence[tuple[str | Callable, Callable]] = (),
                       **kwargs: Any) -> Float[Tensor, "batch pos vocab"]:
        """Bridge ``run_with_hooks`` with the padding mask applied; hooks are removed afterwards."""
        batch = self.as_batch(inputs)
        with torch.no_grad():
            return self.bridge.run_with_hooks(batch.ids, fwd_hooks=list(fwd_hooks),
                                              **self._forward_kwargs(batch), **kwargs)

    @torch.no_grad()
    def generate(self, prompt: str, max_new_tokens: int = 16) -> str:
        """Greedy continuation of ``prompt`` through the bridge (no sampling, no KV cache)."""
        ids = self.tokenize(prompt).ids
        start = ids.shape[1]
        for _ in range(max_new_tokens):
            self.check_length(ids.shape[1] + 1)
            nxt = self.bridge(ids, return_type="logits")[:, -1].argmax(-1, keepdim=True)
            ids = torch.cat([ids, nxt], dim=1)
            if self.tokenizer.eos_token_id is not None and int(nxt) == self.tokenizer.eos_token_id:
                break
        return self.tokenizer.decode(ids[0, start:])
