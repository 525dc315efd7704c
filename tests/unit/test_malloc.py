"""keep_freed_memory: a node's big blocks come from malloc's heap and stay there once freed, so that the next
ones reuse warm pages instead of faulting in fresh ones; and the heap is touched once at start, so that the first
ones do too."""

from __future__ import annotations

import subprocess
import sys

import pytest

# Runs a workload in a fresh interpreter, with keep_freed_memory applied ("keep") or not ("default"), and prints
# whether it applied and how many minor faults the workload took.
PROGRAM = """
import resource, sys
from rocket.node import keep_freed_memory
applied = keep_freed_memory() if sys.argv[1] == "keep" else None
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
{workload}
print(applied, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""

# Blocks of 1, 2, ... 24 MiB, each filled and freed. By default glibc maps each one afresh (its dynamic mmap
# threshold only rises to the size last freed) and every page faults; kept on the heap, only growth faults.
GROWING_BLOCKS = """
for mib in range(1, 25):
    block = b"\\x01" * (mib << 20)
    del block
"""

# 96 blocks of 1 MiB alive at once, as batches in flight and a group's Raft log hold them: a heap that has not
# grown that far yet faults on every page of them, unless it was touched before.
WORKING_SET = """
blocks = [b"\\x01" * (1 << 20) for _ in range(96)]
"""


def faults(mode: str, workload: str = GROWING_BLOCKS) -> tuple[str, int]:
    program = PROGRAM.format(workload=workload)
    out = subprocess.run([sys.executable, "-c", program, mode], capture_output=True, text=True, check=True)
    applied, count = out.stdout.split()
    return applied, int(count)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_freed_blocks_are_reused_warm():
    applied, kept = faults("keep")
    _, default = faults("default")
    pages = sum(range(1, 25)) << 20 >> 12
    assert applied == "True"
    assert default > pages * 0.9  # every page of every block faulted
    assert kept < pages * 0.2, (kept, default)  # about the biggest block's pages: 24 of 300 MiB


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_the_first_blocks_come_from_pages_touched_at_start():
    applied, kept = faults("keep", WORKING_SET)
    _, default = faults("default", WORKING_SET)
    pages = 96 << 20 >> 12
    assert applied == "True"
    assert default > pages * 0.9, default  # every page of every block faulted
    assert kept < pages * 0.1, (kept, default)  # the heap touched at start held them all


async def test_the_heap_is_touched_after_ready_in_slices_between_which_requests_run():
    """touch_heap yields after each slice: a request arriving meanwhile waits for one slice, not the whole touch."""
    import trio

    from rocket import limits
    from rocket.node import touch_heap

    slices = 8
    served_during: list[bool] = []
    async with trio.open_nursery() as nursery:
        done = trio.Event()

        async def touch() -> None:
            await touch_heap(slices * limits.malloc_pretouch_slice_bytes)
            done.set()

        nursery.start_soon(touch)
        while not done.is_set():
            served_during.append(True)
            await trio.sleep(0)
    assert len(served_during) >= slices // 2


# Rounds, as a node's round loop makes them: a few thousand container objects alive together, then freed.
ROUNDS = """
import gc, sys
from rocket.node import tune_collector
if sys.argv[1] == "tuned":
    tune_collector()
collections = [0, 0, 0]
gc.callbacks.append(lambda phase, info: phase == "stop" and collections.__setitem__(
    info["generation"], collections[info["generation"]] + 1))
for _ in range(300):
    round_objects = [{"entry": (index, [index])} for index in range(2000)]
    del round_objects
print(*collections)
"""


def test_a_tuned_collector_leaves_the_objects_of_rounds_to_their_counts():
    """tune_collector (rocket run): the objects of a round are freed by their reference counts, with no collection
    looking at them; CPython's default collects them young several times a round, and older, ever more of them."""
    def collections(mode: str) -> list[int]:
        out = subprocess.run([sys.executable, "-c", ROUNDS, mode], capture_output=True, text=True, check=True)
        return [int(count) for count in out.stdout.split()]

    assert collections("tuned") == [0, 0, 0]
    young, middle, full = collections("default")
    assert young > 300 and middle > 30, (young, middle, full)
