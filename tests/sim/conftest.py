"""Seeds for the simulation tests: `--seed N` replays one run exactly; `--sim-seeds N` runs N of them."""


def pytest_addoption(parser):
    parser.addoption("--seed", type=int, default=None, help="replay the simulation with this seed only")
    parser.addoption("--sim-seeds", type=int, default=200, help="how many seeds each simulation test runs")


def pytest_generate_tests(metafunc):
    if "seed" in metafunc.fixturenames:
        chosen = metafunc.config.getoption("--seed")
        count = metafunc.config.getoption("--sim-seeds")
        cap = metafunc.definition.get_closest_marker("sim_seeds")  # a slower simulation runs fewer
        if cap is not None:
            count = min(count, cap.args[0])
        metafunc.parametrize("seed", [chosen] if chosen is not None else range(count))
