"""Every file the package writes goes through :mod:`gna_interp.store` (atomic, never through a link, strict JSON):
a module that writes a file another way fails this test, naming the line."""

from __future__ import annotations

import ast
from pathlib import Path

import gna_interp

PACKAGE = Path(gna_interp.__file__).parent

# methods and functions that write a file when given a path
WRITING_METHODS = {"write_text", "write_bytes", "write_html", "write_image", "to_csv", "to_json", "to_parquet",
                   "save_pretrained", "savefig", "to_pickle"}
WRITING_FUNCTIONS = {("json", "dump"), ("torch", "save"), ("shutil", "copy"), ("shutil", "copy2"),
                     ("shutil", "copyfile"), ("shutil", "copytree"), ("np", "save"), ("pickle", "dump")}

# The writes allowed outside the store, each inside a private temporary folder the module made itself and that no
# one else reads until it is moved into place whole (by os.replace) or deleted.
ALLOWED = {
    ("models/loading.py", "save_pretrained"): "the GGUF conversion fills a mkdtemp folder, then os.replace moves it",
    ("models/loading.py", "write_text"): "gna_source.json inside the same mkdtemp folder",
    ("models/tiny.py", "save_pretrained"): "fills the temporary folder of store.write_files",
    ("zoo/training.py", "save_pretrained"): "fills the temporary folder of store.write_files",
    ("viz/export.py", "write_text"): "kaleido's job file in a TemporaryDirectory",
    ("viz/export.py", "open"): "the exporter's stderr file in the same TemporaryDirectory",
    ("store.py", "open"): "the store itself",
    ("engine/profile.py", "write_text"): "/proc/self/clear_refs, a kernel switch that resets the peak memory",
    ("store.py", "save"): "the store itself (torch.save into a BytesIO)",
}


def _writes(tree: ast.AST) -> list[tuple[int, str]]:
    """``(line, name)`` of every call in ``tree`` that writes a file other than through the store."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if isinstance(f, ast.Attribute):
            owner = f.value.id if isinstance(f.value, ast.Name) else None
            if (owner, f.attr) in WRITING_FUNCTIONS:
                found.append((node.lineno, f.attr))
            elif f.attr in WRITING_METHODS and (node.args or any(k.arg in ("path", "path_or_buf", "file")
                                                                 for k in node.keywords)):
                found.append((node.lineno, f.attr))  # to_csv() with no path returns text: not a write
        elif isinstance(f, ast.Name) and f.id == "open" and _opens_for_writing(node):
            found.append((node.lineno, "open"))
    return found


def _opens_for_writing(call: ast.Call) -> bool:
    mode = call.args[1] if len(call.args) > 1 else next((k.value for k in call.keywords if k.arg == "mode"), None)
    return isinstance(mode, ast.Constant) and isinstance(mode.value, str) and any(c in mode.value for c in "wax+")


def test_every_file_is_written_through_the_store():
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        for line, name in _writes(ast.parse(path.read_text(encoding="utf-8"))):
            if (rel, name) not in ALLOWED:
                offenders.append(f"gna_interp/{rel}:{line}: {name}(...) writes a file outside gna_interp.store")
    assert not offenders, "\n".join(offenders)


def test_the_check_finds_a_write_another_way():
    """The check itself: each way of writing a file is caught, and the store's own call is not."""
    src = ("p.write_text('x')\nframe.to_csv(p, index=False)\njson.dump(d, fh)\nopen(p, 'w')\nshutil.copy2(a, b)\n"
           "fig.write_html(p)\ntext = frame.to_csv(index=False)\nopen(p)\natomic_write(p, text)\n")
    assert [name for _, name in _writes(ast.parse(src))] == ["write_text", "to_csv", "dump", "open", "copy2",
                                                            "write_html"]
