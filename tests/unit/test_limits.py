"""rocket/limits/ keeps its promise: every limit has a reason on its line (or the comment just above) and one naming
convention, units then _max, _min or _default last; its modules split it by subsystem, read as limits.x."""

import ast
import re
from pathlib import Path

from rocket import limits

PACKAGE = Path(limits.__file__).parent
MODULES = sorted(path for path in PACKAGE.glob("*.py") if path.name != "__init__.py")
UNITS = {"KiB", "MiB", "GiB", "TiB"}


def assigned(path: Path) -> list[tuple[str, int]]:
    return [(node.targets[0].id, node.lineno) for node in ast.parse(path.read_text()).body
            if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)]


def test_every_limit_says_why():
    """Each assignment carries a comment on its line, or right above it."""
    silent = []
    for path in MODULES:
        lines = path.read_text().splitlines()
        silent += [name for name, line in assigned(path) if name not in UNITS
                   and "#" not in lines[line - 1] and not lines[line - 2].lstrip().startswith("#")]
    assert silent == []


def test_names_put_the_bound_last():
    """No limit is named max_..., min_... or default_...: the qualifier goes last, after the unit."""
    assert [name for path in MODULES for name, _ in assigned(path) if re.match(r"(max|min|default)_", name)] == []


def test_every_limit_is_read_as_limits_x_and_named_once():
    """The package holds each module's names (call sites read limits.x, and tests patch it there), and no name is
    set in two modules."""
    names = [name for path in MODULES for name, _ in assigned(path)]
    assert len(names) == len(set(names))
    assert all(hasattr(limits, name) for name in names)
    assert not [node for node in ast.parse((PACKAGE / "__init__.py").read_text()).body if isinstance(node, ast.Assign)
                and getattr(node.targets[0], "id", "") != "__all__"], "limits are set in their subsystem's module"


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
    """Outside rocket/limits/ a module-level number is a format constant, written in capitals (MAGIC, ALIGN, the
    RFC's DEFAULT_WINDOW_BYTES); a lowercase one is a tunable that belongs in limits."""
    found = []
    for path in PACKAGE.parent.rglob("*.py"):
        if path.parent == PACKAGE:
            continue
        for node in ast.parse(path.read_text()).body:
            if (isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)
                    and node.targets[0].id.lstrip("_").islower() and is_number(node.value)):
                found.append(f"{path.name}: {node.targets[0].id}")
    assert found == []
