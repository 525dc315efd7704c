"""Every third-party import of the installed package is declared in pyproject.toml, so a plain `pip install .` on a
fresh machine brings what `rocket` imports (a click that only the test extra brought once hid a broken CLI).

An import is optional when it sits in a `try:` that catches ImportError; it may then come from an extra, and the
code says which one to install. Any other import's distribution must be among `dependencies`.
"""

import ast
import importlib.metadata
import re
import sys
import tomllib
from pathlib import Path

TOP = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((TOP / "pyproject.toml").read_text())["project"]
# The user-facing extras an optional import may name; test, bench and dev are for this repository's own work.
USER_EXTRAS = ("ml", "rocketmq", "azure", "gcs", "hdfs")
# What each package of the wheel may take from an extra without a try: jobs/ runs on Spark, never in a node.
PACKAGE_EXTRAS = {"rocket": (), "jobs": ("ml",)}


def distribution_name(requirement: str) -> str:
    return re.split(r"[<>=\[;! ~]", requirement.strip(), maxsplit=1)[0].lower().replace("_", "-")


def declared(extras: tuple[str, ...] = ()) -> set[str]:
    names = {distribution_name(requirement) for requirement in PROJECT["dependencies"]}
    for extra in extras:
        names |= {distribution_name(requirement) for requirement in PROJECT["optional-dependencies"][extra]}
    return names


def _catches_import_error(handler: ast.ExceptHandler) -> bool:
    caught = handler.type
    names = caught.elts if isinstance(caught, ast.Tuple) else [caught] if caught is not None else []
    return any(isinstance(name, ast.Name) and name.id in {"ImportError", "ModuleNotFoundError"} for name in names)


def third_party_imports(package: str) -> dict[str, tuple[str, bool]]:
    """Top-level module -> (the first file importing it, whether every import of it is optional)."""
    found: dict[str, tuple[str, bool]] = {}

    def visit(node: ast.AST, path: Path, optional: bool) -> None:
        if isinstance(node, ast.Try):
            guarded = optional or any(_catches_import_error(handler) for handler in node.handlers)
            for child in node.body:
                visit(child, path, guarded)
            for child in [*node.handlers, *node.orelse, *node.finalbody]:
                visit(child, path, optional)
            return
        modules = []
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            modules = [node.module]
        for module in modules:
            top = module.split(".")[0]
            if top in sys.stdlib_module_names or top in PACKAGE_EXTRAS or top == "__future__":
                continue
            first, all_optional = found.get(top, (str(path.relative_to(TOP)), True))
            found[top] = (first, all_optional and optional)
        for child in ast.iter_child_nodes(node):
            visit(child, path, optional)

    for path in sorted((TOP / package).rglob("*.py")):
        visit(ast.parse(path.read_text()), path, False)
    return found


def undeclared(package: str) -> list[str]:
    distributions_of = importlib.metadata.packages_distributions()
    required, optional = declared(PACKAGE_EXTRAS[package]), declared(PACKAGE_EXTRAS[package] + USER_EXTRAS)
    problems = []
    for top, (where, is_optional) in sorted(third_party_imports(package).items()):
        distributions = {distribution_name(name) for name in distributions_of.get(top, [])}
        if not distributions:
            problems.append(f"{top} ({where}): no installed distribution provides it, so it cannot be checked")
        elif not distributions & (optional if is_optional else required):
            kind = "an extra or dependencies" if is_optional else "dependencies"
            problems.append(f"{top} ({where}): from {', '.join(sorted(distributions))}, which {kind} does not name")
    return problems


def test_every_import_of_rocket_is_declared():
    assert undeclared("rocket") == []


def test_every_import_of_the_jobs_is_declared():
    assert undeclared("jobs") == []


def test_the_check_sees_an_undeclared_import(tmp_path, monkeypatch):
    """The check would have caught click: imported by rocket/cli, brought only by the test extra (through flask)."""
    monkeypatch.setitem(PACKAGE_EXTRAS, "planted", ())
    monkeypatch.setattr(sys.modules[__name__], "TOP", tmp_path)
    (tmp_path / "planted").mkdir()
    (tmp_path / "planted" / "cli.py").write_text("import typer\nimport pytest\ntry:\n    import hypothesis\n"
                                                 "except ImportError:\n    hypothesis = None\n")
    problems = undeclared("planted")
    assert [problem.split(" ")[0] for problem in problems] == ["hypothesis", "pytest"]
    assert "which dependencies does not name" in problems[1]
    assert "which an extra or dependencies does not name" in problems[0]
