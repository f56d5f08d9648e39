"""The layout section of DESIGN.md, made from the package itself: every module with the first
sentence of its docstring, folder by folder, in one table. `tests/test_layout.py` fails when the
section in DESIGN.md differs; `python3 -m tests.layout --write` writes it again."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "burla"
DESIGN = ROOT / "DESIGN.md"
BEGIN = "<!-- layout: made by `python3 -m tests.layout --write` from the modules' docstrings -->"
END = "<!-- layout ends -->"


def modules() -> list[Path]:
    """Every module of the package, a folder's `__init__.py` first."""
    def place(path: Path) -> tuple:
        return path.parent.relative_to(PACKAGE).parts, path.name != "__init__.py", path.name

    return sorted(PACKAGE.rglob("*.py"), key=place)


def summary(path: Path) -> str:
    """The first sentence of a module's docstring, on one line ("" without one)."""
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    paragraph = " ".join(doc.split("\n\n")[0].split())
    end = paragraph.find(". ")
    return paragraph if end < 0 else paragraph[:end + 1]


def render() -> str:
    """One table: a row per folder (its `__init__.py`'s sentence, in bold), then a row per module."""
    lines = [BEGIN, "", "| module | what it is |", "|---|---|"]
    for path in modules():
        escaped = summary(path).replace("|", "\\|")  # a pipe would end the table's cell
        if path.name == "__init__.py":
            lines.append(f"| **`{path.parent.relative_to(ROOT).as_posix()}/`** | {escaped} |")
        else:
            lines.append(f"| `{path.name}` | {escaped} |")
    lines.append(END)
    return "\n".join(lines)


def section(text: str) -> str:
    """The layout section as DESIGN.md has it ("" if its markers are missing)."""
    start, end = text.find(BEGIN), text.find(END)
    return text[start:end + len(END)] if 0 <= start < end else ""


def write() -> None:
    text = DESIGN.read_text(encoding="utf-8")
    current = section(text)
    if not current:
        raise SystemExit(f"DESIGN.md has no layout markers ({BEGIN} ... {END})")
    DESIGN.write_text(text.replace(current, render()), encoding="utf-8")


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        raise SystemExit("usage: python3 -m tests.layout --write")
    write()
