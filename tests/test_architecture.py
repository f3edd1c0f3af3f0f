"""The house rules, checked: layered imports without cycles, the bridge and head kinds kept inside
``models/``, a head kind added from outside the package, a small top-level API, typo-proof options."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import pkgutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import gna_interp as gna
from gna_interp.errors import OptionError, UnsupportedArchitectureError
from gna_interp.models import LayerSpec, MixerAdapter, PatternOptions, kinds, register_kind, unregister_kind
from gna_interp.models.hf import unwrap

PACKAGE = Path(gna.__file__).parent


def _sources_outside_models() -> list[Path]:
    return [p for p in PACKAGE.rglob("*.py") if "models" not in p.relative_to(PACKAGE).parts]


def test_import_layers_and_no_cycles_hold():
    """`lint-imports` checks the layers contract and acyclic siblings declared in pyproject.toml."""
    exe = Path(sys.executable).parent / "lint-imports"
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "importlinter.cli"]
    proc = subprocess.run(cmd, cwd=PACKAGE.parent, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "2 kept, 0 broken" in proc.stdout


def test_only_models_touches_the_bridge_and_compares_kinds():
    """Outside models/: no `.bridge` attribute, no comparison of anything with a head-kind literal."""
    known = set(kinds())
    bridge, kind_cmp = [], []

    def is_kind_literal(node: ast.AST) -> bool:
        if isinstance(node, ast.Constant) and node.value in known:
            return True
        return isinstance(node, (ast.Tuple, ast.List, ast.Set)) and any(is_kind_literal(e) for e in node.elts)

    for path in _sources_outside_models():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            where = f"{path.relative_to(PACKAGE.parent)}:{getattr(node, 'lineno', '?')}"
            if isinstance(node, ast.Attribute) and node.attr == "bridge":
                bridge.append(where)
            if isinstance(node, ast.Compare) and any(map(is_kind_literal, [node.left, *node.comparators])):
                kind_cmp.append(where)
    assert not bridge, f"bridge reached outside models/: {bridge}"
    assert not kind_cmp, f"head kinds compared to string literals outside models/: {kind_cmp}"


def test_only_models_builds_hook_names():
    """Outside models/, no string literal that is a piece of a hook name (``"blocks."``, ``f"blocks.{l}..."``,
    ``".hook_out"``, ``"ln_final.hook_in"``): hook names come from `Model` and the adapters. Docstrings may name
    hooks in prose."""
    built = []
    for path in _sources_outside_models():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        docs = {id(n.body[0].value) for n in ast.walk(tree)
                if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and n.body
                and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
                text = node.value
                if text.startswith(("blocks.", "hook_")) or ".hook_" in text:
                    built.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: {text[:40]!r}")
    assert not built, f"hook names built outside models/: {built}"


def test_no_module_keeps_per_model_state():
    """What is learnt about one model (a check passed, a shortcut allowed) lives on that model (``Model.facts``), not in
    a module-level ``WeakKeyDictionary`` above ``models/`` (which marks the bridge's own torch modules that way)."""
    kept = []
    for path in _sources_outside_models():
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
            if isinstance(value, ast.Call) and "WeakKeyDictionary" in ast.unparse(value.func):
                kept.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}")
    assert not kept, f"per-model state in module globals: {kept}"


def test_the_engine_keeps_what_it_learns_on_the_model(tiny_dirs):
    """A replay check and the blockwise head run once per model and are remembered on that model only."""
    from gna_interp.engine import unembed
    from gna_interp.engine.replay import VERIFIED, SetAblation

    model, other = (gna.load_model(tiny_dirs["llama"], device="cpu") for _ in range(2))
    assert model.facts == {}
    runner = SetAblation(model, gna.KVRetrieval(n_pairs=3, n_samples=4, seed=0), batch_size=2)
    runner.run(["L0H0"])
    assert runner.fast and model.facts[VERIFIED] and model.facts[unembed.HEAD].blockwise is True
    assert other.facts == {}


def test_top_level_api_reads_like_the_paper_and_shadows_no_subpackage():
    for name in ("load_model", "patterns", "ablate", "evaluate", "scan_heads", "discover", "KVRetrieval",
                 "MultipleChoice", "Circuit", "HeadRef", "Model", "mask_pattern"):
        assert name in gna.__all__ and getattr(gna, name) is not None, name
    packages = [m for m in pkgutil.walk_packages([str(PACKAGE)], "gna_interp.")]
    for info in packages:
        if not info.ispkg:
            continue
        mod = importlib.import_module(info.name)
        for name in getattr(mod, "__all__", []):
            assert importlib.util.find_spec(f"{info.name}.{name}") is None, f"{info.name}.{name} shadows a module"
    for name in gna.__all__:
        assert importlib.util.find_spec(f"gna_interp.{name}") is None, f"gna.{name} shadows a module"
        assert getattr(gna, name).__doc__, f"gna.{name} has no docstring"


def test_unknown_options_name_the_closest_valid_one(tiny_models):
    model = tiny_models["llama"]
    task = gna.KVRetrieval(n_pairs=3, n_samples=2, seed=0)
    with pytest.raises(OptionError, match="no option 'fomr'; did you mean 'form'"):
        gna.patterns(model, "hello", fomr="exact")
    with pytest.raises(OptionError, match="no option 'stratgy'; did you mean 'strategy'"):
        gna.scan_heads(model, task, stratgy="auto")
    with pytest.raises(OptionError, match="did you mean 'seeds'"):
        gna.discover(model, task, seed=3)
    with pytest.raises(OptionError, match="did you mean 'certify'"):
        gna.ScanConfig(certfy=3)
    with pytest.raises(OptionError, match="unknown strategy"):
        gna.ScanConfig(strategy="fast")
    assert gna.ScanConfig().replace(strategy="auto").strategy == "auto"
    cfg = gna.DiscoverConfig.build(k=2, strategy="exact")
    assert cfg.k == 2 and cfg.scan.strategy == "exact"


# ---- a head kind added from this file alone ---------------------------------------------------------


class NeuronGroups(MixerAdapter):
    """Toy kind: groups of 32 MLP neurons of a Llama block (``L0N3`` = neurons 96..127 of layer 0).

    An MLP mixes nothing across positions, so its pattern is the identity; its output is the input of
    ``down_proj`` (``blocks.{l}.mlp.out.hook_in``), a group owning its 32 channels there.
    """

    kind = "neurons"
    letter = "N"
    title = "MLP neuron groups"
    label = "MLP neuron group"
    unit = "neuron groups"
    axis = "neuron group"
    normalized_rows = True
    splittable_cache = True
    width = 32

    def detect(self, layer: int, name: str, component: Any) -> LayerSpec | None:
        mod = unwrap(component)
        if name != "mlp" or not hasattr(mod, "down_proj"):
            return None
        n = mod.down_proj.in_features // self.width
        return LayerSpec(layer, self.kind, n, 1, self.width, 0, f"blocks.{layer}.{name}", type(mod).__name__)

    def output_hook(self, spec: LayerSpec) -> str:
        return f"{spec.bridge_path}.out.hook_in"

    def pattern_hooks(self, spec: LayerSpec) -> list[str]:
        return [f"{spec.bridge_path}.hook_in"]

    def pattern(self, model, spec, cache, heads, batch, options):
        b, t = cache[f"{spec.bridge_path}.hook_in"].shape[:2]
        return torch.eye(t).expand(b, len(heads), t, t).clone()


@pytest.fixture
def toy_model(tiny_dirs):
    adapter = register_kind(NeuronGroups())
    try:
        yield gna.load_model(tiny_dirs["llama"], device="cpu")
    finally:
        unregister_kind(adapter.kind)


def test_a_toy_head_kind_works_end_to_end_without_editing_the_package(toy_model):
    model = toy_model
    toy = model.heads(kind="neurons")
    assert len(toy) == 3 * 4 and toy[0].name == "L0N0" and gna.HeadRef.parse("L2N3") in toy  # 128 neurons / 32
    assert len(model.heads(kind="attn")) == 12  # attention still there, the MLPs now listed too
    assert "MLP neuron group" in model.check_head("L1N2").adapter.label

    ps = gna.patterns(model, ["one two three", "four"], heads=["L1N2", "L1H0"])
    assert torch.equal(ps.sample(0, ["L1N2"])[0], torch.eye(len(ps.str_tokens[0])))

    # ablation = zeroing that group's 32 columns of down_proj, checked against an edited copy of the weights
    ids = model.tokenize("Memorize the following dictionary").ids
    down = model.hf_module("blocks.1.mlp.out")  # the plain nn.Linear down_proj
    with gna.ablate(model, "L1N2"):
        ablated = model.forward(ids)
    saved = down.weight.detach().clone()
    try:
        with torch.no_grad():
            down.weight[:, 64:96] = 0
        edited = model.forward(ids)
    finally:
        with torch.no_grad():
            down.weight.copy_(saved)
    torch.testing.assert_close(ablated, edited, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(ablated, model.forward(ids))

    task = gna.KVRetrieval(n_pairs=3, n_samples=4, seed=1)
    exact = gna.scan_heads(model, task, heads=toy[:6], strategy="exact", batch_size=2, progress=False)
    naive = gna.scan_heads(model, task, heads=toy[:6], strategy="naive", batch_size=2, progress=False)
    for h in toy[:6]:
        assert exact.ablated(h) == pytest.approx(naive.ablated(h), abs=1e-5)
    att = gna.scan_heads(model, task, heads=toy[:6], strategy="attribution", batch_size=2, progress=False)
    assert all(h in att.estimates and att.sizes[h] > 0 for h in toy[:6])

    with pytest.raises(UnsupportedArchitectureError, match="cannot be masked"):
        with gna.mask_pattern(model, {"L0N0": torch.ones(3, 3)}):
            pass


def test_registering_a_taken_kind_or_letter_is_refused():
    with pytest.raises(gna.GnaError, match="already registered"):
        register_kind(type("Again", (NeuronGroups,), {"kind": "attn"})())
    with pytest.raises(gna.GnaError, match="letter 'H' is already used"):
        register_kind(type("Clash", (NeuronGroups,), {"letter": "H"})())
    assert PatternOptions().form == "exact"
