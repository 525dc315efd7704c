"""Snapshot files (rocket/raft/snapshots.py): the chunks come back as written; a flipped byte, a truncated file and a
wrong total are refused with CORRUPT_DATA; a download checks each frame as it completes, in pieces of any size, and
resumes from its partial file's length; a node serves ranges of its own snapshot files and nothing else."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rocket import limits
from rocket.errors import Code, RocketError
from rocket.raft import snapshots
from rocket.raft.core import Snapshot
from rocket.raft.snapshots import FOOTER, Descriptor, Download, SnapshotFiles, read_file, write_file

CHUNKS = [b"first chunk", b"", bytes(range(256)) * 40, b"last"]


def written(directory: Path, chunks: list[bytes] = CHUNKS) -> tuple[Path, Descriptor]:
    path = directory / "g1-i5-t2.snap"
    return path, write_file(path, chunks)


def refused(chunks_of) -> RocketError:
    with pytest.raises(RocketError) as caught:
        list(chunks_of())
    assert caught.value.code == Code.CORRUPT_DATA
    return caught.value


def damaged(path: Path, at: int, value: bytes | None = None) -> None:
    """Flip the byte at `at` (negative: from the end), or write value there."""
    data = bytearray(path.read_bytes())
    if value is None:
        data[at] ^= 0x01
    else:
        data[at:at + len(value)] = value
    path.write_bytes(bytes(data))


@settings(max_examples=50, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.binary(max_size=300), max_size=8))
def test_the_chunks_come_back_as_written(tmp_path, chunks):
    """Same chunks, same boundaries, same order, none included; the descriptor tells the file's size."""
    path, descriptor = written(tmp_path, chunks)
    assert list(read_file(path, descriptor)) == chunks
    assert descriptor.size == path.stat().st_size
    assert Descriptor.decode(descriptor.encode()) == descriptor


@pytest.mark.parametrize("where", ["header", "frame head", "chunk", "footer"])
def test_a_flipped_byte_is_refused(tmp_path, where):
    """One flipped bit anywhere fails the file: at open (header, footer) or at the chunk it damages."""
    path, descriptor = written(tmp_path)
    at = {"header": 1, "frame head": snapshots.HEADER.size + 1, "chunk": snapshots.HEADER.size + 30,
          "footer": -3}[where]
    damaged(path, at)
    refused(lambda: read_file(path, descriptor))


def test_a_damaged_chunk_is_never_handed_out(tmp_path):
    """The chunks before the damage come out; the damaged one does not, CORRUPT_DATA comes instead."""
    path, descriptor = written(tmp_path)
    damaged(path, snapshots.HEADER.size + 2 * snapshots.FRAME.size + len(CHUNKS[0]) + 100)  # in the third chunk
    handed: list[bytes] = []
    refused(lambda: handed.extend(read_file(path, descriptor)) or handed)
    assert handed == CHUNKS[:2]


def test_a_truncated_file_is_refused(tmp_path):
    path, descriptor = written(tmp_path)
    data = path.read_bytes()
    for length in (0, 5, len(data) // 2, len(data) - 1):
        path.write_bytes(data[:length])
        assert "bytes, not" in refused(lambda: read_file(path, descriptor)).message
    path.unlink()
    assert "missing" in refused(lambda: read_file(path, descriptor)).message


def test_a_wrong_total_or_checksum_is_refused(tmp_path):
    """The footer's size and checksum must match the descriptor's and the bytes'."""
    path, descriptor = written(tmp_path)
    refused(lambda: read_file(path, Descriptor(descriptor.size, descriptor.checksum ^ 1)))
    refused(lambda: read_file(path, Descriptor(descriptor.size + 1, descriptor.checksum)))
    size_at = -FOOTER.size + 12  # the footer's file bytes, after its mark and chunk count
    damaged(path, size_at, struct.pack("<Q", descriptor.size + 8))
    refused(lambda: read_file(path, descriptor))


def test_a_wrong_chunk_count_is_refused(tmp_path):
    path, descriptor = written(tmp_path)
    damaged(path, -FOOTER.size + 4, struct.pack("<Q", len(CHUNKS) - 1))
    refused(lambda: read_file(path, descriptor))


def test_a_descriptor_that_is_not_one_is_refused():
    with pytest.raises(RocketError) as caught:
        Descriptor.decode(b"inline state of a snapshot")
    assert caught.value.code == Code.CORRUPT_DATA


@settings(max_examples=100, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.binary(max_size=200), max_size=6), st.data())
def test_a_download_in_pieces_of_any_size_is_the_file(tmp_path, chunks, data):
    """A file fetched in ranges that cut frames anywhere is checked and renamed into place, byte for byte."""
    source, descriptor = written(tmp_path, chunks)
    target = tmp_path / "fetched.snap"
    content = source.read_bytes()
    for leftover in (target, target.with_name(target.name + snapshots.PARTIAL_SUFFIX)):
        leftover.unlink(missing_ok=True)  # hypothesis runs its examples in one directory
    download = Download(target, descriptor)
    while not download.done:
        size = data.draw(st.integers(1, 64))
        download.append(content[download.offset:download.offset + size])
    download.finish()
    assert target.read_bytes() == content and not download.partial.exists()
    assert list(read_file(target, descriptor)) == chunks


def test_a_download_resumes_from_its_partial_file(tmp_path):
    """A fetch that stopped mid-frame leaves a partial file; the next one resumes at its length, and the frames
    already there are not fetched again."""
    source, descriptor = written(tmp_path)
    content = source.read_bytes()
    target = tmp_path / "fetched.snap"
    first = Download(target, descriptor)
    stop = len(content) // 2 + 3  # inside the third chunk
    first.append(content[:1000])
    first.append(content[1000:stop])
    first.close()  # the connection dropped
    assert first.partial.stat().st_size == stop
    resumed = Download(target, descriptor)
    assert resumed.offset == stop
    resumed.append(content[stop:])
    resumed.finish()
    assert target.read_bytes() == content


def third_frame() -> int:
    """Where the third frame of a file of CHUNKS starts."""
    return snapshots.HEADER.size + sum(snapshots.FRAME.size + len(chunk) for chunk in CHUNKS[:2])


def test_a_partial_file_with_a_damaged_frame_resumes_before_it(tmp_path):
    """Damage in what an earlier fetch left is cut off: the fetch resumes where the damaged frame starts."""
    source, descriptor = written(tmp_path)
    content = source.read_bytes()
    target = tmp_path / "fetched.snap"
    third = third_frame()
    partial = target.with_name(target.name + snapshots.PARTIAL_SUFFIX)
    partial.write_bytes(content[:third + 100] + b"\xff" + content[third + 101:len(content) - 10])
    download = Download(target, descriptor)
    assert download.offset == third and partial.stat().st_size == third
    download.append(content[third:])
    download.finish()
    assert target.read_bytes() == content


def test_a_piece_that_fails_its_frame_is_cut_off_and_fetched_again(tmp_path):
    """The bytes that complete a damaged frame are refused; the partial file goes back to the frame's start, and
    the right bytes from there complete the file."""
    source, descriptor = written(tmp_path)
    content = source.read_bytes()
    target = tmp_path / "fetched.snap"
    download = Download(target, descriptor)
    third = third_frame()
    download.append(content[:third + 50])
    bad = bytearray(content[third + 50:])
    bad[100] ^= 0x80
    with pytest.raises(RocketError) as caught:
        download.append(bytes(bad))
    assert caught.value.code == Code.CORRUPT_DATA and "chunk 2" in caught.value.message
    assert download.offset == third == download.partial.stat().st_size and not download.done
    download.append(content[third:])
    download.finish()
    assert target.read_bytes() == content


def test_a_download_refuses_bytes_the_descriptor_does_not_cover(tmp_path):
    """More bytes than the descriptor's size, a wrong checksum, or an early end never become a snapshot."""
    source, descriptor = written(tmp_path)
    content = source.read_bytes()
    for wrong, piece in ((descriptor, content + b"x"), (Descriptor(descriptor.size, descriptor.checksum ^ 1), content),
                         (descriptor, b"")):
        target = tmp_path / "fetched.snap"
        download = Download(target, wrong)
        with pytest.raises(RocketError) as caught:
            download.append(piece)
        assert caught.value.code == Code.CORRUPT_DATA and not download.done
        download.close()
        download.partial.unlink()


def test_a_node_serves_ranges_of_its_own_snapshot_files_only(tmp_path, monkeypatch):
    """Ranges of at most limits.snapshot_chunk_bytes_max, none at the end; a name that is not a snapshot file of
    the group asked for is BAD_REQUEST (no path leaves the directory), a missing one NOT_FOUND."""
    monkeypatch.setattr(limits, "snapshot_chunk_bytes_max", 1000)
    files = SnapshotFiles(tmp_path / "snapshots")
    data = files.write(3, 40, 2, CHUNKS)
    snapshot = Snapshot(40, 2, (1, 2, 3), (), data)
    name = snapshots.name_of(3, snapshot)
    assert files.has(3, snapshot) and list(files.chunks(3, snapshot)) == CHUNKS
    content = (files.directory / name).read_bytes()
    pieces = [files.read(3, name, offset) for offset in range(0, len(content), 1000)]
    assert b"".join(pieces) == content and max(map(len, pieces)) == 1000
    assert files.read(3, name, len(content)) == b""
    (tmp_path / "secret.snap").write_bytes(b"x")
    for group, hostile, code in ((3, "../secret.snap", Code.BAD_REQUEST), (4, name, Code.BAD_REQUEST),
                                 (3, name + ".part", Code.BAD_REQUEST), (3, "g3-i1-t1-00000000.snap", Code.NOT_FOUND)):
        with pytest.raises(RocketError) as caught:
            files.read(group, hostile, 0)
        assert caught.value.code == code, hostile
    with pytest.raises(RocketError) as caught:
        files.read(3, name, len(content) + 1)
    assert caught.value.code == Code.BAD_REQUEST


def test_only_the_files_the_wal_refers_to_are_kept(tmp_path):
    """At a start, what a crash left (half-written, partial, unreferenced) goes."""
    files = SnapshotFiles(tmp_path)
    snapshot = Snapshot(9, 1, (1,), (), files.write(1, 9, 1, [b"kept"]))
    kept = snapshots.name_of(1, snapshot)
    files.write(1, 5, 1, [b"old"])
    for leftover in ("g1-i12-t1.tmp", "g2-i3-t1-0000abcd.snap.part"):
        (tmp_path / leftover).write_bytes(b"?")
    files.keep_only({kept})
    assert [path.name for path in tmp_path.iterdir()] == [kept] and files.has(1, snapshot)


def test_a_durable_snapshot_deletes_its_groups_older_files_only(tmp_path):
    """Once a group's snapshot at an index is durable, the group's files from before it go; its own, newer ones,
    partial ones and other groups' (g1 is no prefix of g12's) stay."""
    files = SnapshotFiles(tmp_path)
    for group, index in ((1, 5), (1, 7), (1, 9), (1, 12), (12, 3), (2, 1)):
        files.write(group, index, 1, [b"state"])
    (tmp_path / "g1-i3-t1-0000abcd.snap.part").write_bytes(b"?")
    files.delete_older(1, 9)
    left = sorted(path.name.split("-t")[0] for path in tmp_path.iterdir())
    assert left == ["g1-i12", "g1-i3", "g1-i9", "g12-i3", "g2-i1"]


def test_a_file_a_replica_is_fetching_outlives_the_next_snapshot_for_a_while(tmp_path):
    """A leader that compacts again while a replica fetches its last file keeps that file (the replica would start
    over with the new one, which a fast writer outdates in turn); once nobody read it for a while, it goes."""
    now = [100.0]
    files = SnapshotFiles(tmp_path, clock=lambda: now[0])
    old = snapshots.name_of(2, Snapshot(5, 1, (1,), (), files.write(2, 5, 1, [b"state"] * 3)))
    files.write(2, 9, 1, [b"newer"])
    assert files.read(2, old, 0)
    now[0] += limits.snapshot_served_keep_s / 2
    files.delete_older(2, 9)
    assert (tmp_path / old).exists()
    assert files.read(2, old, 0)  # the fetch goes on
    now[0] += limits.snapshot_served_keep_s + 1
    files.delete_older(2, 9)
    assert not (tmp_path / old).exists()
