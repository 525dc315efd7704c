"""A storage node's saved assignment (roles/storage/assignment.py) reads back as written, and a damaged, foreign or
missing file is refused or absent, never half used."""

from __future__ import annotations

from rocket.roles.storage import assignment as stored_assignment

ASSIGNMENT = {"version": 7, "unchanged": False, "nodes": [{"id": 2, "address": "127.0.0.1:9002"}],
              "groups": [{"id": 1, "voters": [1, 2, 3], "learners": [], "mode": "raft"}]}


def test_saved_assignment_reads_back(tmp_path):
    """What save writes, load returns; a second save replaces it whole and leaves no temporary behind."""
    stored_assignment.save(tmp_path, 1, ASSIGNMENT)
    assert stored_assignment.load(tmp_path, 1) == ASSIGNMENT
    newer = {**ASSIGNMENT, "version": 9, "groups": []}
    stored_assignment.save(tmp_path, 1, newer)
    assert stored_assignment.load(tmp_path, 1) == newer
    assert sorted(path.name for path in tmp_path.iterdir()) == [stored_assignment.FILE_NAME]


def test_damaged_or_foreign_files_are_not_used(tmp_path):
    """A flipped byte fails the checksum; another node's file, or none, gives no assignment."""
    assert stored_assignment.load(tmp_path, 1) is None
    stored_assignment.save(tmp_path, 1, ASSIGNMENT)
    assert stored_assignment.load(tmp_path, 2) is None
    path = tmp_path / stored_assignment.FILE_NAME
    data = bytearray(path.read_bytes())
    data[-5] ^= 0x01
    path.write_bytes(bytes(data))
    assert stored_assignment.load(tmp_path, 1) is None
    path.write_bytes(b"not a checksum at all")
    assert stored_assignment.load(tmp_path, 1) is None
