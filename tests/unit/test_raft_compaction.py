"""The Raft host's Compaction part, built alone over one group: it snapshots a group whose log grew long, compacts the
log once the file is written, and drops a group's older files once a newer snapshot is durable."""

import outcome

from rocket import limits
from rocket.raft.compaction import Compaction
from rocket.raft.core import Config, HardState, RaftCore, Role
from rocket.raft.rounds import Group
from rocket.raft.snapshots import SnapshotFiles


class Machine:
    def __init__(self) -> None:
        self.applied = 0

    def snapshot(self):
        return [b"state at %d" % self.applied]


def leader_with(entries: int) -> RaftCore:
    core = RaftCore(Config(1, (1,), seed=1))
    core.campaign()
    for _ in range(entries):
        core.propose(b"x")
    while core.has_ready():
        core.advance(core.ready())
    assert core.role == Role.LEADER
    return core


def apply_more(hosted: Group, entries: int) -> None:
    for _ in range(entries):
        hosted.core.propose(b"y")
    while hosted.core.has_ready():
        hosted.core.advance(hosted.core.ready())
    hosted.applied = hosted.machine.applied = hosted.core.applied
    hosted.log_bytes += 1000 * entries  # as the host counts what it applies


def test_a_long_log_is_snapshotted_written_compacted_and_older_files_go_once_durable(tmp_path, monkeypatch):
    monkeypatch.setattr(limits, "raft_log_entries_max", 5)
    events: list[str] = []
    threads: list[str] = []

    def start_thread(work, done):  # the work runs at once, as a thread would; done's answer fails the round loop
        threads.append("started")
        assert done(outcome.capture(work)) is None

    files = SnapshotFiles(tmp_path)
    core = leader_with(0)
    hosted = Group(core, Machine(), HardState(core.term, core.vote, core.commit))
    groups = {7: hosted}
    compaction = Compaction(files, {}, groups, 0.01, start_thread, lambda: events.append("synced"),
                            lambda: events.append("woken"))
    apply_more(hosted, 3)
    compaction.maybe_compact(7, hosted)
    assert compaction.take() == [] and threads == []  # a short log stays

    apply_more(hosted, 5)
    compaction.maybe_compact(7, hosted)
    [first] = compaction.take()
    assert events == ["synced", "woken"]  # the state outside the WAL is durable before the file is written
    assert first.group == 7 and first.snapshot == core.snapshot and core.snapshot.index == hosted.applied
    assert files.has(7, core.snapshot) and core.log == []

    apply_more(hosted, 6)
    compaction.maybe_compact(7, hosted)
    [second] = compaction.take()
    assert second.snapshot.index > first.snapshot.index
    assert len(list(tmp_path.glob("g7-*"))) == 2  # the first file stays until the second is durable in the WAL
    compaction.durable(7, second.snapshot)
    assert len(list(tmp_path.glob("g7-*"))) == 1
    assert files.has(7, second.snapshot) and not files.has(7, first.snapshot)


def test_a_checkpoint_waits_for_every_groups_snapshot_and_a_failed_one_gives_its_records_back(tmp_path):
    written: list = []

    def start_thread(work, done):
        written.append((work, done))  # run later, as the worker thread would

    core = leader_with(3)
    hosted = Group(core, Machine(), HardState(core.term, core.vote, core.commit))
    hosted.applied = core.applied
    compaction = Compaction(SnapshotFiles(tmp_path), {}, {1: hosted}, 0.01, start_thread, lambda: None, lambda: None)
    assert not compaction.ready_for_checkpoint()  # every group snapshotted, its file not written yet
    assert not compaction.ready_for_checkpoint()
    [(work, done)] = written
    assert done(outcome.capture(work)) is None
    assert compaction.ready_for_checkpoint()
    records = compaction.take()
    assert len(records) == 1
    compaction.give_back(records)
    assert compaction.take() == records


def test_a_snapshot_worker_that_fails_with_a_bug_fails_the_round_loop(tmp_path):
    core = leader_with(3)
    hosted = Group(core, Machine(), HardState(core.term, core.vote, core.commit))
    hosted.applied = core.applied
    failures: list = []

    def start_thread(work, done):
        failures.append(done(outcome.capture(lambda: 1 / 0)))

    compaction = Compaction(SnapshotFiles(tmp_path), {}, {1: hosted}, 0.01, start_thread, lambda: None, lambda: None)
    compaction.compact(1, hosted)
    assert [type(error) for error in failures] == [ZeroDivisionError]
    assert compaction.take() == [] and core.snapshot.index == 0  # the log stays


def test_a_snapshot_file_the_disk_refused_keeps_the_groups_log(tmp_path):
    core = leader_with(3)
    hosted = Group(core, Machine(), HardState(core.term, core.vote, core.commit))
    hosted.applied = core.applied

    def refuse(*args):
        raise OSError(28, "No space left on device")

    files = SnapshotFiles(tmp_path)
    files.write = refuse  # type: ignore[method-assign]
    answers: list = []
    compaction = Compaction(files, {}, {1: hosted}, 0.01,
                            lambda work, done: answers.append(done(outcome.capture(work))), lambda: None, lambda: None)
    compaction.compact(1, hosted)
    assert answers == [None] and compaction.take() == [] and core.snapshot.index == 0
