"""The docs, the README, the package's and the benchmarks' docstrings and the tests speak of the tool and its
version, never of the work that made it (:data:`WORDS`: numbered sessions and issues, issue references, words of
the work log). Prose files are read whole; Python files by their docstrings and comments (code may hold a CSS
colour)."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORDS = re.compile(r"\bsessions?\s+\d+|\bissues?\s+#?\d+|(?<![\w&/#])#\d{1,4}\b|\bredone\b|\bthe\s+issue(?:'s)?\b",
                   re.IGNORECASE)
PROSE = (".md", ".yml", ".yaml", ".txt")


def _python_texts(source: str) -> list[tuple[int, str]]:
    """``(line, text)`` of every docstring and comment of a Python source."""
    out = []
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                out.append((body[0].lineno, body[0].value.value))
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            out.append((tok.start[0], tok.string))
    return out


def _texts(path: Path) -> list[tuple[int, str]]:
    source = path.read_text(encoding="utf-8")
    return _python_texts(source) if path.suffix == ".py" else [(1, source)]


def _files() -> list[Path]:
    files = [ROOT / "README.md", ROOT / "mkdocs.yml"]
    for folder, suffixes in (("docs", PROSE), ("gna_interp", (".py",)), ("benchmarks", (".py", *PROSE)),
                             ("tests", (".py", *PROSE))):
        files += sorted(p for p in (ROOT / folder).rglob("*") if p.is_file() and p.suffix in suffixes)
    return [f for f in files if f.is_file()]


def work_history(files: list[Path], root: Path = ROOT) -> list[str]:
    """``file:line: 'words'`` (``file`` relative to ``root``) for every work-history phrase in ``files``."""
    found = []
    for f in files:
        for start, text in _texts(f):
            for m in WORDS.finditer(text):
                line = start + text.count("\n", 0, m.start())
                found.append(f"{f.relative_to(root)}:{line}: {m.group(0)!r}")
    return found


def test_docs_docstrings_and_tests_carry_no_work_history():
    found = work_history(_files())
    assert not found, "work-history words (describe the tool and its version instead):\n" + "\n".join(found)


def test_the_check_names_file_and_line(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Title\n\nMeasured in session 24,\nas issue\n25 asked (#46); redone.\n", encoding="utf-8")
    code = tmp_path / "mod.py"
    code.write_text('"""Fine."""\n\nCOLOUR = "#666"  # fixed in #12\n', encoding="utf-8")
    assert work_history([page, code], tmp_path) == ["page.md:3: 'session 24'", "page.md:4: 'issue\\n25'",
                                                    "page.md:5: '#46'", "page.md:5: 'redone'", "mod.py:3: '#12'"]
