"""Tiny random-initialised models of every supported family, saved in Hugging Face format.

For tests, benchmarks and examples that must run offline: ``build_tiny("llama", dir)`` writes a
real ``LlamaForCausalLM`` (GQA), ``MambaForCausalLM``, ``Mamba2ForCausalLM``, ``BambaForCausalLM``
(Mamba-2 + attention hybrid) or ``JambaForCausalLM`` (Mamba-1 + attention hybrid) with a byte-level
tokenizer, loadable with :func:`gna_interp.load_model`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable

import torch

FAMILIES = ("llama", "mamba", "mamba2", "bamba", "jamba")


def byte_tokenizer() -> Any:
    """A byte-level tokenizer (256 byte symbols + ``<|endoftext|>``, no merges): works on any text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<|endoftext|>": 0}
    for ch in sorted(pre_tokenizers.ByteLevel.alphabet()):
        vocab[ch] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|endoftext|>",
                                   eos_token="<|endoftext|>", pad_token="<|endoftext|>")


def _configs(vocab: int) -> dict[str, Callable[[], tuple[Any, Any]]]:
    import transformers as T

    return {
        "llama": lambda: (T.LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512),
                          T.LlamaForCausalLM),
        "mamba": lambda: (T.MambaConfig(vocab_size=vocab, hidden_size=32, state_size=8, num_hidden_layers=2, expand=2,
                                        conv_kernel=4), T.MambaForCausalLM),
        "mamba2": lambda: (T.Mamba2Config(vocab_size=vocab, hidden_size=32, state_size=8, num_hidden_layers=2, expand=2,
                                          head_dim=16, num_heads=4, n_groups=2, conv_kernel=4, chunk_size=16),
                           T.Mamba2ForCausalLM),
        "bamba": lambda: (T.BambaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                                        num_attention_heads=4, num_key_value_heads=2, attn_layer_indices=[1],
                                        mamba_n_heads=4, mamba_d_head=32, mamba_n_groups=2, mamba_d_state=8,
                                        mamba_expand=2, mamba_chunk_size=16, max_position_embeddings=512),
                          T.BambaForCausalLM),
        "jamba": lambda: (T.JambaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                                        num_attention_heads=4, num_key_value_heads=2, attn_layer_period=3,
                                        attn_layer_offset=1, expert_layer_period=100, expert_layer_offset=99,
                                        num_experts=1, mamba_d_state=8, mamba_expand=2, max_position_embeddings=512),
                          T.JambaForCausalLM),
    }


def build_tiny(family: str, path: str | os.PathLike, seed: int = 0) -> Path:
    """Write a tiny random-initialised ``family`` model plus a byte tokenizer to ``path``; return it."""
    if family not in FAMILIES:
        raise ValueError(f"unknown tiny family {family!r}; choose one of {FAMILIES}")
    tok = byte_tokenizer()
    config, cls = _configs(len(tok))[family]()
    return save_tiny(config, cls, tok, path, seed)


def save_tiny(config: Any, cls: type, tok: Any, path: str | os.PathLike, seed: int = 0) -> Path:
    """Initialise ``cls(config)`` with ``seed`` (pad/bos/eos = the tokenizer's eos) and save it with ``tok``
    to ``path``; return it."""
    from gna_interp.models.loading import quiet_transformers

    config.pad_token_id = config.eos_token_id = config.bos_token_id = tok.eos_token_id
    torch.manual_seed(seed)
    from gna_interp.store import write_files

    with quiet_transformers():
        model = cls(config).eval()

        def fill(tmp: Path) -> None:
            model.save_pretrained(tmp)
            tok.save_pretrained(tmp)

        return write_files(path, fill)
