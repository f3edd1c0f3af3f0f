"""Devices: the same checks on every available device (CPU always, CUDA where there is one).

Each device test is parametrised over :data:`DEVICES`; the ``cuda`` cases carry the ``cuda`` marker and
are skipped when ``torch.cuda.is_available()`` is False (tests/conftest.py), so on a machine without a GPU
the CPU half still runs and proves the test bodies. Every check compares against an independent
computation: the raw Hugging Face model (logits, attention weights), the mixer's own output (SSM implicit
attention), a weight edit (ablation), the naive one-forward-per-head loop (scan) and float32 (bfloat16).

Stated tolerances, bfloat16 against float32 on the same device, zoo models (16 KV samples):
:data:`BF16_DROP_TOL` on every head's drop (the CPU measured 0.029 for the Transformer, docs/scaling.md)
and the same top-3 heads (as a set). Measured on CPU: Transformer 0.029 (largest drop 18.8),
Mamba-2 0.032 (largest 1.95).

The sizing of ``ScanConfig.stack`` on CUDA (:func:`~gna_interp.models.estimate.replay_stack`) is tested
here on CPU with fake free-memory numbers.
"""

from __future__ import annotations

import json
import warnings

import pytest
import torch

import gna_interp as gna
from gna_interp.engine.unembed import logit_atol as replay_atol
from gna_interp.engine.replay import default_stack as _default_stack
from gna_interp.errors import InputError
from gna_interp.models import zoo_dir, zoo_names
from gna_interp.models.estimate import (CPU_REPLAY_TOKENS, STACK_MEMORY_SHARE, measure_row_bytes, replay_row_bytes,
                                        replay_stack)
from gna_interp.models.model import Model
from gna_interp.models.ssm import layer_terms
from gna_interp.models.ssm_kernel import mixer_output
from gna_interp.engine.layout import layout_chunks
from gna_interp.engine.plan import plan_scoring

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]
ZOO = ["transformer-kv", "mamba2-kv"]
BF16_DROP_TOL = 0.1

pytestmark = pytest.mark.skipif(not set(ZOO) <= set(zoo_names()), reason="the zoo checkpoints are not installed")


def _load(name: str, device: str, dtype: str = "float32") -> Model:
    return gna.load_model(f"zoo:{name}", device=device, dtype=dtype)


def _task(model: Model, n: int = 16, seed: int = 0) -> gna.KVRetrieval:
    return gna.KVRetrieval(4, n, seed=seed, max_value=9, words=model.kv_words)


def _prompts(model: Model, seed: int = 0) -> list[str]:
    """Three KV prompts of different lengths (4, 3 and 2 pairs): a left-padded batch."""
    return [gna.KVRetrieval(n, 1, seed=seed + n, max_value=9, words=model.kv_words).samples[0].prompt for n in (4, 3, 2)]


def _hf(name: str, device: str) -> torch.nn.Module:
    """The zoo checkpoint loaded by transformers alone (eager attention), for independent references."""
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(zoo_dir() / name, dtype=torch.float32, attn_implementation="eager")
    return hf.to(device).eval()


@pytest.fixture(scope="module")
def zoo() -> dict:
    """``get(name, device, dtype)``: zoo models loaded once per module (shared: do not mutate)."""
    cache: dict[tuple[str, str, str], Model] = {}

    def get(name: str, device: str, dtype: str = "float32") -> Model:
        key = (name, device, dtype)
        if key not in cache:
            cache[key] = _load(name, device, dtype)
        return cache[key]

    return get


def _on(t: torch.Tensor, device: str) -> bool:
    return t.device.type == torch.device(device).type


# ---- load -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ZOO)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_load_places_every_weight_and_output_on_the_device(zoo, name, device, dtype):
    model = zoo(name, device, dtype)
    assert model.device.type == device and model.dtype == getattr(torch, dtype)
    assert all(_on(p, device) for p in model.hf_model.parameters())
    assert all(_on(b, device) for b in model.hf_model.buffers())
    prompts = _prompts(model)
    batch = model.tokenize(prompts)
    assert _on(batch.ids, device) and batch.padded
    logits = model.forward(batch)
    assert _on(logits, device)  # (Mamba-2 keeps its residual in float32: its half-precision logits may be float32)
    # The bridge keeps the raw weights: its logits are the Hugging Face model's own (float32 reference).
    with torch.no_grad():
        ref = _hf(name, device)(input_ids=batch.ids, attention_mask=batch.attention_mask).logits
    keep = batch.attention_mask.bool()
    err = (logits.float() - ref)[keep].abs().max().item()
    assert err <= (1e-4 if dtype == "float32" else 0.05 * ref[keep].abs().max().item()), err


# ---- patterns -------------------------------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
def test_attention_patterns_stay_on_the_device_and_equal_hf_attentions(zoo, device):
    model = zoo("transformer-kv", device)
    prompts = _prompts(model, 3)
    heads = model.heads()
    pset = gna.patterns(model, prompts, heads)
    got = pset.stack()
    assert _on(got, device) and got.dtype == torch.float32
    batch = pset.batch
    with torch.no_grad():
        out = _hf("transformer-kv", device)(input_ids=batch.ids, attention_mask=batch.attention_mask,
                                            output_attentions=True)
    keep = batch.attention_mask.bool()
    for i, h in enumerate(heads):
        ref = out.attentions[h.layer][:, h.head]
        for b in range(len(prompts)):
            a, r = got[b, i][keep[b]][:, keep[b]], ref[b][keep[b]][:, keep[b]]
            torch.testing.assert_close(a, r, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("device", DEVICES)
def test_ssm_implicit_attention_stays_on_the_device_and_reproduces_the_mixer(zoo, device):
    """Mamba-2 implicit attention computed on the device: ``M x + D x`` through the mixer's gate, norm and
    ``out_proj`` equals the mixer's own output there (padded batch)."""
    model = zoo("mamba2-kv", device)
    prompts = _prompts(model, 4)
    batch = model.tokenize(prompts)
    assert batch.padded
    keep = batch.attention_mask.bool()
    for spec in [s for s in model.layers if s.kind == "ssm2"]:
        names = [f"{spec.bridge_path}.hook_in", f"{spec.bridge_path}.hook_out"]
        _, cache = model.run_with_cache(batch, names_filter=lambda n: n in names)
        terms = layer_terms(model, spec, cache[names[0]], batch.attention_mask)
        assert _on(terms.x, device) and _on(terms.dt, device)
        heads = model.heads(kind="ssm2", layers=[spec.layer])
        M = gna.patterns(model, batch, heads, form="exact").stack()
        assert _on(M, device) and M.dtype == torch.float32
        mx = torch.einsum("bnqk,bknp->bqnp", M, terms.x)
        dx = terms.x * terms.D[None, None, :, None]
        assert mx[keep].norm() > 0.05 * dx[keep].norm(), "M x must carry real weight for the test to mean anything"
        out = mixer_output(model.hf_module(spec.bridge_path), terms, mx + dx)
        ref = cache[names[1]]
        rel = float((out[keep] - ref[keep]).norm() / ref[keep].norm())
        assert rel <= 1e-4, (spec.layer, rel)


# ---- ablation -------------------------------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name, heads", [("transformer-kv", ["L1H2", "L0H0"]), ("mamba2-kv", ["L2S5", "L1S0"])])
def test_zero_ablation_on_the_device_equals_the_weight_edit(zoo, name, heads, device):
    model = zoo(name, device)
    prompts = _prompts(model, 5)
    clean = model.forward(prompts)
    with gna.ablate(model, heads):
        ablated = model.forward(prompts)
    assert _on(ablated, device)
    edited = _load(name, device)
    for h in model.check_heads(heads):
        site = model.head_site(h)
        mixer = edited.hf_module(model.layer_spec(h.layer, h.kind).bridge_path)
        with torch.no_grad():
            (mixer.o_proj if h.kind == "attn" else mixer.out_proj).weight[:, site.columns] = 0
    reference = edited.forward(prompts)
    assert (ablated - clean).abs().max() > 1e-3, "the ablation changed nothing"
    torch.testing.assert_close(ablated, reference, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(model.forward(prompts), clean)  # the hooks are gone


# ---- scan -----------------------------------------------------------------------------------------
def _scan(model: Model, task, **kw) -> "gna.HeadScan":
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        scan = gna.scan_heads(model, task, progress=False, **kw)
    fallbacks = [w for w in caught if "falling back" in str(w.message)]
    assert not fallbacks, f"the fast replay did not reproduce the model: {fallbacks[0].message}"
    return scan


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ZOO)
def test_scan_on_the_device_equals_naive_and_bf16_stays_within_tolerance(zoo, name, device):
    f32, b16 = zoo(name, device), zoo(name, device, "bfloat16")
    task = _task(f32)
    heads = f32.heads() if name == "transformer-kv" else f32.heads()[::3]  # 8 of 32 Mamba-2 heads
    exact = _scan(f32, task, heads=heads, strategy="exact")
    naive = _scan(f32, task, heads=heads, strategy="naive")
    ref = exact.to_frame().set_index("name")
    torch.testing.assert_close(torch.tensor(ref["ablated"].values),
                               torch.tensor(naive.to_frame().set_index("name").loc[ref.index, "ablated"].values),
                               atol=1e-4, rtol=1e-5)
    assert ref["drop"].abs().max() > 0.5, "no head matters: the comparison would mean nothing"
    half = _scan(b16, task, heads=heads, strategy="exact").to_frame().set_index("name").loc[ref.index]
    worst = (half["drop"] - ref["drop"]).abs().max()
    assert worst <= BF16_DROP_TOL, worst
    # The same top 3 (as a set: two of the Mamba-2 model's heads tie within 0.002 in float32, under the tolerance).
    assert set(half.sort_values("rank").index[:3]) == set(ref.sort_values("rank").index[:3])


@pytest.mark.parametrize("device", DEVICES)
def test_default_stack_on_the_device(zoo, device):
    """The scan's default stack: ``2048 // (rows * tokens)`` on CPU; on CUDA sized to the free memory (at least that)."""
    model = zoo("transformer-kv", device)
    chunks = layout_chunks(plan_scoring(model, _task(model).samples), 8)
    stack = _default_stack(model, chunks, 2 << 30)
    if device == "cpu":
        assert stack == CPU_REPLAY_TOKENS // (8 * max(int(c.batch.ids.shape[1]) for c in chunks)) > 1
    else:  # a 2-layer, 4-head model on any GPU: memory allows a whole layer's heads
        assert stack == max(s.n_heads for s in model.layers)


# ---- placement over several devices ---------------------------------------------------------------
def _device_map(device: str) -> dict[str, str | int]:
    """Every module of the zoo Llama on ``device``, named one by one (accelerate dispatches each)."""
    target: str | int = 0 if device == "cuda" else "cpu"
    return {m: target for m in ("model.embed_tokens", "model.layers.0", "model.layers.1", "model.norm",
                                "model.rotary_emb", "lm_head")}


@pytest.mark.parametrize("device", DEVICES)
def test_device_map_load_scans_like_a_single_device_load(zoo, device):
    placed = gna.load_model("zoo:transformer-kv", device_map=_device_map(device))
    assert placed.device.type == device
    task = _task(placed, 8)
    ref = _scan(zoo("transformer-kv", device), task, strategy="exact").to_frame().set_index("name")
    got = _scan(placed, task, strategy="exact").to_frame().set_index("name").loc[ref.index]
    assert (got["drop"] - ref["drop"]).abs().max() <= 1e-5


@pytest.mark.cuda
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_two_gpus_split_the_layers_and_scan_like_one():
    """``n_devices=2``: the layers on two GPUs; patterns, ablation and the exact scan equal one GPU's."""
    one = _load("transformer-kv", "cuda")
    two = gna.load_model("zoo:transformer-kv", n_devices=2)
    assert len({p.device for p in two.hf_model.parameters()}) == 2
    prompts = _prompts(one)
    torch.testing.assert_close(gna.patterns(two, prompts, two.heads()).stack().cpu(),
                               gna.patterns(one, prompts, one.heads()).stack().cpu(), atol=1e-5, rtol=1e-4)
    with gna.ablate(two, ["L1H2"]), gna.ablate(one, ["L1H2"]):
        torch.testing.assert_close(two.forward(prompts).cpu(), one.forward(prompts).cpu(), atol=1e-4, rtol=1e-4)
    task = _task(one, 8)
    ref = _scan(one, task, strategy="exact").to_frame().set_index("name")
    got = _scan(two, task, strategy="exact").to_frame().set_index("name").loc[ref.index]
    assert (got["drop"] - ref["drop"]).abs().max() <= 1e-4


def test_placement_arguments_are_checked():
    with pytest.raises(InputError, match="not both"):
        gna.load_model("zoo:transformer-kv", device="cpu", device_map="auto")
    with pytest.raises(InputError, match="n_devices must be an integer >= 1"):
        gna.load_model("zoo:transformer-kv", n_devices=0)
    with pytest.raises(InputError, match="stateful"):  # TransformerLens keeps an SSM's cache on one device
        gna.load_model("zoo:mamba2-kv", device_map="auto")
    if torch.cuda.device_count() < 2:
        with pytest.raises(InputError, match="n_devices=2"):
            gna.load_model("zoo:transformer-kv", n_devices=2)


# ---- replay verification tolerance ------------------------------------------------------------------
def test_replay_tolerance_follows_the_dtype():
    assert replay_atol(torch.float32, 40.0) == 1e-3
    assert replay_atol(torch.bfloat16, 32.0) == 8 * 2 ** -7 * 32  # 8 bfloat16 steps near 32 (one is 0.25)
    assert replay_atol(torch.float16, 32.0) == 8 * 2 ** -10 * 32
    assert replay_atol(torch.bfloat16, 0.01) == 1e-3


@pytest.mark.parametrize("dtype, shift, ok", [("float32", 0.5, False), ("bfloat16", 0.5, True),
                                              ("bfloat16", 5.0, False)])
def test_verify_replay_accepts_rounding_and_refuses_a_real_mismatch(zoo, monkeypatch, dtype, shift, ok):
    """A replay off by ``shift`` logits: within half-precision rounding it is accepted, beyond it (or in float32)
    the scan is told the replay does not reproduce the model."""
    from gna_interp.engine import replay as replay_mod

    model = zoo("transformer-kv", "cpu", dtype)
    chunk = layout_chunks(plan_scoring(model, _task(model, 2).samples), 2)[0]
    # the replay reads each distinct position once: a matmul of another shape than the forward's, equal to float noise
    assert replay_mod.verify_replay(model, chunk.batch, chunk.read_row, chunk.read_pos) <= 1e-4
    true_final = replay_mod.final_logits
    monkeypatch.setattr(replay_mod, "final_logits", lambda *a: true_final(*a) + shift)
    if ok:
        assert replay_mod.verify_replay(model, chunk.batch, chunk.read_row, chunk.read_pos) == pytest.approx(shift, abs=0.05)  # (bf16 rounding)
    else:
        with pytest.raises(replay_mod.ReplayMismatch, match="does not reproduce"):
            replay_mod.verify_replay(model, chunk.batch, chunk.read_row, chunk.read_pos)


# ---- replay_stack with fake free memory (runs everywhere) ---------------------------------------------
def _config() -> dict:
    return json.loads((zoo_dir() / "transformer-kv" / "config.json").read_text())


def _row_bytes(tokens: int, reads: int, nbytes: int, cfg: dict | None = None) -> int:
    """One replay row's working set of the zoo Llama, from its config.json alone: the block's residual copies and
    widest linear output, eager attention's scores (model dtype, twice) and float32 softmax, the repeated mask
    and position tables, and the float32 log-probs of the reads."""
    cfg = cfg or _config()
    d = cfg["hidden_size"]
    return _block_bytes(tokens, nbytes, cfg) + tokens ** 2 * 4 + 2 * tokens * d * 4 + reads * cfg["vocab_size"] * (nbytes + 8)


def _block_bytes(tokens: int, nbytes: int, cfg: dict | None = None) -> int:
    """The counted activations of one zoo Llama block for one row."""
    cfg = cfg or _config()
    d, widest = cfg["hidden_size"], max(cfg["intermediate_size"], cfg["hidden_size"])
    return tokens * (4 * d + 2 * widest) * nbytes + cfg["num_attention_heads"] * tokens ** 2 * (2 * nbytes + 4)


def test_replay_stack_sizes_to_fake_free_memory(zoo):
    model = zoo("transformer-kv", "cpu")
    n_heads = _config()["num_attention_heads"]
    rows, tokens, reads, reserve = 8, 40, 2, 12345
    assert replay_row_bytes(model, tokens, reads) == _row_bytes(tokens, reads, 4)
    extras = _row_bytes(tokens, reads, 4) - _block_bytes(tokens, 4)
    assert replay_row_bytes(model, tokens, reads, measured=10 ** 7) == 10 ** 7 + extras  # measured > counted
    assert replay_row_bytes(model, tokens, reads, measured=10) == _row_bytes(tokens, reads, 4)  # counted > measured
    per_copy = rows * _row_bytes(tokens, reads, 4)
    for want in (1, 2, 3):  # free memory for `want` and a half copies, after the share and the reserve
        free = int(((want + 0.5) * per_copy + reserve) / STACK_MEMORY_SHARE)
        assert replay_stack(model, rows, tokens, reads=reads, reserve_bytes=reserve, free_bytes=free) == want
    huge = 80 << 30
    assert replay_stack(model, rows, tokens, reads=reads, free_bytes=huge) == n_heads  # capped: one layer's heads
    assert replay_stack(model, rows, tokens, reads=reads, free_bytes=1000) == 1  # never below one
    assert replay_stack(model, rows, tokens, reads=reads, free_bytes=huge, reserve_bytes=huge) == 1
    # Without free_bytes a CPU model keeps the CPU default exactly.
    for r in (1, 3, 8, 16, 64, 100):
        assert replay_stack(model, r, tokens) == max(1, CPU_REPLAY_TOKENS // (r * tokens))


def test_replay_stack_fits_more_half_precision_rows(zoo):
    f32, b16 = zoo("transformer-kv", "cpu"), zoo("transformer-kv", "cpu", "bfloat16")
    free = int(2.5 * 8 * _row_bytes(200, 1, 4) / STACK_MEMORY_SHARE)
    assert replay_stack(f32, 8, 200, free_bytes=free) == 2
    want = int(free * STACK_MEMORY_SHARE // (8 * _row_bytes(200, 1, 2)))
    assert want > 2 and replay_stack(b16, 8, 200, free_bytes=free) == min(4, want)


def test_scan_default_stack_reads_cuda_free_memory(zoo, monkeypatch):
    """On a (faked) CUDA model the scan's default stack comes from ``torch.cuda.mem_get_info`` of the model's
    device plus the allocator's unused cache, less the clean prefixes it keeps, at the larger of the counted
    and the measured row; the CPU rule is not used."""
    from gna_interp.models import estimate

    model = zoo("transformer-kv", "cpu")
    chunks = layout_chunks(plan_scoring(model, _task(model).samples), 8)
    assert _default_stack(model, chunks, 2 << 30) == CPU_REPLAY_TOKENS // (8 * max(int(c.batch.ids.shape[1]) for c in chunks))
    tokens = max(int(c.batch.ids.shape[1]) for c in chunks)
    reads = max(-(-len(c.read_pos) // c.size) for c in chunks)
    cfg = _config()
    prefixes = sum(c.n_tokens for c in chunks) * cfg["hidden_size"] * cfg["num_hidden_layers"] * 4
    row = _row_bytes(tokens, reads, 4)
    cached = 1 << 20  # reserved by PyTorch's allocator but unused: free for the scan too
    free = int((2.5 * 8 * row + prefixes) / STACK_MEMORY_SHARE) - cached  # two copies fit next to the prefixes
    asked, measured = [], {"row": 0}
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (asked.append(device), (free, 80 << 30))[1])
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 5 * cached)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 4 * cached)
    monkeypatch.setattr(estimate, "measure_row_bytes", lambda m, t, r: (asked.append((t, r)), measured["row"])[1])
    monkeypatch.setattr(Model, "device", property(lambda self: torch.device("cuda", 0)))
    assert _default_stack(model, chunks, 2 << 30) == 2
    assert asked == [(tokens, 4), torch.device("cuda", 0)]  # the probe runs before the free memory is read
    # Prefixes over max_prefix_bytes are recomputed per group, not kept: nothing is reserved for them.
    assert _default_stack(model, chunks, 0) == min(4, int((free + cached) * STACK_MEMORY_SHARE // (8 * row)))
    # A measured forward row larger than the counted block (as Hugging Face's SSM paths give) replaces it.
    measured["row"] = int(1.3 * row)
    big = measured["row"] + row - _block_bytes(tokens, 4)  # plus the mask, position tables and reads
    want = int(((free + cached) * STACK_MEMORY_SHARE - prefixes) // (8 * big))
    assert want == 1 and _default_stack(model, chunks, 2 << 30) == want


@pytest.mark.cuda
@pytest.mark.parametrize("name", ZOO)
def test_measured_row_bounds_a_real_stacked_replay(zoo, name):
    """On the GPU: the row size the sizing plans on (counted or measured, the larger) is at least what a
    stacked replay of four ablations really allocates per row."""
    from gna_interp.engine.replay import Prefixes, replay_scores
    from gna_interp.interventions.ablation import replacements

    model = zoo(name, "cuda")
    plan = plan_scoring(model, _task(model, 32).samples)
    chunks = layout_chunks(plan, 32)
    prefixes = Prefixes(model, chunks)
    prefixes.get(0)
    c = chunks[0]
    tokens, reads = int(c.batch.ids.shape[1]), -(-len(c.read_pos) // c.size)
    planned = replay_row_bytes(model, tokens, reads, measure_row_bytes(model, tokens, 4))
    reps = replacements(model, model.heads(layers=[0])[:4])
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    replay_scores(model, plan, prefixes, [[r] for r in reps])
    torch.cuda.synchronize()
    assert len(chunks) == 1
    per_row = (torch.cuda.max_memory_allocated() - base) / (len(reps) * c.size)
    assert per_row <= planned, (per_row, planned)


def test_replay_stack_refuses_bad_input(zoo):
    model = zoo("transformer-kv", "cpu")
    with pytest.raises(InputError, match="rows must be an integer >= 1"):
        replay_stack(model, 0, 10)
    with pytest.raises(InputError, match="share must be in"):
        replay_stack(model, 4, 10, share=0)
    with pytest.raises(InputError, match="measures CUDA memory"):
        measure_row_bytes(model, 10)
