"""The hand-off checks what it is given: ablated_modules refuses a Hugging Face model of another shape than the
addresses' (width, head count, depth) and takes one address or a list of them; edge_addresses takes the edge table
a scan writes and refuses edges that cannot be; a Hugging Face model with a tokenizer built in memory loads."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

import gna_interp as gna
from gna_interp.errors import HeadError, InputError
from gna_interp.models import zoo_names
from gna_interp.models.handoff import Address, ablated_modules, edge_addresses, head_addresses
from gna_interp.models.tiny import build_tiny

needs_zoo = pytest.mark.skipif("transformer-kv" not in zoo_names(), reason="the zoo Transformer is not installed")


from made_up import tiny_llama as _llama  # noqa: E402


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[gna.Model, torch.nn.Module]:
    """The tiny Llama as a gna_interp Model and, separately, as a plain Hugging Face model."""
    from transformers import AutoModelForCausalLM

    folder = build_tiny("llama", tmp_path_factory.mktemp("handoff") / "llama")
    return gna.load_model(folder, device="cpu"), AutoModelForCausalLM.from_pretrained(folder).eval()


@pytest.fixture(scope="module")
def zoo() -> gna.Model:
    return gna.load_model("zoo:transformer-kv", device="cpu")


@pytest.fixture(scope="module")
def scanned(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder of a real `gna scan` of the zoo Transformer (its circuit.json holds the edge table)."""
    from gna_interp.cli import main

    out = tmp_path_factory.mktemp("scan") / "zoo"
    code = main(["--device", "cpu", "scan", "--model", "zoo:transformer-kv", "--out", str(out), "--threads", "1",
                 "--no-png", "--quiet"])
    assert code == 0
    return out


def _no_hooks(hf: torch.nn.Module) -> bool:
    return all(not m._forward_pre_hooks and not m._forward_hooks for m in hf.modules())


def test_ablated_modules_refuses_a_model_of_another_width_head_count_or_depth(tiny):
    m, hf = tiny
    addresses = head_addresses(m, ["L0H3", "L2H1"])
    assert [(a.width, a.head_dim) for a in addresses] == [(64, 16), (64, 16)]
    wider, more_heads, shallower = (_llama(hidden_size=128, num_attention_heads=8), _llama(num_attention_heads=8),
                                    _llama(num_hidden_layers=2))
    ids = torch.tensor([[5, 9, 3, 7]])
    for other, message in [(wider, r"o_proj has 128 channels at its input; the address of L0H3 needs 64"),
                           (more_heads, r"self_attn has heads of 8 channels \(8 heads there\); the address of L0H3 "
                                        r"needs heads of 16 \(4 heads\)"),
                           (shallower, r"has 2 layers \(model.layers.0 .. model.layers.1\); the address of L2H1 "
                                       r"needs layer 2")]:
        for given in (addresses, [a.to_dict() for a in addresses]):
            with pytest.raises(InputError, match=message):
                with ablated_modules(other, given):
                    other(ids)
        assert _no_hooks(other)
    with gna.ablate(m, ["L0H3", "L2H1"]):
        ref = m(ids)
    with torch.no_grad(), ablated_modules(hf, addresses):  # the model they were taken from passes the checks
        assert torch.allclose(hf(ids).logits, ref, atol=1e-5)
    old = [{k: v for k, v in a.to_dict().items() if k not in ("width", "head_dim")} for a in addresses]
    with torch.no_grad(), ablated_modules(hf, old):  # addresses without a shape: what can be checked is
        assert torch.allclose(hf(ids).logits, ref, atol=1e-5)
    with pytest.raises(InputError, match=r"has 64 channels at its input; the address of L0H3 needs at least 100"):
        with ablated_modules(hf, [{**old[0], "start": 80, "stop": 100}]):  # a span past the module's channels
            pass


def test_ablated_modules_takes_one_address_and_refuses_a_string_saying_what_to_pass(tiny):
    m, hf = tiny
    ids = torch.tensor([[5, 9, 3, 7]])
    with gna.ablate(m, "L1H2"):
        ref = m(ids)
    (address,) = head_addresses(m, "L1H2")
    for one in (address, address.to_dict()):
        with torch.no_grad(), ablated_modules(hf, one):
            assert torch.allclose(hf(ids).logits, ref, atol=1e-5)
    assert _no_hooks(hf)
    with pytest.raises(InputError, match=r"the output of head_addresses\(model, heads\).*head_addresses\(model, "
                                         r"'L1H2'\)"):
        with ablated_modules(hf, "L1H2"):
            pass
    with pytest.raises(InputError, match="got int"):
        with ablated_modules(hf, 3):
            pass
    with pytest.raises(InputError, match="lacks \\['hook'\\]"):
        with ablated_modules(hf, {k: v for k, v in address.to_dict().items() if k != "hook"}):
            pass
    with pytest.raises(InputError, match="channels 20:10"):
        Address("L1H2", "output", "h", "m", "input", 20, 10)
    with pytest.raises(InputError, match="side must be"):
        Address("L1H2", "output", "h", "m", "middle", 0, 10)


@needs_zoo
def test_edge_addresses_refuses_edges_that_cannot_be(zoo):
    for edge, error, message in [
        ({"sender": "L1H3", "receiver": "L0H1", "input": "k"}, HeadError, "later layer than the sender"),
        ({"sender": "L1H3", "receiver": "L1H2", "input": "v"}, HeadError, "later layer than the sender"),
        ({"sender": "L1H3", "receiver": "L1H3", "input": "q"}, HeadError, "cannot feed itself"),
        ({"sender": "L0H3", "receiver": "logits", "input": "k"}, InputError, "direct edge .* input must be 'logits'"),
        ({"sender": "L0H3", "receiver": None, "input": "q"}, InputError, "direct edge"),
        ({"sender": "L0H3", "receiver": "L1H3", "input": "logits"}, InputError, "belongs to a direct edge"),
        ({"sender": "L0H3", "receiver": "L1H3", "input": "key"}, InputError, r"L1H3 reads no input 'key' \(its "
                                                                             r"inputs: q, k, v\)"),
        ({"sender": "L0H3", "receiver": "L1H3", "input": "other"}, InputError, "reads no input 'other'"),
        ({"sender": "MLP0", "receiver": "L1H3", "input": "k"}, InputError, "sender 'MLP0' is not a head"),
        ({"sender": "L0H3", "receiver": "L1H9", "input": "k"}, HeadError, "L0H3 -> L1H9.k: L1H9 is out of range"),
        ({"edge": "L0H3 -> L1H3.k@items + L0H3 -> L1H2.k@items", "sender": "L0H3", "receiver": "L1H3", "input": "k"},
         InputError, "a set of edges"),
    ]:
        with pytest.raises(error, match=message):
            edge_addresses(zoo, [edge])


@needs_zoo
def test_edge_addresses_takes_the_edge_table_a_scan_writes(zoo, scanned):
    from gna_interp.circuits import Circuit

    circuit = Circuit.load(scanned)
    table = circuit.edges
    assert table is not None and (table["receiver"] == "logits").any()
    rows = edge_addresses(zoo, table)
    assert [r["edge"] for r in rows] == list(table["edge"])
    assert edge_addresses(zoo, circuit) == rows
    assert edge_addresses(zoo, table.to_dict("records")[0]) == rows[:1]
    group = zoo.hf_model.config.num_attention_heads // zoo.hf_model.config.num_key_value_heads
    d = zoo.cfg.d_head
    for row, edge in zip(rows, table.to_dict("records")):
        assert row["sender"] == head_addresses(zoo, edge["sender"])[0].to_dict()
        assert row["effect"] == edge["effect"] and row["positions"] == edge["positions"]
        if edge["receiver"] == "logits":
            assert row["receiver"] is None and row["receivers"] == []
            continue
        receiver = int(edge["receiver"].split("H")[1])
        start = (receiver if edge["input"] == "q" else receiver // group) * d
        layer = edge["receiver"][1:].split("H")[0]
        assert row["receivers"] == [row["receiver"]]
        assert {k: row["receiver"][k] for k in ("head", "input", "module", "side", "start", "stop")} == {
            "head": edge["receiver"], "input": edge["input"], "side": "output", "start": start, "stop": start + d,
            "module": f"model.layers.{layer}.self_attn.{edge['input']}_proj"}


def _word_tokenizer(**special: Any) -> Any:
    """A tokenizer built in memory (a WordLevel vocabulary, never saved: no name_or_path)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["<unk>", "<eos>", "<bos>", "red", "green", "blue", ":", "1", "2", "3"]
    tok = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="<eos>", pad_token="<eos>",
                                   **special)


def test_a_hugging_face_model_with_a_tokenizer_built_in_memory_loads():
    hf = _llama(vocab_size=10, num_hidden_layers=2)
    special: dict[str, Any]
    for special in ({"bos_token": "<bos>"}, {"bos_token": "<bos>", "add_bos_token": True}, {}):
        tok = _word_tokenizer(**special)
        assert not tok.name_or_path and "name_or_path" not in tok.init_kwargs
        before = dict(tok.init_kwargs)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            m = gna.load_model(hf, tok)
        text = "red : 1 blue : 2 red :"
        ids = m.to_tokens(text)
        assert torch.equal(ids, torch.tensor([tok(text)["input_ids"]]))  # tokenised as the tokenizer does
        with torch.no_grad():
            assert torch.allclose(m(ids), hf(ids).logits, atol=1e-5)
        if "bos_token" in special:
            assert torch.equal(m.bridge.to_tokens(text), m.to_tokens(text, prepend_bos=True))
        assert tok.init_kwargs == before  # the tokenizer given is left as it was
