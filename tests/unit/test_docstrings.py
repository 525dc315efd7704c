"""A module's docstring says what it owns and its contract in at most three lines (../shared/STYLE.md); the detail goes
to the classes and functions it is about, and measurements to benchmarks/RESULTS.md."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAX_LINES = 3


def test_module_docstrings_are_at_most_three_lines():
    long = {}
    for path in sorted((ROOT / "rocket").rglob("*.py")):
        docstring = ast.get_docstring(ast.parse(path.read_text()), clean=False)
        lines = len(docstring.strip("\n").split("\n")) if docstring is not None else 0
        if lines > MAX_LINES:
            long[str(path.relative_to(ROOT))] = lines
    assert not long, f"module docstrings longer than {MAX_LINES} lines (move the detail to what it is about): {long}"
