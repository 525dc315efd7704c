"""The leader's side of replication in the Raft core: what it knows of each follower (Progress, etcd's
tracker.Progress) and the flow control of its appends, the answers that move a follower's progress, and commit by
counting matches. A mixin of RaftCore (core.py), whose state it reads: no I/O and no clock, as the core.
"""

from __future__ import annotations

from collections import deque

from rocket.raft.types import Message, MessageType, Role


class Progress:
    """What the leader knows of one follower: PROBE sends one message at a time until the follower's
    position is found; REPLICATE pipelines up to append_messages_in_flight_max; SNAPSHOT waits for one."""

    PROBE, REPLICATE, SNAPSHOT = 1, 2, 3

    def __init__(self, next_index: int):
        self.match = 0
        self.next = next_index
        self.state = self.PROBE
        self.paused = False
        self.inflight: deque[int] = deque()  # last index of each append in flight
        self.recent_active = False
        self.pending_snapshot = 0
        self.snapshot_tick = 0  # the leader's tick when the pending snapshot was sent
        self.lease_tick = -1  # the leader's tick at which it sent the last heartbeat this follower answered

    def become_probe(self) -> None:
        self.state, self.paused, self.next = self.PROBE, False, self.match + 1
        self.inflight.clear()

    def become_replicate(self) -> None:
        self.state, self.paused, self.next = self.REPLICATE, False, self.match + 1
        self.inflight.clear()

    def acknowledge(self, index: int) -> bool:
        """Record that the follower holds up to index; returns whether that is news."""
        while self.inflight and self.inflight[0] <= index:
            self.inflight.popleft()
        if index > self.match:
            self.match = index
            self.next = max(self.next, index + 1)
            self.paused = False
            return True
        return False


class LeaderReplication:
    """RaftCore's leader: its followers' progress (self.progress), the appends and heartbeats it sends them, and the
    commit their answers allow."""

    def _on_append_response(self, message: Message) -> None:
        if self.role != Role.LEADER or message.sender not in self.progress:
            return
        progress = self.progress[message.sender]
        progress.recent_active = True
        if message.reject:
            stale = message.index <= progress.match or (
                progress.state == Progress.PROBE and message.index != progress.next - 1)
            if not stale:
                progress.become_probe()
                progress.next = max(progress.match + 1, min(message.index, message.reject_hint + 1))
                self._send_append(message.sender)
            return
        if progress.acknowledge(message.index):
            if progress.state == Progress.PROBE or (
                    progress.state == Progress.SNAPSHOT and progress.match >= progress.pending_snapshot):
                progress.become_replicate()
            self._maybe_commit()
            if message.sender == self.transferee and progress.match == self.last_index:
                self._send(Message(MessageType.TIMEOUT_NOW, self.id, message.sender, self.term))
        self._send_appends_while_room(message.sender)

    def _on_heartbeat_response(self, message: Message) -> None:
        if self.role != Role.LEADER or message.sender not in self.progress:
            return
        progress = self.progress[message.sender]
        progress.recent_active = True
        progress.paused = False
        progress.lease_tick = max(progress.lease_tick, message.index)
        # The follower is alive, yet appends or a snapshot sent to it may have been lost (it was down):
        # free one slot of a full window (etcd's FreeFirstOne), and send a snapshot again once one
        # has gone unanswered for an election timeout, so that a returning follower always catches up.
        if progress.state == Progress.REPLICATE and len(progress.inflight) >= self.config.append_messages_in_flight_max:
            progress.inflight.popleft()
        if progress.state == Progress.SNAPSHOT and self.ticks - progress.snapshot_tick >= self.config.election_ticks:
            progress.become_probe()
        if progress.match < self.last_index:
            self._send_append(message.sender)
        if message.context in self._pending_reads:
            index, acknowledged = self._pending_reads[message.context]
            acknowledged.add(message.sender)
            if self._confirmed(acknowledged):
                del self._pending_reads[message.context]
                self._read_states.append((message.context, index))

    def _send_heartbeat(self, peer: int, context: int) -> None:
        progress = self.progress.get(peer)
        commit = min(self.commit, progress.match) if progress else 0
        self._send(Message(MessageType.HEARTBEAT, self.id, peer, self.term, index=self.ticks, commit=commit,
                           context=context, leader_commit=self.commit))

    def _broadcast_append(self) -> None:
        for peer in self.progress:
            if peer != self.id:
                self._send_appends_while_room(peer)

    def _send_appends_while_room(self, peer: int) -> None:
        progress = self.progress[peer]
        while progress.next <= self.last_index and self._send_append(peer):
            if progress.state != Progress.REPLICATE:
                break

    def _send_append(self, peer: int) -> bool:
        """Send the next entries to peer if flow control allows; returns whether anything was sent."""
        progress = self.progress[peer]
        if progress.state == Progress.SNAPSHOT or progress.paused:
            return False
        if progress.state == Progress.REPLICATE and len(progress.inflight) >= self.config.append_messages_in_flight_max:
            return False
        previous = progress.next - 1
        previous_term = self.term_at(previous)
        if previous_term is None:
            progress.state = Progress.SNAPSHOT
            progress.pending_snapshot = self.snapshot.index
            progress.snapshot_tick = self.ticks
            self._send(Message(MessageType.SNAPSHOT, self.id, peer, self.term, snapshot=self.snapshot))
            return True
        high = min(self.last_index + 1, progress.next + self.config.entries_per_message_max)
        entries = tuple(self._entries(progress.next, high, self.config.message_bytes_max))
        self._send(Message(MessageType.APPEND, self.id, peer, self.term, previous_term, previous, entries, self.commit))
        if progress.state == Progress.REPLICATE and entries:
            progress.next = entries[-1].index + 1
            progress.inflight.append(entries[-1].index)
        elif progress.state == Progress.PROBE:
            progress.paused = True
        return True

    def _maybe_commit(self) -> None:
        matches = sorted((self.progress[v].match for v in self.voters if v in self.progress), reverse=True)
        if not matches:
            return
        candidate = matches[len(self.voters) // 2] if len(matches) > len(self.voters) // 2 else 0
        # Only entries of the current term are committed by counting (Raft, section 5.4.2).
        if candidate > self.commit and self.term_at(candidate) == self.term:
            self._commit_to(candidate)
            self._broadcast_append()

    def _commit_to(self, index: int) -> None:
        if index > self.commit:
            self.commit = index
