"""The Raft core, in the shape of etcd-raft: step(message), tick(), ready() -> Ready, advance(ready). No I/O and no
clock: time passes only through tick(), and the caller persists, sends and applies what Ready holds (persist before
send)."""

from __future__ import annotations

import random

from rocket.errors import Code, RocketError, invariant
from rocket.raft.progress import Progress, ProgressTracker
from rocket.raft.types import (NONE, Config, Entry, EntryKind, HardState, Message, MessageType,  # noqa: F401
                               Ready, Role, Snapshot)
from rocket.replication import NotLeader

__all__ = ["NONE", "Config", "Entry", "EntryKind", "HardState", "Message", "MessageType", "NotLeader", "RaftCore",
           "Ready", "Role", "Snapshot"]


class RaftCore:
    """A Raft group's replica, as etcd-raft's: pre-vote, check-quorum, pipelined replication with flow control,
    ReadIndex reads, leadership transfer, learners with single-server membership change, snapshots. Its types are in
    rocket.raft.types (imported here, so `from rocket.raft.core import Entry` works as before). What the leader knows
    of each follower is a ProgressTracker of its own (rocket.raft.progress), as etcd keeps its tracker apart from
    raft.go."""

    def __init__(self, config: Config, hard_state: HardState = HardState(), entries: list[Entry] | None = None,
                 snapshot: Snapshot | None = None):
        config.validate()
        self.config = config
        self.id = config.node_id
        self._random = random.Random(config.seed * 1_000_003 + config.node_id)
        self.voters: set[int] = set(snapshot.voters if snapshot else config.voters)
        self.learners: set[int] = set(snapshot.learners if snapshot else config.learners)
        # The log holds entries after the snapshot: log[i] has index snapshot_index + 1 + i.
        self.snapshot: Snapshot = snapshot or Snapshot(0, 0, tuple(sorted(self.voters)), tuple(sorted(self.learners)))
        self.log: list[Entry] = list(entries or [])
        invariant(not self.log or self.log[0].index == self.snapshot.index + 1, "the log follows its snapshot")
        self.role = Role.FOLLOWER
        self._reload_configuration()  # the snapshot's members plus every change in the log
        self.term = hard_state.term
        self.vote = hard_state.vote
        self.commit = max(hard_state.commit, self.snapshot.index)
        self.applied = self.snapshot.index
        self.stable_index = self.last_index  # everything given to us at start is persisted
        self.role = Role.FOLLOWER
        self.leader = NONE
        self.leader_commit = 0  # the leader's commit as last heard: how far behind this follower is
        self.election_elapsed = 0
        self.heartbeat_elapsed = 0
        self.randomized_election_ticks = 0
        self.transferee = NONE
        self.pending_conf_index = 0
        self.tracker = ProgressTracker()  # while leading: every member's progress
        self.votes: dict[int, bool] = {}
        self._outbox: list[Message] = []
        self._read_states: list[tuple[int, int]] = []
        self._pending_reads: dict[int, tuple[int, set[int]]] = {}  # request id -> (index, acks)
        self._snapshot_to_install: Snapshot | None = None
        self._last_hard_state = HardState(self.term, self.vote, self.commit)
        self.quiet = False  # an idle group's host stops ticking it until traffic or wake() arrives
        self.ticks = 0  # this node's clock, in ticks; leases are measured on it
        # A restarted node may have promised a leader its vote: it waits an election out. One that never voted (a new
        # replica) promised nothing.
        self._booting = bool(self.term or self.vote)
        self._reset_election_timeout()

    # ---- the log ---------------------------------------------------------------------------------

    @property
    def last_index(self) -> int:
        return self.log[-1].index if self.log else self.snapshot.index

    @property
    def last_term(self) -> int:
        return self.log[-1].term if self.log else self.snapshot.term

    def term_at(self, index: int) -> int | None:
        """The term of the entry at index, or None when it is compacted away or beyond the log."""
        if index == self.snapshot.index:
            return self.snapshot.term
        position = index - self.snapshot.index - 1
        if 0 <= position < len(self.log):
            return self.log[position].term
        return None

    def _entries(self, low: int, high: int, bytes_max: int | None = None) -> list[Entry]:
        """Entries with low <= index < high, cut at bytes_max (always at least one)."""
        start = low - self.snapshot.index - 1
        selected = self.log[start: high - self.snapshot.index - 1]
        if bytes_max is None:
            return selected
        total = 0
        for count, entry in enumerate(selected):
            total += len(entry.data) + 16
            if count and total > bytes_max:
                return selected[:count]
        return selected

    def _up_to_date(self, log_term: int, index: int) -> bool:
        return log_term > self.last_term or (log_term == self.last_term and index >= self.last_index)

    def _append(self, entries: list[Entry]) -> None:
        """Append after truncating any conflicting suffix; conflicts never reach committed entries."""
        for entry in entries:
            existing = self.term_at(entry.index)
            if existing == entry.term:
                continue
            if existing is not None or entry.index <= self.last_index:
                invariant(entry.index > self.commit, "a committed entry can never be overwritten")
                del self.log[entry.index - self.snapshot.index - 1:]
                self.stable_index = min(self.stable_index, entry.index - 1)
                self._reload_configuration()
            invariant(entry.index == self.last_index + 1, "entries are appended without gaps")
            self.log.append(entry)
            if entry.kind == EntryKind.CONF_CHANGE:
                self._apply_conf_change(entry.data)

    # ---- membership ------------------------------------------------------------------------------

    def _reload_configuration(self) -> None:
        """Configuration is the snapshot's plus every change in the log, applied as appended."""
        self.voters = set(self.snapshot.voters)
        self.learners = set(self.snapshot.learners)
        for entry in self.log:
            if entry.kind == EntryKind.CONF_CHANGE:
                self._apply_conf_change(entry.data)

    def _apply_conf_change(self, data: bytes) -> None:
        action, _, node_text = data.decode().partition(":")
        node = int(node_text)
        if action == "add_learner":
            if node not in self.voters:
                self.learners.add(node)
        elif action == "promote":
            self.learners.discard(node)
            self.voters.add(node)
        elif action == "remove":
            self.voters.discard(node)
            self.learners.discard(node)
        if self.role == Role.LEADER:
            self.tracker.set_members(self.voters | self.learners, self.last_index + 1)

    def propose_conf_change(self, action: str, node: int) -> int:
        """Add a learner, promote one to voter, or remove a member: one change at a time."""
        invariant(action in ("add_learner", "promote", "remove"), f"unknown membership change {action}")
        if self.pending_conf_index > self.applied:
            raise RocketError(Code.OVERLOADED, "a membership change is still in progress")
        if action == "remove" and node == self.id:
            raise RocketError(Code.BAD_REQUEST, "transfer leadership before removing the leader")
        if action == "promote" and node not in self.learners:
            raise RocketError(Code.BAD_REQUEST, f"node {node} must catch up as a learner before it votes")
        index = self._propose([f"{action}:{node}".encode()], EntryKind.CONF_CHANGE)
        self.pending_conf_index = index
        return index

    # ---- proposals and reads ---------------------------------------------------------------------

    def propose(self, data: bytes) -> int:
        """Append data to the log as leader; returns its index (committed later, or lost to a new leader)."""
        return self._propose([data], EntryKind.NORMAL)

    def propose_many(self, datas: list[bytes]) -> int:
        """Append entries to the log as leader, all or none, sending each follower what flow control allows once
        (etcd's MsgProp carries many entries); returns the first one's index, the others following it."""
        return self._propose(datas, EntryKind.NORMAL)

    def check_proposable(self) -> None:
        """Raise what a proposal made now would meet: this node does not lead, or its leadership is moving."""
        if self.role != Role.LEADER:
            raise NotLeader(self.leader)
        if self.transferee != NONE:
            raise RocketError(Code.UNAVAILABLE, f"leadership is moving to {self.transferee}")

    def _propose(self, datas: list[bytes], kind: EntryKind) -> int:
        self.wake()
        self.check_proposable()
        first = self.last_index + 1
        self._append([Entry(self.term, first + number, data, kind) for number, data in enumerate(datas)])
        self._broadcast_append()
        self._maybe_commit()
        return first

    def read_index(self, request_id: int, lease: bool = False) -> int | None:
        """Ask for a linearizable read: a read state (request_id, index) appears in a Ready once a
        quorum confirms this node still leads; the read is served when applied reaches index. With
        lease, a leader whose lease holds answers at once, without a round of heartbeats: then (and alone
        in its group) the index is returned too, so the caller need not wait for the Ready."""
        self.wake()
        if self.role != Role.LEADER:
            raise NotLeader(self.leader)
        if self.term_at(self.commit) != self.term:
            raise RocketError(Code.UNAVAILABLE, "the new leader has not committed in its term yet; retry")
        if self.readable_at(lease) is not None:
            self._read_states.append((request_id, self.commit))
            return self.commit
        self._pending_reads[request_id] = (self.commit, {self.id})
        for peer in self.voters - {self.id}:
            self._send_heartbeat(peer, request_id)
        return None

    def readable_at(self, lease: bool = True) -> int | None:
        """The index a linearizable read may be served at now, with no round of heartbeats: the commit index, when
        this node leads, has committed in its term, and is a quorum alone or (with lease) holds its lease; else
        None. It records nothing and does not wake a quiet group (read_index does both)."""
        if self.role != Role.LEADER or self.term_at(self.commit) != self.term:
            return None
        if self._confirmed({self.id}) or (lease and self.lease_valid()):
            return self.commit
        return None

    def _confirmed(self, acknowledged: set[int]) -> bool:
        """Whether these nodes' answers confirm that this node still leads: a quorum of the voters."""
        return len(acknowledged & self.voters) > len(self.voters) // 2

    def lease_valid(self) -> bool:
        """Whether no other leader can exist yet: a quorum answered heartbeats sent at most
        election_ticks - 1 ticks ago, and a follower that heard one ignores candidates for
        election_ticks of its own ticks (this assumes clocks tick at the same rate, as etcd's does)."""
        if self.role != Role.LEADER or not self.config.check_quorum or self.transferee != NONE:
            return False
        sent = self.tracker.quorum_lease_tick(self.voters, self.id, self.ticks)
        return sent >= 0 and self.ticks < sent + self.config.election_ticks - 1

    def transfer_leadership(self, to: int) -> None:
        if self.role != Role.LEADER:
            raise NotLeader(self.leader)
        if to == self.id or to not in self.voters:
            raise RocketError(Code.BAD_REQUEST, f"node {to} is not another voter")
        self.transferee = to
        self.election_elapsed = 0
        if self.tracker[to].match == self.last_index:
            self._send(Message(MessageType.TIMEOUT_NOW, self.id, to, self.term))
        else:
            self._send_append(to)

    def quiesce(self) -> bool:
        """As leader of an idle, fully replicated group: tell followers to stop their election timers
        and stop ticking. Returns whether the group went quiet."""
        if self.role != Role.LEADER or self._pending_reads or self.transferee != NONE:
            return False
        if self.commit != self.last_index or not self.tracker.all_hold(self.last_index):
            return False
        for peer in self.tracker:
            if peer != self.id:
                self._send(Message(MessageType.HEARTBEAT, self.id, peer, self.term, commit=self.commit, quiesce=True))
        self.quiet = True
        return True

    def wake(self) -> None:
        """Resume ticking: on traffic, or when the host learns that the quiet group's leader is gone."""
        if not self.quiet:
            return
        self.quiet = False
        if self.role == Role.LEADER:
            self.election_elapsed = 0
            self.tracker.woken()

    def follower_lacks(self, index: int, heard_ticks: int) -> bool:
        """Whether, as leader, a follower that answered a heartbeat within heard_ticks lacks entries up to index: it
        was away, or is installing a snapshot, or catching up from the log after one. Compacting to index would
        leave it needing a snapshot (another one after each install, for as long as writes go on). Followers in sync
        hold index already (the commit counted them). (While it fetches a big file, the leader may count it silent
        and probe it again: its state alone does not tell; and installing one keeps it from answering for seconds. A
        follower that is down longer holds nothing back.)"""
        return self.role == Role.LEADER and self.tracker.follower_lacks(index, self.ticks - heard_ticks, self.id)

    def compact(self, index: int, data: bytes) -> None:
        """Replace the log up to index (applied) with a snapshot of the state machine."""
        invariant(self.snapshot.index < index <= self.applied, "compact only what is applied")
        term = self.log[index - self.snapshot.index - 1].term  # in the log: after the snapshot, and applied
        voters, learners = self._configuration_at(index)
        self.log = self.log[index - self.snapshot.index:]
        self.snapshot = Snapshot(index, term, voters, learners, data)

    def _configuration_at(self, index: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        voters, learners = set(self.snapshot.voters), set(self.snapshot.learners)
        saved = self.voters, self.learners
        self.voters, self.learners = voters, learners
        for entry in self._entries(self.snapshot.index + 1, index + 1):
            if entry.kind == EntryKind.CONF_CHANGE:
                self._apply_conf_change(entry.data)
        result = tuple(sorted(self.voters)), tuple(sorted(self.learners))
        self.voters, self.learners = saved
        return result

    # ---- time ------------------------------------------------------------------------------------

    def _reset_election_timeout(self) -> None:
        if self.term == 0 and self.id == self.config.first_voter and self.id in self.voters:
            # A group that never held an election (a new one): its first voter asks for votes soon and again until
            # one is held, while the others wait out the usual timeout: the first leader comes as soon as a quorum
            # hosts the group, with no split vote. (A pre-vote changes no one's term.)
            self.randomized_election_ticks = self.config.first_election_ticks
            return
        ticks = self.config.election_ticks
        self.randomized_election_ticks = ticks + self._random.randrange(ticks)

    def tick(self) -> None:
        if self.quiet:
            return
        self.ticks += 1
        self.election_elapsed += 1
        if self.election_elapsed >= self.config.election_ticks:
            self._booting = False
        if self.role == Role.LEADER:
            self.heartbeat_elapsed += 1
            if self.election_elapsed >= self.config.election_ticks:
                self.election_elapsed = 0
                if self.config.check_quorum and not self.tracker.quorum_active(self.voters, self.id):
                    self._become_follower(self.term, NONE)
                    return
                self.transferee = NONE
            if self.heartbeat_elapsed >= self.config.heartbeat_ticks:
                self.heartbeat_elapsed = 0
                for peer in self.tracker:
                    if peer != self.id:
                        self._send_heartbeat(peer, 0)
        elif self.id in self.voters and (self.election_elapsed >= self.randomized_election_ticks
                                         or self.voters == {self.id}):
            # The only voter has no one to wait for, nor any vote to split: it elects itself on its next tick.
            self._campaign(pre_vote=self.config.pre_vote)

    def in_sync(self, entries_max: int) -> bool:
        """Whether this follower may serve reads of what it applied (committed data only) as a read
        replica: it heard from its leader within an election timeout and has applied to within
        entries_max of the leader's commit as last told."""
        return (self.role == Role.FOLLOWER and self.leader != NONE
                and self.election_elapsed < self.config.election_ticks
                and self.applied >= self.leader_commit - entries_max)

    def campaign(self) -> None:
        """Start an election now rather than after a timeout (etcd's MsgHup): a group whose only voter
        is this node need not wait to lead."""
        if self.role != Role.LEADER and self.id in self.voters:
            self._campaign(pre_vote=self.config.pre_vote)

    # ---- roles -----------------------------------------------------------------------------------

    def _become_follower(self, term: int, leader: int) -> None:
        if term != self.term:
            self.term, self.vote = term, NONE
            self.leader_commit = 0
        self.role, self.leader = Role.FOLLOWER, leader
        self.election_elapsed = 0
        self.transferee = NONE
        self._pending_reads.clear()
        self._reset_election_timeout()

    def _campaign(self, pre_vote: bool, forced: bool = False) -> None:
        if pre_vote:
            self.role, self.leader = Role.PRE_CANDIDATE, NONE
            term = self.term + 1  # asked for, not taken: a pre-vote changes no one's term
            kind = MessageType.PRE_VOTE
        else:
            self.role, self.leader = Role.CANDIDATE, NONE
            self.term += 1
            self.vote = self.id
            term = self.term
            kind = MessageType.VOTE
        self.election_elapsed = 0
        self._reset_election_timeout()
        self.votes = {self.id: True}
        if self._tally() == "won":
            self._on_election_won(pre_vote)
            return
        for peer in self.voters - {self.id}:
            self._send(Message(kind, self.id, peer, term, self.last_term, self.last_index, context=int(forced)))

    def _tally(self) -> str:
        granted = sum(1 for node, granted in self.votes.items() if granted and node in self.voters)
        rejected = sum(1 for node, granted in self.votes.items() if not granted and node in self.voters)
        quorum = len(self.voters) // 2 + 1
        return "won" if granted >= quorum else "lost" if rejected >= quorum else "pending"

    def _on_election_won(self, pre_vote: bool) -> None:
        if pre_vote:
            self._campaign(pre_vote=False)
        else:
            self._become_leader()

    def _become_leader(self) -> None:
        self.role, self.leader = Role.LEADER, self.id
        self.heartbeat_elapsed = 0
        self.election_elapsed = 0
        self.transferee = NONE
        self.tracker.reset(self.voters | self.learners, self.last_index + 1)
        self.tracker[self.id].match = self.stable_index
        self.tracker[self.id].become_replicate()
        conf_pending = [e.index for e in self._entries(self.commit + 1, self.last_index + 1)
                        if e.kind == EntryKind.CONF_CHANGE]
        self.pending_conf_index = conf_pending[-1] if conf_pending else 0
        # An empty entry of the new term lets the leader commit, and so serve reads, promptly.
        self._append([Entry(self.term, self.last_index + 1)])
        self._broadcast_append()

    # ---- the leader's replication: appends and heartbeats to followers, their answers, commit ------------

    def _on_append_response(self, message: Message) -> None:
        if self.role != Role.LEADER or message.sender not in self.tracker:
            return
        progress = self.tracker[message.sender]
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
        if self.role != Role.LEADER or message.sender not in self.tracker:
            return
        progress = self.tracker[message.sender]
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
        progress = self.tracker.get(peer)
        commit = min(self.commit, progress.match) if progress else 0
        self._send(Message(MessageType.HEARTBEAT, self.id, peer, self.term, index=self.ticks, commit=commit,
                           context=context, leader_commit=self.commit))

    def _broadcast_append(self) -> None:
        for peer in self.tracker:
            if peer != self.id:
                self._send_appends_while_room(peer)

    def _send_appends_while_room(self, peer: int) -> None:
        progress = self.tracker[peer]
        while progress.next <= self.last_index and self._send_append(peer):
            if progress.state != Progress.REPLICATE:
                break

    def _send_append(self, peer: int) -> bool:
        """Send the next entries to peer if flow control allows; returns whether anything was sent."""
        progress = self.tracker[peer]
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
        candidate = self.tracker.committed(self.voters)
        # Only entries of the current term are committed by counting (Raft, section 5.4.2).
        if candidate > self.commit and self.term_at(candidate) == self.term:
            self._commit_to(candidate)
            self._broadcast_append()

    def _commit_to(self, index: int) -> None:
        if index > self.commit:
            self.commit = index

    # ---- messages in -----------------------------------------------------------------------------

    def step(self, message: Message) -> None:
        if self.quiet and not self._keeps_quiet(message):
            self.wake()
        if message.term > self.term:
            if message.type in (MessageType.PRE_VOTE, MessageType.VOTE):
                in_lease = (self.config.check_quorum and (self.leader != NONE or self._booting)
                            and self.election_elapsed < self.config.election_ticks)
                if in_lease and not message.context:
                    return  # a leader was heard from recently: a disruptive candidate is ignored
            if message.type == MessageType.PRE_VOTE:
                pass  # a pre-vote never changes our term
            elif message.type == MessageType.PRE_VOTE_RESPONSE and not message.reject:
                pass  # granted pre-votes carry the term we asked for
            else:
                leader = message.sender if message.type in (
                    MessageType.APPEND, MessageType.HEARTBEAT, MessageType.SNAPSHOT) else NONE
                self._become_follower(message.term, leader)
        elif message.term < self.term:
            if message.type in (MessageType.APPEND, MessageType.HEARTBEAT):
                # Tell a stale leader about the new term so it steps down.
                self._send(Message(MessageType.APPEND_RESPONSE, self.id, message.sender, self.term))
            elif message.type == MessageType.PRE_VOTE:
                self._send(Message(MessageType.PRE_VOTE_RESPONSE, self.id, message.sender, self.term, reject=True))
            return
        handler = self._HANDLERS.get(message.type)
        if handler is not None:  # another engine's message (a misrouted or forged one) is dropped
            getattr(self, handler)(message)

    _HANDLERS = {
        MessageType.PRE_VOTE: "_on_vote_request",
        MessageType.VOTE: "_on_vote_request",
        MessageType.PRE_VOTE_RESPONSE: "_on_vote_response",
        MessageType.VOTE_RESPONSE: "_on_vote_response",
        MessageType.APPEND: "_on_append",
        MessageType.HEARTBEAT: "_on_heartbeat",
        MessageType.SNAPSHOT: "_on_snapshot",
        MessageType.APPEND_RESPONSE: "_on_append_response",
        MessageType.HEARTBEAT_RESPONSE: "_on_heartbeat_response",
        MessageType.TIMEOUT_NOW: "_on_timeout_now",
    }

    def _keeps_quiet(self, message: Message) -> bool:
        """Messages that need no timers: the current leader's heartbeats (answered while quiet) and
        plain acknowledgements. Anything else means work, and wakes the group."""
        if message.term != self.term:
            return False
        if message.type == MessageType.HEARTBEAT:
            return message.sender == self.leader
        return message.type == MessageType.HEARTBEAT_RESPONSE or (
            message.type == MessageType.APPEND_RESPONSE and not message.reject)

    def _on_vote_request(self, message: Message) -> None:
        pre_vote = message.type == MessageType.PRE_VOTE
        can_vote = (self.vote == message.sender or (self.vote == NONE and self.leader == NONE)
                    or (pre_vote and message.term > self.term))
        grant = can_vote and self._up_to_date(message.log_term, message.index)
        response = MessageType.PRE_VOTE_RESPONSE if pre_vote else MessageType.VOTE_RESPONSE
        self._send(Message(response, self.id, message.sender, message.term if grant else self.term, reject=not grant))
        if grant and not pre_vote:
            self.vote = message.sender
            self.election_elapsed = 0

    def _on_vote_response(self, message: Message) -> None:
        expected = Role.PRE_CANDIDATE if message.type == MessageType.PRE_VOTE_RESPONSE else Role.CANDIDATE
        if self.role != expected:
            return
        self.votes[message.sender] = not message.reject
        outcome = self._tally()
        if outcome == "won":
            self._on_election_won(expected == Role.PRE_CANDIDATE)
        elif outcome == "lost":
            self._become_follower(self.term, NONE)

    def _on_append(self, message: Message) -> None:
        self.leader = message.sender
        self.election_elapsed = 0
        if self.role != Role.FOLLOWER:
            self._become_follower(message.term, message.sender)
        if message.index < self.commit:
            self._send(Message(MessageType.APPEND_RESPONSE, self.id, message.sender, self.term, index=self.commit))
            return
        if self.term_at(message.index) != message.log_term:
            self._send(Message(MessageType.APPEND_RESPONSE, self.id, message.sender, self.term,
                               index=message.index, reject=True, reject_hint=min(message.index - 1, self.last_index)))
            return
        self._append(list(message.entries))
        last_new = message.index + len(message.entries)
        self.leader_commit = max(self.leader_commit, message.commit)
        self._commit_to(min(message.commit, last_new))
        self._send(Message(MessageType.APPEND_RESPONSE, self.id, message.sender, self.term, index=last_new))

    def _on_heartbeat(self, message: Message) -> None:
        self.leader = message.sender
        self.election_elapsed = 0
        if self.role != Role.FOLLOWER:
            self._become_follower(message.term, message.sender)
        self.leader_commit = max(self.leader_commit, message.leader_commit, message.commit)
        self._commit_to(min(message.commit, self.last_index))
        if message.quiesce:
            # Go quiet only when holding everything the leader has committed; otherwise ask for it.
            self.quiet = self.commit == self.last_index == message.commit
            if self.quiet:
                return
        self._send(Message(MessageType.HEARTBEAT_RESPONSE, self.id, message.sender, self.term, index=message.index,
                           context=message.context))

    def _on_snapshot(self, message: Message) -> None:
        snapshot = message.snapshot
        if snapshot is None:
            return  # only a forged message lacks it (the codec refuses one from the wire)
        self.leader = message.sender
        self.election_elapsed = 0
        if self.role != Role.FOLLOWER:
            self._become_follower(message.term, message.sender)
        if snapshot.index <= self.commit:
            self._send(Message(MessageType.APPEND_RESPONSE, self.id, message.sender, self.term, index=self.commit))
            return
        if self.term_at(snapshot.index) == snapshot.term:
            # We already hold the entries the snapshot covers: keep the log after it.
            self.log = self.log[snapshot.index - self.snapshot.index:]
        else:
            self.log = []
        self.snapshot = snapshot
        self._reload_configuration()
        self.stable_index = max(min(self.stable_index, self.last_index), snapshot.index)
        self.commit = snapshot.index
        self.applied = snapshot.index
        self._snapshot_to_install = snapshot
        self._send(Message(MessageType.APPEND_RESPONSE, self.id, message.sender, self.term, index=self.last_index))

    def _on_timeout_now(self, message: Message) -> None:
        if self.id in self.voters:
            self._campaign(pre_vote=False, forced=True)

    # ---- messages out ----------------------------------------------------------------------------

    def _send(self, message: Message) -> None:
        self._outbox.append(message)

    # ---- Ready -----------------------------------------------------------------------------------

    def has_ready(self) -> bool:
        return bool(self._outbox or self._read_states or self._snapshot_to_install
                    or self.last_index > self.stable_index or min(self.commit, self.stable_index) > self.applied
                    or (self.term, self.vote, self.commit) != self._last_hard_state)  # equal to a HardState alike

    def ready(self) -> Ready:
        hard_state = HardState(self.term, self.vote, self.commit)
        committed_high = min(self.commit, self.stable_index)  # apply only what this node has persisted
        return Ready(
            hard_state=hard_state if hard_state != self._last_hard_state else None,
            entries=self._entries(self.stable_index + 1, self.last_index + 1) if self.last_index > self.stable_index
            else [],
            snapshot=self._snapshot_to_install,
            committed_entries=self._entries(self.applied + 1, committed_high + 1) if committed_high > self.applied
            else [],
            messages=list(self._outbox),
            read_states=list(self._read_states),
        )

    def advance(self, ready: Ready) -> None:
        """The caller has persisted ready's state and entries, sent its messages and applied its entries."""
        if ready.hard_state is not None:
            self._last_hard_state = ready.hard_state
        if ready.entries:
            self.stable_index = max(self.stable_index, ready.entries[-1].index)
        if ready.snapshot is not None and self._snapshot_to_install is ready.snapshot:
            self._snapshot_to_install = None
        if ready.committed_entries:
            self.applied = ready.committed_entries[-1].index
        del self._outbox[: len(ready.messages)]
        del self._read_states[: len(ready.read_states)]
        if self.role == Role.LEADER and self.tracker[self.id].acknowledge(self.stable_index):
            self._maybe_commit()
