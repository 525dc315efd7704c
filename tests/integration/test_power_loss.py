"""Power loss, not just kill -9: a dev node on a lazy slowfs (benchmarks/slowfs.py), killed mid-produce while its
file system drops every write not fsynced, keeps every acknowledged message, once, in order, where it was
acknowledged. The cycles are benchmarks/power_loss.py's; ROCKET_POWER_LOSS_CYCLES runs more than CI's 5."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import power_loss  # noqa: E402

if not os.path.exists("/dev/fuse"):
    pytest.skip("no /dev/fuse on this machine: the lazy slowfs cannot mount", allow_module_level=True)
if importlib.util.find_spec("pyfuse3") is None:
    pytest.skip("pyfuse3 is not installed (pip install pyfuse3; needs Debian libfuse3-dev fuse3 pkg-config)",
                allow_module_level=True)

CYCLES = int(os.environ.get("ROCKET_POWER_LOSS_CYCLES", "5"))


@pytest.mark.parametrize("direct", [False, True], ids=["page-cache", "direct-io"])
def test_power_loss_keeps_every_acknowledged_message(tmp_path, direct):
    """Each cycle kills the node at a random moment and drops its unsynced writes; afterwards nothing acknowledged
    is lost, moved, repeated or reordered, and the crashes did drop data (the test is not vacuous)."""
    tally = power_loss.run(tmp_path, CYCLES, queues=4, direct_io=direct)
    assert tally.cycles == CYCLES and tally.acknowledged > 0
    assert sum(crash["bytes_dropped"] for crash in tally.crashes) > 0
    assert (tally.lost, tally.misplaced, tally.duplicated, tally.reordered) == (0, 0, 0, 0)
    assert "no O_DIRECT" not in (tmp_path / "node.log").read_text()


def test_a_node_that_skips_fdatasync_is_caught(tmp_path, monkeypatch):
    """The same cycles find acknowledged messages lost when the node's fdatasync does nothing (the WAL's group
    commit then acknowledges what only the page cache holds), which kill -9 alone would never show."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import os\nos.fdatasync = lambda descriptor: None\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(site), *filter(None, [os.environ.get("PYTHONPATH")])]))
    tally = power_loss.run(tmp_path / "work", 2, queues=2, seed=7)
    assert tally.acknowledged > 0 and tally.lost > 0
