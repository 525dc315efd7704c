"""The telemetry spool: samples appended as Avro blocks to one open file in a directory, closed into files named
<first_time_ms>-<last_time_ms>-<records>.avro for the shipper, the oldest dropped (and counted) beyond a byte bound.
Best effort (flushed, never fsynced); a crash loses at most the open file's torn tail. Safe to call from threads.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import cast

import fastavro

from rocket.limits.tier import telemetry_file_age_s, telemetry_file_bytes_max, telemetry_spool_bytes_max
from rocket.serde.schema import avro_schema

log = logging.getLogger("rocket.telemetry")

SCHEMA_NAME = "rocket.v1.TelemetrySample"
METADATA = {"rocket.telemetry.schema": SCHEMA_NAME}
CODEC = "deflate"
OPEN_NAME = "open.avro.part"  # the file appends go to; never shipped, never dropped
TEMPORARY_SUFFIX = ".tmp"  # a recovered file being rewritten; a crash may leave one, deleted on open
# fastavro's sync_interval: an append's records are encoded as one block, so a torn tail loses one append only.
BLOCK_BYTES_MAX = 1 << 30
TIME_MS_DIGITS = 13  # ms since 1970 fit 13 digits until the year 2286: zero-padded names sort by time
_CLOSED_NAME = re.compile(r"(\d{13})-(\d{13})-(\d+)(?:-(\d+))?\.avro")


def closed_name(first_time_ms: int, last_time_ms: int, records: int, duplicate: int = 0) -> str:
    """The name of a closed file; duplicate > 0 only when another file already has the same times and count."""
    assert 0 <= first_time_ms <= last_time_ms < 10**TIME_MS_DIGITS, (first_time_ms, last_time_ms)
    suffix = f"-{duplicate}" if duplicate else ""
    return f"{first_time_ms:013d}-{last_time_ms:013d}-{records}{suffix}.avro"


def parse_closed_name(name: str) -> tuple[int, int, int, int] | None:
    """(first_time_ms, last_time_ms, records, duplicate) of a closed file's name, or None for any other name."""
    match = _CLOSED_NAME.fullmatch(name)
    if match is None:
        return None
    first, last, records, duplicate = match.groups()
    return int(first), int(last), int(records), int(duplicate or 0)


class Spool:
    """A bounded spool of Avro container files of TelemetrySample records in one directory (the node's is
    data_dir/telemetry), the open file rotated by age and size (file_age_s, file_bytes_max).

    The closed files plus the open one never stay above spool_bytes_max: each append drops the oldest closed
    files (dropped_files, dropped_records) until they fit. torn_files and unreadable_files count what recovery
    on open found damaged; the records lost in them are unknown."""

    def __init__(self, directory: Path, *, file_age_s: float = telemetry_file_age_s,
                 file_bytes_max: int = telemetry_file_bytes_max, spool_bytes_max: int = telemetry_spool_bytes_max,
                 clock: Callable[[], float] = time.time):
        assert file_age_s > 0 and 0 < file_bytes_max <= spool_bytes_max, (file_age_s, file_bytes_max, spool_bytes_max)
        self.directory = Path(directory)
        self.open_path = self.directory / OPEN_NAME
        self.file_age_s = file_age_s
        self.file_bytes_max = file_bytes_max
        self.spool_bytes_max = spool_bytes_max
        self._clock = clock
        self._schema = avro_schema("TelemetrySample")
        self._lock = threading.Lock()
        self._closed: dict[str, int] = {}  # name -> bytes
        self._reset_open()
        self._open_damaged = False  # a failed append may have left a partial block: recover before the next
        self.dropped_files = 0
        self.dropped_records = 0
        self.torn_files = 0
        self.unreadable_files = 0
        self.directory.mkdir(parents=True, exist_ok=True)
        with self._lock:
            self._scan()
            self._recover_open()
            self._enforce_bound()

    # The interface.

    def append(self, records: list[dict]) -> None:
        """Write records as one block to the open file, rotate it if due, then drop the oldest closed files
        beyond the bound. Blocking file I/O. OSError (disk full, EIO) reaches the caller; nothing is half-written."""
        if not records:
            return
        for record in records:
            time_ms = record.get("time_ms")
            if not isinstance(time_ms, int) or not 0 <= time_ms < 10**TIME_MS_DIGITS:
                raise ValueError(f"a telemetry sample's time_ms must be ms since 1970, not {time_ms!r}")
        with self._lock:
            if self._open_damaged:
                self._recover_open()
            if self._rotation_due():
                self._close_open()
            self._write(records)
            if self._rotation_due():
                self._close_open()
            self._enforce_bound()

    def rotate(self) -> None:
        """Close the open file now, if there is one, so that the shipper can take everything."""
        with self._lock:
            if self._open_damaged:
                self._recover_open()
            self._close_open()

    def closed(self) -> list[Path]:
        """The closed files, oldest first."""
        with self._lock:
            return [self.directory / name for name in self._closed_oldest_first()]

    def discard(self, path: Path) -> bool:
        """Delete a closed file once shipped; False when the bound dropped it meanwhile (or it is not ours)."""
        with self._lock:
            name = Path(path).name
            if name not in self._closed:
                return False
            (self.directory / name).unlink(missing_ok=True)
            del self._closed[name]
            return True

    @property
    def bytes(self) -> int:
        """The spool's size: its closed files and its open file."""
        with self._lock:
            return self._bytes()

    # The open file.

    def _reset_open(self) -> None:
        self._opened_at: float | None = None  # None: no open file
        self._open_bytes = 0
        self._open_records = 0
        self._open_first_time_ms = 0
        self._open_last_time_ms = 0

    def _rotation_due(self) -> bool:
        if self._opened_at is None:
            return False
        return self._clock() - self._opened_at >= self.file_age_s or self._open_bytes >= self.file_bytes_max

    def _write(self, records: list[dict]) -> None:
        starting = self._opened_at is None
        bytes_before = self._open_bytes
        try:
            # "a+b" makes fastavro read the existing header and append a block under its sync marker.
            with open(self.open_path, "w+b" if starting else "a+b") as file:
                fastavro.writer(file, self._schema, records, codec=CODEC, metadata=METADATA,
                                sync_interval=BLOCK_BYTES_MAX, validator=True)
                file.flush()
                size = os.fstat(file.fileno()).st_size
        except BaseException:
            self._undo_write(starting, bytes_before)
            raise
        times_ms = [record["time_ms"] for record in records]
        if starting:
            self._opened_at = self._clock()
            self._open_first_time_ms = min(times_ms)
            self._open_last_time_ms = max(times_ms)
        else:
            self._open_first_time_ms = min(self._open_first_time_ms, *times_ms)
            self._open_last_time_ms = max(self._open_last_time_ms, *times_ms)
        self._open_bytes = size
        self._open_records += len(records)

    def _undo_write(self, starting: bool, bytes_before: int) -> None:
        """Cut what a failed append wrote, so that later blocks follow complete ones."""
        try:
            if starting:
                self.open_path.unlink(missing_ok=True)
            else:
                os.truncate(self.open_path, bytes_before)
        except OSError as error:
            log.warning("telemetry spool: cannot cut a failed append from %s (%s); recovering it next", self.open_path, error)
            self._open_damaged = True

    def _close_open(self) -> None:
        if self._opened_at is None:
            return
        name = self._free_name(self._open_first_time_ms, self._open_last_time_ms, self._open_records)
        os.rename(self.open_path, self.directory / name)
        self._closed[name] = self._open_bytes
        self._reset_open()

    def _free_name(self, first_time_ms: int, last_time_ms: int, records: int) -> str:
        # Only a clock stepped back can repeat times and count; a suffix keeps both files.
        for duplicate in range(len(self._closed) + 1):
            name = closed_name(first_time_ms, last_time_ms, records, duplicate)
            if name not in self._closed and not (self.directory / name).exists():
                return name
        raise AssertionError("one of len(closed) + 1 names is free")

    # Recovery and the bound.

    def _scan(self) -> None:
        for path in self.directory.iterdir():
            if path.name.endswith(TEMPORARY_SUFFIX):
                path.unlink(missing_ok=True)
            elif parse_closed_name(path.name) is not None and path.is_file():
                self._closed[path.name] = path.stat().st_size

    def _recover_open(self) -> None:
        """Close an open file left by a crash (or a failed append) with its complete blocks; delete what can't be read."""
        self._reset_open()
        self._open_damaged = False
        if not self.open_path.exists():
            return
        try:
            records, complete = _complete_records(self.open_path)
        except (ValueError, OSError) as error:
            log.warning("telemetry spool: deleting %s, which cannot be read: %s", self.open_path, error)
            self.unreadable_files += 1
            self._delete_quietly(self.open_path)
            return
        if not complete:
            log.warning("telemetry spool: %s has a torn tail; keeping its %d complete records", self.open_path, len(records))
            self.torn_files += 1
        if not records:
            self._delete_quietly(self.open_path)
            return
        times_ms = [record["time_ms"] for record in records]
        name = self._free_name(min(times_ms), max(times_ms), len(records))
        target = self.directory / name
        try:
            if complete:
                os.rename(self.open_path, target)
            else:
                self._rewrite(records, target)
            self._closed[name] = target.stat().st_size
        except OSError as error:
            log.warning("telemetry spool: deleting %s, which cannot be closed: %s", self.open_path, error)
            self.unreadable_files += 1
            self._delete_quietly(self.open_path)

    def _rewrite(self, records: list[dict], target: Path) -> None:
        temporary = target.with_name(target.name + TEMPORARY_SUFFIX)
        try:
            with open(temporary, "wb") as file:
                fastavro.writer(file, self._schema, records, codec=CODEC, metadata=METADATA)
            os.rename(temporary, target)
        except BaseException:
            self._delete_quietly(temporary)
            raise
        self.open_path.unlink()

    @staticmethod
    def _delete_quietly(path: Path) -> None:
        try:
            path.unlink(missing_ok=True)
        except OSError as error:
            log.warning("telemetry spool: cannot delete %s: %s", path, error)

    def _bytes(self) -> int:
        return sum(self._closed.values()) + self._open_bytes

    def _closed_oldest_first(self) -> list[str]:
        return sorted(self._closed, key=lambda name: (parse_closed_name(name), name))

    def _enforce_bound(self) -> None:
        dropped_files = dropped_records = 0
        # Each turn drops a file or closes the open one, so the loop ends.
        for _ in range(len(self._closed) + 2):
            if self._bytes() <= self.spool_bytes_max:
                break
            if not self._closed:
                self._close_open()  # one append alone passed the bound: the open file goes too
                continue
            name = self._closed_oldest_first()[0]
            (self.directory / name).unlink(missing_ok=True)
            del self._closed[name]
            dropped_files += 1
            dropped_records += cast("tuple[int, int, int, int]", parse_closed_name(name))[2]  # a closed file's name
        assert self._bytes() <= self.spool_bytes_max, (self._bytes(), self.spool_bytes_max)
        if dropped_files:
            self.dropped_files += dropped_files
            self.dropped_records += dropped_records
            log.warning("telemetry spool over %d bytes: dropped the oldest %d files (%d records)",
                        self.spool_bytes_max, dropped_files, dropped_records)


def _complete_records(path: Path) -> tuple[list[dict], bool]:
    """The records of path's complete blocks, and whether that is all of it. ValueError when its header is unreadable."""
    with open(path, "rb") as file:
        try:
            blocks = fastavro.block_reader(file)
        except Exception as error:  # fastavro reports a bad header as several types
            raise ValueError(f"no Avro header: {error}") from error
        records: list[dict] = []
        try:
            for block in blocks:
                # Decoded whole: a block that fails to decode is torn. A TelemetrySample record reads as a dict.
                records.extend(cast("list[dict]", list(block)))
        except Exception:  # a torn block shows as EOFError, ValueError (no sync marker), zlib.error, ...
            return records, False
    return records, True
