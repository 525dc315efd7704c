"""The commit log at open, as a crash or damage leaves it: a torn tail is cut back to the last good record, an empty
newest segment after a roll is dropped, and damage before good records, or a sealed segment of the wrong size, is
refused with CORRUPT_DATA naming the file. The WAL is one of these logs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rocket import limits
from rocket.disk.commitlog import CommitLog
from rocket.errors import Code, RocketError

SEGMENT = limits.segment_bytes_min
RECORD = 1000  # body bytes: some 1,000 records fill a segment


def write(directory: Path, count: int, first: int = 0) -> list[int]:
    """Append records whose bodies say their number, one per call as an apply writes; returns their positions."""
    log = CommitLog.open(directory, SEGMENT)
    positions = [log.append([(1, b"%08d" % n + bytes(RECORD - 8))])[0] for n in range(first, first + count)]
    log.close()
    return positions


def numbers(log: CommitLog) -> list[int]:
    return [int(body[:8]) for _, _, body in log.scan(log.start_position)]


def segments(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.log"))


@pytest.mark.parametrize("damage", ["cut", "garbage", "zeros"])
def test_a_torn_tail_is_cut_back_to_the_last_good_record(tmp_path, damage):
    """A tail torn mid-record, or followed by junk (garbage, or the zeros a file system leaves), is cut to the last
    good record, and appends go on from there."""
    write(tmp_path, 1500)
    segment = segments(tmp_path)[-1]
    size = segment.stat().st_size
    with open(segment, "r+b") as file:
        if damage == "cut":
            file.truncate(size - 37)  # the last record loses its end
        else:
            file.seek(size)
            file.write(os.urandom(5000) if damage == "garbage" else bytes(5000))
    log = CommitLog.open(tmp_path, SEGMENT)
    assert numbers(log) == list(range(1499 if damage == "cut" else 1500))
    log.close()
    write(tmp_path, 1, first=7777)
    log = CommitLog.open(tmp_path, SEGMENT)
    assert numbers(log)[-2:] == [1498 if damage == "cut" else 1499, 7777]
    log.close()


def test_damage_before_good_records_is_reported(tmp_path):
    """A flipped byte in the middle of the last segment refuses to open, naming the file."""
    write(tmp_path, 1500)
    segment = segments(tmp_path)[-1]
    with open(segment, "r+b") as file:
        file.seek(segment.stat().st_size // 2)
        byte = file.read(1)
        file.seek(-1, os.SEEK_CUR)
        file.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(RocketError) as caught:
        CommitLog.open(tmp_path, SEGMENT)
    assert caught.value.code == Code.CORRUPT_DATA
    assert segment.name in caught.value.message and "valid records after it" in caught.value.message


def test_damage_in_a_sealed_segment_fails_the_read_that_reaches_it(tmp_path):
    """Damage in a sealed segment is found by the record's checksum when it is read, never returned as data."""
    positions = write(tmp_path, 1500)
    first = segments(tmp_path)[0]
    with open(first, "r+b") as file:
        file.seek(positions[10] + 100)
        file.write(b"\xde\xad\xbe\xef")
    log = CommitLog.open(tmp_path, SEGMENT)
    assert int(log.read(positions[9])[1][:8]) == 9
    with pytest.raises(RocketError) as caught:
        list(log.scan(0))
    assert caught.value.code == Code.CORRUPT_DATA and first.name in caught.value.message
    log.close()


def test_an_empty_newest_segment_after_a_roll_is_dropped(tmp_path):
    """A crash right after a roll leaves an empty segment: it is removed and appends continue at the end."""
    write(tmp_path, 1500)
    before = segments(tmp_path)
    end = int(before[-1].name[:-4]) + before[-1].stat().st_size
    (tmp_path / f"{end:020d}.log").touch()
    log = CommitLog.open(tmp_path, SEGMENT)
    assert log.end_position == end and segments(tmp_path) == before
    log.close()


def test_a_sealed_segment_of_the_wrong_size_is_reported(tmp_path):
    """Bytes missing from the end of a sealed segment are damage, not a tail to cut."""
    write(tmp_path, 1500)
    first = segments(tmp_path)[0]
    with open(first, "r+b") as file:
        file.truncate(first.stat().st_size - 10)
    with pytest.raises(RocketError) as caught:
        CommitLog.open(tmp_path, SEGMENT)
    assert caught.value.code == Code.CORRUPT_DATA and first.name in caught.value.message
