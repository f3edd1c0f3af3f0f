"""`plan_hybrid` / `gna hybrid plan`: the memory of a retrieval-guided hybrid, checked against hand arithmetic
(Llama-3.2-1B's full KV cache, the paper's 4.2 MB / 67 MB) and a brute-force count over heads."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pandas as pd
import pytest
import torch

import gna_interp as gna
from gna_interp.circuits.hybrid import COLUMNS, HybridPlan, plan_hybrid
from gna_interp.circuits.scan import HeadScan
from gna_interp.cli import main
from gna_interp.errors import InputError
from gna_interp.models.heads import HeadRef
from gna_interp.tasks import KVRetrieval

LLAMA = "config:llama-3.2-1b"


@pytest.fixture(scope="module")
def llama():
    return gna.load_model(LLAMA, device="meta")  # shapes only: 16 layers x 32 query heads, 8 KV heads, head_dim 64


@pytest.fixture(scope="module")
def zoo():
    """The zoo Transformer (2 layers x 4 heads, no GQA, head_dim 16), a small exact scan of it and its circuit."""
    model = gna.load_model("zoo:transformer-kv", device="cpu")
    task = KVRetrieval(4, 8, seed=0, words=model.kv_words)
    circuit = gna.discover(model, task, strategy="exact", progress=False, k=2, seeds=1, n_cards=0, role_samples=2)
    return model, circuit


def synthetic_scan(model, seed: int = 0) -> tuple[HeadScan, list[HeadRef]]:
    """A scan of every head of ``model`` whose drops are a random permutation (so its ranking is known)."""
    heads = model.heads()
    drops = random.Random(seed).sample(range(len(heads)), len(heads))
    base = {"logit_diff": torch.tensor([50.0, 50.0], dtype=torch.float64), "correct": torch.tensor([True, True])}
    exact = {h: {"logit_diff": base["logit_diff"] - d / 10, "correct": base["correct"]} for h, d in zip(heads, drops)}
    scan = HeadScan(model.name, "synthetic", "zero", "logit_diff", "exact", heads, base, exact)
    return scan, [h for _, h in sorted(zip(drops, heads), key=lambda t: -t[0])]


def brute_force(conf, kept: set[tuple[int, int]], length: int, nbytes: int, d_state: int, d_conv: int) -> dict[str, int]:
    """Bytes counted head by head from the Hugging Face config (independent of plan_hybrid's layout)."""
    n_q, n_kv, d = conf.num_attention_heads, conf.num_key_value_heads, conf.head_dim
    out = {"full_kv_bytes": 0, "kept_kv_bytes": 0, "ssm_state_bytes": 0, "conv_state_bytes": 0, "kv_heads_kept": 0}
    for layer in range(conf.num_hidden_layers):
        for j in range(n_kv):
            out["full_kv_bytes"] += 2 * d * length * nbytes
            readers = [h for h in range(n_q) if h * n_kv // n_q == j]  # the query heads of KV head j
            if any((layer, h) in kept for h in readers):
                out["kept_kv_bytes"] += 2 * d * length * nbytes
                out["kv_heads_kept"] += 1
        for h in range(n_q):
            if (layer, h) not in kept:
                out["ssm_state_bytes"] += d * d_state * nbytes
                out["conv_state_bytes"] += d_conv * (d + d_state + d_state) * nbytes
    return out


def test_llama_full_attention_figures_equal_the_hand_arithmetic(llama):
    plan = plan_hybrid(llama, order="random", seed=0)
    assert (plan.dtype, plan.dtype_source) == ("bfloat16", "the checkpoint's saved dtype")
    for length in (128, 2048, 4096):  # 16 layers x 8 KV heads x 64 x 2 (K, V) x L x 2 bytes
        assert plan.full_kv_bytes(length) == 16 * 8 * 64 * 2 * length * 2
    df = plan.to_frame()
    full = df.drop_duplicates("length").set_index("length")["full_mb"]
    assert full[128] == pytest.approx(4.194304) and round(full[128], 1) == 4.2  # the paper's 4.2 MB
    assert full[2048] == pytest.approx(67.108864) and round(full[2048]) == 67  # and 67 MB
    text = plan.summary()
    assert "4.19" in text and "67.11" in text and "NOT retrieval-guided" in text
    assert plan_hybrid(llama, order="random", seed=0, dtype="float32").full_kv_bytes(128) == 2 * 4_194_304
    # every head kept: the hybrid is the Transformer
    every = plan_hybrid(llama, order="random", seed=1, ks=[512, 999], d_state=8)
    row = every.to_frame().iloc[0]
    assert (row["kept"], row["replaced"], row["hybrid_bytes"], row["ratio"]) == (512, 0, row["full_kv_bytes"], 1.0)
    assert "k=999 capped at 512 (the model's head count)" in every.notes
    assert plan_hybrid(llama, order="random", seed=0, ks=[5, 5, 0], lengths=[64, 64]).wide()["k"].tolist() == \
        ["full", "5", "0"]


def test_kept_and_replaced_bytes_equal_a_brute_force_count_over_heads(llama):
    scan, ranked = synthetic_scan(llama, seed=3)
    conf = llama.hf_model.config
    for d_state, d_conv in ((64, 4), (8, 0)):
        plan = plan_hybrid(llama, scan, ks=(0, 5, 10, 20, 40), lengths=(128, 2048, 4096), d_state=d_state, d_conv=d_conv)
        df = plan.to_frame()
        assert list(df.columns) == COLUMNS and len(df) == 15
        for _, row in df.iterrows():
            kept = ranked[:row["k"]]
            assert row["kept_heads"] == ",".join(h.name for h in kept)  # the top k of the scan
            want = brute_force(conf, {(h.layer, h.head) for h in kept}, row["length"], 2, d_state, d_conv)
            for col, v in want.items():
                assert row[col] == v, (col, row["k"], row["length"])
            assert row["replaced"] == 512 - row["k"]
            assert row["hybrid_bytes"] == want["kept_kv_bytes"] + want["ssm_state_bytes"] + want["conv_state_bytes"]
            assert row["ratio"] == pytest.approx(want["full_kv_bytes"] / row["hybrid_bytes"])
    # GQA: two kept query heads of one group cost one KV head; a head of the next group adds one
    plan = plan_hybrid(llama, ["L3H0", "L3H3", "L3H4", "L9H31"], ks=(1, 2, 3, 4), lengths=(100,))
    assert plan.to_frame()["kv_heads_kept"].tolist() == [1, 1, 2, 3]
    assert plan.to_frame()["kept_kv_bytes"].tolist() == [n * 64 * 2 * 100 * 2 for n in (1, 1, 2, 3)]


def test_a_meta_model_without_a_scan_is_refused_and_random_order_needs_a_seed(llama):
    with pytest.raises(InputError, match=r"needs a scan for the retrieval-guided order.*meta device.*order='random'"):
        plan_hybrid(llama)
    with pytest.raises(InputError, match="needs an integer seed"):
        plan_hybrid(llama, order="random")
    a, b = plan_hybrid(llama, order="random", seed=7), plan_hybrid(llama, order="random", seed=7)
    assert a.ranking == b.ranking and a.ranking != plan_hybrid(llama, order="random", seed=8).ranking
    with pytest.raises(InputError, match="does not have"):
        plan_hybrid(llama, ["L16H0"])
    with pytest.raises(InputError, match="lengths must be"):
        plan_hybrid(llama, order="random", seed=0, lengths=[0])


def test_zoo_transformer_plan_from_its_scan_and_circuit_through_the_cli(zoo, tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture):
    model, circuit = zoo
    circuit.save(tmp_path / "scan")
    circuit.scan.save((tmp_path / "only").mkdir() or tmp_path / "only" / "scan.json")
    top = circuit.scan.top(8)
    assert plan_hybrid(model, circuit).ranking == top == plan_hybrid(model, circuit.scan).ranking

    out = tmp_path / "plan"
    assert main(["hybrid", "plan", "--model", "zoo:transformer-kv", "--scan", str(tmp_path / "scan"),
                 "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "retrieval-guided, the top k of the" in printed and "k=10, 20, 40 capped at 8" in printed
    plan = HybridPlan.load(out)
    assert plan.dtype == "float32" and plan.kept(5) == top[:5] and plan.kept(40) == top
    df = pd.read_csv(out / "hybrid_plan.csv")
    assert len(df) == 15 and df["full_kv_bytes"].tolist() == [2 * 4 * 16 * 2 * L * 4 for L in (128, 2048, 4096)] * 5
    conf = model.hf_model.config
    for _, row in df.iterrows():  # 4 KV heads per layer = 4 query heads: each kept head keeps its own cache
        want = brute_force(conf, {(h.layer, h.head) for h in top[:row["k"]]}, row["length"], 4, 64, 4)
        assert all(row[c] == v for c, v in want.items())
    pd.testing.assert_frame_equal(plan.to_frame(), plan_hybrid(model, circuit).to_frame())
    doc = json.loads((out / "hybrid_plan.json").read_text())
    assert (doc["format"], doc["format_version"]) == ("hybrid_plan", 1) and len(doc["table"]) == 15
    assert "<table" in (out / "report.html").read_text() and "<table" in plan._repr_html_()

    again = tmp_path / "again"
    assert main(["hybrid", "plan", "--model", "zoo:transformer-kv", "--scan", str(tmp_path / "only"), "--ks", "3",
                 "--lengths", "64", "--d-state", "8", "--out", str(again)]) == 0
    row = HybridPlan.load(again / "hybrid_plan.json").to_frame().iloc[0]
    assert row["kept_heads"] == ",".join(h.name for h in top[:3])
    assert row["ssm_state_bytes"] == 5 * 16 * 8 * 4 and row["conv_state_bytes"] == 5 * 4 * (16 + 16) * 4


def test_cli_errors_say_what_to_do(tmp_path: Path, capsys: pytest.CaptureFixture):
    assert main(["hybrid", "plan", "--model", LLAMA]) == 2
    assert "--order random --seed N" in capsys.readouterr().err
    assert main(["hybrid", "plan", "--model", LLAMA, "--order", "random"]) == 2
    assert "needs --seed" in capsys.readouterr().err
    assert main(["hybrid", "plan", "--model", LLAMA, "--scan", str(tmp_path / "nope")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["hybrid", "plan", "--model", LLAMA, "--ks", "5,-1", "--order", "random", "--seed", "0"]) == 2
    assert "at least 0" in capsys.readouterr().err
    assert main(["hybrid"]) == 2


def test_a_non_transformer_and_a_tampered_file_are_refused(llama, tmp_path: Path):
    ssm = gna.load_model("zoo:mamba2-kv", device="meta")
    with pytest.raises(InputError, match="attention heads into Mamba-2 heads.*ssm2"):
        plan_hybrid(ssm, order="random", seed=0)
    path = plan_hybrid(llama, order="random", seed=0).save(tmp_path / "p.json")
    doc = json.loads(path.read_text())
    pd.testing.assert_frame_equal(HybridPlan.load(path).to_frame(), pd.DataFrame(doc["table"])[COLUMNS])
    doc["format_version"] = 99
    path.write_text(json.dumps(doc))
    with pytest.raises(InputError, match="format version 99"):
        HybridPlan.load(path)
