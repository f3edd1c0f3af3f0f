"""The family matrix: one tiny random-initialised config of every causal-LM family the installed
TransformerLens bridge supports, what gna_interp checks on each, and the page ``docs/family_matrix.md``
generated from the same list.

``tests/test_family_matrix.py`` runs the checks; ``python -m tests.family_matrix`` (from the repository
root) rewrites the page, and a test fails when the committed page differs from what this module writes.

Each :class:`Family` names the Hugging Face class, the tiny config, the output projection of each head
kind (the module whose input columns a head owns) and the head layout expected from the config alone.
"""

from __future__ import annotations

import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "family_matrix.md"

# What the matrix checks, in the order of the page's columns.
CHECKS: dict[str, str] = {
    "load": "`load_model` loads the saved checkpoint",
    "logits": "logits equal the plain Hugging Face forward (max abs. difference ≤ 1e-5 × max(1, max |logit|))",
    "heads": "`model.heads()` lists every head with its kind, counts and layers derived from the config alone",
    "patterns": "attention rows are finite, causal and sum to 1; SSM implicit attention `M x + D x` "
                "reproduces the mixer's output (≤ 1e-4 rel.)",
    "ablation": "`ablate` on a head equals zeroing its input columns of the output projection in a copy of the "
                "Hugging Face model (≤ 1e-5 on the logits; the head must move them by more than 1e-4)",
    "scan": "`scan_heads` strategy `exact` equals strategy `naive` on three heads (≤ 1e-5)",
    "kv": "a `KVRetrieval` task tokenised by the model's own tokenizer evaluates (accuracy in [0, 1])",
    "paths": "path patching: a head's direct path to the logits (its write `o_S`, or measured through the block's "
             "norm or multiplier) equals a plain Hugging Face forward with the write the sender's zeroed columns "
             "take out of its layer's output (MLP output zeroed) removed from the last layer's output (≤ 1e-5), and "
             "its edges into a later head's key and value inputs measure a finite effect",
}
ALL = tuple(CHECKS)
_NO_PATHS = tuple(c for c in ALL if c != "paths")

# Vocabulary of the byte-level tokenizer every tiny model is saved with (gna_interp.models.tiny.byte_tokenizer).
VOCAB = 257
INIT = 0.08  # initializer_range: large enough that every head moves the logits well above float32 noise


Layout = dict[tuple[int, str], tuple[int, int]]  # (layer, kind) -> (heads, channels per head at the projection)


@dataclass(frozen=True)
class Family:
    """One row of the matrix.

    Attributes:
        key: short id (test ids, page anchors).
        label: the family's usual name.
        cls: the ``transformers`` class built with ``from_config``.
        config: keyword arguments of ``cls.config_class`` (``vocab_size`` and ``initializer_range`` added).
        proj: head kind -> Hugging Face module paths of that kind's output projection, ``{l}`` the layer; the
            first path that exists in a layer is used.
        layout: the expected ``{(layer, kind): (heads, channels per head)}``, from the config alone.
        shared: kinds whose projection is shared by several depths (Zamba2's shared attention): ablation is
            checked by zeroing the columns only while that depth runs, not by editing the weights.
        checks: what passes (a subset of :data:`CHECKS`).
        note: what is particular to the family (soft-capping, parallel blocks, ...).
        unsupported: layers whose token mixer no adapter recognises (listed with kind ``unsupported``).
        raises: for a family gna_interp cannot load, text the ``UnsupportedArchitectureError`` must contain.
        limits: ``(check, text)`` for each check that fails on this family with an error containing ``text``
            (the test asserts that error, so a fix upstream shows up as a failing test).
        sinks: attention with sink logits (gpt-oss): a row's weights over the keys sum to less than 1.
        replays: whether the fast exact scan can replay blocks from their recorded inputs (else it warns and
            falls back to one full forward per head, with the same numbers).
    """

    key: str
    label: str
    cls: str
    config: dict[str, Any]
    proj: dict[str, tuple[str, ...]]
    layout: Callable[[Any], Layout]
    shared: tuple[str, ...] = ()
    checks: tuple[str, ...] = ALL
    note: str = ""
    unsupported: tuple[int, ...] = ()
    raises: str = ""
    limits: tuple[tuple[str, str], ...] = ()
    sinks: bool = False
    replays: bool = True

    @property
    def status(self) -> str:
        """How gna_interp treats the family: analysed, partly analysed, listed unsupported, or refused."""
        if self.raises:
            return "refused with `UnsupportedArchitectureError`"
        if any(c == "logits" for c, _ in self.limits):
            return "loads; its forward fails in the bridge"
        if self.unsupported and not self.proj:
            return "loads; every mixer listed `unsupported`"
        if self.unsupported:
            which = "layer" if len(self.unsupported) == 1 else "layers"
            return f"analysed; {which} {', '.join(map(str, self.unsupported))} listed `unsupported`"
        return "analysed"

    def build(self, path: str | os.PathLike, seed: int = 0) -> Path:
        """Write the tiny random-initialised model (SSM mixers livened) and the byte tokenizer to ``path``."""
        import transformers

        from gna_interp.models.loading import quiet_transformers
        from gna_interp.models.tiny import byte_tokenizer

        tok = byte_tokenizer()
        cls = getattr(transformers, self.cls)
        kwargs = {"vocab_size": len(tok), "initializer_range": INIT, **self.config}
        config = cls.config_class(**kwargs)
        config.pad_token_id = config.eos_token_id = config.bos_token_id = tok.eos_token_id
        torch.manual_seed(seed)
        path = Path(path)
        with quiet_transformers():
            model = cls(config).eval()
            liven(model, seed)
            model.save_pretrained(path)
        tok.save_pretrained(path)
        return path


def liven(model: torch.nn.Module, seed: int = 0) -> None:
    """Re-draw every Mamba mixer's projections, convolution, ``D`` and ``Δ`` bias at unit scale, in place, so
    that the scan term ``M x`` matters next to ``D x`` (with the default initialisation it is ~1e-5 of it and an
    SSM check could pass with ``M = 0``)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for mod in model.modules():
            if not (hasattr(mod, "A_log") and hasattr(mod, "conv1d") and hasattr(mod, "D")):  # Mamba mixers only
                continue
            for name in ("in_proj", "x_proj"):
                lin = getattr(mod, name, None)
                if isinstance(lin, torch.nn.Linear):
                    lin.weight.copy_(torch.randn(lin.weight.shape, generator=g) / lin.weight.shape[1] ** 0.5)
            mod.conv1d.weight.copy_(torch.randn(mod.conv1d.weight.shape, generator=g) * 0.5)
            if mod.conv1d.bias is not None:
                mod.conv1d.bias.copy_(torch.randn(mod.conv1d.bias.shape, generator=g) * 0.5)
            mod.D.copy_(torch.rand(mod.D.shape, generator=g) + 0.5)
            if hasattr(mod, "dt_proj"):  # Mamba-1
                w = mod.dt_proj.weight
                w.copy_(torch.randn(w.shape, generator=g) / w.shape[1] ** 0.5)
                mod.dt_proj.bias.copy_(torch.rand(mod.dt_proj.bias.shape, generator=g) - 0.5)
            else:  # Mamba-2
                mod.dt_bias.copy_(torch.rand(mod.dt_bias.shape, generator=g) - 0.5)


# ---- expected layouts, from the config alone ----------------------------------------------------------


def _n_heads(cfg: Any) -> int:
    return int(getattr(cfg, "num_attention_heads", None) or cfg.n_head)


def _head_dim(cfg: Any) -> int:
    hd = getattr(cfg, "head_dim", None)
    return int(hd) if hd else int(cfg.hidden_size) // _n_heads(cfg)


def attention_only(cfg: Any) -> Layout:
    """Every layer one attention layer of ``num_attention_heads`` query heads (per-layer configs where the
    config is heterogeneous: Gemma-4's global layers have their own ``head_dim``)."""
    per_layer = getattr(cfg, "per_layer_config", None)
    return {(l, "attn"): (_n_heads(cfg), _head_dim(per_layer[l] if per_layer else cfg))
            for l in range(cfg.num_hidden_layers)}


def mamba1(cfg: Any) -> Layout:
    """Every layer ``intermediate_size`` Mamba-1 channels, one channel each."""
    return {(l, "ssm1"): (cfg.intermediate_size, 1) for l in range(cfg.num_hidden_layers)}


def mamba2(cfg: Any) -> Layout:
    """Every layer ``num_heads`` Mamba-2 heads of ``head_dim`` channels."""
    return {(l, "ssm2"): (cfg.num_heads, cfg.head_dim) for l in range(cfg.num_hidden_layers)}


def bamba(cfg: Any) -> Layout:
    """Attention at ``attn_layer_indices``, Mamba-2 elsewhere."""
    return {(l, "attn") if l in cfg.attn_layer_indices else (l, "ssm2"):
            (_n_heads(cfg), _head_dim(cfg)) if l in cfg.attn_layer_indices else (cfg.mamba_n_heads, cfg.mamba_d_head)
            for l in range(cfg.num_hidden_layers)}


def jamba(cfg: Any) -> Layout:
    """Attention every ``attn_layer_period`` layers from ``attn_layer_offset``, Mamba-1 elsewhere."""
    out: Layout = {}
    for l in range(cfg.num_hidden_layers):
        if l % cfg.attn_layer_period == cfg.attn_layer_offset:
            out[(l, "attn")] = (_n_heads(cfg), _head_dim(cfg))
        else:
            out[(l, "ssm1")] = (cfg.mamba_expand * cfg.hidden_size, 1)
    return out


def zamba2(cfg: Any) -> Layout:
    """Mamba-2 in every layer; the shared attention block also runs in the ``hybrid`` layers."""
    out: Layout = {}
    d_ssm = cfg.mamba_expand * cfg.hidden_size // cfg.n_mamba_heads
    for l, t in enumerate(cfg.layers_block_type):
        if t == "hybrid":
            out[(l, "attn")] = (_n_heads(cfg), cfg.attention_hidden_size // _n_heads(cfg))
        out[(l, "ssm2")] = (cfg.n_mamba_heads, d_ssm)
    return out


def nemotron_h(cfg: Any) -> Layout:
    """One mixer per layer as ``layers_block_type`` says; MLP layers list no heads."""
    out: Layout = {}
    for l, t in enumerate(cfg.layers_block_type):
        if t in ("attention", "full_attention"):  # transformers 5 names them as in its layer_types
            out[(l, "attn")] = (_n_heads(cfg), _head_dim(cfg))
        elif t in ("mamba", "linear_attention"):
            out[(l, "ssm2")] = (cfg.mamba_num_heads, cfg.mamba_head_dim)
    return out


def falcon_h1(cfg: Any) -> Layout:
    """Attention and Mamba-2 side by side in every layer."""
    out: Layout = {}
    for l in range(cfg.num_hidden_layers):
        out[(l, "attn")] = (_n_heads(cfg), _head_dim(cfg))
        out[(l, "ssm2")] = (cfg.mamba_n_heads, cfg.mamba_d_head)
    return out


# ---- the families ---------------------------------------------------------------------------------

_SMALL = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
              max_position_embeddings=256)
_GQA = dict(_SMALL, num_key_value_heads=2)
_LLAMA_O = {"attn": ("model.layers.{l}.self_attn.o_proj",)}


def _llama_like(key: str, label: str, cls: str, note: str = "", **config: Any) -> Family:
    """An attention-only family laid out like Llama (``model.layers.{l}.self_attn.o_proj``)."""
    return Family(key, label, cls, {**_GQA, **config}, _LLAMA_O, attention_only, note=note)


FAMILIES: tuple[Family, ...] = (
    Family("gpt2", "GPT-2", "GPT2LMHeadModel", dict(n_embd=64, n_layer=2, n_head=4, n_positions=256),
           {"attn": ("transformer.h.{l}.attn.c_proj",)}, attention_only,
           note="fused `c_attn`; `c_proj` is a `Conv1D` (weight `[in, out]`)"),
    Family("gpt_neox", "GPT-NeoX", "GPTNeoXForCausalLM", dict(_SMALL, rotary_pct=0.5),
           {"attn": ("gpt_neox.layers.{l}.attention.dense",)}, attention_only,
           note="parallel attention and MLP; partial rotary"),
    Family("gptj", "GPT-J", "GPTJForCausalLM", dict(n_embd=64, n_layer=2, n_head=4, n_positions=256, rotary_dim=8),
           {"attn": ("transformer.h.{l}.attn.out_proj",)}, attention_only,
           note="parallel attention and MLP; partial rotary (`rotary_dim`)"),
    _llama_like("llama", "Llama", "LlamaForCausalLM", note="grouped-query attention"),
    _llama_like("qwen2", "Qwen2", "Qwen2ForCausalLM", note="q/k/v biases"),
    _llama_like("qwen3", "Qwen3", "Qwen3ForCausalLM", head_dim=16, note="q/k RMS norms"),
    _llama_like("mistral", "Mistral", "MistralForCausalLM", sliding_window=16, note="sliding window 16"),
    _llama_like("gemma2", "Gemma-2", "Gemma2ForCausalLM", head_dim=16, query_pre_attn_scalar=16, sliding_window=16,
                attn_logit_softcapping=5.0, final_logit_softcapping=3.0,
                note="attention and final logit soft-capping (set low: 5 and 3), sliding window 16"),
    _llama_like("gemma3", "Gemma-3 (text)", "Gemma3ForCausalLM", head_dim=16, query_pre_attn_scalar=16,
                sliding_window=16, layer_types=["sliding_attention", "full_attention"],
                note="`Gemma3ForCausalLM` (text only); q/k norms, one sliding and one full layer"),
    Family("phi", "Phi", "PhiForCausalLM", dict(_GQA, partial_rotary_factor=0.5),
           {"attn": ("model.layers.{l}.self_attn.dense",)}, attention_only,
           note="parallel attention and MLP; output projection `dense`"),
    _llama_like("phi3", "Phi-3", "Phi3ForCausalLM", note="fused `qkv_proj`"),
    _llama_like("olmo2", "OLMo-2", "Olmo2ForCausalLM", note="q/k norms over all heads; post-norms"),
    _llama_like("stablelm", "StableLM", "StableLmForCausalLM", partial_rotary_factor=0.5, note="partial rotary"),
    Family("falcon", "Falcon", "FalconForCausalLM", dict(_SMALL),
           {"attn": ("transformer.h.{l}.self_attention.dense",)}, attention_only,
           note="fused `query_key_value`, multi-query (1 KV head), parallel attention and MLP"),
    _llama_like("granite", "Granite", "GraniteForCausalLM", attention_multiplier=0.3, residual_multiplier=0.7,
                embedding_multiplier=2.0, logits_scaling=1.5, note="every multiplier away from 1"),
    Family("mamba", "Mamba", "MambaForCausalLM",
           dict(hidden_size=32, state_size=8, num_hidden_layers=2, expand=2, conv_kernel=4),
           {"ssm1": ("backbone.layers.{l}.mixer.out_proj",)}, mamba1, checks=_NO_PATHS, limits=(("paths", "cannot receive path patches"),),
           note="Mamba-1 (S6): one head per channel; its channels send paths (checked) but cannot receive them: B, C and Δ are shared by every channel of the layer"),
    Family("mamba2", "Mamba-2", "Mamba2ForCausalLM",
           dict(hidden_size=32, state_size=8, num_hidden_layers=2, expand=2, head_dim=16, num_heads=4, n_groups=2,
                conv_kernel=4, chunk_size=16),
           {"ssm2": ("backbone.layers.{l}.mixer.out_proj",)}, mamba2, note="SSD heads, 2 B/C groups, gated norm"),
    Family("bamba", "Bamba", "BambaForCausalLM",
           dict(_GQA, num_hidden_layers=3, attn_layer_indices=[1], mamba_n_heads=4, mamba_d_head=32,
                mamba_n_groups=2, mamba_d_state=8, mamba_expand=2, mamba_chunk_size=16),
           {"attn": ("model.layers.{l}.self_attn.o_proj",), "ssm2": ("model.layers.{l}.mamba.out_proj",)}, bamba,
           note="Mamba-2 layers with one attention layer"),
    Family("jamba", "Jamba", "JambaForCausalLM",
           dict(_GQA, num_hidden_layers=3, attn_layer_period=3, attn_layer_offset=1, expert_layer_period=100,
                expert_layer_offset=99, num_experts=1, mamba_d_state=8, mamba_expand=2),
           {"attn": ("model.layers.{l}.self_attn.o_proj",), "ssm1": ("model.layers.{l}.mamba.out_proj",)}, jamba,
           note="Mamba-1 layers with one attention layer"),
    Family("zamba2", "Zamba2", "Zamba2ForCausalLM",
           dict(hidden_size=32, num_hidden_layers=4, layers_block_type=["mamba", "hybrid", "mamba", "hybrid"],
                mamba_d_state=8, mamba_expand=2, mamba_ngroups=2, n_mamba_heads=4, chunk_size=16,
                num_attention_heads=4, num_key_value_heads=4, num_mem_blocks=1, use_shared_attention_adapter=True,
                adapter_rank=4, use_mem_rope=True, intermediate_size=64, max_position_embeddings=256),
           {"attn": ("model.layers.{l}.shared_transformer.self_attn.o_proj",),
            "ssm2": ("model.layers.{l}.mamba_decoder.mamba.out_proj", "model.layers.{l}.mamba.out_proj")},
           zamba2, shared=("attn",),
           note="one shared attention block run at layers 1 and 3 (per-depth LoRA adapters); "
                "its heads are listed at each depth and ablated at one depth only"),
    Family("nemotron_h", "Nemotron-H", "NemotronHForCausalLM",
           dict(hidden_size=32, layers_block_type=["mamba", "attention", "mlp"], num_attention_heads=4,
                num_key_value_heads=2, head_dim=8, intermediate_size=64, ssm_state_size=8, mamba_num_heads=4,
                mamba_head_dim=16, n_groups=2, chunk_size=16, max_position_embeddings=256),
           {"attn": ("model.layers.{l}.mixer.o_proj",), "ssm2": ("model.layers.{l}.mixer.out_proj",)}, nemotron_h,
           checks=_NO_PATHS, limits=(("paths", "cannot receive path patches: the bridge has no hook"),),
           note="one mixer per layer: Mamba-2, attention, MLP (lists no heads); its attention, reached through the "
                "pass-through mixer, has no hook on its query/key/value projections, so it sends paths (checked) "
                "but cannot receive them"),
    Family("falcon_h1", "Falcon-H1", "FalconH1ForCausalLM",
           dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, mamba_d_ssm=64, mamba_n_heads=4, mamba_d_head=16, mamba_n_groups=2,
                mamba_d_state=8, mamba_chunk_size=16, mamba_rms_norm=False, max_position_embeddings=256,
                key_multiplier=0.7, attention_in_multiplier=1.3, attention_out_multiplier=0.8,
                ssm_multipliers=[1.1, 0.9, 1.2, 0.8, 1.05], ssm_in_multiplier=1.2, ssm_out_multiplier=0.9,
                mlp_multipliers=[1.1, 0.9], embedding_multiplier=2.0, lm_head_multiplier=0.5),
           {"attn": ("model.layers.{l}.self_attn.o_proj",), "ssm2": ("model.layers.{l}.mamba.out_proj",)}, falcon_h1,
           note="attention and Mamba-2 in parallel in every layer, muP multipliers away from 1"),
)


def none(cfg: Any) -> Layout:
    """No analysed heads."""
    return {}


def attention_at(*layers: int) -> Callable[[Any], Layout]:
    """Attention heads at ``layers`` only (the other layers' mixers are not analysed)."""
    return lambda cfg: {k: v for k, v in attention_only(cfg).items() if k[0] in layers}


def mla(cfg: Any) -> Layout:
    """Multi-head latent attention: ``num_attention_heads`` heads, ``v_head_dim`` channels each at ``o_proj``."""
    return {(l, "attn"): (_n_heads(cfg), cfg.v_head_dim) for l in range(cfg.num_hidden_layers)}


def granite_hybrid(cfg: Any) -> Layout:
    """GraniteMoeHybrid: attention or Mamba-2 per layer as ``layer_types`` says."""
    out: Layout = {}
    for l, t in enumerate(cfg.layer_types):
        if t in ("attention", "full_attention"):
            out[(l, "attn")] = (_n_heads(cfg), _head_dim(cfg))
        else:
            out[(l, "ssm2")] = (cfg.mamba_n_heads, cfg.mamba_d_head)
    return out


_MOE = dict(num_experts=4, num_local_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)
_MLA = dict(_SMALL, num_key_value_heads=4, kv_lora_rank=16, q_lora_rank=24, qk_rope_head_dim=8, qk_nope_head_dim=8,
            v_head_dim=16, n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2, moe_intermediate_size=32,
            first_k_dense_replace=1, n_group=1, topk_group=1)
_O = {"attn": ("model.layers.{l}.self_attn.o_proj",)}


def _mla(key: str, label: str, cls: str, **config: Any) -> Family:
    return Family(key, label, cls, {**_MLA, **config}, _O, mla, checks=_NO_PATHS,
                  limits=(("paths", "cannot receive path patches: the bridge has no hook"),),
                  note="multi-head latent attention (low-rank q and kv); one dense and one MoE layer; its heads send "
                       "paths (checked) but cannot receive them: their queries and keys come from shared low-rank "
                       "projections the bridge gives no per-head hook")


EXTRA: tuple[Family, ...] = (
    _llama_like("afmoe", "AFMoE", "AfmoeForCausalLM", **_MOE),
    _llama_like("apertus", "Apertus", "ApertusForCausalLM"),
    _llama_like("arcee", "Arcee", "ArceeForCausalLM"),
    _llama_like("bitnet", "BitNet", "BitNetForCausalLM"),
    Family("bloom", "BLOOM", "BloomForCausalLM", dict(hidden_size=64, n_layer=2, n_head=4),
           {"attn": ("transformer.h.{l}.self_attention.dense",)}, attention_only, note="ALiBi positions"),
    Family("codegen", "CodeGen", "CodeGenForCausalLM", dict(n_embd=64, n_layer=2, n_head=4, n_positions=256,
                                                               rotary_dim=8),
           {}, none, checks=("load", "logits", "heads"), unsupported=(0, 1),
           note="TransformerLens 4.3's CodeGen bridge runs the forward but gives `CodeGenAttention` no pattern or "
                "output-projection hook: both layers listed `unsupported`, no heads"),
    _llama_like("cohere", "Cohere", "CohereForCausalLM", logit_scale=0.5, note="`logit_scale` 0.5"),
    _llama_like("cohere2", "Cohere2", "Cohere2ForCausalLM", sliding_window=16, logit_scale=0.5,
                layer_types=["sliding_attention", "full_attention"], note="RoPE on sliding layers only"),
    _mla("deepseek_v2", "DeepSeek-V2", "DeepseekV2ForCausalLM"),
    _mla("deepseek_v3", "DeepSeek-V3", "DeepseekV3ForCausalLM"),
    _llama_like("ernie4_5", "ERNIE-4.5", "Ernie4_5ForCausalLM"),
    _llama_like("ernie4_5_moe", "ERNIE-4.5 MoE", "Ernie4_5_MoeForCausalLM", **_MOE),
    _llama_like("exaone4", "EXAONE-4", "Exaone4ForCausalLM"),
    Family("falcon_mamba", "Falcon-Mamba", "FalconMambaForCausalLM",
           dict(hidden_size=32, state_size=8, num_hidden_layers=2, expand=2, conv_kernel=4),
           {"ssm1": ("backbone.layers.{l}.mixer.out_proj",)}, mamba1, checks=_NO_PATHS, limits=(("paths", "cannot receive path patches"),),
           note="Mamba-1 with B/C/Δ RMS norms; its channels send paths (checked) but cannot receive them: B, C and Δ are shared by every channel of the layer"),
    _llama_like("flex_olmo", "FlexOlmo", "FlexOlmoForCausalLM", **_MOE),
    _llama_like("gemma", "Gemma", "GemmaForCausalLM", head_dim=16),
    _llama_like("glm", "GLM", "GlmForCausalLM"),
    _llama_like("glm4", "GLM-4", "Glm4ForCausalLM"),
    _llama_like("glm4_moe", "GLM-4 MoE", "Glm4MoeForCausalLM", n_routed_experts=4, num_experts_per_tok=2,
                moe_intermediate_size=32, first_k_dense_replace=1),
    _mla("glm4_moe_lite", "GLM-4 MoE Lite", "Glm4MoeLiteForCausalLM"),
    Family("gpt_bigcode", "GPT-BigCode", "GPTBigCodeForCausalLM", dict(n_embd=64, n_layer=2, n_head=4,
                                                                         n_positions=256),
           {"attn": ("transformer.h.{l}.attn.c_proj",)}, attention_only, note="multi-query attention"),
    Family("gpt_neo", "GPT-Neo", "GPTNeoForCausalLM",
           dict(hidden_size=64, num_layers=2, num_heads=4, max_position_embeddings=256, window_size=16,
                attention_types=[[["global", "local"], 1]]),
           {"attn": ("transformer.h.{l}.attn.attention.out_proj",)}, attention_only,
           note="one global and one local (window 16) layer; unscaled attention"),
    Family("gpt_oss", "gpt-oss", "GptOssForCausalLM", dict(_GQA, head_dim=16, num_local_experts=4,
                                                           num_experts_per_tok=2, sliding_window=16),
           _LLAMA_O, attention_only, sinks=True,
           note="attention sinks (a row sums to 1 less the sink's share), sliding window, MoE"),
    _llama_like("granite_moe", "Granite MoE", "GraniteMoeForCausalLM", num_local_experts=4, num_experts_per_tok=2,
                logits_scaling=1.5, attention_multiplier=0.3),
    Family("granite_moe_hybrid", "Granite MoE hybrid (Granite-4)", "GraniteMoeHybridForCausalLM",
           dict(_GQA, layer_types=["mamba", "attention"], mamba_n_heads=4, mamba_d_head=32, mamba_n_groups=2,
                mamba_d_state=8, mamba_expand=2, mamba_chunk_size=16, num_local_experts=4, num_experts_per_tok=2,
                logits_scaling=1.5, position_embedding_type="rope"),
           {"attn": ("model.layers.{l}.self_attn.o_proj",), "ssm2": ("model.layers.{l}.mamba.out_proj",)},
           granite_hybrid, note="Mamba-2 and attention layers; shared MLP plus experts"),
    _llama_like("hunyuan_dense", "Hunyuan dense", "HunYuanDenseV1ForCausalLM", head_dim=16),
    _llama_like("jais2", "Jais-2", "Jais2ForCausalLM"),
    Family("jetmoe", "JetMoE", "JetMoeForCausalLM", dict(_GQA, num_local_experts=4, num_experts_per_tok=2),
           _LLAMA_O, attention_only, checks=("load", "logits", "heads", "patterns", "kv"),
           limits=(("ablation", "has no hook 'blocks.0.attn.o.hook_in'"),),
           note="mixture of attention heads: the output projection is a mixture of experts, so a head's "
                "output has no hook to ablate at (`HeadError`)"),
    _llama_like("laguna", "Laguna", "LagunaForCausalLM", **_MOE),
    Family("lfm2", "LFM2", "Lfm2ForCausalLM", dict(_GQA, layer_types=["conv", "full_attention"]),
           {"attn": ("model.layers.{l}.self_attn.out_proj",)}, attention_at(1), unsupported=(0,),
           note="short-convolution layers have no adapter: listed `unsupported`"),
    _llama_like("llama4", "Llama-4 (text)", "Llama4ForCausalLM", head_dim=16, num_local_experts=4,
                intermediate_size_mlp=128, note="`Llama4ForCausalLM`; chunked attention, MoE"),
    _llama_like("minimax_m2", "MiniMax-M2", "MiniMaxM2ForCausalLM", head_dim=16, num_local_experts=4,
                num_experts_per_tok=2),
    _llama_like("ministral3", "Ministral-3", "Ministral3ForCausalLM"),
    _llama_like("mixtral", "Mixtral", "MixtralForCausalLM", num_local_experts=4, num_experts_per_tok=2),
    Family("modernbert_decoder", "ModernBERT decoder", "ModernBertDecoderForCausalLM",
           dict(_SMALL, local_attention=16, global_attn_every_n_layers=2),
           {"attn": ("model.layers.{l}.attn.Wo",)}, attention_only, replays=False, checks=_NO_PATHS,
           note="fused `Wqkv`, local and global layers; its LM head runs a dense layer and a norm before the "
                "decoder, so the exact scan falls back to one full forward per head (same numbers); path patching "
                "replays blocks from their recorded inputs, which this model does not allow"),
    _llama_like("nanochat", "nanochat", "NanoChatForCausalLM"),
    _llama_like("nemotron", "Nemotron", "NemotronForCausalLM", partial_rotary_factor=0.5),
    _llama_like("olmo", "OLMo", "OlmoForCausalLM"),
    _llama_like("olmo3", "OLMo-3", "Olmo3ForCausalLM", sliding_window=16),
    _llama_like("olmoe", "OLMoE", "OlmoeForCausalLM", num_experts=4, num_experts_per_tok=2),
    Family("opt", "OPT", "OPTForCausalLM", dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                                 ffn_dim=128, max_position_embeddings=256, word_embed_proj_dim=64),
           {"attn": ("model.decoder.layers.{l}.self_attn.out_proj",)}, attention_only),
    _llama_like("qwen2_moe", "Qwen2-MoE", "Qwen2MoeForCausalLM", num_experts=4, num_experts_per_tok=2,
                moe_intermediate_size=32, shared_expert_intermediate_size=64),
    _llama_like("qwen3_moe", "Qwen3-MoE", "Qwen3MoeForCausalLM", head_dim=16, num_experts=4, num_experts_per_tok=2,
                moe_intermediate_size=32),
    _llama_like("seed_oss", "Seed-OSS", "SeedOssForCausalLM"),
    _llama_like("smollm3", "SmolLM3", "SmolLM3ForCausalLM"),
    _llama_like("starcoder2", "Starcoder2", "Starcoder2ForCausalLM"),
    _llama_like("vaultgemma", "VaultGemma", "VaultGemmaForCausalLM", head_dim=16, query_pre_attn_scalar=16),
    Family("xglm", "XGLM", "XGLMForCausalLM", dict(d_model=64, num_layers=2, attention_heads=4, ffn_dim=128,
                                                   max_position_embeddings=256),
           {"attn": ("model.layers.{l}.self_attn.out_proj",)}, attention_only),
    _mla("youtu", "Youtu", "YoutuForCausalLM"),
    _mla("glm_moe_dsa", "GLM MoE DSA", "GlmMoeDsaForCausalLM", index_n_heads=2, index_head_dim=16, index_topk=8),
    _llama_like("gemma4", "Gemma-4 (text)", "Gemma4ForCausalLM",
                note="`Gemma4ForCausalLM`; per-layer input projections (per position, no heads)"),
    Family("deepseek_v4", "DeepSeek-V4", "DeepseekV4ForCausalLM", dict(_GQA, head_dim=16), _O, attention_only,
           checks=("load", "logits", "heads", "kv"), unsupported=(0, 1),
           limits=(("patterns", "blocks.0.attn.hook_pattern"), ("ablation", "has no hook 'blocks.0.attn.o.hook_in'")),
           note="the bridge gives its attention no pattern or output-projection hook, so its heads are listed "
                "but cannot be read or ablated (errors say so); the hyper-connections are listed `unsupported`"),
    Family("mpt", "MPT", "MptForCausalLM", dict(d_model=64, n_layers=2, n_heads=4, max_seq_len=256),
           {"attn": ("transformer.blocks.{l}.attn.out_proj",)}, attention_only,
           checks=("load", "logits", "heads", "patterns", "ablation", "kv"), limits=(("scan", "must match the size"),),
           note="fused `Wqkv`, ALiBi; the exact scan's stacked replay fails in the bridge's ALiBi attention "
                "(use `strategy='naive'`), and path patching, which replays blocks the same way, with it"),
    Family("openai_gpt", "OpenAI GPT", "OpenAIGPTLMHeadModel", dict(n_embd=64, n_layer=2, n_head=4, n_positions=256),
           {}, none, checks=("load", "logits", "heads"), unsupported=(0, 1),
           note="its attention bridge has no output-projection hook: listed `unsupported`"),
    Family("bert_lm", "BERT as a decoder", "BertLMHeadModel",
           dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, is_decoder=True),
           {}, none, checks=("load", "logits", "heads"), unsupported=(0, 1),
           note="`BertLMHeadModel` (`is_decoder=True`): its attention is not reached, listed `unsupported`"),
    # token mixers without an adapter: the model loads and runs, they are listed `unsupported`
    Family("lfm2_moe", "LFM2-MoE", "Lfm2MoeForCausalLM",
           dict(_GQA, layer_types=["conv", "full_attention"], num_experts=4, num_experts_per_tok=2,
                moe_intermediate_size=32, num_dense_layers=1),
           {"attn": ("model.layers.{l}.self_attn.out_proj",)}, attention_at(1), unsupported=(0,),
           note="short-convolution layers have no adapter: listed `unsupported`"),
    Family("qwen3_5", "Qwen3.5 (text)", "Qwen3_5ForCausalLM",
           dict(_GQA, head_dim=16, layer_types=["linear_attention", "full_attention"], linear_num_key_heads=2,
                linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=8),
           _O, attention_at(1), unsupported=(0,),
           note="gated delta net layers have no adapter: listed `unsupported`; gated attention analysed"),
    Family("qwen3_5_moe", "Qwen3.5-MoE (text)", "Qwen3_5MoeForCausalLM",
           dict(_GQA, head_dim=16, layer_types=["linear_attention", "full_attention"], linear_num_key_heads=2,
                linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=8, num_experts=4,
                num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=64),
           _O, attention_at(1), unsupported=(0,),
           note="gated delta net layers have no adapter: listed `unsupported`; gated attention analysed"),
    Family("recurrent_gemma", "RecurrentGemma", "RecurrentGemmaForCausalLM",
           dict(hidden_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                intermediate_size=128, lru_width=64, attention_window_size=16, head_dim=16,
                block_types=["recurrent", "recurrent", "attention"]),
           {"attn": ("model.layers.{l}.temporal_block.o_proj",)}, attention_at(2), unsupported=(0, 1),
           checks=("load", "logits", "heads", "patterns", "ablation", "scan", "kv", "paths"),
           note="RG-LRU recurrent blocks have no adapter: listed `unsupported`; local attention analysed (the "
                "exact scan's replay leaves the recurrent cache out of the recorded block inputs); one attention "
                "layer, so its heads' paths go to the logits only"),
    Family("hrm_text", "HRM text", "HrmTextForCausalLM", dict(_GQA), {}, none, checks=(),
           raises="exposes no blocks",
           note="TransformerLens's bridge for it has no `blocks`: refused at load"),
    Family("qwen3_next", "Qwen3-Next", "Qwen3NextForCausalLM",
           dict(_GQA, head_dim=16, layer_types=["linear_attention", "full_attention"], num_experts=4,
                num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=64,
                linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=8),
           _O, attention_at(1), unsupported=(0,),
           note="gated delta net layers have no adapter: listed `unsupported`; gated attention analysed"),
    Family("olmo_hybrid", "OLMo hybrid", "OlmoHybridForCausalLM",
           dict(_GQA, layer_types=["linear_attention", "full_attention"]), _O, attention_at(1), unsupported=(0,),
           note="gated delta net layers have no adapter: listed `unsupported`"),
    Family("rwkv", "RWKV", "RwkvForCausalLM", dict(hidden_size=32, num_hidden_layers=2, attention_hidden_size=32,
                                                   intermediate_size=64, context_length=256),
           {}, none, checks=("load", "logits", "heads"), unsupported=(0, 1),
           note="RWKV time-mix has no adapter: every layer listed `unsupported`, no heads"),
)

FAMILIES = FAMILIES + EXTRA


# Causal LMs of the bridge that are not rows of the matrix, with the reason (those without a class in the
# installed transformers are found and listed by :func:`remote_code_only`).
NOT_IN_MATRIX: dict[str, str] = {}


def bridge_causal_lms() -> list[str]:
    """The causal-LM architectures (``*ForCausalLM``, ``*LMHeadModel``) TransformerLens's bridge supports."""
    from transformer_lens.factories.architecture_adapter_factory import SUPPORTED_ARCHITECTURES

    return sorted(a for a in SUPPORTED_ARCHITECTURES if a.endswith(("ForCausalLM", "LMHeadModel")))


def remote_code_only() -> list[str]:
    """Bridge-supported causal LMs with no class in the installed transformers (remote-code checkpoints,
    or aliases of another class): transformers cannot build them from a config here."""
    import transformers

    return [a for a in bridge_causal_lms() if not hasattr(transformers, a) and a not in NOT_IN_MATRIX]


def family(key: str) -> Family:
    """The family with ``key``."""
    return next(f for f in FAMILIES if f.key == key)


# ---- the page -------------------------------------------------------------------------------------------


def unsupported_message() -> str:
    """The real message of :class:`~gna_interp.errors.UnsupportedArchitectureError` for a tiny BioGPT
    checkpoint (an architecture the bridge does not support), with its temporary path replaced."""
    from transformers import BioGptConfig, BioGptForCausalLM

    from gna_interp import load_model
    from gna_interp.errors import UnsupportedArchitectureError
    from gna_interp.models.loading import quiet_transformers
    from gna_interp.models.tiny import byte_tokenizer

    with tempfile.TemporaryDirectory() as tmp:
        with quiet_transformers():
            BioGptForCausalLM(BioGptConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1,
                                           num_attention_heads=2, intermediate_size=64)).save_pretrained(tmp)
        byte_tokenizer().save_pretrained(tmp)
        try:
            load_model(tmp, device="cpu")
        except UnsupportedArchitectureError as e:
            return str(e).replace(repr(tmp), "'./biogpt-checkpoint'").replace(tmp, "./biogpt-checkpoint")
    raise AssertionError("BioGPT loaded: pick another architecture the bridge does not support")


def render() -> str:
    """The Markdown of ``docs/family_matrix.md``."""
    analysed = [f for f in FAMILIES if not f.raises and f.proj]
    lines = [
        "# Family matrix",
        "",
        "<!-- generated by `python -m tests.family_matrix` from the list in tests/family_matrix.py; "
        "tests/test_family_matrix.py checks this page equals what it writes -->",
        "",
        f"TransformerLens's bridge (installed here) lists {len(bridge_causal_lms())} causal-LM architectures. "
        f"Every one that the installed transformers can build is a row below ({len(FAMILIES)} families; "
        f"{len(analysed)} with heads gna_interp analyses). Each is built as a tiny random-initialised model with "
        "`from_config` (2-4 layers, `d_model` 32-64, the 257-token byte-level tokenizer of "
        "`gna_interp.models.tiny`), saved to a folder and loaded with `gna.load_model(folder)`. "
        "`tests/test_family_matrix.py` then checks, on CPU in float32, against computations that do not go "
        "through gna_interp:",
        "",
    ]
    lines += [f"- **{name}**: {text};" for name, text in CHECKS.items()]
    lines[-1] = lines[-1][:-1] + "."
    lines += ["", "✓: the check runs in CI and passes. ✗: it fails with the error the notes give, and a test asserts "
              "that error (a fix upstream shows up as a failing test). —: it does not apply (no heads of that "
              "family are analysed).", "",
              "| family | HF class | heads | status | " + " | ".join(CHECKS) + " | notes |",
              "|---|---|---|---|" + "---|" * len(CHECKS) + "---|"]
    for f in FAMILIES:
        kinds = ", ".join(f"`{k}`" for k in sorted(f.proj)) or "none"
        failing = {c for c, _ in f.limits}
        cells = " | ".join("✓" if c in f.checks else "✗" if c in failing else "—" for c in CHECKS)
        lines.append(f"| {f.label} | `{f.cls}` | {kinds} | {f.status} | {cells} | {f.note} |")
    lines += [
        "",
        "Head kinds: `attn` is one query head of an attention layer (grouped-query and multi-query layouts "
        "included), `ssm2` one Mamba-2 head, `ssm1` one Mamba-1 channel (see [Concepts](concepts.md)). Where one "
        "attention block runs at several depths (Zamba2), its heads are listed at each depth and ablating `L3H1` "
        "acts at depth 3 only, so that check zeroes the columns while that depth runs instead of editing the "
        "shared weights.",
        "",
        "Not in the matrix: the bridge's causal LMs that have no class in the installed transformers (remote-code "
        "checkpoints, or another spelling of a class above), which transformers cannot build from a config here: "
        + ", ".join(f"`{a}`" for a in remote_code_only()) + ".",
    ]
    if NOT_IN_MATRIX:
        lines += [""] + [f"- `{a}`: {why}" for a, why in sorted(NOT_IN_MATRIX.items())]
    lines += [
        "",
        "## An architecture that is not supported",
        "",
        "`load_model` raises `UnsupportedArchitectureError` (a `GnaError`; `gna` prints it and exits with "
        "status 2) when TransformerLens's bridge has no adapter for the checkpoint's architecture. For a "
        "BioGPT checkpoint the message is:",
        "",
        "```text",
        unsupported_message(),
        "```",
        "",
        "A model the bridge loads but whose token mixers no gna_interp adapter recognises (RWKV time-mix, "
        "LFM2 short convolutions, gated delta nets, RecurrentGemma's RG-LRU) loads and runs, and each such mixer "
        "is listed with kind `unsupported` and no heads: `model.unsupported()` returns them and `gna models` "
        "prints them. Asking for a head there raises `HeadError`; a scan with no supported head raises "
        "`InputError`.",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    """Write ``docs/family_matrix.md``."""
    PAGE.write_text(render(), encoding="utf-8")
    print(f"wrote {PAGE.relative_to(ROOT)}", file=sys.stderr)


if __name__ == "__main__":
    main()
