"""What a node takes from the machine beside time (clock.py): the data disk's free space, worker threads and
randomness. node.py gives the roles and the Raft host the machine's own (WORLD); the roles simulator one of its own
making (tests/sim/roles_sim.py), so that a seed replays exactly."""

from __future__ import annotations

import os
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import trio

T = TypeVar("T")

__all__ = ["WORLD", "World"]


class World:
    """The machine: free space from statvfs, blocking work in trio's worker threads, randomness from the OS."""

    def __init__(self, randomness: random.Random | None = None):
        self.random = randomness or random.SystemRandom()

    def free_bytes(self, directory: Path) -> int:
        """Bytes an unprivileged writer may still put on the file system that holds directory."""
        status = os.statvfs(directory)
        return status.f_bavail * status.f_frsize

    async def run_sync(self, function: Callable[..., T], *args: Any) -> T:
        """Run blocking work without blocking the event loop; its result, or its error raised."""
        return await trio.to_thread.run_sync(function, *args)

    def start_thread_soon(self, work: Callable[[], T], deliver: Callable[[Any], object]) -> None:
        """Run work in a thread started at once; deliver(its outcome.Outcome) runs in that thread once it returned."""
        trio.lowlevel.start_thread_soon(work, deliver)


WORLD = World()
