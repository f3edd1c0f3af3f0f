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
}
ALL = tuple(CHECKS)

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
            if not hasattr(mod, "A_log") or not hasattr(mod, "conv1d"):
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
    """Every layer one attention layer of ``num_attention_heads`` query heads."""
    return {(l, "attn"): (_n_heads(cfg), _head_dim(cfg)) for l in range(cfg.num_hidden_layers)}


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
           {"ssm1": ("backbone.layers.{l}.mixer.out_proj",)}, mamba1, note="Mamba-1 (S6): one head per channel"),
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
           note="one mixer per layer: Mamba-2, attention, MLP (lists no heads)"),
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
    mark = {True: "✓", False: "—"}
    lines = [
        "# Family matrix",
        "",
        "<!-- generated by `python -m tests.family_matrix` from the list in tests/family_matrix.py; "
        "tests/test_family_matrix.py checks this page equals what it writes -->",
        "",
        "Every family below is built as a tiny random-initialised model with `AutoModelForCausalLM.from_config` "
        "(2-4 layers, `d_model` 32-64, the 257-token byte-level tokenizer of `gna_interp.models.tiny`), saved to "
        "a folder and loaded with `gna.load_model(folder)`. `tests/test_family_matrix.py` then checks, on CPU "
        "in float32, against computations that do not go through gna_interp:",
        "",
    ]
    lines += [f"- **{name}**: {text};" for name, text in CHECKS.items()]
    lines[-1] = lines[-1][:-1] + "."
    lines += ["", "A ✓ is a check that runs in CI for that family; — is one that does not apply.", "",
              "| family | HF class | heads | " + " | ".join(CHECKS) + " | notes |",
              "|---|---|---|" + "---|" * len(CHECKS) + "---|"]
    for f in FAMILIES:
        kinds = sorted({k for k in f.proj})
        cells = " | ".join(mark[c in f.checks] for c in CHECKS)
        lines.append(f"| {f.label} | `{f.cls}` | {', '.join(f'`{k}`' for k in kinds)} | {cells} | {f.note} |")
    lines += [
        "",
        "Head kinds: `attn` is one query head of an attention layer (grouped-query layouts included), "
        "`ssm2` one Mamba-2 head, `ssm1` one Mamba-1 channel (see [Concepts](concepts.md)). Where one attention "
        "block runs at several depths (Zamba2), its heads are listed at each depth and ablating `L3H1` acts at "
        "depth 3 only, so that check zeroes the columns while that depth runs instead of editing the shared "
        "weights.",
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
        "LFM2 short convolutions, gated delta nets) loads, and each such mixer is listed with kind "
        "`unsupported` and no heads: `model.unsupported()` returns them and `gna models` prints them. "
        "Asking for a head there raises `HeadError`; a scan with no supported head raises `InputError`.",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    """Write ``docs/family_matrix.md``."""
    PAGE.write_text(render(), encoding="utf-8")
    print(f"wrote {PAGE.relative_to(ROOT)}", file=sys.stderr)


if __name__ == "__main__":
    main()
