"""Scaling without big weights: the shipped 7-8B configs on the meta device (heads, hooks, no allocation),
the scan estimate, and half precision on CPU against float32.

Meta loads read only the config.json files shipped in gna_interp/data/configs: no network, no weights.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

import gna_interp as gna
from gna_interp.cli import main
from gna_interp.errors import InputError, ModelPathError, OptionError, UnknownModelError, UnsupportedArchitectureError
from gna_interp.models.estimate import DEVICES, Device, check_hooks, estimate_scan, forward_flops, get_device
from gna_interp.models.loading import MissingTokenizer, configs_dir, parse_dtype, shipped_configs
from gna_interp.models.hf import unwrap
from gna_interp.engine.forward import run_plan
from gna_interp.engine.plan import plan_scoring
from gna_interp.engine.unembed import read_logprobs

GiB = 1 << 30


def _config(name: str) -> dict:
    return json.loads((configs_dir() / name / "config.json").read_text())


def _expected_heads(name: str) -> dict[str, int]:
    """Head counts by kind derived from the config file alone (independently of gna_interp's detection)."""
    cfg = _config(name)
    t = cfg["model_type"]
    if t == "llama":
        return {"attn": cfg["num_hidden_layers"] * cfg["num_attention_heads"]}
    if t == "falcon_mamba":
        return {"ssm1": cfg["num_hidden_layers"] * cfg["intermediate_size"]}
    if t == "zamba2":  # every layer has a Mamba-2 mixer; hybrid layers add a run of a shared attention block
        n_hybrid = sum(k == "hybrid" for k in cfg["layers_block_type"])
        return {"ssm2": cfg["num_hidden_layers"] * cfg["n_mamba_heads"], "attn": n_hybrid * cfg["num_attention_heads"]}
    raise AssertionError(t)


def _rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    pytest.skip("no /proc/self/status on this platform")


@pytest.fixture(scope="module")
def meta_models():
    """The four shipped configs loaded on the meta device (float32: 32 GB of weights for Llama-3.1-8B if
    anything were allocated)."""
    return {name: gna.load_model(f"config:{name}", device="meta") for name in shipped_configs()}


def test_the_shipped_configs_are_the_published_ones():
    assert set(shipped_configs()) >= {"llama-3.1-8b", "llama-3.2-1b", "falcon-mamba-7b", "zamba2-7b"}
    l8 = _config("llama-3.1-8b")
    assert (l8["num_hidden_layers"], l8["num_attention_heads"], l8["num_key_value_heads"], l8["hidden_size"],
            l8["hidden_size"] // l8["num_attention_heads"]) == (32, 32, 8, 4096, 128)
    l1 = _config("llama-3.2-1b")
    assert (l1["num_hidden_layers"], l1["num_attention_heads"], l1["num_key_value_heads"], l1["head_dim"],
            l1["hidden_size"]) == (16, 32, 8, 64, 2048)
    fm = _config("falcon-mamba-7b")
    assert (fm["model_type"], fm["num_hidden_layers"], fm["hidden_size"], fm["intermediate_size"],
            fm["state_size"]) == ("falcon_mamba", 64, 4096, 8192, 16)
    z = _config("zamba2-7b")
    assert (z["num_hidden_layers"], z["hidden_size"], z["n_mamba_heads"], z["mamba_d_state"], z["num_mem_blocks"],
            [i for i, k in enumerate(z["layers_block_type"]) if k == "hybrid"]) == \
        (81, 3584, 112, 64, 2, [6, 11, 17, 23, 29, 35, 41, 47, 53, 59, 65, 71, 77])


def test_meta_load_allocates_no_weights():
    before = _rss()
    model = gna.load_model("config:llama-3.1-8b", device="meta")  # float32: 32 GB if allocated
    grown = _rss() - before
    assert model.is_meta and model.dtype == torch.float32
    assert all(p.is_meta for p in model.hf_model.parameters())
    assert all(b.is_meta for b in model.hf_model.buffers())
    assert sum(p.numel() for p in model.hf_model.parameters()) == 8_030_261_248
    assert grown < 1 * GiB, f"meta load grew the process by {grown / GiB:.2f} GiB"


@pytest.mark.parametrize("name", ["llama-3.1-8b", "llama-3.2-1b", "falcon-mamba-7b", "zamba2-7b"])
def test_meta_configs_list_the_right_heads(name, meta_models):
    model = meta_models[name]
    counts: dict[str, int] = {}
    for s in model.layers:
        if s.supported:
            counts[s.kind] = counts.get(s.kind, 0) + s.n_heads
    assert counts == _expected_heads(name)
    assert model.unsupported() == []
    assert model.n_layers == _config(name)["num_hidden_layers"]


def test_llama_8b_layout(meta_models):
    model = meta_models["llama-3.1-8b"]
    heads = model.heads()
    assert len(heads) == 1024 and heads[0].name == "L0H0" and heads[-1].name == "L31H31"
    spec = model.layer_spec(17, "attn")
    assert (spec.n_heads, spec.n_groups, spec.head_dim) == (32, 8, 128)
    site = model.head_site("L16H22")
    assert (site.hook, site.start, site.stop, site.width) == ("blocks.16.attn.o.hook_in", 22 * 128, 23 * 128, 4096)
    assert tuple(model.output_projection("L16H22").shape) == (4096, 4096)


def test_falcon_mamba_layout(meta_models):
    model = meta_models["falcon-mamba-7b"]
    spec = model.layer_spec(35, "ssm1")
    assert (spec.n_heads, spec.state_size) == (8192, 16)
    assert model.head_site("L35C3186").hook == "blocks.35.mixer.out_proj.hook_in"
    assert len(model.default_heads()) == 64 * 16  # each layer shown as 16 groups of 512 channels


@pytest.mark.parametrize("name, n_hooks", [("llama-3.1-8b", 64), ("llama-3.2-1b", 32), ("falcon-mamba-7b", 128),
                                           ("zamba2-7b", 2 * 81 + 2 * 13)])
def test_every_hook_of_every_head_resolves(name, n_hooks, meta_models):
    model = meta_models[name]
    check = check_hooks(model)
    assert check.ok, check.summary()
    assert check.heads == {k: v for k, v in _expected_heads(name).items()}
    assert len(check.hooks) == n_hooks  # one ablation site and one pattern hook per mixer
    assert check.unsupported == ()


def test_hook_check_reports_a_missing_hook(monkeypatch):
    model = gna.load_model("config:llama-3.2-1b", device="meta")
    registry = dict(model.bridge._hook_registry)
    del registry["blocks.3.attn.o.hook_in"]
    monkeypatch.setattr(model.bridge, "_hook_registry", registry)
    check = check_hooks(model)
    assert not check.ok and check.n_missing == 32
    assert check.missing[0] == ("L3H0", "blocks.3.attn.o.hook_in")


def test_meta_model_refuses_to_run_and_says_what_to_do(meta_models):
    model = meta_models["llama-3.2-1b"]
    assert isinstance(model.tokenizer, MissingTokenizer)
    with pytest.raises(InputError, match="meta device .* cannot run a forward.*weights on a real device"):
        model.forward(torch.tensor([[1, 2, 3]]))
    with pytest.raises(InputError, match="meta device"):
        gna.patterns(model, torch.tensor([[1, 2, 3]]), heads=["L0H0"])
    with pytest.raises(InputError, match="no tokenizer files"):
        model.tokenize("hello")
    with pytest.raises(InputError, match="no tokenizer files"):
        gna.evaluate(model, gna.KVRetrieval(3, 2))


def test_config_only_folder_without_meta_says_what_to_do(tmp_path):
    (tmp_path / "config.json").write_text((configs_dir() / "llama-3.2-1b" / "config.json").read_text())
    with pytest.raises(ModelPathError, match="no weights: pass device='meta'"):
        gna.load_model(tmp_path, device="cpu")
    assert gna.load_model(tmp_path, device="meta").heads()[-1].name == "L15H31"


def test_unsupported_config_folders(tmp_path):
    (tmp_path / "unknown").mkdir()
    (tmp_path / "unknown" / "config.json").write_text(json.dumps({"model_type": "no_such_model", "hidden_size": 8}))
    with pytest.raises(UnsupportedArchitectureError, match="model_type 'no_such_model'"):
        gna.load_model(tmp_path / "unknown", device="meta")
    (tmp_path / "vision").mkdir()  # a real transformers config without a causal language model
    (tmp_path / "vision" / "config.json").write_text(json.dumps({"model_type": "vit"}))
    with pytest.raises(UnsupportedArchitectureError, match="no causal language model"):
        gna.load_model(tmp_path / "vision", device="meta")
    with pytest.raises(UnknownModelError, match="no shipped config 'gpt-9'.*config:llama-3.1-8b"):
        gna.load_model("config:gpt-9", device="meta")


def test_unknown_dtype_is_refused_before_loading():
    with pytest.raises(OptionError, match="dtype 'int8' is not supported: use one of float32, bfloat16, float16"):
        gna.load_model("config:llama-3.2-1b", device="meta", dtype="int8")
    assert parse_dtype("BFloat16") is torch.bfloat16 and parse_dtype(torch.float16) is torch.float16
    with pytest.raises(OptionError):
        parse_dtype(torch.float64)


# ---- the estimate ------------------------------------------------------------------------------

def test_flops_count_matches_the_textbook_formula(meta_models):
    """Llama-3.1-8B: 2 x non-embedding parameters per token plus attention's 4 x heads x d_head x T^2 per
    layer, plus the unembedding -- computed here from the config numbers."""
    c = _config("llama-3.1-8b")
    d, v, L, T = c["hidden_size"], c["vocab_size"], c["num_hidden_layers"], 100
    kv = c["num_key_value_heads"] * 128
    per_layer = d * d + 2 * d * kv + d * d + 3 * d * c["intermediate_size"] + 2 * d  # q, k, v, o, MLP, 2 norms
    want = 2 * per_layer * L * T + 4 * 32 * 128 * T * T * L + 2 * d * v * T
    assert forward_flops(meta_models["llama-3.1-8b"], T) == pytest.approx(want, rel=1e-12)


def test_estimate_of_llama_8b(meta_models):
    model = meta_models["llama-3.1-8b"]
    e = estimate_scan(model, samples=32, tokens=64, device="H100-80GB", dtype="bfloat16")
    assert e.n_heads == 1024 and e.heads == {"attn": 1024}
    unembedding = 128_256 * 4_096  # kept in float32 by a half-precision load: 2 more bytes a weight
    assert e.weight_bytes == pytest.approx(8_030_261_248 * 2 + unembedding * 2, rel=1e-3)
    # replay fraction: heads spread evenly over 32 equal blocks -> mean of (32 - L) / 32 = 33 / 64
    assert e.replay_fraction == pytest.approx(33 / 64, rel=1e-9)
    assert e.exact_forwards == pytest.approx(1024 * 32 * 33 / 64)
    assert e.prefix_bytes == 32 * 64 * 4096 * 32 * 2 and e.prefix_kept
    assert e.fits and e.fits_exact and e.exact_peak_bytes <= e.peak_bytes < 80 * GiB
    f32 = estimate_scan(model, samples=32, tokens=64, device="H100-80GB", dtype="float32")
    assert f32.weight_bytes == pytest.approx(8_030_261_248 * 4, rel=1e-3)
    assert f32.seconds_exact > 10 * e.seconds_exact  # 67 vs 989 TFLOP/s
    l4 = estimate_scan(model, samples=32, tokens=64, device="L4", dtype="float32")
    assert not l4.fits  # 30 GiB of float32 weights on a 24 GB card
    assert "data-sheet" in e.notes[0]


def test_estimate_scales_with_the_task(meta_models):
    model = meta_models["llama-3.2-1b"]
    a = estimate_scan(model, samples=32, tokens=64, device="A100-80GB", dtype="bfloat16")
    b = estimate_scan(model, samples=64, tokens=64, device="A100-80GB", dtype="bfloat16")
    c = estimate_scan(model, samples=32, tokens=256, device="A100-80GB", dtype="bfloat16")
    assert b.exact_flops == pytest.approx(2 * a.exact_flops, rel=1e-9)
    assert c.exact_flops > 4 * a.exact_flops  # linear terms x4 plus attention's quadratic term
    half = estimate_scan(model, samples=32, tokens=64, device="A100-80GB", dtype="bfloat16",
                         heads=[h for h in model.heads() if h.layer >= 8])
    assert half.n_heads == 256 and half.replay_fraction < a.replay_fraction


def test_estimate_of_the_ssm_and_hybrid_configs(meta_models):
    fm = estimate_scan(meta_models["falcon-mamba-7b"], samples=32, tokens=64, device="H100-80GB", dtype="bfloat16")
    assert fm.heads == {"ssm1": 64 * 8192}
    grouped = estimate_scan(meta_models["falcon-mamba-7b"], samples=32, tokens=64, device="H100-80GB",
                            dtype="bfloat16", heads=meta_models["falcon-mamba-7b"].default_heads())
    assert grouped.n_heads == 1024 and grouped.seconds_exact < fm.seconds_exact / 100
    # the torch path's Mamba-1 backward keeps [batch, d_inner, T, state] float32 tensors in every layer: an auto
    # scan's attribution does not fit on 80 GB, an exact scan does
    assert fm.fits_exact and not fm.fits and fm.attribution_bytes > 60 * GiB
    z = estimate_scan(meta_models["zamba2-7b"], samples=32, tokens=64, device="H100-80GB", dtype="bfloat16")
    assert z.heads == {"ssm2": 9072, "attn": 416}
    assert any("torch path" in n for n in z.notes)


def test_cpu_row_is_calibrated_on_a_measured_scan():
    """cpu-2core reproduces the measurement it was calibrated on: SmolLM2-135M's exact heads at about 3 s
    each (docs/discovery.md: KV, 10 pairs, 32 samples of 64 tokens), from SmolLM2's shapes alone."""
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 576, "intermediate_size": 1536,
           "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3, "vocab_size": 49152,
           "max_position_embeddings": 8192, "tie_word_embeddings": True, "rms_norm_eps": 1e-5}
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        Path(d, "config.json").write_text(json.dumps(cfg))
        smol = gna.load_model(d, device="meta")
    e = estimate_scan(smol, samples=32, tokens=64, device="cpu-2core")
    assert e.params == 134_515_008 and e.n_heads == 270
    assert 2.5 < e.seconds_per_head < 3.5
    assert DEVICES["cpu-2core"].measured and not DEVICES["H100-80GB"].measured


def test_estimate_bad_input(meta_models):
    model = meta_models["llama-3.2-1b"]
    with pytest.raises(OptionError, match="unknown device 'TPU'.*H100-80GB"):
        estimate_scan(model, device="TPU")
    with pytest.raises(InputError, match="samples must be an integer >= 1"):
        estimate_scan(model, samples=0)
    with pytest.raises(InputError, match="exceeds the context"):
        estimate_scan(model, tokens=10**7)
    assert get_device("h100-80gb").name == "H100-80GB"
    slow = Device("slow", {"float32": 1.0}, 1, None, 1.0, True, "test")
    with pytest.raises(OptionError, match="no throughput figure for bfloat16"):
        estimate_scan(model, device=slow, dtype="bfloat16")


def test_gna_models_estimate_cli(capsys, tmp_path):
    assert main(["models", "config:llama-3.1-8b", "--estimate", "--gpu", "H100-80GB", "--dtype", "bfloat16"]) == 0
    out = capsys.readouterr().out
    assert "heads: 1024 attn" in out and "hooks: 1,024 attn; 64 hook names resolved" in out
    assert "assumed: no tokenizer" in out
    row = next(line for line in out.splitlines() if line.startswith("config:llama-3.1-8b ") and "H100" in line)
    assert "bfloat16" in row and "1,024" in row and "15.94 GiB" in row and " yes " in row
    assert main(["models", "config:llama-3.2-1b", "--estimate", "--gpu", "TPU"]) == 2
    assert "unknown device 'TPU'" in capsys.readouterr().err
    assert main(["models", "config:llama-3.2-1b", "--dtype", "int8"]) == 2
    assert main(["--device", "meta", "scan", "--model", "config:llama-3.2-1b", "--out", str(tmp_path / "scan")]) == 2
    assert "cannot run a forward" in capsys.readouterr().err


# ---- half precision on CPU ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def precisions(tiny_dirs):
    """The tiny random Llama and the shipped zoo Transformer in float32, bfloat16 and float16."""
    out = {}
    for name, spec in (("tiny", tiny_dirs["llama"]), ("zoo", "zoo:transformer-kv")):
        if name == "zoo" and "transformer-kv" not in gna.models.zoo_names():
            continue
        out[name] = {dt: gna.load_model(spec, device="cpu", dtype=dt) for dt in ("float32", "bfloat16", "float16")}
    return out


# Measured (this machine, seed 0, float32 output end): tiny random Llama, bf16 - fp32: scores 0.0035, patterns 0.0019,
# scan drops 0.00045; zoo Transformer: scores 0.19 (of up to 41 nats: 0.5 %), patterns 0.027, drops 0.017 (largest
# drop 18.8), same top 3.
TOL = {"tiny": {"score": 0.02, "pattern": 0.01, "drop": 0.005},
       "zoo": {"score_rtol": 0.02, "score": 0.05, "pattern": 0.06, "drop": 0.1}}


def test_read_logprobs_are_float32_from_half_logits():
    logits = torch.randn(3, 50).to(torch.bfloat16)
    lp = read_logprobs(logits, torch.tensor([1, 2, 3]))
    assert lp.dtype == torch.float32
    torch.testing.assert_close(lp, torch.log_softmax(logits.float(), -1)[torch.arange(3), [1, 2, 3]])


@pytest.mark.parametrize("family", ["llama", "mamba2"])
def test_half_precision_logits_come_from_a_float32_output_end(tiny_dirs, family):
    """The last block's half-precision output, normed and unembedded by hand in float32 from the float32
    model's weights (rounded to bf16, as the bf16 model got them), equals the bf16 model's logits; the
    embedding keeps its dtype and the float32 model is left as it was."""
    ref = gna.load_model(tiny_dirs[family], device="cpu")
    half = gna.load_model(tiny_dirs[family], device="cpu", dtype="bfloat16")
    ids = torch.tensor([[1, 5, 9, 3, 7, 2]])
    seen = {}
    logits = half.run(ids, fwd_hooks=[(half.block_output_hook(half.n_layers - 1),
                                       lambda t, hook: seen.setdefault("resid", t.detach()))])
    assert logits.dtype == torch.float32 and half.dtype == torch.bfloat16
    norm, head = unwrap(ref.bridge.ln_final), unwrap(ref.bridge.unembed)
    x = seen["resid"].float()
    eps = getattr(norm, "variance_epsilon", getattr(norm, "eps", None))
    normed = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * norm.weight.to(torch.bfloat16).float()
    expected = normed @ head.weight.to(torch.bfloat16).float().T
    torch.testing.assert_close(logits, expected, atol=1e-4, rtol=1e-5)
    emb = half.hf_model.get_input_embeddings().weight
    assert emb.dtype == torch.bfloat16 and unwrap(half.bridge.unembed).weight.dtype == torch.float32
    assert unwrap(ref.bridge.unembed).weight.dtype == torch.float32 and not ref.bridge.ln_final._forward_pre_hooks


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_scores_stay_close_to_float32(precisions, dtype):
    for name, ms in precisions.items():
        assert ms[dtype].dtype == getattr(torch, dtype) and ms["float32"].dtype == torch.float32
        words = ms["float32"].kv_words
        task = gna.KVRetrieval(4 if words else 5, 16, seed=0, max_value=9, words=words)
        ref = run_plan(ms["float32"], plan_scoring(ms["float32"], task.samples), 8)
        got = run_plan(ms[dtype], plan_scoring(ms[dtype], task.samples), 8)
        assert got.scores.dtype == torch.float64  # scores are accumulated in float64 from float32 log-probs
        tol = TOL[name]
        torch.testing.assert_close(got.scores, ref.scores, atol=tol["score"], rtol=tol.get("score_rtol", 0.0))
        if name == "zoo":  # the trained model's answers do not flip (a random model's near-ties may)
            assert torch.equal(got.correct, ref.correct)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_patterns_are_float32_and_close(precisions, dtype):
    for name, ms in precisions.items():
        prompt = gna.KVRetrieval(4, 1, seed=1, max_value=9, words=ms["float32"].kv_words).samples[0].prompt
        ref = gna.patterns(ms["float32"], prompt, heads=ms["float32"].heads()).stack()
        got = gna.patterns(ms[dtype], prompt, heads=ms[dtype].heads()).stack()
        assert got.dtype == torch.float32
        torch.testing.assert_close(got.sum(-1), torch.ones(got.shape[:-1]), atol=2e-2, rtol=0)
        assert (got - ref).abs().max().item() <= TOL[name]["pattern"]


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_ablation_and_scan(precisions, dtype):
    for name, ms in precisions.items():
        words = ms["float32"].kv_words
        task = gna.KVRetrieval(4 if words else 5, 16, seed=0, max_value=9, words=words)
        scans = {dt: gna.scan_heads(ms[dt], task, strategy="exact", progress=False) for dt in ("float32", dtype)}
        ref, got = (scans[dt].to_frame().set_index("name") for dt in ("float32", dtype))
        assert got["drop"].dtype == ref["drop"].dtype
        assert (got["drop"] - ref["drop"]).abs().max() <= TOL[name]["drop"]
        assert math.isfinite(got["baseline"].iloc[0])
        if name == "zoo":
            assert scans[dtype].top(3) == scans["float32"].top(3)
        heads = scans["float32"].top(2)
        with gna.ablate(ms[dtype], heads):
            ablated = run_plan(ms[dtype], plan_scoring(ms[dtype], task.samples), 8)
        with gna.ablate(ms["float32"], heads):
            ablated_ref = run_plan(ms["float32"], plan_scoring(ms["float32"], task.samples), 8)
        tol = TOL[name]
        torch.testing.assert_close(ablated.scores, ablated_ref.scores, atol=tol["score"],
                                   rtol=tol.get("score_rtol", 0.0))
        assert next(ms[dtype].hf_model.parameters()).dtype == getattr(torch, dtype)  # ablation left the weights


def _llama_config_model(folder: Path, vocab: int):
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256, "intermediate_size": 512,
           "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 1, "vocab_size": vocab,
           "max_position_embeddings": 2048, "tie_word_embeddings": False, "rms_norm_eps": 1e-5}
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(cfg))
    return gna.load_model(str(folder), device="meta")


@pytest.mark.parametrize("reads", [1, 3])
def test_estimate_pays_the_vocabulary_at_the_reads(tmp_path, reads):
    """Two configs that differ only in vocab_size: every pass (the capture, each replayed copy, attribution's three
    forwards) unembeds ``reads`` positions a sample, 2 x reads x d_model x vocab FLOPs each; on a CPU each pass also
    reads the vocab x d_model float32 weight at least once."""
    small, large = _llama_config_model(tmp_path / "v1k", 1024), _llama_config_model(tmp_path / "v262k", 262_144)
    d, dv, samples, n_heads = 256, 262_144 - 1024, 32, 8
    for device in ("H100-80GB", "cpu-2core"):
        a, b = (estimate_scan(m, samples=samples, tokens=64, device=device, reads=reads) for m in (small, large))
        assert a.reads == reads and a.n_heads == n_heads
        per_pass = 2.0 * reads * d * dv * samples  # extra FLOPs of one pass over the task at the larger vocabulary
        assert b.exact_flops - a.exact_flops == pytest.approx(per_pass * (1 + n_heads), rel=1e-9)  # capture + a copy per head
        assert b.attribution_flops - a.attribution_flops == pytest.approx(3 * per_pass, rel=1e-9)
        assert b.seconds_exact > a.seconds_exact and b.seconds_attribution > a.seconds_attribution
    cpu = estimate_scan(large, samples=samples, tokens=64, device="cpu-2core", reads=reads)
    chunks, groups = 2, 4  # 32 samples in batches of 16; 2 layers x 4 heads stacked 4 at a time
    floor = (1 + groups + 3) * chunks * d * 262_144 * 4 / 16e9  # capture, replays, attribution: one weight pass each
    assert cpu.seconds_exact + cpu.seconds_attribution >= floor  # seconds_exact includes the capture
    assert any("GB/s" in n for n in cpu.notes)
