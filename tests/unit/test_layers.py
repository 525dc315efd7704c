"""Cores have no I/O (DESIGN.md rule 1), the roles and the Raft host take time and the machine from what node.py
gives them, and the runtime never imports pyspark."""

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "rocket"
IO_MODULES = {"trio", "socket", "asyncio", "time", "os", "pathlib", "plyvel", "io", "select", "threading"}
CORES = ["serde/batch.py", "serde/piece.py", "disk/record.py", "transport/frames.py", "transport/grpc_wire.py",
         "gateway/remoting/codec.py", "gateway/remoting/messages.py", "gateway/remoting/signature.py",
         "gateway/rocketmq/signature.py", "raft/codec.py", "raft/types.py", "raft/controlled.py", "raft/progress.py",
         "roles/nameserver/metadata.py", "roles/nameserver/control.py", "roles/controller/machine.py", "ml/placement.py", "ml/forecast.py", "ml/load.py", "ml/health.py", "ml/trees.py", "filter/__init__.py", "filter/tags.py", "filter/sql.py",
         "store/commands.py", "store/records.py", "store/manifest.py", "store/machine.py", "store/values.py",
         "store/pop.py", "quotas.py", "raft/planner.py"]


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("core", CORES + [str(p.relative_to(ROOT)) for p in ROOT.glob("raft/*core*.py")])
def test_cores_import_no_io(core):
    """A pure core imports no sockets, files, clocks or event loops."""
    assert not imported_modules(ROOT / core) & IO_MODULES


def test_runtime_never_imports_pyspark():
    """Only jobs/ may use pyspark."""
    for path in ROOT.rglob("*.py"):
        assert "pyspark" not in imported_modules(path), path


@pytest.mark.parametrize("path", sorted(str(p.relative_to(ROOT)) for folder in ("roles", "gateway")
                                         for p in (ROOT / folder).rglob("*.py")))
def test_roles_read_the_clock_they_are_given(path):
    """Roles and gateways take wall and monotonic time from the Clock node.py gives them (rocket/clock.py), so
    that a simulator can move both: none imports time."""
    assert "time" not in imported_modules(ROOT / path)


OWN_MACHINE = re.compile(r"to_thread|trio\.lowlevel\.start_thread_soon|statvfs|disk_usage|SystemRandom|os\.urandom|secrets\."
                         r"|\brandom\.(random|randint|choice|getrandbits|randrange|shuffle|uniform|sample)\(")


@pytest.mark.parametrize("path", sorted(str(p.relative_to(ROOT)) for folder in ("roles", "raft", "store")
                                         for p in (ROOT / folder).rglob("*.py")))
def test_roles_and_the_raft_host_take_the_machine_from_their_world(path):
    """Worker threads, free space and randomness come from the World node.py gives them (rocket/world.py), so that
    the roles simulator replays a seed exactly: none starts a thread, looks at the disk or draws from the OS itself
    (the Raft cores' own Random is seeded by their config)."""
    assert not OWN_MACHINE.search((ROOT / path).read_text())
