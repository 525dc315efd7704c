"""Imports go one way (ARCHITECTURE.md, "Layers"): no package under rocket/ imports one it may not, and none
imports another in a circle."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "rocket"

# The base: every package may use these, and they use nothing above them.
BASE = {"__init__", "errors", "limits", "model", "config", "filter", "serde", "clock", "world", "access", "quotas",
        "parked"}  # __init__: the version
# What each unit of rocket/ may import besides itself. A unit is a top-level package or module of rocket/.
ALLOWED = {
    "__init__": set(),
    "errors": set(),
    "clock": set(),
    "world": set(),
    "limits": {"errors"},
    "model": {"errors", "limits"},
    "filter": {"errors", "limits", "model"},
    "serde": {"errors", "limits", "model"},
    "config": {"errors", "limits", "model"},
    "access": {"errors", "limits"},
    "quotas": {"errors", "limits", "access"},  # a quota may name a namespace as a policy does
    "parked": {"errors"},
    "disk": BASE,
    "ml": BASE,
    "transport": BASE,
    "tier": BASE | {"disk"},
    "replication": BASE | {"disk"},  # the engine's WAL is a disk.commitlog.CommitLog
    "telemetry": BASE | {"tier"},
    "raft": BASE | {"disk", "replication"},
    "store": BASE | {"disk"},
    "client": BASE | {"transport"},
    "roles": BASE | {"disk", "ml", "raft", "replication", "store", "telemetry", "tier", "transport"},
    "gateway": BASE | {"transport"},
    "node": BASE | {"disk", "ml", "raft", "replication", "store", "telemetry", "tier", "transport", "roles", "gateway"},
    "cli": BASE | {"client", "node"},
    "__main__": {"cli"},
}


def unit_of(module: str) -> str:
    """rocket.store.group -> store; rocket -> __init__."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def imports() -> dict[tuple[str, str], list[str]]:
    """(importing unit, imported unit) -> the files with such an import, over all of rocket/."""
    found: dict[tuple[str, str], list[str]] = {}
    for path in ROOT.rglob("*.py"):
        relative = path.relative_to(ROOT.parent).with_suffix("")
        module = ".".join(relative.parts).removesuffix(".__init__")
        here = unit_of(module)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                # `from rocket import limits` imports the unit limits, not the package.
                names = ([f"rocket.{alias.name}" for alias in node.names] if node.module == "rocket"
                         else [node.module])
            else:
                continue
            for name in names:
                if name == "rocket" or name.startswith("rocket."):
                    there = unit_of(name)
                    if there == "__version__":
                        there = "__init__"
                    if there != here:
                        found.setdefault((here, there), []).append(str(path.relative_to(ROOT.parent)))
    return found


def test_every_unit_is_in_the_rule():
    """A new package under rocket/ must be placed in the layers before it is used."""
    units = {path.stem if path.is_file() else path.name for path in ROOT.iterdir()
             if (path.suffix == ".py" or (path / "__init__.py").exists())}
    assert units <= set(ALLOWED), sorted(units - set(ALLOWED))


def test_no_import_goes_against_the_layers():
    """Every import between units of rocket/ is one the rule allows (downwards, or to the base)."""
    against = {f"{here} -> {there}": files for (here, there), files in imports().items()
               if there not in ALLOWED[here]}
    assert not against, against


def test_no_import_cycle():
    """The graph of imports between units has no cycle (the base units included)."""
    edges: dict[str, set[str]] = {}
    for here, there in imports():
        edges.setdefault(here, set()).add(there)
    done: set[str] = set()

    def cycle_from(unit: str, path: list[str]) -> list[str] | None:
        for following in sorted(edges.get(unit, ())):
            if following in path or following == unit:
                return path[path.index(following):] + [unit, following] if following in path else [unit, following]
            if following not in done:
                found = cycle_from(following, path + [unit])
                if found:
                    return found
        done.add(unit)
        return None

    for unit in sorted(edges):
        found = cycle_from(unit, []) if unit not in done else None
        assert found is None, " -> ".join(found)


def test_the_runtime_never_imports_the_jobs_or_pyspark():
    """jobs/ (PySpark) imports rocket, never the other way: a node runs without pyspark (DESIGN.md, the learning
    loop)."""
    found = []
    for path in ROOT.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            else:
                continue
            found += [f"{path.relative_to(ROOT.parent)}: {name}" for name in names
                      if name.split(".")[0] in ("jobs", "pyspark")]
    assert not found, found
