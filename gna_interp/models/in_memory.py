"""In-memory models: a Hugging Face causal LM (with its tokenizer) or a TransformerLens ``TransformerBridge``
already loaded in a notebook, wrapped as a :class:`~gna_interp.models.model.Model` without copying a weight or
reading a file, and left exactly as it was.

**Why a copy of the module tree.** Booting a ``TransformerBridge`` on a Hugging Face model rewrites that model in
place: bridge components replace its embedding, blocks, attention and MLP modules, and its config is switched to
eager attention. gna_interp then adds its own hook points to mixers the bridge does not hook
(:mod:`gna_interp.models.reach`), puts the bridge in eval mode and, in half precision, gives the output end float32
weights (:func:`~gna_interp.models.loading.float32_output`). None of that may reach the user's object, so the bridge
is built on a :func:`shared_copy`: every module, config and tokenizer object is new, while every parameter and
buffer *is* the user's tensor (``copy.deepcopy`` with those tensors pre-seeded in its memo). The copy costs the
modules' Python objects, never the weights. A bridge passed in is copied the same way, and the copy starts with no
TransformerLens hooks (hooks added to your bridge do not run inside gna_interp; use its interventions). The
tokenizer is copied too, and the bridge boots on that copy (:func:`bridge_tokenizer`) rather than one TransformerLens
would reload from its ``name_or_path``: no tokenizer file is read, and a tokenizer built in memory, which has no
``name_or_path``, works.

**What is shared, and why that is safe.** Interventions (:func:`~gna_interp.interventions.ablate`,
``mask_pattern``, ``skip_layers``) act on activations through hooks of the copy and never write a weight;
attribution switches ``requires_grad`` off while it runs and restores it, and takes gradients with
``torch.autograd.grad``, so no ``.grad`` is left on a parameter. In half precision the final norm and the
unembedding of the copy get float32 copies of their weights (a few MB), so the user's stay as they are.

**Naming.** There is no spec to reload such a model from: its name is ``<in-memory LlamaForCausalLM>``
(:func:`in_memory_name`), results record it (a saved circuit says ``"model_in_memory": true``), and
:func:`~gna_interp.models.spec.resolve_spec` refuses that name with a :class:`ModelUnavailableError` saying why.
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from gna_interp.errors import InputError, UnsupportedArchitectureError
from gna_interp.models.hf import unwrap
from gna_interp.models.model import owned_by_model
from gna_interp.models.reach import Reached, reached_kind
from gna_interp.models.spec import IN_MEMORY_PREFIX

__all__ = ["bridge_of", "bridge_tokenizer", "from_nnsight", "in_memory_name", "is_model_object", "own_output_weights",
           "shared_copy"]


def is_model_object(obj: Any) -> bool:
    """Whether ``obj`` is a model object rather than a spec: a ``torch.nn.Module`` (a Hugging Face model, a
    ``TransformerBridge``, or something :func:`bridge_of` will refuse with a clear error)."""
    return isinstance(obj, torch.nn.Module)


def from_nnsight(obj: Any, tokenizer: Any = None) -> tuple[Any, Any] | None:
    """``(hf_model, tokenizer)`` inside an nnsight model (an nnsight ``LanguageModel`` or any of its envoys: the
    wrapped module is ``._module``, older nnsight releases called it ``._model``; the tokenizer is the
    LanguageModel's unless one is given), or None when ``obj`` is not an nnsight object. nnsight itself is not
    imported: the object is recognised by its class's module.

    Raises :class:`InputError` when the nnsight model was not dispatched (its weights are still on the meta device:
    ``LanguageModel(..., dispatch=True)``) and :class:`UnsupportedArchitectureError` for an envoy of a part of the
    model (``lm.model``, the base model without the LM head: pass ``lm`` itself)."""
    if not any(c.__module__.split(".")[0] == "nnsight" for c in type(obj).__mro__):
        return None
    inner = None
    for name in ("_module", "_model"):
        try:
            inner = object.__getattribute__(obj, name)
        except AttributeError:
            continue
        if isinstance(inner, torch.nn.Module):
            break
    if not isinstance(inner, torch.nn.Module):
        raise InputError(f"this {type(obj).__name__} (nnsight) holds no torch module to wrap: pass the LanguageModel "
                         f"of a Hugging Face causal LM")
    if not _is_causal_lm(inner):
        raise UnsupportedArchitectureError(
            f"this nnsight envoy wraps a {type(inner).__name__}, a part of the model without its LM head (e.g. "
            f"lm.model): pass the LanguageModel itself, load_model(lm)")
    if any(p.is_meta for p in inner.parameters()):
        raise InputError(f"the nnsight {type(obj).__name__} has not loaded its weights yet (they are on the meta "
                         f"device until its first trace): create it with LanguageModel(..., dispatch=True), or call "
                         f"lm.dispatch() first")
    if tokenizer is None:
        try:
            tokenizer = getattr(obj, "tokenizer", None)
        except Exception:  # noqa: BLE001 -- an envoy without one
            tokenizer = None
    return inner, tokenizer


def _is_bridge(obj: Any) -> bool:
    from transformer_lens.model_bridge import TransformerBridge

    return isinstance(obj, TransformerBridge)


def _hf_of(model: Any) -> torch.nn.Module:
    """The Hugging Face model of ``model`` (itself, or a bridge's ``original_model``)."""
    return model.original_model if _is_bridge(model) else model


def in_memory_name(model: Any) -> str:
    """The name an in-memory model goes by in results: ``<in-memory LlamaForCausalLM>``."""
    return f"{IN_MEMORY_PREFIX}{type(_hf_of(model)).__name__}>"


def shared_copy(module: torch.nn.Module) -> torch.nn.Module:
    """A copy of ``module``'s object tree (modules, configs, hook dictionaries) whose parameters and buffers are
    ``module``'s own tensors: changing the copy's structure leaves ``module`` alone, and no weight is copied."""
    tensors = [*module.parameters(), *module.buffers()]
    if _is_bridge(module):
        tensors += [*module.original_model.parameters(), *module.original_model.buffers()]
    memo: dict[int, Any] = {id(t): t for t in tensors}
    out = copy.deepcopy(module, memo)
    ours = {id(t) for t in tensors}
    stray = [n for n, p in out.named_parameters(remove_duplicate=False) if id(p) not in ours]
    if stray:  # a parameter the walk above did not see (kept outside the module tree): refuse rather than copy it
        raise UnsupportedArchitectureError(
            f"{type(module).__name__} keeps parameters outside its module tree ({stray[:3]}); gna_interp cannot wrap it "
            f"without copying them. Save it (save_pretrained) and load the folder with load_model(DIR)")
    return out


def _is_causal_lm(model: torch.nn.Module) -> bool:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    name = type(model).__name__
    known = {n for v in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values() for n in ((v,) if isinstance(v, str) else v)}
    return name in known or name.endswith(("ForCausalLM", "LMHeadModel"))


def _check_tokenizer(tokenizer: Any, what: str) -> None:
    from transformers import PreTrainedTokenizerBase

    if tokenizer is None:
        raise InputError(f"{what} came without its tokenizer: gna_interp turns task text into tokens with it. Pass both: "
                         f"load_model(model, tokenizer) (e.g. tokenizer = AutoTokenizer.from_pretrained(same_id_or_dir))")
    if not isinstance(tokenizer, PreTrainedTokenizerBase):
        raise InputError(f"the tokenizer of {what} must be a Hugging Face tokenizer (PreTrainedTokenizerBase, from "
                         f"AutoTokenizer.from_pretrained), got {type(tokenizer).__name__}")


def own_output_weights(bridge: Any) -> None:
    """Give the copy's final norm and unembedding their own parameter objects (copies), so that
    :func:`float32_output` casting them in place cannot reach the user's tensors."""
    for comp in (bridge.ln_final, bridge.unembed):
        for mod in unwrap(comp).modules():
            for name, p in list(mod.named_parameters(recurse=False)):
                setattr(mod, name, torch.nn.Parameter(p.detach().clone(), requires_grad=p.requires_grad))


def _adds_bos(tokenizer: Any) -> bool:
    """Whether ``tokenizer`` says it puts a BOS token first, as TransformerLens's boot reads it: its saved
    ``add_bos_token`` (``init_kwargs``), else its ``add_bos_token`` attribute."""
    saved = tokenizer.init_kwargs.get("add_bos_token")
    return bool(getattr(tokenizer, "add_bos_token", False) if saved is None else saved)


def bridge_tokenizer(tokenizer: Any) -> Any:
    """The tokenizer to boot the bridge with, made so that TransformerLens keeps it rather than reload it from its
    ``name_or_path``: ``tokenizer`` itself (gna_interp's own copy: the boot normalises it in place), or, where the
    boot would reload it with ``add_bos_token=True`` (it has a BOS token and does not add it), a copy with
    ``add_bos_token`` switched on in memory. Nothing is read from disk or the hub, and a tokenizer built in memory
    (``PreTrainedTokenizerFast(tokenizer_object=...)``, without a ``name_or_path``) boots as one from a folder."""
    if not isinstance(getattr(tokenizer, "init_kwargs", None), dict):
        return tokenizer
    out = tokenizer
    if getattr(tokenizer, "bos_token", None) is not None and not _adds_bos(tokenizer):
        out = copy.deepcopy(tokenizer)
        try:
            out.add_bos_token = True  # transformers 5 rebuilds a fast tokenizer's post-processor: BOS is added
        except (AttributeError, TypeError, ValueError):
            pass  # no setter: the bridge sees no BOS in the ids and puts it first itself
        out.init_kwargs["add_bos_token"] = True
    out.init_kwargs.setdefault("name_or_path", str(getattr(out, "name_or_path", "") or ""))  # the boot reads it
    return out


def _boot(hf_copy: torch.nn.Module, tokenizer: Any, name: str) -> Any:
    from transformer_lens.model_bridge import TransformerBridge

    p = next(hf_copy.parameters())
    try:
        return TransformerBridge.boot_transformers(name, device=str(p.device), dtype=p.dtype,
                                                   tokenizer=bridge_tokenizer(tokenizer), hf_model=hf_copy)
    except ValueError as e:
        if "supported architecture" in str(e) or "Unsupported architecture" in str(e):
            arch = "/".join(getattr(hf_copy.config, "architectures", None) or [type(hf_copy).__name__])
            raise UnsupportedArchitectureError(
                f"{name} is a {arch} model, which TransformerLens's TransformerBridge does not support. Supported "
                f"families include Llama/Mistral/Qwen/GPT-2 (attention), Mamba, Mamba-2, Falcon-Mamba, Jamba, Bamba, "
                f"Zamba2 and NemotronH; see transformer_lens.model_bridge.supported_architectures") from e
        raise


def bridge_of(model: Any, tokenizer: Any = None) -> tuple[Any, Any]:
    """A new ``TransformerBridge`` over an in-memory model and a copy of its tokenizer: ``model`` is a Hugging Face
    causal LM (``PreTrainedModel``, ``tokenizer`` required) or a ``TransformerBridge`` (its own tokenizer unless one
    is given). The bridge runs on a :func:`shared_copy` (the user's parameter tensors, new everything else), so
    nothing done to it reaches ``model``; a bridge's copy starts without TransformerLens hooks.

    Raises :class:`InputError` for a missing or wrong tokenizer, :class:`UnsupportedArchitectureError` for an
    object that is not a causal language model or an architecture the bridge does not support.
    """
    if not is_model_object(model):
        raise InputError(f"expected a Hugging Face causal LM (PreTrainedModel) or a TransformerBridge, got "
                         f"{type(model).__name__}")
    name = in_memory_name(model)
    if _is_bridge(model):
        tokenizer = tokenizer if tokenizer is not None else getattr(model, "tokenizer", None)
        _check_tokenizer(tokenizer, f"the TransformerBridge of {type(model.original_model).__name__}")
        if owned_by_model(model) or any(isinstance(mod, Reached) or reached_kind(mod) for mod in model.modules()):
            raise InputError("this TransformerBridge already belongs to a gna_interp Model (it is model.bridge, or "
                             "carries gna_interp's hook points): use that Model itself rather than wrapping its bridge "
                             "again; for a second, independent Model load the checkpoint again (load_model(DIR))")
        bridge = shared_copy(model)
        bridge.reset_hooks(including_permanent=True)
        for mod in bridge.modules():  # TL wires these on first forward, closures over *its* modules: wire them anew
            teardown = getattr(mod, "_teardown_capture_hooks", None)
            if callable(teardown):
                teardown()
        tok = copy.deepcopy(tokenizer)
        bridge.tokenizer = tok
        return bridge, tok
    from transformers import PreTrainedModel

    if not isinstance(model, PreTrainedModel):
        raise UnsupportedArchitectureError(
            f"{type(model).__name__} is a torch module but not a Hugging Face PreTrainedModel: gna_interp wraps "
            f"transformers causal LMs (AutoModelForCausalLM) and TransformerLens bridges")
    if not _is_causal_lm(model):
        raise UnsupportedArchitectureError(
            f"{type(model).__name__} is not a causal language model (no next-token head): gna_interp scores "
            f"next-token log-probabilities. Load it with AutoModelForCausalLM.from_pretrained(...)")
    _check_tokenizer(tokenizer, name)
    tok = copy.deepcopy(tokenizer)
    return _boot(shared_copy(model), tok, name), tok
