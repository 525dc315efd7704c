"""Why the raw-disk probe swings: on a VM whose balloon reports free pages to the host, a page-cache page
that was free for a while costs a host fault when a write first touches it. This measures, in one run,
1 MiB writes + fdatasync five ways, with the time in write() and in fdatasync() apart:

- buffered, cold, pipelined: appending to a new file after the pages freed before have had time to be reported
  (--settle-s), each write overlapping the fdatasync of the write before it (in another thread), as a log with
  group commit does: the most any buffered log can write durably onto fresh pages;
- buffered, cold: the same after another wait, each write followed by its fdatasync;
- buffered, warm: the same at once after deleting that file, so that its freed pages are reused;
- buffered, overwrite: that file written again from its start, its blocks allocated and its pages cached, as a log
  that wrote its segments full ahead (PostgreSQL's wal_init_zero) or reused old ones (wal_recycle) would write;
- direct: O_DIRECT from one aligned buffer, which allocates no page-cache page at all;

and reading that file back in 1 MiB preads, its pages dropped first: cold (after another wait), and recycled (each
MiB's pages dropped once read, so that the next reads reuse them).

    python benchmarks/disk_modes.py [--dir DIR] [--mib 512] [--rounds 2] [--settle-s 5]    # results/disk-modes.json
"""

from __future__ import annotations

import argparse
import concurrent.futures
import errno
import json
import mmap
import os
import time
from pathlib import Path

MiB = 1 << 20
REPORTING_WAIT_S = 5.0  # Linux reports free pages to the host about 2 s after they are freed


def write_and_sync(path: Path, mib: int, direct: bool, pipelined: bool = False, overwrite: bool = False) -> dict:
    """Serial: each 1 MiB write, then its fdatasync. Pipelined: write N+1 while N's fdatasync runs, then wait
    for it and start N+1's; the time given to fdatasync is then only what the writer waited for it. Overwrite:
    into the file as it is, not a new one."""
    block = mmap.mmap(-1, MiB)  # page-aligned, as O_DIRECT needs, and the same buffer every time
    block.write(os.urandom(MiB))
    flags = os.O_WRONLY | (0 if overwrite else os.O_CREAT | os.O_TRUNC) | (os.O_DIRECT if direct else 0)
    descriptor = os.open(path, flags, 0o644)
    writing = syncing = 0.0
    syncer = concurrent.futures.ThreadPoolExecutor(1)
    pending = None
    try:
        for index in range(mib):
            before = time.perf_counter()
            os.pwrite(descriptor, block, index * MiB)
            written = time.perf_counter()
            if pipelined:
                if pending is not None:
                    pending.result()
                pending = syncer.submit(os.fdatasync, descriptor)
            else:
                os.fdatasync(descriptor)
            writing += written - before
            syncing += time.perf_counter() - written
        if pending is not None:
            before = time.perf_counter()
            pending.result()
            syncing += time.perf_counter() - before
    finally:
        syncer.shutdown()
        os.close(descriptor)
    return {"mb_per_s": round(mib * MiB / (writing + syncing) / 1e6, 1),
            "write_ms_per_mib": round(writing / mib * 1000, 3), "fdatasync_ms_per_mib": round(syncing / mib * 1000, 3)}


def read_back(path: Path, mib: int, recycle: bool, settle_s: float) -> dict:
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(descriptor, 0, 0, os.POSIX_FADV_DONTNEED)
        if not recycle:
            time.sleep(settle_s)
        started = time.perf_counter()
        for index in range(mib):
            os.pread(descriptor, MiB, index * MiB)
            if recycle:
                os.posix_fadvise(descriptor, index * MiB, MiB, os.POSIX_FADV_DONTNEED)
        seconds = time.perf_counter() - started
    finally:
        os.close(descriptor)
    return {"mb_per_s": round(mib * MiB / seconds / 1e6, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default=".", help="a directory on the disk under test")
    parser.add_argument("--mib", type=int, default=512, help="MiB written by each measurement")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--settle-s", type=float, default=REPORTING_WAIT_S,
                        help="idle time before each cold measurement, for the freed pages to be reported")
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "disk-modes.json"))
    arguments = parser.parse_args()
    directory = Path(arguments.dir)
    runs = []
    for number in range(1, arguments.rounds + 1):
        modes = (("buffered, cold, pipelined", False, True), ("buffered, cold", False, False),
                 ("buffered, warm", False, False), ("direct", True, False))
        for index, (mode, direct, pipelined) in enumerate(modes):
            if "cold" in mode:
                time.sleep(arguments.settle_s)
            path = directory / f"rocket-disk-modes-{index}"
            try:
                measured = write_and_sync(path, arguments.mib, direct, pipelined)
            except OSError as error:
                if not direct or error.errno != errno.EINVAL:
                    raise
                print(f"{mode}: left out, the file system at {directory} refuses O_DIRECT", flush=True)
                continue
            runs.append({"round": number, "mode": mode, **measured})
            print(json.dumps(runs[-1]), flush=True)
            if mode == "buffered, warm":
                runs.append({"round": number, "mode": "buffered, overwrite",
                             **write_and_sync(path, arguments.mib, direct=False, overwrite=True)})
                print(json.dumps(runs[-1]), flush=True)
            if direct:  # the last file written: read it back
                for read_mode, recycle in (("read, cold", False), ("read, recycled", True)):
                    runs.append({"round": number, "mode": read_mode,
                                 **read_back(path, arguments.mib, recycle, arguments.settle_s)})
                    print(json.dumps(runs[-1]), flush=True)
            path.unlink()  # frees its pages: the next mode's writes reuse them at once
    report = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "mib_per_measurement": arguments.mib,
              "runs": runs}
    Path(arguments.out).write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
