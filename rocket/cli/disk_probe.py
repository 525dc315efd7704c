"""The raw durable write bandwidth of a directory's disk (1 MiB writes + fdatasync), which `rocket bench` and
benchmarks/ report rocket against, measured in the same run.
"""

from __future__ import annotations

import errno
import mmap
import os
import tempfile
import time
from pathlib import Path

from rocket import limits
from rocket.client.bench import percentile


def raw_disk_bandwidth(directory: Path, total_bytes: int = 256 * limits.MiB, seconds_max: float = 20.0,
                       direct: bool = False) -> dict:
    """Write 1 MiB blocks with fdatasync after each, as a durable log would; MB/s and fsync latency.
    Give it as many bytes as the workload writes: on thin-provisioned virtual disks the first write to a
    region costs far more than a rewrite, and a short probe only measures the rewrite. direct: with O_DIRECT
    from one page-aligned buffer, past the page cache, as a direct WAL writes (Linux only)."""
    directory.mkdir(parents=True, exist_ok=True)
    block = mmap.mmap(-1, limits.MiB)  # page-aligned, as O_DIRECT needs
    block.write(os.urandom(limits.MiB))
    written = 0
    latencies = []
    with tempfile.NamedTemporaryFile(dir=directory, prefix="rocket-disk-probe-") as probe:
        descriptor = os.open(probe.name, os.O_WRONLY | (os.O_DIRECT if direct else 0))
        try:
            started = time.perf_counter()
            while written < total_bytes and time.perf_counter() - started < seconds_max:
                before = time.perf_counter()
                os.pwrite(descriptor, block, written)
                os.fdatasync(descriptor)
                latencies.append(time.perf_counter() - before)
                written += len(block)
            elapsed = time.perf_counter() - started
        finally:
            os.close(descriptor)
    return {"bytes": written, "seconds": elapsed, "mb_per_s": written / elapsed / 1e6,
            "fdatasync_ms_p50": percentile(latencies, 50) * 1000}


def raw_disk_bandwidth_direct(directory: Path, total_bytes: int = 256 * limits.MiB,
                              seconds_max: float = 20.0) -> dict | None:
    """raw_disk_bandwidth with O_DIRECT, or None where the file system refuses O_DIRECT (tmpfs before Linux 6.6)."""
    try:
        return raw_disk_bandwidth(directory, total_bytes, seconds_max, direct=True)
    except OSError as error:
        if error.errno != errno.EINVAL:
            raise
        return None
