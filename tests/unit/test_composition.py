"""No class in rocket/ has more than two bases, protocols aside (issue 51): a role is a router over components that
own their state, not a stack of mixins sharing one self. MIXED lists the classes that still are one, with their
bases; a class may only leave it or lose bases, and the test asks for the list to follow."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

MIXED: dict[str, int] = {}  # none left


def bases_by_class() -> dict[str, int]:
    found = {}
    for path in sorted((ROOT / "rocket").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                bases = [base for base in node.bases
                         if not ast.unparse(base).startswith(("Protocol", "typing.Protocol", "Generic"))]
                found[f"{path.relative_to(ROOT)}:{node.name}"] = len(bases)
    return found


def test_no_class_has_more_than_two_bases_beyond_the_known_ones():
    found = bases_by_class()
    grew = {name: count for name, count in found.items() if count > max(2, MIXED.get(name, 0))}
    assert not grew, f"classes with more than two bases (compose components instead): {grew}"
    shrunk = {name: found.get(name) for name, count in MIXED.items() if found.get(name, 0) < count}
    assert not shrunk, f"fewer bases than MIXED lists (lower or remove their entries): {shrunk}"
