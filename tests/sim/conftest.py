"""Seeds for the simulation tests: `--seed N` replays one run exactly; `--sim-seeds N` runs N of them (without it, 200,
or fewer for a slower simulation that says so with its sim_seeds mark). The roles simulations' disk is in memory
(fast_disk)."""

import shutil
import tempfile
from pathlib import Path

import pytest

DEFAULT_SEEDS = 200


def pytest_addoption(parser):
    parser.addoption("--seed", type=int, default=None, help="replay the simulation with this seed only")
    parser.addoption("--sim-seeds", type=int, default=None,
                     help="how many seeds each simulation test runs (default: 200, fewer for a slower one)")


def pytest_generate_tests(metafunc):
    if "seed" in metafunc.fixturenames:
        chosen = metafunc.config.getoption("--seed")
        count = metafunc.config.getoption("--sim-seeds")
        if count is None:
            count = DEFAULT_SEEDS
            cap = metafunc.definition.get_closest_marker("sim_seeds")  # a slower simulation runs fewer by default
            if cap is not None:
                count = min(count, cap.args[0])
        metafunc.parametrize("seed", [chosen] if chosen is not None else range(count))


@pytest.fixture
def fast_disk():
    """A directory in memory when there is one: the simulation's fsyncs then cost nothing."""
    parent = "/dev/shm" if Path("/dev/shm").is_dir() else None
    directory = Path(tempfile.mkdtemp(prefix="rocket-sim-", dir=parent))
    yield directory
    shutil.rmtree(directory, ignore_errors=True)
