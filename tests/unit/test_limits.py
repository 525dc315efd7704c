"""limits.py keeps its promise: every limit has a reason on its line (or the comment just above) and one naming
convention, units then _max, _min or _default last."""

import ast
import re
from pathlib import Path

from rocket import limits

SOURCE = Path(limits.__file__).read_text()
UNITS = {"KiB", "MiB", "GiB"}


def assigned() -> list[tuple[str, int]]:
    return [(node.targets[0].id, node.lineno) for node in ast.parse(SOURCE).body
            if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)]


def test_every_limit_says_why():
    """Each assignment carries a comment on its line, or right above it."""
    lines = SOURCE.splitlines()
    silent = [name for name, line in assigned() if name not in UNITS
              and "#" not in lines[line - 1] and not lines[line - 2].lstrip().startswith("#")]
    assert silent == []


def test_names_put_the_bound_last():
    """No limit is named max_..., min_... or default_...: the qualifier goes last, after the unit."""
    assert [name for name, _ in assigned() if re.match(r"(max|min|default)_", name)] == []


def is_number(node: ast.AST) -> bool:
    """A literal number, or arithmetic on literals and limits' units (a sum over format fields is no tunable)."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, (int, float)) and not isinstance(node.value, bool)
    if isinstance(node, ast.UnaryOp):
        return is_number(node.operand)
    if isinstance(node, ast.BinOp):
        return is_number(node.left) and is_number(node.right)
    if isinstance(node, ast.Attribute):
        return isinstance(node.value, ast.Name) and node.value.id == "limits" and node.attr in UNITS
    return isinstance(node, ast.Name) and node.id in UNITS


def test_no_tunable_number_lives_outside_limits():
    """Outside limits.py a module-level number is a format constant, written in capitals (MAGIC, ALIGN, the RFC's
    DEFAULT_WINDOW_BYTES); a lowercase one is a tunable that belongs in limits.py."""
    found = []
    for path in Path(limits.__file__).parent.rglob("*.py"):
        if path.name == "limits.py":
            continue
        for node in ast.parse(path.read_text()).body:
            if (isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)
                    and node.targets[0].id.lstrip("_").islower() and is_number(node.value)):
                found.append(f"{path.name}: {node.targets[0].id}")
    assert found == []
