"""`Model`: a TransformerBridge plus what gna_interp needs to know about its heads."""

from __future__ import annotations

import contextlib
import copy
import math
import re
import warnings
import weakref
from collections import Counter
from dataclasses import dataclass, replace
from typing import Any, Callable, Collection, Iterable, Iterator, Sequence

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from gna_interp.constants import TOKENIZER_CONFIG
from gna_interp.errors import BridgeOnlyError, HeadError, InputError, UnsupportedArchitectureError
from gna_interp.models.arch import LayerSpec, detect_layers
from gna_interp.models.call_args import (CACHE_KEYWORDS, FORWARD_KEYWORDS, HOOK_KEYWORDS, TEXT_KEYWORDS, Hooks,
                                         check_cache_options, check_flag, check_forward_options, check_hooks,
                                         check_keywords, check_loss_rows, check_names_filter, check_new_tokens,
                                         check_padding_side, check_return_type, check_run_options, gradient_hooks)
from gna_interp.models.heads import HeadRef, parse_heads
from gna_interp.models.hf import quiet_transformers, unwrap
from gna_interp.models.mixer import HeadSite
from gna_interp.models.spec import ResolvedSpec
from gna_interp.models.tokens import token_labels as text_labels, token_offsets

# the bridges that gna_interp Models own: load_model(model.bridge) refuses them (use the Model itself)
_OWNED: "weakref.WeakSet[torch.nn.Module]" = weakref.WeakSet()


# TransformerLens names a Model does not carry, with what to use instead (the rest of the bridge's attributes
# are refused with a pointer to ``model.bridge.NAME``: see Model.__getattr__)
_INSTEAD = {
    "add_hook": "model.hooks([(name, fn)]) as a with-block, or model.run_with_hooks(text, fwd_hooks=[(name, fn)]): "
                "a Model's hooks are always removed when the block or the run ends",
    "add_perma_hook": "model.hooks([(name, fn)]) as a with-block (a Model keeps no hook between runs)",
    "reset_hooks": "nothing to reset: a Model's hooks are removed when their with-block or run ends",
    "remove_all_hook_fns": "nothing to remove: a Model's hooks are removed when their with-block or run ends",
    "get_token_position": "model.to_str_tokens(text).index(token_string) (positions as model.to_tokens(text) gives them)",
    "from_pretrained": "gna_interp.load_model(spec) (a hub id, a folder, a .gguf file, zoo:NAME) or "
                       "gna_interp.load_model(hf_model, tokenizer)",
    "boot_transformers": "gna_interp.load_model(spec), or gna_interp.load_model(bridge) for a bridge you booted",
}


def owned_by_model(bridge: Any) -> bool:
    """Whether ``bridge`` is the bridge of a gna_interp :class:`Model` (``model.bridge``)."""
    try:
        return bridge in _OWNED
    except TypeError:  # not weak-referenceable: not one of ours
        return False


def checkpoint_tokenizer(tokenizer: Any) -> Any:
    """The BOS rule, the same for every family and every way of loading: text is tokenised as the checkpoint's
    own tokenizer does by default (``AutoTokenizer.from_pretrained(checkpoint)``), so a BOS token is there only
    where that tokenizer adds one (Llama-3 and Gemma tokenizers do; SmolLM2, GPT-2, Qwen and the zoo and tiny
    byte tokenizers do not).

    TransformerLens's boot replaces a tokenizer that adds no BOS by one reloaded with ``add_bos_token=True``: a
    bridge a user booted carries that tokenizer, and its ids would start with a BOS the checkpoint's tokenizer
    does not add (other logits than ``load_model(folder)`` or ``load_model(hf_model, tokenizer)`` give). A
    tokenizer whose ``add_bos_token`` was switched on when it was loaded is therefore reloaded from its
    ``name_or_path`` with its saved setting; the one returned otherwise is ``tokenizer`` itself. When the files
    are gone (nothing to reload), the tokenizer is kept and a warning says its BOS policy may differ."""
    kwargs = dict(getattr(tokenizer, "init_kwargs", None) or {})
    if kwargs.get("add_bos_token") is not True:
        return tokenizer
    source = str(kwargs.pop("name_or_path", "") or getattr(tokenizer, "name_or_path", "") or "")
    kwargs.pop("add_bos_token", None)
    if not source or _saved_add_bos(source) is True:  # built in memory (its own setting), or the checkpoint adds BOS
        return tokenizer
    try:
        from transformers import AutoTokenizer

        with quiet_transformers():
            default = AutoTokenizer.from_pretrained(source, **{**kwargs, "local_files_only": True})
    except Exception as e:  # transformers raises many types for files that are gone or unreadable
        warnings.warn(f"the tokenizer of this model was loaded with add_bos_token=True and its checkpoint {source!r} "
                      f"cannot be read to restore the saved setting ({type(e).__name__}); gna_interp uses it as it is, "
                      f"so ids may start with a BOS token where load_model(folder) would put none", stacklevel=3)
        return tokenizer
    if len(default) != len(tokenizer):  # another tokenizer lives there now: keep the one given
        return tokenizer
    default.padding_side = tokenizer.padding_side
    return default


def check_mask(mask: Any, ids: Tensor, what: str = "attention_mask") -> None:
    """Raise :class:`InputError` unless ``mask`` is a tensor of ``ids``'s shape ``[batch, pos]`` holding only 0 and 1
    (1 = real token, 0 = padding)."""
    if not isinstance(mask, Tensor):
        raise InputError(f"{what} must be a tensor of 0 and 1 shaped like the ids {tuple(ids.shape)}, got "
                         f"{type(mask).__name__}")
    if tuple(mask.shape) != tuple(ids.shape):
        raise InputError(f"{what} has shape {tuple(mask.shape)} but the ids have {tuple(ids.shape)}: pass one 0/1 "
                         f"entry per token (1 = real token, 0 = padding)")
    if mask.is_complex() or (mask.numel() and not mask.is_meta and not bool(((mask == 0) | (mask == 1)).all())):
        raise InputError(f"{what} may hold only 0 (padding) and 1 (real token)")


MEAN_ACTIVATIONS = "model.mean_activations"  # Model.facts key: (prompts and weights, {hook: mean})

# unsigned integer dtypes torch stores but barely computes with (no comparison, no min or max)
_BARE_UNSIGNED = tuple(getattr(torch, n) for n in ("uint16", "uint32", "uint64") if hasattr(torch, n))

_BOS_WITH_IDS = ("prepend_bos and padding_side apply to text: token ids are fed exactly as given. Leave them out, or "
                 "pass the text (model.to_tokens(text, prepend_bos=True) shows the ids it becomes)")


@dataclass
class TokenBatch:
    """Token ids and the matching attention mask (1 = real token, 0 = padding).

    A *packed* batch (several continuations of one prompt in one row, see
    :func:`~gna_interp.engine.layout.layout_chunks`) also carries ``tree``: ``tree[b, q, k]`` is True
    where position ``q`` may attend to position ``k`` (its prompt and its own branch), and
    ``positions``, the position id of every token (siblings share one).
    """

    ids: Int[Tensor, "batch pos"]
    attention_mask: Int[Tensor, "batch pos"]
    tree: Bool[Tensor, "batch pos pos"] | None = None
    positions: Int[Tensor, "batch pos"] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.ids, Tensor) or self.ids.dim() != 2:
            raise InputError(f"TokenBatch ids must be a [batch, pos] tensor, got "
                             f"{tuple(self.ids.shape) if isinstance(self.ids, Tensor) else type(self.ids).__name__}")
        check_mask(self.attention_mask, self.ids, "TokenBatch attention_mask")
        shape = tuple(self.ids.shape)
        for name, value, want in (("tree", self.tree, (*shape, shape[1])), ("positions", self.positions, shape)):
            if value is not None and (not isinstance(value, Tensor) or tuple(value.shape) != want):
                got = tuple(value.shape) if isinstance(value, Tensor) else type(value).__name__
                raise InputError(f"TokenBatch {name} must have shape {want} (the ids are {shape}), got {got}")

    @classmethod
    def left_padded(cls, seqs: Sequence[Sequence[int]], pad_id: int, device: torch.device | str = "cpu") -> "TokenBatch":
        """Lists of token ids left-padded with ``pad_id`` into one batch on ``device``, the padding masked out."""
        return cls.from_rows(seqs, pad_id, device)

    @classmethod
    def from_rows(cls, seqs: Sequence[Sequence[int]], pad_id: int, device: torch.device | str = "cpu",
                  side: str = "left") -> "TokenBatch":
        """Lists of token ids padded with ``pad_id`` into one batch on ``device``, the padding masked out; on the
        left unless ``side="right"``."""
        if not seqs:
            raise InputError("no token sequences given")
        width = max(len(x) for x in seqs)
        ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(seqs), width), dtype=torch.long)
        for k, x in enumerate(seqs):
            cols = slice(width - len(x), width) if side == "left" else slice(0, len(x))
            ids[k, cols] = torch.tensor(list(x), dtype=torch.long)
            mask[k, cols] = 1
        return cls(ids.to(device), mask.to(device))

    def select(self, rows: Sequence[int] | Tensor) -> "TokenBatch":
        """The batch restricted to ``rows``."""
        idx = torch.as_tensor(rows, dtype=torch.long, device=self.ids.device)
        return TokenBatch(self.ids[idx], self.attention_mask[idx],
                          None if self.tree is None else self.tree[idx],
                          None if self.positions is None else self.positions[idx])

    @property
    def padded(self) -> bool:
        return bool((self.attention_mask == 0).any())

    @property
    def pad(self) -> Int[Tensor, "batch"]:
        """Padding tokens in front of each row (the offset of its first real token, left padding)."""
        return (self.attention_mask == 0).sum(1)


def _saved_add_bos(source: str) -> Any:
    """The ``add_bos_token`` saved in ``source``'s ``tokenizer_config.json`` (a folder, or a hub id in the local
    cache); None when it is not saved or cannot be read."""
    import json
    from pathlib import Path

    path: Any = Path(source) / TOKENIZER_CONFIG if source and Path(source).is_dir() else None
    if path is None and source:
        try:
            from huggingface_hub import try_to_load_from_cache

            path = try_to_load_from_cache(source, TOKENIZER_CONFIG)
        except Exception:  # not a hub id
            path = None
    try:
        saved = json.loads(Path(path).read_text()) if isinstance(path, (str, Path)) else {}
    except (OSError, ValueError):
        return None
    return saved.get("add_bos_token") if isinstance(saved, dict) else None


class Model:
    """A loaded model: the TransformerLens bridge, its tokenizer and its head layout.

    ``Model`` is the only code that touches the bridge: everything else runs the model through its
    methods (:meth:`forward`, :meth:`run_with_hooks`, :meth:`run_with_cache`, :meth:`hooks`,
    :meth:`blocks`, :meth:`unembed`) and learns about heads from :meth:`heads`, :meth:`layer_spec` and
    each kind's adapter. Tokenisation follows the checkpoint tokenizer's own special-token policy
    (:func:`checkpoint_tokenizer`, however the model was loaded), so ids equal what the plain HF model would be fed.
    """

    def __init__(self, bridge: Any, tokenizer: Any, source: ResolvedSpec | None = None) -> None:
        self.bridge = bridge
        tokenizer = checkpoint_tokenizer(tokenizer)
        self.tokenizer = tokenizer
        self.source = source
        _OWNED.add(bridge)
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token or tokenizer.unk_token
        self.layers: list[LayerSpec] = detect_layers(bridge)
        # keys a zoo model was trained with (its card's "keys"); tasks for it must draw keys from these
        self.kv_words: tuple[str, ...] | None = None
        self._by_layer_kind = {(s.layer, s.kind): s for s in self.layers if s.supported}
        # what the engine established about this model once (e.g. whether its head reads in vocabulary blocks), by
        # the engine's own keys; kept here so that it lives and dies with the model
        self.facts: dict[str, Any] = {}

    def __getattr__(self, name: str) -> Any:
        """TransformerLens names a Model does not carry raise :class:`BridgeOnlyError` (an ``AttributeError``) that
        says what to use: a Model method, or ``model.bridge.NAME`` (the TransformerLens bridge, for weights such as
        ``W_U`` and everything else TransformerLens offers)."""
        bridge = self.__dict__.get("bridge")
        if name.startswith("_") or bridge is None:
            raise AttributeError(f"'Model' object has no attribute {name!r}")
        if name in _INSTEAD:
            raise BridgeOnlyError(f"a gna_interp Model has no {name!r}: use {_INSTEAD[name]}")
        if hasattr(bridge, name):
            raise BridgeOnlyError(f"a gna_interp Model has no {name!r}; its TransformerLens bridge does: "
                                  f"model.bridge.{name} (the Model's methods list: see docs/python.md, "
                                  f"'Coming from TransformerLens')")
        raise AttributeError(f"'Model' object has no attribute {name!r}")

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
    def in_memory(self) -> bool:
        """Whether this model was wrapped from an object in memory (:func:`~gna_interp.models.loading.load_in_memory`):
        its :attr:`name` is ``<in-memory ARCH>`` and no spec can reload it."""
        return bool(self.source and self.source.in_memory)

    @property
    def device(self) -> torch.device:
        return next(self.hf_model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        """Dtype of the weights (``float32``, ``bfloat16`` or ``float16``); scores and patterns are float32 whatever it is."""
        return next((p.dtype for p in self.hf_model.parameters() if p.dtype.is_floating_point), torch.float32)

    @property
    def is_meta(self) -> bool:
        """Whether the model holds shapes only (loaded with ``device="meta"``): heads and hooks, no weights."""
        return self.device.type == "meta"

    def check_runnable(self) -> None:
        """Raise :class:`InputError` if the model cannot run a forward (it was loaded on the meta device)."""
        if self.is_meta:
            raise InputError(
                f"{self.name} was loaded on the meta device (shapes only, no weights), so it cannot run a forward. "
                f"A meta model lists heads and hooks and feeds the cost estimate (gna_interp.models.estimate."
                f"estimate_scan, gna models --estimate). To run it, load a folder or hub id holding the checkpoint's "
                f"weights on a real device: load_model(DIR_WITH_WEIGHTS, device='cuda', dtype='bfloat16') "
                f"(gna --device cuda scan --model DIR_WITH_WEIGHTS --dtype bfloat16)")

    @property
    def n_layers(self) -> int:
        return len(self.bridge.blocks)

    @property
    def n_ctx(self) -> int:
        return int(getattr(self.cfg, "n_ctx", 0) or 0)

    @property
    def d_vocab(self) -> int:
        """Width of the model's logits: the config's vocabulary (else the tokenizer's)."""
        return int(getattr(self.cfg, "d_vocab", 0) or len(self.tokenizer))

    @property
    def architecture(self) -> str:
        return type(self.hf_model).__name__

    @property
    def family(self) -> str:
        """The Hugging Face ``model_type`` of the config (``llama``, ``mamba2``, ``jamba``, ...; ``""`` if none)."""
        return str(getattr(getattr(self.hf_model, "config", None), "model_type", "") or "")

    def head_counts(self) -> dict[str, int]:
        """Heads of each kind over all supported mixers (``{"attn": 16, "ssm2": 8}``), counted from the layer
        specs (every Mamba-1 channel one head, as :meth:`heads` lists them)."""
        out: dict[str, int] = {}
        for s in self.layers:
            if s.supported:
                out[s.kind] = out.get(s.kind, 0) + s.n_heads
        return out

    def __repr__(self) -> str:
        return (f"Model({self.name!r}, {self.architecture}, layers={self.n_layers}, heads={self.head_counts()}, "
                f"{str(self.dtype).removeprefix('torch.')}, {self.device})")

    def _repr_html_(self) -> str:
        """Jupyter's display: name, family and architecture, blocks, head kinds with their counts, dtype, device."""
        from gna_interp import html_repr as _html

        blocks = ", ".join(f"{n}x {k}" for k, n in Counter(self.layer_kinds()).items())
        facts = [("family", self.family or "?"), ("architecture", self.architecture),
                 ("layers", f"{self.n_layers} ({blocks})" if blocks else self.n_layers),
                 ("dtype", str(self.dtype).removeprefix("torch.")), ("device", str(self.device))]
        if self.n_ctx:
            facts.append(("context", f"{self.n_ctx} tokens"))
        if self.source is not None and not self.in_memory:
            facts.append(("loaded from", f"{self.source.source}: {self.source.location}"))
        rows, seen = [], {}
        for s in self.layers:
            if s.supported:
                seen.setdefault(s.kind, []).append(s)
        for kind, specs in seen.items():
            a = specs[0].adapter
            per = sorted({s.n_heads for s in specs})
            rows.append([kind, a.title, f"L{specs[0].layer}{a.letter}0",
                         len(specs), "/".join(map(str, per)), sum(s.n_heads for s in specs), a.describe(specs[0])])
        parts = [_html.title(f"Model {self.name}", f"{self.architecture}, {self.n_layers} layers"), _html.facts(facts),
                 _html.table(["kind", "heads are", "e.g.", "layers", "per layer", "total", "layout"], rows)]
        bad = self.unsupported()
        if bad:
            parts.append(_html.title(f"{len(bad)} mixer(s) not supported (no heads listed)",
                                     ", ".join(sorted({s.hf_class for s in bad}))))
        return _html.block(parts)

    # ---- heads ----------------------------------------------------------------------------
    def layer_kinds(self) -> list[str]:
        """Mixer kind of each block, e.g. ``['ssm2', 'attn', 'ssm2']``; ``'ssm2+unsupported'`` when a
        block holds two mixers and one of them is not supported; ``'no mixer'`` for a block without a
        token mixer (Nemotron-H's MLP-only blocks)."""
        kinds: list[list[str]] = [[] for _ in range(self.n_layers)]
        for s in self.layers:
            kinds[s.layer].append(s.kind)
        return ["+".join(k) or "no mixer" for k in kinds]

    def unsupported(self) -> list[LayerSpec]:
        """Token mixers gna_interp cannot analyse (RWKV time-mix, short convolutions, unbridged attention...)."""
        return [s for s in self.layers if not s.supported]

    def describe(self) -> str:
        """A few lines: architecture, blocks by mixer kind, head counts by kind, one line per kind's layout."""
        blocks = ", ".join(f"{n}x {k}" for k, n in Counter(self.layer_kinds()).items())
        units = ", ".join(f"{n} {k}" for k, n in Counter(h.kind for h in self.heads()).items()) or "none"
        lines = [f"  architecture: {self.architecture}", f"  blocks: {self.n_layers} ({blocks})", f"  heads: {units}"]
        first: dict[str, LayerSpec] = {}
        for s in self.layers:
            if s.supported:
                first.setdefault(s.kind, s)
        lines += [f"  {s.adapter.describe(s)}" for s in first.values()]
        lines += [f"  UNSUPPORTED mixer at {s.bridge_path}: {s.hf_class} (no heads listed for it)"
                  for s in self.unsupported()]
        return "\n".join(lines)

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

        ``kind`` filters to one kind (``attn``/``ssm2``/``ssm1``/...); ``channel_group=k`` groups k
        consecutive units of groupable kinds (Mamba-1 channels) into one (the last group may be
        narrower); ``layers`` restricts blocks.
        """
        if channel_group < 1:
            raise HeadError(f"channel_group must be >= 1, got {channel_group}")
        wanted = set(layers) if layers is not None else None
        out: list[HeadRef] = []
        for s in self.layers:
            if not s.supported or (kind is not None and s.kind != kind):
                continue
            if wanted is not None and s.layer not in wanted:
                continue
            out.extend(self._layer_heads(s, channel_group if s.adapter.groupable else 1))
        return out

    @staticmethod
    def _layer_heads(s: LayerSpec, group: int) -> list[HeadRef]:
        return [HeadRef(s.layer, c, s.kind, min(group, s.n_heads - c)) for c in range(0, s.n_heads, group)]

    def default_heads(self) -> list[HeadRef]:
        """Heads shown when none are named: every head, except that a kind with many units per layer
        (Mamba-1 channels) shows each layer as ``adapter.default_groups`` equal groups."""
        out: list[HeadRef] = []
        for s in self.layers:
            if s.supported:
                n = s.adapter.default_groups
                out.extend(self._layer_heads(s, -(-s.n_heads // n) if n else 1))
        return out

    def check_head(self, head: HeadRef | str) -> HeadRef:
        """Parse and validate one head against this model; raise :class:`HeadError` if it does not exist."""
        h = HeadRef.parse(head)
        spec = self.layer_spec(h.layer, h.kind)
        if h.head + h.width > spec.n_heads:
            raise HeadError(
                f"{h.name} is out of range: layer {h.layer} of {self.name} has {spec.n_heads} {spec.adapter.unit} "
                f"(valid indices 0..{spec.n_heads - 1})"
            )
        return h

    def check_heads(self, heads: str | HeadRef | Sequence[str | HeadRef]) -> list[HeadRef]:
        """:meth:`check_head` over a comma-separated string or a list."""
        return [self.check_head(h) for h in parse_heads(heads)]

    def head_site(self, head: HeadRef | str) -> HeadSite:
        """Where ``head``'s output lives: the hook at its output projection's input and its channels there."""
        h = self.check_head(head)
        spec = self.layer_spec(h.layer, h.kind)
        site = spec.adapter.site(spec, h)
        if not self.has_hook(site.hook):
            raise HeadError(f"cannot reach {h.name}: the bridge of {self.name} has no hook {site.hook!r} at the "
                            f"input of the layer's output projection ({spec.hf_class})")
        return site

    def output_projection(self, head: HeadRef | str) -> Float[Tensor, "d_model width"]:
        """Weight of the output projection that ``head``'s channels (:meth:`head_site`) feed."""
        h = self.check_head(head)
        spec = self.layer_spec(h.layer, h.kind)
        return spec.adapter.output_projection(self, spec)

    @property
    def packs_rows(self) -> bool:
        """Whether several continuations of a prompt may share one row under a tree-shaped attention mask
        (:class:`TokenBatch` ``tree``) whatever the rows' length: every mixer is attention, which honours an explicit
        mask, and no layer restricts attention to a window or chunk (an explicit mask would override that)."""
        return self.packs_rows_up_to(math.inf)

    def packs_rows_up_to(self, length: float) -> bool:
        """Whether rows of up to ``length`` tokens may be packed (:attr:`packs_rows`, :attr:`longest_packed_row`)."""
        return length <= self.longest_packed_row

    @property
    def longest_packed_row(self) -> float:
        """The longest row, in tokens, that may be packed (:attr:`packs_rows`): ``math.inf`` where any may, 0 where
        none may. On a model whose attention has a sliding window, rows shorter than the window -- the explicit tree
        mask replaces the window, which would never bite on such rows (chunked or local attention stays unpacked)."""
        conf = getattr(self.hf_model, "config", None)
        if not self.splits_prefix_cache or any(getattr(conf, a, None) for a in ("attention_chunk_size", "local_window")):
            return 0
        window = getattr(conf, "sliding_window", None)
        if not window:
            return math.inf
        return window - 1 if isinstance(window, int) else 0

    @property
    def splits_prefix_cache(self) -> bool:
        """Whether scoring may run a prompt once and continue candidates from its cache: every mixer
        keeps a Hugging Face cache that can be split per row and continued (attention-only models)."""
        return bool(self.layers) and all(s.supported and s.adapter.splittable_cache for s in self.layers)

    # ---- tokens ---------------------------------------------------------------------------
    def tokenize(self, texts: str | Sequence[str], padding_side: str | None = "left",
                 prepend_bos: bool | None = None, truncate: bool = False) -> TokenBatch:
        """Tokenise one prompt or a batch (padded on ``padding_side``, left when None), checking the context length.

        ``prepend_bos`` as in TransformerLens: None follows the tokenizer's own policy (a BOS token only where the
        checkpoint's tokenizer adds one, see :func:`checkpoint_tokenizer`); True puts the BOS token first in every
        row (once: a row that already starts with it is left alone), which gives the ids of TransformerLens's
        ``bridge.to_tokens(text)``; False removes a BOS token the tokenizer added. A tokenizer without a BOS token
        refuses ``prepend_bos=True`` (:class:`InputError`). ``truncate=True`` keeps the first :attr:`n_ctx` tokens
        of each row instead of refusing a longer one."""
        batch = self._texts(texts)
        check_flag("prepend_bos", prepend_bos, optional=True)
        check_padding_side(padding_side)
        check_flag("truncate", truncate)
        padding_side = "left" if padding_side is None else padding_side
        if prepend_bos is not None or truncate:
            return self._tokenize_rows(batch, padding_side, prepend_bos, self.n_ctx if truncate else 0)
        enc = self.tokenizer(batch, return_tensors="pt", padding=True, padding_side=padding_side)
        ids, mask = enc["input_ids"], enc["attention_mask"]
        if ids.shape[1] == 0:
            raise InputError("the prompt tokenizes to nothing; pass non-empty text")
        for row, keep, text in zip(ids.tolist(), mask.tolist(), batch):
            self.check_known([t for t, k in zip(row, keep) if k], text)
        self.check_length(ids.shape[1])
        return TokenBatch(ids.to(self.device), mask.to(self.device))

    @staticmethod
    def _texts(texts: Any) -> list[str]:
        """``texts`` as a non-empty list of strings; :class:`InputError` otherwise."""
        batch = [texts] if isinstance(texts, str) else list(texts) if isinstance(texts, (list, tuple)) else None
        if batch is None or not all(isinstance(t, str) for t in batch):
            raise InputError(f"a prompt must be a string or a list of strings, got {type(texts).__name__}"
                             + (f" holding {type(next(t for t in batch if not isinstance(t, str))).__name__}"
                                if batch else ""))
        if not batch:
            raise InputError("no prompt given: pass a string or a non-empty list of strings")
        return batch

    @property
    def bos_id(self) -> int | None:
        """The tokenizer's BOS token id (None when it has none); :meth:`tokenize` puts it first only where the
        tokenizer does, or when ``prepend_bos=True`` asks for it."""
        bos = getattr(self.tokenizer, "bos_token_id", None)
        return int(bos) if bos is not None else None

    def _tokenize_rows(self, batch: list[str], padding_side: str, prepend_bos: bool | None, limit: int) -> TokenBatch:
        """:meth:`tokenize` one row at a time: the BOS token put first or removed as ``prepend_bos`` says (None:
        left as the tokenizer gives it), each row cut to its first ``limit`` tokens (0: not cut)."""
        bos = self.bos_id
        if prepend_bos and bos is None:
            raise InputError(f"prepend_bos=True, but the tokenizer of {self.name} has no BOS token: leave prepend_bos "
                             f"out (its text is fed as the tokenizer encodes it) or pass ids you built yourself")
        rows = []
        for text in batch:
            row = list(self.tokenizer(text)["input_ids"])
            self.check_known(row, text)
            starts = bool(row) and row[0] == bos
            if prepend_bos and not starts:
                row.insert(0, bos)
            elif prepend_bos is False and starts and not text.startswith(str(self.tokenizer.bos_token)):
                row.pop(0)  # the tokenizer's own BOS (text that starts with the BOS string keeps it)
            rows.append(row[:limit] if limit else row)
        if not max(len(r) for r in rows):
            raise InputError("the prompt tokenizes to nothing; pass non-empty text")
        return self.pad_ids(rows, side=padding_side)

    def to_tokens(self, input: str | Sequence[str], prepend_bos: bool | None = None,
                  padding_side: str | None = None, move_to_device: bool = True,
                  truncate: bool = False) -> Int[Tensor, "batch pos"]:
        """Token ids ``[batch, pos]`` of text or a list of texts, as TransformerLens's ``to_tokens``; these are the ids
        :meth:`forward`, :meth:`run_with_cache` and :meth:`run_with_hooks` feed for the same text and flags.

        Differences from TransformerLens, on purpose: with ``prepend_bos=None`` (the default) a BOS token is there
        only where the checkpoint's tokenizer adds one (``prepend_bos=True`` gives TransformerLens's ids, BOS
        first); a batch is padded on the left unless ``padding_side="right"`` (the padding is the pad id: use
        :meth:`tokenize` for the mask too); text longer than the context is refused unless ``truncate=True`` (then
        each row keeps its first :attr:`n_ctx` tokens, TransformerLens's default). ``move_to_device=False`` returns the
        ids on the CPU."""
        if isinstance(input, Tensor):
            raise InputError("to_tokens takes text or a list of texts; these are already token ids (to_string turns "
                             "ids back into text)")
        check_flag("move_to_device", move_to_device)
        ids = self.tokenize(input, padding_side, prepend_bos, truncate).ids
        return ids if move_to_device else ids.cpu()

    def to_string(self, tokens: Int[Tensor, "... pos"] | Sequence[int] | int) -> str | list[str]:
        """Text of token ids, as TransformerLens's ``to_string``: one sequence (``[pos]``, a list of ints, one int)
        gives a string, a batch ``[batch, pos]`` a list of strings. Special tokens (BOS, padding) are decoded too."""
        if isinstance(tokens, Tensor):
            if tokens.is_floating_point() or tokens.is_complex() or tokens.dtype == torch.bool or tokens.dim() > 2:
                raise InputError(f"to_string takes integer token ids ([pos] or [batch, pos]), got a {tokens.dtype} "
                                 f"tensor of shape {tuple(tokens.shape)}")
            if tokens.dim() == 2:
                self.check_ids(tokens)
                return [self.tokenizer.decode(row.tolist()) for row in tokens]
            ids = tokens.reshape(-1).tolist()
        elif isinstance(tokens, int) and not isinstance(tokens, bool):
            ids = [tokens]
        elif isinstance(tokens, (list, tuple)) and all(isinstance(i, int) and not isinstance(i, bool) for i in tokens):
            ids = list(tokens)
        else:
            raise InputError(f"to_string takes token ids (a tensor, a list of ints or an int), got "
                             f"{type(tokens).__name__}")
        self.check_ids(torch.tensor([ids], dtype=torch.long) if ids else torch.zeros((1, 0), dtype=torch.long))
        return self.tokenizer.decode(ids)

    def to_single_token(self, string: str) -> int:
        """The id of ``string`` when it is exactly one token (no BOS added), as TransformerLens's
        ``to_single_token``; :class:`InputError` naming the tokens otherwise."""
        if not isinstance(string, str):
            raise InputError(f"to_single_token takes a string, got {type(string).__name__}")
        ids = self.to_tokens(string, prepend_bos=False)[0].tolist()
        if len(ids) != 1:
            raise InputError(f"{string!r} is {len(ids)} tokens for {self.name}, not one: "
                             f"{[self.tokenizer.decode([i]) for i in ids]}")
        return int(ids[0])

    def check_known(self, ids: Sequence[int], text: str, hint: str | None = None, what: str = "the prompt") -> None:
        """Raise :class:`InputError` if ``text`` (tokenised to ``ids``) holds words outside the vocabulary, i.e. some
        id is the unknown token while ``text`` does not hold the unknown-token string itself. The message calls the
        text ``what``, names the words and ends with ``hint`` (default: for a model with :attr:`kv_words`, how to
        build tasks from them).
        Every way text enters a model calls it: :meth:`tokenize` (so :meth:`to_tokens` and every run on text),
        :meth:`to_str_tokens` and :meth:`token_labels` of text, the scoring engine's prompts and candidates and the
        lm-eval model's ``tok_encode``."""
        unk = getattr(self.tokenizer, "unk_token_id", None)
        if unk is None or unk not in ids or str(self.tokenizer.unk_token) in text:
            return
        words = self._unknown_words(text, unk)
        if hint is None:
            hint = (f"this model was trained on the keys in model.kv_words ({len(self.kv_words)} words): build tasks "
                    f"with KVRetrieval(..., words=model.kv_words)" if self.kv_words else "")
        hint = f"; {hint}" if hint else ""
        raise InputError(f"{what} holds text outside {self.name}'s vocabulary (it becomes "
                         f"{self.tokenizer.unk_token!r}): {words[:8] or text[:60]!r}{self._spacing_note(words)}{hint}")

    def _spacing_note(self, pieces: Sequence[str]) -> str:
        """For the first unknown piece that is a token once the whitespace around it is removed (``' apple'``, where
        ``'apple'`` is a token), a note that the whitespace is what fails; ``""`` when there is none."""
        unk = getattr(self.tokenizer, "unk_token_id", None)
        for piece in pieces:
            bare = piece.strip()
            if bare and bare != piece and unk not in self.tokenizer(bare, add_special_tokens=False)["input_ids"]:
                lead = piece[:len(piece) - len(piece.lstrip())]
                space = f"the {lead!r} before" if lead else f"the {piece[len(piece.rstrip()):]!r} after"
                return f" ({piece!r} is no token but {bare!r} is: {space} it is what fails; remove it)"
        return ""

    def _unknown_words(self, text: str, unk: int) -> list[str]:
        """The pieces of ``text`` that become the unknown token, whitespace included (by the tokenizer's offsets;
        without offsets, the words that are no vocabulary entry)."""
        if getattr(self.tokenizer, "is_fast", False):
            ids, offsets = token_offsets(self.tokenizer, text)
            found = sorted({text[a:b] for i, (a, b) in zip(ids, offsets) if i == unk and b > a})
            if found:
                return found
        known = set(self.tokenizer.get_vocab())
        return sorted({w for w in re.findall(r"[A-Za-z]+", text) if w not in known and f" {w}" not in known})

    def check_ids(self, ids: Tensor) -> None:
        """Raise :class:`InputError` unless ``ids`` are integer token ids inside the vocabulary, ``[batch, pos]``."""
        if ids.dim() != 2 or ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
            raise InputError(f"token ids must be an integer tensor [batch, pos] (or [pos]), got {ids.dtype} of shape "
                             f"{tuple(ids.shape)}: pass integer ids (any integer dtype; ids.long() of whole-number "
                             f"floats) or the text itself")
        vocab = self.d_vocab
        if ids.dtype in _BARE_UNSIGNED:  # torch neither compares nor takes the min of these: their values as ints
            bad = [v for v in ids.unique().tolist() if v >= vocab][:5]
        elif ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab):
            bad = ids[(ids < 0) | (ids >= vocab)].unique()[:5].tolist()
        else:
            bad = []
        if bad:
            raise InputError(f"token ids {bad} are outside the vocabulary of {self.name} (0..{vocab - 1})")

    def check_length(self, n_tokens: int) -> None:
        """Raise :class:`InputError` if ``n_tokens`` exceeds the model's context."""
        if self.n_ctx and n_tokens > self.n_ctx:
            raise InputError(
                f"prompt is {n_tokens} tokens long but {self.name} has a context of {self.n_ctx} tokens; "
                f"shorten the prompt (fewer dictionary pairs / samples) or pick a longer-context model"
            )

    def to_str_tokens(self, tokens: str | Int[Tensor, "pos"] | Sequence[int],
                      prepend_bos: bool | None = None) -> list[str]:
        """Token strings of one sequence, as the tokenizer decodes each id on its own.

        ``tokens`` is text (tokenised as :meth:`tokenize` does, so ``to_str_tokens(text) ==
        to_str_tokens(tokenize(text).ids[0])``: the positions :meth:`run_with_cache` sees, with a BOS token only
        where the tokenizer adds one, or as ``prepend_bos`` says, see :meth:`tokenize`), ids of one sequence
        (``[pos]`` or ``[1, pos]``) or a list of ints (``prepend_bos`` is refused with ids: they are shown as given).
        Text outside the vocabulary is refused (:meth:`check_known`). These are the decoded tokens, as in
        TransformerLens; figures label positions with :meth:`token_labels`, which also show what a tokenizer drops."""
        if prepend_bos is not None and not isinstance(tokens, str):
            raise InputError(_BOS_WITH_IDS)
        if isinstance(tokens, str):
            ids = (list(self.tokenizer(tokens)["input_ids"]) if prepend_bos is None
                   else self.to_tokens(tokens, prepend_bos=prepend_bos)[0].tolist())
            self.check_known(ids, tokens)
        elif isinstance(tokens, Tensor):
            if tokens.dim() == 2 and tokens.shape[0] == 1:
                tokens = tokens[0]
            if tokens.dim() != 1 or tokens.is_floating_point() or tokens.is_complex() or tokens.dtype == torch.bool:
                raise InputError(f"to_str_tokens takes text or the integer ids of one sequence ([pos] or [1, pos]), "
                                 f"got a {tokens.dtype} tensor of shape {tuple(tokens.shape)}")
            ids = tokens.tolist()
        elif isinstance(tokens, (list, tuple)):
            bad = [i for i in tokens if isinstance(i, bool) or not isinstance(i, (int, Tensor))
                   or isinstance(i, Tensor) and (i.dim() != 0 or i.is_floating_point())]
            if bad:
                raise InputError(f"to_str_tokens takes text or the integer ids of one sequence, got a "
                                 f"{type(tokens).__name__} holding {type(bad[0]).__name__}")
            ids = [int(i) for i in tokens]
        else:
            raise InputError(f"to_str_tokens takes text, a tensor of ids or a list of ints, got {type(tokens).__name__}")
        vocab = self.d_vocab
        outside = [i for i in ids if not 0 <= i < vocab]
        if outside:
            raise InputError(f"token ids {outside[:5]} are outside the vocabulary of {self.name} (0..{vocab - 1})")
        return self._decoded([ids])[0]

    def row_tokens(self, batch: TokenBatch) -> list[list[str]]:
        """:meth:`to_str_tokens` of each row's real tokens (its ids where the attention mask is set)."""
        return self._decoded([ids[m.bool()].tolist() for ids, m in zip(batch.ids, batch.attention_mask)])

    def _decoded(self, rows: list[list[int]]) -> list[list[str]]:
        """Each id of ``rows`` as the tokenizer decodes it on its own (each id decoded once per tokenizer: prompts
        share most of their tokens)."""
        held = self.__dict__.get("_token_strings")
        if held is None or held[0] is not self.tokenizer:
            held = self.__dict__["_token_strings"] = (self.tokenizer, {})
        cache = held[1]
        for i in {i for ids in rows for i in ids} - cache.keys():
            cache[i] = self.tokenizer.decode([i])
        return [[cache[i] for i in ids] for ids in rows]

    def token_labels(self, tokens: str | Int[Tensor, "pos"] | Sequence[int],
                     prepend_bos: bool | None = None) -> list[str]:
        """The labels figures show, one per position of :meth:`to_str_tokens` of the same input.

        For a tokenizer that drops nothing (its tokens decoded together give the text back) they are
        ``to_str_tokens(text)``. Where it drops some of the text (the zoo's ``":"`` and line breaks) a token's label
        runs from its start to the next token's start (:func:`~gna_interp.models.tokens.token_labels`): what was
        dropped shows with the token before it and ``"".join(labels)`` is the text (after a BOS label where one is
        fed). Ids carry no text: their labels are ``to_str_tokens(ids)``. ``prepend_bos`` as in
        :meth:`to_str_tokens`; text outside the vocabulary is refused (:class:`InputError`)."""
        if not isinstance(tokens, str):
            return self.to_str_tokens(tokens, prepend_bos)
        ids, labels = text_labels(self.tokenizer, tokens)
        self.check_known(ids, tokens)
        if prepend_bos is None:
            return labels
        fed = self.to_tokens(tokens, prepend_bos=prepend_bos)[0].tolist()
        if fed == ids:
            return labels
        return self.to_str_tokens(fed[:1]) + labels if fed[1:] == ids else labels[1:]

    def as_batch(self, inputs: str | Sequence[str] | Tensor | TokenBatch,
                 attention_mask: Tensor | None = None, prepend_bos: bool | None = None,
                 padding_side: str | None = None) -> TokenBatch:
        """Normalise text, ids or a :class:`TokenBatch` into a :class:`TokenBatch` on the model's device.

        ``prepend_bos`` and ``padding_side`` apply to text (:meth:`tokenize`); with ids or a batch they are refused
        (:class:`InputError`), since ids are fed exactly as given."""
        if not isinstance(inputs, (str, list, tuple)) and (prepend_bos is not None or padding_side is not None):
            raise InputError(_BOS_WITH_IDS)
        if isinstance(inputs, TokenBatch):
            if inputs.ids.dtype == torch.long:
                return inputs
            self.check_ids(inputs.ids)
            return replace(inputs, ids=inputs.ids.long())
        if isinstance(inputs, Tensor):
            ids = inputs if inputs.dim() == 2 else inputs.unsqueeze(0)
            self.check_ids(ids)
            self.check_length(ids.shape[1])
            ids = ids.long()
            if attention_mask is None:
                mask = torch.ones_like(ids)
            else:
                mask = attention_mask.unsqueeze(0) if isinstance(attention_mask, Tensor) and attention_mask.dim() == 1 \
                    and inputs.dim() == 1 else attention_mask
                check_mask(mask, ids)
            return TokenBatch(ids.to(self.device), mask.to(device=self.device, dtype=torch.long))
        if attention_mask is not None:
            raise InputError("attention_mask goes with token ids (a tensor); text is padded and masked by tokenize")
        return self.tokenize(inputs, padding_side, prepend_bos)

    def pad_ids(self, seqs: Sequence[Sequence[int]], check_length: bool = True, side: str = "left") -> TokenBatch:
        """Pad lists of token ids into one :class:`TokenBatch` (padding masked out; on the left unless
        ``side="right"``); ``check_length`` refuses rows longer than the context (off for packed rows, whose branches
        are checked instead)."""
        batch = TokenBatch.from_rows(seqs, self.pad_id, self.device, side)
        self.check_ids(batch.ids)
        if check_length:
            self.check_length(batch.ids.shape[1])
        return batch

    @property
    def pad_id(self) -> int:
        """The token that pads a row (the tokenizer's pad token, else 0); padding is masked out."""
        return self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0

    # ---- running --------------------------------------------------------------------------
    def _forward_kwargs(self, batch: TokenBatch) -> dict[str, Any]:
        if batch.tree is not None:  # a packed batch: an explicit 4D additive mask and position ids
            longest = int(batch.positions.max()) + 1  # the longest branch: its row's length unpacked
            if not self.packs_rows_up_to(longest):
                raise InputError(f"{self.name} cannot run a packed (tree-masked) batch of rows up to {longest} tokens: "
                                 f"its mixers do not honour the tree mask there. Lay the plan out for this model: "
                                 f"layout_chunks(for_model(model, plan), batch_size)")
            dtype = next(self.hf_model.parameters()).dtype
            dtype = dtype if dtype.is_floating_point else torch.float32
            mask = torch.zeros(batch.tree.shape, dtype=dtype, device=self.device)
            mask.masked_fill_(~batch.tree.to(self.device), torch.finfo(dtype).min)
            return {"attention_mask": mask[:, None], "position_ids": batch.positions.to(self.device)}
        return {"attention_mask": batch.attention_mask} if batch.padded else {}

    def _run_batch(self, inputs: str | Sequence[str] | Tensor | TokenBatch, kwargs: dict[str, Any],
                   prepend_bos: bool | None = None, padding_side: str | None = None) -> TokenBatch:
        """The batch a run feeds (``attention_mask`` is popped from ``kwargs``), after the checks that come before
        its forward: a runnable model, a known ``return_type`` and, for a loss, rows of 2 tokens or more."""
        self.check_runnable()
        return_type = kwargs.get("return_type", "logits")
        check_return_type(return_type)
        check_forward_options(kwargs, self.n_layers)
        batch = self.as_batch(inputs, kwargs.pop("attention_mask", None), prepend_bos, padding_side)
        if not batch.ids.numel():
            raise InputError(f"the token ids are empty (shape {tuple(batch.ids.shape)}): pass at least one row of at "
                             f"least one token")
        check_loss_rows(return_type, batch.attention_mask, batch.tree is not None)
        return batch

    def run(self, inputs: str | Sequence[str] | Tensor | TokenBatch, fwd_hooks: Hooks = (), *,
            grad: bool = False, prepend_bos: bool | None = None, padding_side: str | None = None,
            **kwargs: Any) -> Any:
        """One forward of the bridge with ``fwd_hooks`` (removed afterwards) and the padding mask
        applied; ``kwargs`` go to the bridge's forward (``return_type``, ``logits_to_keep``, ``stop_at_layer``,
        ``use_cache``, ``past_key_values``, ``loss_per_token``, ``attention_mask`` with ids; others are refused).
        Gradients only with ``grad=True``. ``prepend_bos`` / ``padding_side`` tokenise text as :meth:`tokenize`
        says. A loss (``return_type="loss"``) is the mean over every predicted token of every row, padding left
        out (TransformerLens's loss with an attention mask)."""
        check_keywords("run", kwargs, ("fwd_hooks", "grad", *TEXT_KEYWORDS, *FORWARD_KEYWORDS),
                       "model.bridge(ids, ...)")
        batch = self._run_batch(inputs, kwargs, prepend_bos, padding_side)
        with torch.set_grad_enabled(grad), self.hooks(fwd_hooks):
            return self.bridge(batch.ids, **self._forward_kwargs(batch), **kwargs)

    def forward(self, inputs: str | Sequence[str] | Tensor | TokenBatch, prepend_bos: bool | None = None,
                padding_side: str | None = None) -> Float[Tensor, "batch pos vocab"]:
        """Logits of the bridge for text, ids or a TokenBatch (padding handled through the mask)."""
        return self.run(inputs, return_type="logits", prepend_bos=prepend_bos, padding_side=padding_side)

    def __call__(self, input: str | Sequence[str] | Tensor | TokenBatch, return_type: str | None = "logits", *,
                 prepend_bos: bool | None = None, padding_side: str | None = None,
                 attention_mask: Tensor | None = None, fwd_hooks: Hooks = (), loss_per_token: bool = False) -> Any:
        """``model(text_or_ids)``: the logits ``[batch, pos, vocab]``, as a TransformerLens model's call (no gradients;
        ``model.run(..., grad=True)`` keeps them). ``return_type`` is ``"logits"`` (the default), ``"loss"`` (the
        mean next-token loss over every row, padding left out; each row needs 2 tokens or more), ``"both"`` or None,
        as the bridge takes it; ``prepend_bos`` / ``padding_side`` as :meth:`tokenize`."""
        check_flag("loss_per_token", loss_per_token)
        extra = {"loss_per_token": True} if loss_per_token else {}
        return self.run(input, fwd_hooks, return_type=return_type, prepend_bos=prepend_bos,
                        padding_side=padding_side, attention_mask=attention_mask, **extra)

    def read_logits(self, inputs: str | Sequence[str] | Tensor | TokenBatch, rows: Int[Tensor, " n"],
                    pos: Int[Tensor, " n"], fwd_hooks: Hooks = (), *, grad: bool = False) -> Float[Tensor, "n vocab"]:
        """The logits at ``(rows[i], pos[i])`` only, from one forward with ``fwd_hooks``: the model's own head is
        applied to those positions alone (a boolean ``logits_to_keep``), so the vocabulary is paid once per read,
        not once per position of the batch."""
        batch = self.as_batch(inputs)
        keep = torch.zeros(batch.ids.shape, dtype=torch.bool, device=self.device)
        rows, pos = rows.to(self.device), pos.to(self.device)
        keep[rows, pos] = True
        out = self.run(batch, fwd_hooks, grad=grad, logits_to_keep=keep)
        out = out.reshape(-1, out.shape[-1])
        linear = rows * keep.shape[1] + pos
        kept = torch.unique(linear)  # sorted: the head's output lists the kept positions in row-major order
        if out.shape[0] != kept.numel():
            raise RuntimeError(f"{self.name}: the forward kept {out.shape[0]} positions' logits, not the "
                               f"{kept.numel()} asked for (a causal-LM head that ignores a boolean logits_to_keep)")
        return out[torch.searchsorted(kept, linear)]

    def final_residual(self, inputs: str | Sequence[str] | Tensor | TokenBatch, fwd_hooks: Hooks = (), *,
                       grad: bool = False) -> Float[Tensor, "batch pos d_model"] | None:
        """The residual stream entering the final norm, from one forward with ``fwd_hooks`` that stops there (the
        final norm and the output layer never run), or None where the bridge has no :attr:`FINAL_NORM_INPUT` hook
        (the caller then reads logits, :meth:`read_logits`)."""
        if not self.has_hook(self.FINAL_NORM_INPUT):
            return None
        done: list[bool] = []  # the last block has run: a norm module the bridge also calls earlier (nanochat's
        # parameter-free norm after the embeddings) is not yet the final norm

        def stop(x: Tensor, hook: Any = None) -> Tensor:
            if done:
                raise _Stopped(x)
            return x

        last = self.blocks()[-1].register_forward_hook(lambda *_: done.append(True))
        try:
            self.run(inputs, [*fwd_hooks, (self.FINAL_NORM_INPUT, stop)], grad=grad)
        except _Stopped as got:
            return got.resid
        finally:
            last.remove()
        return None  # the hook never fired after the last block: a model that does not route its output through it

    def mean_activations(self, reference: Any, hooks: Collection[str]) -> dict[str, Float[Tensor, " width"]]:
        """Each of ``hooks``' activation (channels flattened: ``[batch, pos, width]``) averaged over the real tokens of
        ``reference`` (a task's prompts, text or a batch), in float32: one forward for the hooks not yet known. Kept
        in :attr:`facts` for one reference's prompts and these weights (a weight replaced, edited in place or cast
        computes them again); never kept while a hook is placed on the model, whose forward is then not its own."""
        prompts = getattr(reference, "prompts", reference)
        text = isinstance(prompts, Sequence) and not isinstance(prompts, str) and \
            all(isinstance(p, str) for p in prompts)
        placed = any(point.fwd_hooks for point in self.hook_points().values())
        key = (tuple(prompts), hash(tuple((id(p), p._version, p.dtype) for p in self.hf_model.parameters()))) \
            if text and not placed else None
        kept = self.facts.get(MEAN_ACTIVATIONS)
        known: dict[str, Tensor] = kept[1] if kept is not None and kept[0] == key and key is not None else {}
        missing = set(hooks) - set(known)
        if missing:
            if key is not None:  # kept: the same forward reads every sender's output (a head's, an MLP's, the
                missing |= self._sender_hooks() - set(known)  # embeddings'), which node and edge ablations ask for
            batch = self.as_batch(list(prompts) if text else reference)
            mask = batch.attention_mask.bool().to(self.device)

            def mean(name: str) -> Any:
                def hook(x: Tensor, hook: Any = None) -> Tensor:
                    known[name] = (x.flatten(2) if x.dim() == 4 else x)[mask].float().mean(0)
                    return x
                return hook

            hooks_in = [(h, mean(h)) for h in sorted(missing)]
            with torch.no_grad():
                if self.final_residual(batch, hooks_in) is None:
                    self.run(batch, hooks_in)
            unread = sorted(set(hooks) - set(known))
            if unread:
                raise UnsupportedArchitectureError(f"{self.name}: the hook {unread[0]!r} never fired in a forward, so "
                                                   f"its mean cannot be read")
            if key is not None:
                self.facts[MEAN_ACTIVATIONS] = (key, known)  # one reference at a time
        return {h: known[h] for h in hooks}

    def _sender_hooks(self) -> set[str]:
        """The hooks of every sender's output: each head's site, each MLP's output, the stream entering block 0."""
        out = {self.head_site(h).hook for h in self.heads()} | {self.block_input_hook(0)}
        out |= {h for layer in range(self.n_layers) if (h := self.mlp_hook(layer, "out"))}
        return {h for h in out if self.has_hook(h)}

    def run_with_cache(self, inputs: str | Sequence[str] | Tensor | TokenBatch,
                       names_filter: Callable[[str], bool] | Sequence[str] | str | None = None,
                       **kwargs: Any) -> tuple[Float[Tensor, "batch pos vocab"], Any]:
        """Bridge ``run_with_cache`` with the padding mask applied; returns ``(logits, cache)``, the cache
        indexed by hook name.

        ``names_filter`` is None (every hook), a hook name, a list of names or a function ``name -> bool``. The
        keywords of TransformerLens's ``run_with_cache`` it honours: ``prepend_bos``, ``padding_side``,
        ``return_type`` (a loss as :meth:`run` computes it), ``stop_at_layer``, ``remove_batch_dim``, ``pos_slice``,
        ``return_cache_object``, ``device``, ``clear_contexts``, ``incl_bwd`` (with ``return_type="loss"``; runs
        with gradients) and the forward's (:meth:`run`); any other keyword is refused (:class:`OptionError`), as is
        ``reset_hooks_end=False`` (a Model keeps no hook after its run).

        **BOS convention.** Text is tokenised by :meth:`tokenize`, which follows the Hugging Face tokenizer's own
        special-token policy: a BOS token is there only where the tokenizer adds one (Llama-3 does; SmolLM2,
        GPT-2-style and the zoo tokenizers do not). TransformerLens's ``bridge.run_with_cache(text)`` prepends
        BOS whatever the tokenizer does, so for SmolLM2 it caches one more position (19 where this gives 18) and
        every index is shifted by one. gna_interp keeps the Hugging Face convention so that its logits equal the
        plain Hugging Face model's on the same text and the positions of tasks' segments (summary tokens, the
        final token) are the tokenizer's. ``to_str_tokens(text)`` lists exactly these positions; to get
        TransformerLens's, pass ``prepend_bos=True`` (or ids: ``run_with_cache(bridge.to_tokens(text))``)."""
        check_keywords("run_with_cache", kwargs, ("names_filter", *FORWARD_KEYWORDS, *TEXT_KEYWORDS, *CACHE_KEYWORDS))
        check_run_options(kwargs)
        names_filter = check_names_filter(names_filter, self.bridge.hook_dict)
        batch = self._run_batch(inputs, kwargs, kwargs.pop("prepend_bos", None), kwargs.pop("padding_side", None))
        check_cache_options(kwargs, batch.ids.shape[1])
        with torch.set_grad_enabled(bool(kwargs.get("incl_bwd"))):
            return self.bridge.run_with_cache(batch.ids, names_filter=names_filter,
                                              **self._forward_kwargs(batch), **kwargs)

    def run_with_hooks(self, inputs: str | Sequence[str] | Tensor | TokenBatch, fwd_hooks: Hooks = (),
                       bwd_hooks: Hooks = (), **kwargs: Any) -> Any:
        """A forward with ``fwd_hooks`` ``[(hook name, fn), ...]`` active (removed afterwards), no gradients;
        returns the logits (or what ``return_type`` asks for, a loss as :meth:`run` computes it).

        ``bwd_hooks`` ``[(hook name, fn), ...]`` make the run keep gradients: at ``output.backward()``, after the run,
        ``fn(grad, hook=hook)`` is called with the gradient of the hook point's output (a tensor it returns replaces
        it), as in TransformerLens. Keywords honoured besides the forward's (:meth:`run`): ``prepend_bos``,
        ``padding_side``, ``stop_at_layer``, ``remove_batch_dim``, ``clear_contexts``; any other keyword is refused
        (:class:`OptionError`), as is ``reset_hooks_end=False`` (a Model keeps no hook after its run)."""
        check_keywords("run_with_hooks", kwargs, ("fwd_hooks", "bwd_hooks", *FORWARD_KEYWORDS, *TEXT_KEYWORDS,
                                                  *HOOK_KEYWORDS))
        check_run_options(kwargs)
        hooks = [*check_hooks("fwd_hooks", fwd_hooks, lambda: self.bridge.hook_dict),
                 *gradient_hooks(check_hooks("bwd_hooks", bwd_hooks, lambda: self.bridge.hook_dict))]
        if bwd_hooks and not any(p.requires_grad for p in self.hf_model.parameters()):
            raise InputError("bwd_hooks need gradients through the model, but none of its parameters requires one: "
                             "call model.hf_model.requires_grad_(True) first")
        batch = self._run_batch(inputs, kwargs, kwargs.pop("prepend_bos", None), kwargs.pop("padding_side", None))
        with torch.set_grad_enabled(bool(bwd_hooks)):
            return self.bridge.run_with_hooks(batch.ids, fwd_hooks=hooks, **self._forward_kwargs(batch), **kwargs)

    def continue_from(self, ids: Int[Tensor, "batch new"], attention_mask: Int[Tensor, "batch total"],
                      past_key_values: Any, fwd_hooks: Hooks = (), rows: Tensor | None = None
                      ) -> Float[Tensor, "batch new vocab"]:
        """Logits of ``ids`` fed after a cached prefix (``past_key_values`` from ``return_type=
        "logits_and_cache"``); ``attention_mask`` covers prefix and new tokens. With ``rows``, row ``i`` continues
        the cache's row ``rows[i]`` (from a copy: the cache is left as it was, for other rows to continue)."""
        self.check_runnable()
        if rows is not None:
            past_key_values = copy.deepcopy(past_key_values)
            past_key_values.batch_select_indices(rows)
        with torch.no_grad(), self.hooks(fwd_hooks):
            return self.bridge(ids, return_type="logits", attention_mask=attention_mask,
                               past_key_values=past_key_values)

    @contextlib.contextmanager
    def hooks(self, fwd_hooks: Hooks = ()) -> Iterator["Model"]:
        """Inside the block, every forward runs with ``fwd_hooks``; they are removed on exit, exceptions
        included; a hook name the model lacks, or anything but ``(name, fn)`` pairs, is refused
        (:class:`InputError`) before any is placed. Hooks given by name go straight onto the bridge's hook points
        (:meth:`hook_points`, read once), as the bridge's own ``hooks`` places them outside its compatibility mode,
        without its walk of every module on each call."""
        points = self.hook_points()
        fwd = [] if fwd_hooks is None else check_hooks("fwd_hooks", fwd_hooks, lambda: points)
        if not fwd:
            yield self
            return
        if self.bridge.compatibility_mode or not all(isinstance(name, str) for name, _ in fwd):
            with self.bridge.hooks(fwd_hooks=fwd):
                yield self
            return
        placed = []
        try:
            for name, fn in fwd:
                point = points[name]
                self.bridge.check_hooks_to_add(point, name, fn)
                placed.append((point, point.add_hook(fn, dir="fwd")))
            yield self
        finally:
            for point, handle in reversed(placed):
                handle.hook.remove()
                point.fwd_hooks[:] = [h for h in point.fwd_hooks if h is not handle]

    def hook_points(self) -> dict[str, Any]:
        """The bridge's hook points by name (``bridge.hook_dict``, read once per bridge: walking its modules costs
        about a millisecond)."""
        cached = getattr(self, "_hook_points", None)
        if cached is None or cached[0] is not self.bridge:
            cached = self._hook_points = (self.bridge, dict(self.bridge.hook_dict))
        return cached[1]

    def has_hook(self, name: str) -> bool:
        """Whether the bridge has a hook point called ``name``."""
        return name in self.hook_points()

    def component(self, path: str) -> torch.nn.Module:
        """The bridge component at ``path`` (e.g. ``blocks.3.attn``); calling it fires hooks."""
        try:
            return self.bridge.get_submodule(path)
        except AttributeError as e:
            raise HeadError(f"{self.name} has no component {path!r}") from e

    def hf_module(self, path: str) -> torch.nn.Module:
        """The plain Hugging Face module behind the bridge component at ``path`` (fires no hooks)."""
        return unwrap(self.component(path))

    def blocks(self) -> list[torch.nn.Module]:
        """The bridged blocks in order (calling one runs it with its hooks)."""
        return list(self.bridge.blocks)

    def unembed(self, resid: Float[Tensor, "... pos d_model"]) -> Float[Tensor, "... pos vocab"]:
        """Final norm and unembedding of residual-stream vectors (cast to the unembedding's dtype, as Hugging
        Face's own heads do: a half-precision Mamba keeps its residual, hence its final norm's output, in float32),
        then what the family's causal-LM head does after ``lm_head`` (the bridge adapter's output transform:
        Gemma-2's final soft-cap ``c·tanh(x/c)``, Granite's ``x / logits_scaling``, Falcon-H1's
        ``lm_head_multiplier``, Cohere's ``logit_scale``), so these logits equal the forward's."""
        logits = self.bridge.unembed(self.final_norm(resid))
        transform = self.output_transform
        return transform(logits) if transform is not None else logits

    def final_norm(self, resid: Float[Tensor, "... pos d_model"]) -> Float[Tensor, "... pos d_model"]:
        """The final norm of residual-stream vectors, cast to the unembedding's dtype (what :meth:`unembed`
        multiplies with the output layer's weight)."""
        return self.bridge.ln_final(resid).to(self.hf_model.get_output_embeddings().weight.dtype)

    @property
    def output_transform(self) -> Callable[[Tensor], Tensor] | None:
        """What the family's causal-LM head does to the output layer's logits (see :meth:`unembed`), or None."""
        return getattr(getattr(self.bridge, "adapter", None), "apply_output_logits_transform", None)

    @staticmethod
    def block_input_hook(layer: int) -> str:
        """Hook on the residual stream entering block ``layer``."""
        return f"blocks.{layer}.hook_in"

    @staticmethod
    def block_output_hook(layer: int) -> str:
        """Hook on the residual stream leaving block ``layer``."""
        return f"blocks.{layer}.hook_out"

    def mixed_stream_hook(self, layer: int) -> str:
        """Hook on the residual stream once block ``layer``'s token mixers have written to it and before its MLP
        reads it (``blocks.{layer}.hook_resid_mid``); the block's output where the bridge has no such hook (blocks
        whose MLP reads the block's input, or that have no MLP)."""
        mid = f"blocks.{layer}.hook_resid_mid"
        return mid if self.has_hook(mid) else self.block_output_hook(layer)

    def mixer_output_hook(self, layer: int, kind: str) -> str | None:
        """Hook on the output of block ``layer``'s output projection for its ``kind`` mixer (the projection whose
        input :meth:`head_site` names: what the mixer writes before any post-norm or scale of its block), or None
        when the bridge has no such hook."""
        spec = self.layer_spec(layer, kind)
        name = spec.adapter.output_hook(spec).rsplit(".", 1)[0] + ".hook_out"
        return name if self.has_hook(name) else None

    def scaled_blocks(self) -> list[int]:
        """Blocks that multiply the whole residual stream, input included, by a factor other than 1 (Gemma-4's
        ``layer_scalar``): there the stream is no longer the sum of what each part wrote."""
        out = []
        for layer in range(self.n_layers):
            scale = getattr(self.hf_module(f"blocks.{layer}"), "layer_scalar", None)
            if isinstance(scale, Tensor) and not bool((scale == 1).all()):
                out.append(layer)
        return out

    @staticmethod
    def io_hook(path: str, where: str) -> str:
        """The hook on the input (``where="in"``) or the output (``"out"``) of the bridge component at ``path``."""
        return f"{path}.hook_{where}"

    def linear_input(self, hook: str) -> tuple[str, torch.nn.Linear] | None:
        """Where the hook ``hook`` is the output of a plain linear projection (an ``nn.Linear`` behind the bridge
        component, with a hook on its input): that input hook and the module; else None."""
        path = hook.removesuffix(self.io_hook("", "out"))
        if path == hook or not self.has_hook(self.io_hook(path, "in")):
            return None
        module = self.hf_module(path)
        return (self.io_hook(path, "in"), module) if isinstance(module, torch.nn.Linear) else None

    def post_map(self, layer: int, part: str) -> tuple[torch.nn.Module | None, float]:
        """What block ``layer`` applies to its mixers' (``part="attn"``) or its MLP's (``"mlp"``) summed output before
        adding it to the residual stream: the norm after it (Gemma-2/3 and OLMo-2's ``ln1_post`` / ``ln2_post``; None
        where there is none) and the block's residual scale (Granite's multiplier; 1.0 where there is none)."""
        block = f"blocks.{layer}"
        scale = float(getattr(self.component(block), "residual_contribution_scale", 1.0))
        path = f"{block}.{'ln1_post' if part == 'attn' else 'ln2_post'}"
        return (self.hf_module(path) if self.has_hook(self.io_hook(path, "out")) else None), scale

    def pre_norms(self, layer: int) -> list[torch.nn.Module]:
        """The plain Hugging Face modules of block ``layer``'s norms before its mixer (the bridge's ``ln1``, ``norm``
        or ``ln_1``; those it has), none of them checked: a caller checks what a module computes before using it."""
        out = []
        for name in ("ln1", "norm", "ln_1"):
            try:
                out.append(self.hf_module(f"blocks.{layer}.{name}"))
            except HeadError:
                continue
        return out

    def mlp_hook(self, layer: int, where: str) -> str | None:
        """Hook ``where`` (``in`` or ``out``) of block ``layer``'s MLP, or None when the block has none."""
        name = f"blocks.{layer}.mlp.hook_{where}"
        return name if self.has_hook(name) else None

    FINAL_NORM_INPUT = "ln_final.hook_in"

    @torch.no_grad()
    def generate(self, prompt: str, max_new_tokens: int = 16, **options: Any) -> str:
        """The prompt followed by its greedy continuation of up to ``max_new_tokens`` tokens (fewer where the model
        ends the text), as TransformerLens's ``generate`` returns for a string: ``prompt`` as given, then the new
        tokens decoded after it (special tokens left out). ``max_new_tokens=0`` returns the prompt; a prompt and
        ``max_new_tokens`` that together exceed the context are refused up front, naming the largest value that
        fits. No sampling, no KV cache: sampling options (``temperature``, ``top_k``, ``do_sample``, ...) are refused
        with :class:`InputError`, pointing at TransformerLens's own ``model.bridge.generate(...)``."""
        if options:
            raise InputError(f"Model.generate is greedy decoding of one prompt (prompt, max_new_tokens); it takes no "
                             f"{', '.join(sorted(options))}. For sampling use TransformerLens's own: "
                             f"model.bridge.generate(prompt, max_new_tokens=..., {next(iter(sorted(options)))}=...)")
        if not isinstance(prompt, str):
            raise InputError(f"Model.generate takes one prompt (a string), got {type(prompt).__name__}")
        ids = self.tokenize(prompt).ids
        check_new_tokens(max_new_tokens, ids.shape[1], self.n_ctx, self.name)
        start = ids.shape[1]
        for _ in range(max_new_tokens):
            nxt = self.forward(ids)[:, -1].argmax(-1, keepdim=True)
            ids = torch.cat([ids, nxt], dim=1)
            if self.tokenizer.eos_token_id is not None and int(nxt) == self.tokenizer.eos_token_id:
                break
        return self._with_prompt(prompt, ids[0].tolist(), start)

    def _with_prompt(self, prompt: str, ids: list[int], start: int) -> str:
        """``ids`` decoded as TransformerLens decodes a generation (special tokens skipped), with ``prompt`` as
        written in place of the decoding of its own ``start`` tokens (a tokenizer that drops text, as the zoo's
        ``:`` and line breaks, would lose it)."""
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        head = self.tokenizer.decode(ids[:start], skip_special_tokens=True)
        return prompt + text[len(head):] if text.startswith(head) else text


class _Stopped(Exception):
    """Raised by :meth:`Model.final_residual`'s hook to end the forward at the final norm."""

    def __init__(self, resid: Tensor) -> None:
        super().__init__("forward stopped at the final norm")
        self.resid = resid


def check_model(model: Any, what: str = "model", *, runnable: bool = True) -> Model:
    """The one check of a public function's model argument: ``model`` must be a loaded :class:`Model` (and, with
    ``runnable``, one that can run a forward: not a shapes-only ``device="meta"`` model). Raises
    :class:`InputError` naming ``what`` and saying how to get one: a spec string is loaded with
    ``gna.load_model(spec)``, a Hugging Face model or a TransformerBridge is wrapped with
    ``gna.load_model(obj, tokenizer)``. Returns ``model``."""
    if isinstance(model, Model):
        if runnable:
            model.check_runnable()
        return model
    import os

    if isinstance(model, (str, os.PathLike)):
        hint = f"load it first: {what} = gna.load_model({str(model)!r:.80})"
    elif model is None:
        hint = "load one first: model = gna.load_model('zoo:transformer-kv') (or a folder, .gguf file, hub id)"
    elif isinstance(model, torch.nn.Module):
        hint = (f"wrap this {type(model).__name__} first: {what} = gna.load_model(obj, tokenizer) (a Hugging Face causal "
                f"LM with its tokenizer, or a TransformerBridge)")
    else:
        hint = "load one with gna.load_model(spec) (a zoo name, a folder, a .gguf file, a hub id)"
    shown = f"{type(model).__name__} {model!r:.60}" if not isinstance(model, torch.nn.Module) else type(model).__name__
    raise InputError(f"{what} must be a gna_interp Model, got {shown}: {hint}")

