"""The storage state machine: the queues, consumer offsets, timers, pop state, tier manifests and KV shards of the
groups a node hosts. apply() takes a group's committed entries and returns their results and the Effects that the
shell (store/store.py) persists. Pure: no I/O, no clock (the index and KV keys are read through IndexView, KvView)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Protocol

import orjson

from rocket import limits
from rocket.errors import Code, RocketError, invariant
from rocket.model import SYSTEM_PREFIX, dead_letter_parts, dead_letter_topic, half_topic, timer_topic
from rocket.serde import batch as batch_codec
from rocket.store import commands, manifest, pop
from rocket.store.producers import Producers
from rocket.store.commands import Append, Cancel, CommitOffsets, Drop, Import, Lock, PopCommand, Rearm, TierCommand
from rocket.store.kv import KeyState, KvBatch, KvChange, ShardTxn, Txn
from rocket.store.manifest import TierChange, TierQueue
from rocket.store.pop import PopChange, PopQueue
from rocket.store.values import HALF_PREFIX, IndexEntry, QueueStats, Timer

NEVER_MS = 2**63 - 1  # the delivery time of no timer


@dataclasses.dataclass(slots=True)
class DropChange:
    """What a drop takes from the index: the queues' entries, stats, manifests and timers; the pop states named;
    the offsets committed on (topic, queue) for queues (None: every queue), by consumer_group (every group: "")."""

    queues: list[tuple[str, int]]  # stored queues (the topic's, its system queues', its dead letters')
    pops: list[pop.PopKey]
    topic: str
    offsets_of: tuple[int, ...] | None
    consumer_group: str


class IndexView(Protocol):
    """What the machine reads of the index: the pending timers (kept there, not in memory)."""

    def timer(self, topic: str, queue: int, offset: int) -> tuple[int, int, int] | None: ...

    def timers(self, group: int, from_ms: int = 0, until_ms: int = 2**63 - 2, limit: int = 2**63 - 1,
               halves: bool = False) -> list[Timer]: ...


class KvView(Protocol):
    """What the machine reads of the KV index: a key's state, and the keys with a prefix."""

    def get(self, bucket: str, shard: int, key: str) -> KeyState | None: ...

    def keys(self, bucket: str, shard: int, prefix: str, limit: int) -> list[str]: ...


@dataclasses.dataclass(slots=True)
class Effects:
    """What applying a group's entries changed, for the shell to persist: the index's changes, and the queues whose
    waiting readers look again."""

    group: int
    applied: int = 0  # the index of the last entry applied
    index_entries: list[tuple[str, int, IndexEntry]] = dataclasses.field(default_factory=list)
    commits: list[tuple[str, str, dict[int, int]]] = dataclasses.field(default_factory=list)
    timers: list[tuple[int, Timer, bool]] = dataclasses.field(default_factory=list)
    pop_changes: list[PopChange] = dataclasses.field(default_factory=list)
    tier_changes: list[TierChange] = dataclasses.field(default_factory=list)
    touched: dict[tuple[str, int], QueueStats] = dataclasses.field(default_factory=dict)  # queues appended to
    woken: set[tuple[str, int]] = dataclasses.field(default_factory=set)  # besides touched ones
    kv_applied: int = 0  # the index of the last entry applied to the KV part (0: the KV part did not move)
    kv_changes: list[KvChange] = dataclasses.field(default_factory=list)
    kv_shards: dict[tuple[str, int], list[int]] = dataclasses.field(default_factory=dict)  # touched ones, as kv_shards
    producer_changes: list = dataclasses.field(default_factory=list)  # producers' answers remembered and forgotten
    producers_restored: list | None = None  # a snapshot installed: its producers' rows, which replace the group's
    drops: list[DropChange] = dataclasses.field(default_factory=list)
    tombstones: list[tuple[int, str, bool]] = dataclasses.field(default_factory=list)  # (group, topic, set or cleared)
    incarnations: list[tuple[int, str, int]] = dataclasses.field(default_factory=list)  # (group, topic, incarnation)
    # orderly consumers' locks set (group, consumer group, topic, queue, client, renewed ms) or given up (client "")
    lock_changes: list[tuple[int, str, str, int, str, int]] = dataclasses.field(default_factory=list)


class StorageMachine:
    """apply(group, entries, positions) returns results and Effects (index changes, queues to wake), with one handler
    per command type (commands.py), plus snapshot and restore. Controller-mode groups run the same state machine over
    their own core. The pending timers it checks are read through IndexView, the KV keys through KvView.

    The KV state is kept apart from the rest (its own LevelDB, its own last applied entry per group), so that it can
    be rebuilt alone: entries are applied to the KV part past kv_applied and to the rest past applied.

    To add a kind of replicated state: a command in commands.py, and a handler here that returns Effects; if it needs
    persisting beyond the existing records, the index (queue_index.py) stores it from the Effects (Store._persist) and
    replay.load hands it back at open."""

    def __init__(self, index: IndexView, kv: KvView):
        self.index = index
        self.kv = kv
        # (bucket, shard) -> [its group, its revision, the bucket's history as its last change had it]
        self.kv_shards: dict[tuple[str, int], list[int]] = {}
        self.kv_applied: dict[int, int] = {}  # Raft group -> index of its last entry applied to the KV part
        self._kv_changed: dict[tuple[str, int], dict] = {}  # within one apply: keys changed, per shard
        self.queues: dict[tuple[str, int], QueueStats] = {}
        self.applied: dict[int, int] = {}  # Raft group -> index of its last entry applied
        self.pops: dict[pop.PopKey, PopQueue] = {}  # pop consumption: (consumer group, topic, queue) -> state
        self.tier: dict[tuple[str, int], TierQueue] = {}  # the tier manifest of each queue that has one
        self.producers = Producers()  # each producer's latest batches per queue, so a batch sent again is not stored
        # (Raft group, topic) of deleted topics whose names are not open again: appends to them are refused. One per
        # topic deleted and not made again, cleared by the nameservers after limits.topic_tombstone_s.
        self.dropped: set[tuple[int, str]] = set()
        # (Raft group, topic) -> the newest incarnation (creation time) a drop or reopen named: one per topic name
        # deleted in the group, so that a deposed nameserver's late drop does not reach the topic made again.
        self.incarnations: dict[tuple[int, str], int] = {}
        # Orderly consumers' queue locks (remoting LOCK_BATCH_MQ), shared by every broker: (Raft group, consumer group,
        # topic, queue) -> (client, renewed at ms), at most limits.remoting_locks_max per node, lapsed ones swept first.
        self.locks: dict[tuple[int, str, str, int], tuple[str, int]] = {}
        self._entry_index = 0  # within one apply: the entry being applied
        self.next_due: dict[tuple[int, bool], int] = {}  # (Raft group, halves) -> nothing of it is due before this
        # Queues appended to since the offloader last found nothing of them left to upload (all at open).
        self.offload_candidates: set[tuple[str, int]] = set()
        # Queues appended to since the key indexer last found all their batches' keys indexed (all at open).
        self.key_candidates: dict[tuple[str, int], None] = {}  # in the order the indexer takes them
        self._timer_changes: dict[tuple[str, int, int], int | None] = {}  # within one apply: set or done
        self._handlers: dict[type, Callable] = {Append: self._append, CommitOffsets: self._commit_offsets,
                                                Cancel: self._cancel, Rearm: self._rearm, PopCommand: self._pop,
                                                TierCommand: self._tier_command, KvBatch: self._kv_batch,
                                                Drop: self._drop, Import: self._import, Lock: self._lock}

    def apply(self, group: int, entries, positions: list[int]) -> tuple[list, Effects | None]:
        """Apply a group's committed entries, whose data lies in the WAL at positions. Results are (base offset,
        count) for appends, timers and moves that delivered, False for a move that did not (its messages were no
        longer pending), True or False for a cancel or rearm, and pop.decide's results for pop commands. No
        effects if every entry was applied before (a restart re-applies what the store already holds)."""
        done, kv_done = self.applied.get(group, 0), self.kv_applied.get(group, 0)
        effects = Effects(group)
        results: list = []
        for entry, position in zip(entries, positions):
            # Applied before a restart, or a new leader's empty entry.
            if entry.index <= min(done, kv_done) or not entry.data:
                results.append(None)
                continue
            command = commands.decode(entry.data)
            if entry.index <= (kv_done if type(command) is KvBatch else done):
                results.append(None)
            else:
                self._entry_index = entry.index
                results.append(self._handlers[type(command)](group, command, position, effects))
        self._timer_changes.clear()
        self._kv_changed.clear()
        last = entries[-1].index if entries else done
        if last > kv_done:
            effects.kv_applied = self.kv_applied[group] = last
        if last <= done:
            return results, effects if effects.kv_applied else None
        effects.applied = self.applied[group] = last
        return results, effects

    # ---- one handler per command ----------------------------------------------------------------------

    def _append(self, group: int, command: Append, position: int, effects: Effects):
        if command.producer:  # a batch applied before gets its first answer (also once its topic was sealed here)
            key = (command.producer, command.topic, command.queue)
            known = self.producers.check(group, key, command.sequence)
            if known is not None:
                return known
        if self.dropped and (group, command.topic) in self.dropped:
            return deleted(command.topic)
        if command.command == commands.MOVE_COMMAND and not self._take_timers(
                group, command.source, command.queue, command.moved, effects.timers):
            return False  # not None: the Raft host answers None with the entry's index
        stored_topic = command.stored_topic
        invariant(position >= 0, f"group {group} entry at {command.topic}/{command.queue} was applied before it was "
                                 f"persisted")
        base_offset, count = self._index_batch(group, stored_topic, command.queue, command.batch,
                                               position + command.batch_at, command.append_ms, effects)
        if command.command == commands.TIMER_COMMAND:
            for message in batch_codec.decode(command.batch, base_offset):
                self._set_timer(group, Timer(message.deliver_at_ms or command.append_ms, stored_topic, command.queue,
                                             message.offset), effects.timers)
        elif command.command == commands.HALF_COMMAND:
            for offset in range(base_offset, base_offset + count):
                self._set_timer(group, Timer(command.check_at_ms, stored_topic, command.queue, offset), effects.timers)
        if command.producer:
            self.producers.record(group, key, command.sequence, (base_offset, count), self._entry_index,
                                  command.append_ms, effects.producer_changes)
        return base_offset, count

    def _import(self, group: int, command: Import, position: int, effects: Effects):
        """Copied batches join the queue where their offsets say: a new queue starts at the first one's, and those
        the queue holds already are skipped (a copy sent again). Returns the queue's next offset, or BAD_REQUEST if
        they would leave a gap or do not start at a batch the queue holds. The producers' answers it carries are
        remembered, unless known already."""
        topic, queue = command.topic, command.queue
        if self.dropped and (group, topic) in self.dropped:
            return deleted(topic)
        stats = self.queues.get((topic, queue))
        base = command.base_offset
        if command.batches and (stats is None or stats.next_offset == stats.bytes == 0):
            stats = self.queues[(topic, queue)] = QueueStats(next_offset=base, group=group, sampled=(0, 0, 0, 0))
        next_offset = stats.next_offset if stats is not None else 0
        for at, batch in command.batches:
            count = batch_codec.peek_header(batch).count
            if base + count <= next_offset:  # held already
                base += count
                continue
            if base != next_offset:
                return RocketError(Code.BAD_REQUEST, f"{topic}/{queue}: a copied batch at offset {base} does not "
                                   f"follow the queue's end, {next_offset}")
            self._index_batch(group, topic, queue, batch, position + at, command.append_ms, effects)
            base = next_offset = base + count
        for producer, sequence, answer_base, count in command.producers:
            if self.producers.check(group, (producer, topic, queue), sequence) is None:
                self.producers.record(group, (producer, topic, queue), sequence, (answer_base, count),
                                      self._entry_index, command.append_ms, effects.producer_changes)
        return next_offset

    def _index_batch(self, group: int, topic: str, queue: int, batch: memoryview, position: int, append_ms: int,
                     effects: Effects) -> tuple[int, int]:
        """A batch lying in the WAL at position joins its queue: (base offset, count)."""
        header = batch_codec.peek_header(batch)  # checked before it was proposed
        stats = self.queues.get((topic, queue))
        if stats is None:  # a new queue: telemetry counts its traffic from zero
            stats = self.queues[(topic, queue)] = QueueStats(group=group, sampled=(0, 0, 0, 0))
        base_offset = stats.next_offset
        stats.next_offset += header.count
        stats.bytes += len(batch)
        stats.last_append_ms = append_ms
        effects.touched[(topic, queue)] = stats
        if not topic.startswith(SYSTEM_PREFIX):
            self.offload_candidates.add((topic, queue))
            self.key_candidates[(topic, queue)] = None
        placed = IndexEntry(base_offset, position, header.count, len(batch), header.first_timestamp_ms, append_ms,
                            header.tag_summary)
        effects.index_entries.append((topic, queue, placed))
        return base_offset, header.count

    def _commit_offsets(self, group: int, command: CommitOffsets, position: int, effects: Effects):
        if self.dropped and (group, command.topic) in self.dropped:
            return deleted(command.topic)
        effects.commits.append((command.consumer_group, command.topic, command.offsets))

    def _cancel(self, group: int, command: Cancel, position: int, effects: Effects) -> bool:
        return self._take_timers(group, command.topic, command.queue, command.offsets, effects.timers)

    def _rearm(self, group: int, command: Rearm, position: int, effects: Effects) -> bool:
        if not self._take_timers(group, command.topic, command.queue, command.offsets, effects.timers, command.due_ms):
            return False
        for offset in command.offsets:
            self._set_timer(group, Timer(command.next_ms, command.topic, command.queue, offset, command.checks),
                            effects.timers)
        return True

    def _pop(self, group: int, command: PopCommand, position: int, effects: Effects):
        request = command.request
        if self.dropped and (group, request["topic"]) in self.dropped:
            return deleted(request["topic"])
        if request["op"] == "bury":  # messages a consumer gave up on, never popped: to the dead letters as they are
            self._index_batch(group, dead_letter_topic(request["consumer_group"], request["topic"]), request["queue"],
                              command.batch, position + command.batch_at, request["now_ms"], effects)
            return True
        result, change = pop.decide(self.pops, request)
        if change is None:
            return result
        pop.apply_change(self.pops, change)
        effects.pop_changes.append(change)
        effects.woken.add((request["topic"], request["queue"]))  # a receive waiting on the queue looks again
        if request["op"] == "dead":
            self._index_batch(group, dead_letter_topic(request["consumer_group"], request["topic"]), request["queue"],
                              command.batch, position + command.batch_at, request["now_ms"], effects)
        return result

    def _tier_command(self, group: int, command: TierCommand, position: int, effects: Effects) -> bool:
        request = command.request
        change = manifest.apply(self.tier, self.queues.get((request["topic"], request["queue"])), request)
        if change is not None:
            effects.tier_changes.append(change)
            topic, queue, _, drop_below = change
            if drop_below is not None:  # the index drops what it holds; what this apply added is dropped here
                effects.index_entries = [(t, q, entry) for t, q, entry in effects.index_entries
                                         if t != topic or q != queue or entry.base_offset >= drop_below]
        return change is not None

    def _lock(self, group: int, command: Lock, position: int, effects: Effects) -> list[int]:
        """Lock or unlock queues for an orderly consumer: a queue is locked to the client that asks if it holds it
        already, or nobody does, or its holder's lock lapsed (limits.remoting_lock_expiry_s without a renewal).
        Returns the queues it holds now (unlock: those it gave back)."""
        expiry_ms = int(limits.remoting_lock_expiry_s * 1000)
        now_ms, held, changes = command.now_ms, [], effects.lock_changes
        for queue in command.queues:
            key = (group, command.consumer_group, command.topic, queue)
            holder = self.locks.get(key)
            if command.op == "unlock":
                if holder is not None and holder[0] == command.client:
                    del self.locks[key]
                    changes.append((*key, "", 0))
                    held.append(queue)
                continue
            if holder is not None and holder[0] != command.client and now_ms - holder[1] <= expiry_ms:
                continue
            if holder is None and len(self.locks) >= limits.remoting_locks_max:
                for lapsed in [key for key, (_, renewed) in self.locks.items() if now_ms - renewed > expiry_ms]:
                    del self.locks[lapsed]
                    changes.append((*lapsed, "", 0))
                if len(self.locks) >= limits.remoting_locks_max:
                    continue
            self.locks[key] = (command.client, now_ms)
            changes.append((*key, command.client, now_ms))
            held.append(queue)
        return held

    def _kv_batch(self, group: int, batch: KvBatch, position: int, effects: Effects) -> list[dict]:
        return [self._kv_txn(group, txn, effects) for txn in batch.txns]

    def _kv_txn(self, group: int, txn: Txn, effects: Effects) -> dict:
        place = (txn.bucket, txn.shard)
        shard = self.kv_shards.setdefault(place, [group, 0, txn.history])
        shard[0], shard[2] = group, txn.history
        changed = self._kv_changed.setdefault(place, {})
        decision = ShardTxn(txn, shard[1], lambda key: self.kv.get(txn.bucket, txn.shard, key),
                            lambda prefix, limit: self.kv.keys(txn.bucket, txn.shard, prefix, limit), changed)
        result = decision.decide()
        shard[1] = decision.revision
        effects.kv_changes.extend(decision.changes)
        effects.kv_shards[place] = shard
        return result

    def _drop(self, group: int, command: Drop, position: int, effects: Effects) -> bool:
        """A deleted topic's queues (with their system queues and dead letters), or a consumer group's state on a
        topic, leave the group; what this apply changed of them so far is taken out of effects, as the index drops
        only what it holds."""
        topic, queues = command.topic, set(command.queues)
        if command.op != "group":
            newest = self.incarnations.get((group, topic), 0)
            if command.incarnation < newest:
                return False  # a drop of an older incarnation of the name, come late: the name was made anew
            if command.incarnation > newest:
                self.incarnations[(group, topic)] = command.incarnation
                effects.incarnations.append((group, topic, command.incarnation))
        if command.op == "reopen":
            self.dropped.discard((group, topic))
            effects.tombstones.append((group, topic, False))
            return True
        if command.op == "seal":  # appends refused as for a deleted topic; its data stays for reads
            if (group, topic) not in self.dropped:
                self.dropped.add((group, topic))
                effects.tombstones.append((group, topic, True))
                effects.woken.update(place for place, stats in self.queues.items()
                                     if place[0] == topic and stats.group == group)
            return True
        consumer_group = command.consumer_group
        if command.op in ("topic", "moved"):
            self.dropped.add((group, topic))
            effects.tombstones.append((group, topic, True))
            names = {topic, timer_topic(topic), half_topic(topic)}
            gone_pops = [key for key in self.pops if key[1] == topic and key[2] in queues]
        else:  # one consumer group's state: looked up by key, not by a scan of every group's (O(1) per queue)
            names = {dead_letter_topic(consumer_group, topic)}
            gone_pops = [key for queue in sorted(queues) if (key := (consumer_group, topic, queue)) in self.pops]

        def leaves(name: str) -> bool:  # a dead-letter topic's name is its consumer group's and its topic's
            return name in names or command.op != "group" and (dead_letter_parts(name) or ("", ""))[1] == topic
        if command.op == "group":
            places = [(name, queue) for name in names for queue in sorted(queues)
                      if (stats := self.queues.get((name, queue))) is not None and stats.group == group]
        else:
            places = [(name, queue) for (name, queue), stats in self.queues.items()
                      if queue in queues and stats.group == group and leaves(name)]
        for place in places:
            del self.queues[place]
            self.tier.pop(place, None)
            self.offload_candidates.discard(place)
            self.key_candidates.pop(place, None)
        for key in gone_pops:
            del self.pops[key]
        for key in [key for key in self.locks if key[0] == group and key[2] == topic and key[3] in queues
                    and (command.op != "group" or key[1] == consumer_group)]:
            del self.locks[key]
            effects.lock_changes.append((*key, "", 0))
        for key in self._timer_changes:
            if key[:2] in places:
                self._timer_changes[key] = None
        if command.op != "group":
            self.producers.forget(group, topic, queues, effects.producer_changes)
        _take_out(effects, set(places), topic, queues, consumer_group)
        effects.drops.append(DropChange(places, gone_pops, topic, command.queues, consumer_group))
        effects.woken.update(places)  # readers waiting on them look again, and find nothing
        return True

    # ---- timers ---------------------------------------------------------------------------------------

    def _set_timer(self, group: int, timer: Timer, timers: list) -> None:
        self._timer_changes[(timer.topic, timer.queue, timer.offset)] = timer.deliver_at_ms
        timers.append((group, timer, True))
        kind = (group, timer.topic.startswith(HALF_PREFIX))
        self.next_due[kind] = min(self.next_due.get(kind, NEVER_MS), timer.deliver_at_ms)

    def _take_timers(self, group: int, topic: str, queue: int, offsets, timers: list, due_ms: int | None = None) -> bool:
        """Mark pending timers done, if every one of them is pending (seen through the changes this apply
        made so far), and due at due_ms if given; else change nothing."""
        due = []
        for offset in offsets:
            place = (topic, queue, offset)
            if place in self._timer_changes:
                deliver_at_ms = self._timer_changes[place]
            else:
                found = self.index.timer(*place)
                deliver_at_ms = found[0] if found is not None and found[1] == group else None
            if deliver_at_ms is None or due_ms is not None and deliver_at_ms != due_ms:
                return False
            due.append(deliver_at_ms)
        for offset, deliver_at_ms in zip(offsets, due):
            self._timer_changes[(topic, queue, offset)] = None
            timers.append((group, Timer(deliver_at_ms, topic, queue, offset), False))
        return True

    def replace_timers(self, group: int, timers: list[Timer]) -> list[tuple[int, Timer, bool]]:
        """The changes that make a group's pending timers those of a snapshot."""
        for halves in (False, True):
            self.next_due[(group, halves)] = min((timer.deliver_at_ms for timer in timers
                                                  if timer.topic.startswith(HALF_PREFIX) == halves), default=NEVER_MS)
        return ([(group, timer, False) for halves in (False, True) for timer in self.index.timers(group, halves=halves)]
                + [(group, timer, True) for timer in timers])

    # ---- snapshots ------------------------------------------------------------------------------------

    def group_of(self, topic: str, queue: int) -> int | None:
        stats = self.queues.get((topic, queue))
        return stats.group if stats is not None else None

    def snapshot(self, group: int) -> bytes:
        """The group's state as applied: its queue positions (so a replica that installs it assigns the same
        offsets as the others from then on), timers, pop states and tier manifests."""
        queues = [[topic, queue, stats.next_offset, stats.bytes, stats.last_append_ms]
                  for (topic, queue), stats in self.queues.items() if stats.group == group]
        timers = [[t.deliver_at_ms, t.topic, t.queue, t.offset, t.checks]
                  for halves in (False, True) for t in self.index.timers(group, halves=halves)]
        pops = [PopChange(key, state.cursor, dict(state.in_flight), reset=True).to_wire()
                for key, state in self.pops.items() if self.group_of(key[1], key[2]) == group]
        tier = [[topic, queue, state.to_wire()] for (topic, queue), state in self.tier.items()
                if self.group_of(topic, queue) == group]
        kv = [[bucket, shard, revision, history] for (bucket, shard), (holder, revision, history)
              in self.kv_shards.items() if holder == group]
        return orjson.dumps({"group": group, "applied": self.applied.get(group, 0), "queues": queues,
                             "timers": timers, "pops": pops, "tier": tier, "kv": kv,
                             "producers": self.producers.snapshot(group),
                             "dropped": sorted(topic for holder, topic in self.dropped if holder == group),
                             "incarnations": sorted([topic, incarnation] for (holder, topic), incarnation
                                                    in self.incarnations.items() if holder == group),
                             "locks": [[*key[1:], *lock] for key, lock in self.locks.items() if key[0] == group]})

    def restore(self, group: int, data: bytes | memoryview) -> Effects | None:
        """Install a snapshot taken past what this machine applied (else None): the group's queue positions, pop
        states, tier manifests and timers become the snapshot's (the batches before it are not here), and its KV
        shards' revisions if the KV part is behind it too (kv_applied set: the shell takes the KV records)."""
        snapshot = Snapshot.decode(data)
        effects = Effects(group)
        if snapshot.applied > self.kv_applied.get(group, 0):
            effects.kv_applied = self.kv_applied[group] = snapshot.applied
            effects.kv_shards = {place: [group, *kept] for place, kept in snapshot.kv.items()}
            self.kv_shards.update(effects.kv_shards)
        if snapshot.applied <= self.applied.get(group, 0):
            return effects if effects.kv_applied else None
        effects.applied = snapshot.applied
        gone = [place for place, stats in self.queues.items() if stats.group == group and place not in snapshot.queues]
        if gone:  # deleted since what this replica applied: the index forgets them
            for place in gone:
                del self.queues[place]
                self.tier.pop(place, None)
            gone_pops = [key for key in self.pops if key[1:] in gone]
            for key in gone_pops:
                del self.pops[key]
            effects.drops.append(DropChange(gone, gone_pops, "", (), ""))
        for holder, topic in [place for place in self.dropped if place[0] == group]:
            if topic not in snapshot.dropped:
                self.dropped.discard((holder, topic))
                effects.tombstones.append((group, topic, False))
        for key in [key for key in self.locks if key[0] == group]:
            del self.locks[key]
            effects.lock_changes.append((*key, "", 0))
        for consumer_group, topic, queue, client, renewed_ms in snapshot.locks:
            self.locks[(group, consumer_group, topic, queue)] = (client, renewed_ms)
            effects.lock_changes.append((group, consumer_group, topic, queue, client, renewed_ms))
        for topic, incarnation in snapshot.incarnations:
            if self.incarnations.get((group, topic), 0) < incarnation:
                self.incarnations[(group, topic)] = incarnation
                effects.incarnations.append((group, topic, incarnation))
        for topic in snapshot.dropped:
            if (group, topic) not in self.dropped:  # and the offsets committed on it, on every queue
                self.dropped.add((group, topic))
                effects.tombstones.append((group, topic, True))
                effects.drops.append(DropChange([], [], topic, None, ""))
        self.queues.update(snapshot.queues)
        self.applied[group] = snapshot.applied
        effects.pop_changes = replace_pops(self.pops, snapshot.queues, snapshot.pops)
        for change in effects.pop_changes:
            pop.apply_change(self.pops, change)
        self.tier.update(snapshot.tier)
        effects.tier_changes = snapshot.tier_changes()
        effects.timers = self.replace_timers(group, snapshot.timers)
        effects.producers_restored = self.producers.restore(group, snapshot.producers)
        effects.touched = snapshot.queues
        return effects


def deleted(topic: str) -> RocketError:
    return RocketError(Code.UNKNOWN_TOPIC, f"topic {topic!r} was deleted")


def _take_out(effects: Effects, places: set[tuple[str, int]], topic: str, queues: set[int], consumer_group: str) -> None:
    """Take what effects changed so far of dropped queues (places) and of the offsets on topic's queues (of
    consumer_group; of every group if "") out of them: the index drops what it holds, not what it is about to get."""
    effects.index_entries = [change for change in effects.index_entries if change[:2] not in places]
    effects.touched = {place: stats for place, stats in effects.touched.items() if place not in places}
    effects.timers = [change for change in effects.timers if (change[1].topic, change[1].queue) not in places]
    effects.tier_changes = [change for change in effects.tier_changes if change[:2] not in places]
    effects.pop_changes = [change for change in effects.pop_changes if
                           change.key[1:] not in places and not (change.key[1] == topic and change.key[2] in queues
                                                                 and consumer_group in ("", change.key[0]))]
    effects.commits = [(group, name, offsets) if name != topic or consumer_group not in ("", group) else
                       (group, name, {queue: offset for queue, offset in offsets.items() if queue not in queues})
                       for group, name, offsets in effects.commits]


@dataclasses.dataclass(slots=True)
class Snapshot:
    """A group's snapshot, decoded."""

    group: int
    applied: int
    queues: dict[tuple[str, int], QueueStats]
    timers: list[Timer]
    pops: list[PopChange]
    tier: dict[tuple[str, int], TierQueue]
    kv: dict[tuple[str, int], tuple[int, int]]  # (bucket, shard) -> (revision, history)
    producers: list  # Producers.snapshot's
    dropped: list[str]  # deleted topics whose appends the group refuses
    incarnations: list[list]  # [topic, the newest incarnation a drop or reopen named]
    locks: list[list]  # [consumer group, topic, queue, client, renewed ms]: orderly consumers' queue locks

    @classmethod
    def decode(cls, data: bytes | memoryview) -> "Snapshot":
        snapshot = orjson.loads(data)
        group = snapshot["group"]
        return cls(group, snapshot["applied"], {
            (topic, queue): QueueStats(next_offset, size, last_append_ms, group, available_from=next_offset)
            for topic, queue, next_offset, size, last_append_ms in snapshot["queues"]
        }, [Timer(*timer) for timer in snapshot.get("timers", ())],
            [PopChange.from_wire(wire) for wire in snapshot.get("pops", ())],
            {(topic, queue): TierQueue.from_wire(state) for topic, queue, state in snapshot.get("tier", ())},
            {(bucket, shard): (revision, history) for bucket, shard, revision, history in snapshot.get("kv", ())},
            snapshot.get("producers", []), snapshot.get("dropped", []), snapshot.get("incarnations", []),
            snapshot.get("locks", []))

    def tier_changes(self) -> list[TierChange]:
        return [(topic, queue, orjson.dumps(state.to_wire()), state.local_from)
                for (topic, queue), state in self.tier.items()]


def replace_pops(pops: dict, positions: dict[tuple[str, int], QueueStats],
                 snapshot_pops: list[PopChange]) -> list[PopChange]:
    """The changes that make the pop states of a snapshot's queues those of the snapshot."""
    replaced = {change.key for change in snapshot_pops}
    return snapshot_pops + [PopChange(key, 0, reset=True) for key in pops
                            if (key[1], key[2]) in positions and key not in replaced]
