"""The applications stay within the library's size gates (issue 41): no function over `MAX_FUNCTION_LINES` lines and
no file over `MAX_FILE_LINES` in demo/, export/ and training/. A function is counted from its `def` line to its
last line (its docstring and comments included); a nested function counts on its own and inside its parent.

    python -m tests.test_code_size   # prints every function and file over the bounds (none: nothing printed)
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHECKED = ("demo", "export", "training")
MAX_FUNCTION_LINES = 60
MAX_FILE_LINES = 450


def python_files(packages=CHECKED) -> list[Path]:
    return sorted(p for name in packages for p in (ROOT / name).rglob("*.py") if "node_modules" not in p.parts)


def long_functions(path: Path, root: Path = ROOT, most: int = MAX_FUNCTION_LINES) -> list[tuple[str, int]]:
    """(`file:line name`, lines) of each function of `path` (under `root`) longer than `most` lines."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    where = path.relative_to(root)
    return [
        (f"{where}:{node.lineno} {node.name}", node.end_lineno - node.lineno + 1)
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > most
    ]


def long_files(paths, root: Path = ROOT, most: int = MAX_FILE_LINES) -> list[tuple[str, int]]:
    counts = ((str(p.relative_to(root)), len(p.read_text(encoding="utf-8").splitlines())) for p in paths)
    return [(name, n) for name, n in counts if n > most]


def test_no_application_function_is_over_60_lines():
    found = [item for path in python_files() for item in long_functions(path)]
    assert not found, f"functions over {MAX_FUNCTION_LINES} lines: {found}"


def test_no_application_file_is_over_450_lines():
    found = long_files(python_files())
    assert not found, f"files over {MAX_FILE_LINES} lines: {found}"


def test_the_check_finds_a_long_function_and_a_long_file(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    (tmp_path / "long.py").write_text(f"def short():\n    return 1\n\n\ndef long():\n{body}\n" + "\n" * 400)
    assert long_functions(tmp_path / "long.py", tmp_path) == [("long.py:5 long", MAX_FUNCTION_LINES + 1)]
    assert long_functions(tmp_path / "long.py", tmp_path, most=MAX_FUNCTION_LINES + 1) == []
    assert long_files([tmp_path / "long.py"], tmp_path) == [("long.py", 5 + MAX_FUNCTION_LINES + 400)]


if __name__ == "__main__":
    for path in python_files():
        for name, n in long_functions(path):
            print(f"function {name}: {n} lines")
    for name, n in long_files(python_files()):
        print(f"file {name}: {n} lines")
