"""A controller-mode group's replica (RIP-44): master-slave replication whose master a controller names, on the Raft
core's log and replication. ControlledCore says how it differs from Raft, and why nothing acknowledged is lost."""

from __future__ import annotations

import dataclasses

from rocket.errors import Code, RocketError, invariant
from rocket.raft.core import RaftCore
from rocket.raft.types import NONE, Config, Entry, HardState, Message, MessageType, Role, Snapshot
from rocket.replication import Control, SyncStateRequest


class ControlledCore(RaftCore):
    """A controller-mode replica: the Raft core (core.py) with the parts that differ replaced. A group's storage class
    chooses its core; both run on the same host (host.py, add_group). With RaftCore a majority commits and the voters
    elect; with this core the controller names the master, and every member of the SyncStateSet must hold an entry
    before it is acknowledged. The state machine (store/), the storage role's handlers and the broker do not know
    which core a group has: a proposal, a read barrier, "who leads" and "who lags" mean the same on both
    (replication.Engine).

    The controller (rocket.roles.nameserver.controller; its state in the nameservers' metadata, or standalone in its
    own group's, rocket.roles.controller) holds, per group, the master, its epoch (master_epoch), the SyncStateSet
    (SSS: the replicas known to hold everything acknowledged) and the SSS's epoch (sync_state_set_epoch), and tells
    each replica through its assignment, or the standalone controller's heartbeat answers (control()). The storage node learns the controller's word from its heartbeat's answer
    (roles/storage/assignment.py, Assignments._control_of), and as master asks the controller for SSS changes
    (roles/storage/replicas.py, sync_states_forever: ControllerAlterSyncStateSet). What differs from Raft:
    - no elections: the controller's word makes a master (at its epoch, the core's term) or a slave;
    - an entry is committed (acknowledged) once every member of the SSS holds it durably, and, while a change of the
      SSS is asked of the controller, every member of the new set too: the commit waits for the union of both;
    - the master asks for a slave behind for ha_max_lag_s to leave the SSS, and for one that caught up to rejoin
      (sync_state_request); only the controller's answer changes the SSS;
    - a slave that meets a new master first compares epochs with it (EPOCH_QUERY, EPOCH_ANSWER: Kafka's leader-epoch
      truncation) and truncates what lies past the last entry they agree on; only then does it accept entries. Each
      entry carries its epoch (its term), so the epoch list, (epoch, start offset), is read off the log and its
      snapshot: it is persisted with them, in the WAL.
    Replication itself (pipelined appends, flow control, snapshots to a slave far behind, persist before send) is the
    Raft core's, as is the log.

    Why nothing acknowledged is lost, and why a master cut off from the controller is fenced. One invariant carries
    it: every member of the controller's SSS holds every acknowledged entry.
    1. A master acknowledges an entry only once every member of its SSS holds it durably (persist before send: a
       slave's answer comes after its fsync), and, while a change of the set is asked of the controller, every member
       of the requested set too (the union). This is the fix of apache/rocketmq#5663, where an expansion was applied
       by the controller, its answer lost, and the master went on acknowledging with the old, smaller set.
    2. The controller's set changes in two ways only. (a) A master's request, applied only when it names the current
       master_epoch and sync_state_set_epoch (else FENCED): a shrink keeps members who hold everything; a joining
       replica held everything committed when the master asked, and by (1) every later acknowledgement waited for
       it. (b) An election, which picks the new master from the set (so it holds everything, by the invariant) and
       makes the set that master alone, at the next epochs.
    3. The fence. A master changes its own set only on the controller's answer. One that cannot reach the controller
       therefore keeps every member it had, and the controller's set is always that set or the one it asked for,
       until an election; an elected successor is a member of it. Before the successor learns it is master, whatever
       the old master acknowledges the successor holds, and keeps: its log becomes the group's. Once it knows, it
       answers the old master's appends with its newer epoch, which deposes it: no acknowledgement without it. So
       the old master never acknowledges alone behind the controller's back, and two masters never acknowledge in
       the same epoch (the controller gives each epoch one master).
    4. A slave that meets a new master truncates only past the last entry both logs agree on (the epoch handshake),
       and never below its commit: committed entries are in every later master's log, by the invariant.
    5. An unclean election (`--unclean-election`, from outside the set, when no member is up) breaks the invariant
       on purpose; it is recorded with the offsets that may be lost.

    The price of the fence: while the controller is unreachable, a master still serves, but cannot drop a slave that
    stopped answering, so its writes wait for that slave (ha_max_lag_s passes, the request fails, and writes stall)
    until the controller is back or the slave returns. A restarted master keeps its whole durable log (entries past
    its commit included) and re-replicates them before new ones are committed; offsets are given at apply, in log
    order, on every replica alike, so no two messages share an offset after such a restart (apache/rocketmq#7689)."""

    def __init__(self, config: Config, hard_state: HardState = HardState(), entries: list[Entry] | None = None,
                 snapshot: Snapshot | None = None):
        super().__init__(dataclasses.replace(config, check_quorum=False, pre_vote=False), hard_state, entries,
                         snapshot)
        self.sync_state_set: frozenset[int] = frozenset()
        self.sync_state_set_epoch = 0
        self.min_in_sync_replicas = 1
        self.lag_ticks_max = 50
        self.requested: SyncStateRequest | None = None  # asked of the controller, not yet answered
        # A master back at the epoch it held before a restart forgot the request it had pending, which may still be
        # applied (in flight), or be applied already while the word it got is older: until the controller applies a
        # request of this incarnation, the commit waits for every replica.
        self._unsure = False
        self._synced_with: tuple[int, int] | None = None  # (epoch, master) whose epochs this slave compared
        self._query_tick = -1  # a slave asks a master for its epochs at most once a tick
        self._caught_up_tick: dict[int, int] = {}  # slave -> the last tick it reached the master's mark
        self._led_since_tick = 0  # when this replica became master: an SSS member not heard since is given that long
        # Slaves outside the SSS that keep up: the commit waits for them too (never unsafe), so that one soon holds
        # everything committed and may be asked in; under steady writes it otherwise trails the commit by an entry.
        self._joining: frozenset[int] = frozenset()
        self._mark: dict[int, int] = {}  # slave -> the master's log end when it last reached the mark

    # ---- the controller's word -----------------------------------------------------------------

    def control(self, control: Control) -> None:
        """Follow the controller: become master or slave at its epoch, and take its SSS. A word from an epoch
        older than this replica's is stale (a new master's appends brought the news first) and ignored."""
        self.min_in_sync_replicas = control.min_in_sync_replicas
        self.lag_ticks_max = control.lag_ticks_max
        if control.master_epoch < self.term:
            return
        if control.master == self.id:
            if control.master_epoch > self.term or self.role != Role.LEADER:
                unsure = control.master_epoch == self.term  # a restart: see _unsure
                self.term, self.vote = control.master_epoch, NONE
                self._become_leader()
                self._unsure = unsure
            if control.sync_state_set_epoch > self.sync_state_set_epoch:
                requested = self.requested
                self.sync_state_set = control.sync_state_set | {self.id}
                self.sync_state_set_epoch = control.sync_state_set_epoch
                if requested is not None and requested.sync_state_set_epoch < self.sync_state_set_epoch:
                    self.requested = None  # answered: applied (this is it) or superseded
                    if (requested.sync_state_set_epoch + 1, requested.sync_state_set) == (
                            self.sync_state_set_epoch, self.sync_state_set):
                        self._unsure = False  # this incarnation's request applied: none of an earlier one can be
                self._maybe_commit()
        elif control.master_epoch > self.term or self.leader != control.master or self.role != Role.FOLLOWER:
            invariant(control.master_epoch > self.term or self.role != Role.LEADER, "one master per epoch")
            self._become_follower(control.master_epoch, control.master)
            self.wake()

    def sync_state_request(self) -> SyncStateRequest | None:
        """As master: the change of the SSS to ask of the controller, if one is wanted (slaves behind for
        lag_ticks_max leave; slaves that keep up join once they hold everything committed, the commit waiting for
        them meanwhile). Until it is answered, the commit waits for the old and the new set both, and the same request
        is returned (to send again)."""
        if self.role != Role.LEADER:
            return None
        if self.requested is not None:
            return self.requested
        current = self.sync_state_set
        behind = {node for node in current - {self.id}
                  if self.ticks - self._caught_up_tick.get(node, self._led_since_tick) > self.lag_ticks_max}
        self._joining = frozenset(
            node for node in self.voters - current if node in self.tracker
            and self.ticks - self._caught_up_tick.get(node, -self.lag_ticks_max - 1) <= self.lag_ticks_max)
        self._maybe_commit()  # a slave that stopped keeping up no longer holds it back
        joining = {node for node in self._joining if self.tracker[node].match >= self.commit}
        wanted = (current - behind) | joining
        if wanted == current and not self._unsure:
            return None  # (an unsure master asks for its set as it is: that moves the controller's epoch past any
            # request of its previous incarnation)
        self.requested = SyncStateRequest(self.id, self.term, self.sync_state_set_epoch, frozenset(wanted))
        return self.requested

    def sync_state_refused(self, request: SyncStateRequest) -> None:
        """The controller refused the request for good (not for a stale epoch: then its control() brings what
        holds): it was not applied, so the commit no longer waits for its set."""
        if self.requested == request:
            self.requested = None
            self._maybe_commit()

    # ---- what differs from Raft ----------------------------------------------------------------

    def campaign(self) -> None:
        """No elections: the controller names the master."""

    def _campaign(self, pre_vote: bool, forced: bool = False) -> None:
        pass  # the election timer runs on, so that in_sync() tells a slave whose master went silent

    def _on_vote_request(self, message: Message) -> None:
        pass

    def _on_timeout_now(self, message: Message) -> None:
        pass

    def transfer_leadership(self, to: int) -> None:
        raise RocketError(Code.BAD_REQUEST, "a controller-mode group's master is the controller's choice")

    def propose_conf_change(self, action: str, node: int) -> int:
        """A replica replaced (the nameservers' move): the new one joins as a learner, is promoted (a slave outside
        the SSS, which the master asks the controller to let in once it holds everything committed), and the old one
        is removed only once it is out of the SSS and out of any set asked for (the controller drops it first): the
        commit never waits for a replica that is gone, and every member of the set still holds everything."""
        if action == "remove" and (node in self.sync_state_set
                                   or (self.requested is not None and node in self.requested.sync_state_set)):
            raise RocketError(Code.UNAVAILABLE, f"node {node} is in the SyncStateSet {sorted(self.sync_state_set)}: "
                              "the controller drops it before it is removed; retry")
        return super().propose_conf_change(action, node)

    def _apply_conf_change(self, data: bytes) -> None:
        super()._apply_conf_change(data)
        if self.role == Role.LEADER:
            self._joining &= self.voters  # a removed slave no longer holds the commit back

    def lease_valid(self) -> bool:
        return False  # no leases: a deposed master learns of its successor only from it or the controller

    def _confirmed(self, acknowledged: set[int]) -> bool:
        """A read is confirmed by every member of the SSS: a successor is elected from it, and would answer with
        its newer epoch (which deposes this master) instead."""
        return self.sync_state_set <= acknowledged | {self.id}

    def check_proposable(self) -> None:
        if self.role == Role.LEADER and len(self.sync_state_set) < self.min_in_sync_replicas:
            raise RocketError(Code.NOT_ENOUGH_REPLICAS, f"{len(self.sync_state_set)} replicas are in sync; the "
                              f"storage class needs {self.min_in_sync_replicas}")
        super().check_proposable()

    def _become_leader(self) -> None:
        super()._become_leader()
        self.requested, self._joining = None, frozenset()
        # A slave keeps up once it holds the log as it is now, then each time it reaches where the log ended the time
        # before; one that never does (down) keeps up never: it joins nothing and holds no commit back.
        self._led_since_tick, self._caught_up_tick = self.ticks, {}
        self._mark = {node: self.last_index for node in self.voters}

    def _become_follower(self, term: int, leader: int) -> None:
        self._unsure = False
        if self.role == Role.LEADER:
            self.requested = None
            self.sync_state_set, self.sync_state_set_epoch = frozenset(), 0  # the controller tells again
        super()._become_follower(term, leader)

    def _maybe_commit(self) -> None:
        """Commit what every member of the SSS holds, and of the set asked for while a change is pending."""
        if self.role != Role.LEADER or not self.sync_state_set:
            return
        required = (self.sync_state_set | self._joining
                    | (self.requested.sync_state_set if self.requested else frozenset[int]()))
        if self._unsure:
            required |= self.voters
        candidate = min(self.tracker[node].match if node in self.tracker else 0 for node in required | {self.id})
        if candidate > self.commit and self.term_at(candidate) == self.term:
            self._commit_to(candidate)
            self._broadcast_append()

    def tick(self) -> None:
        super().tick()
        if self.role == Role.LEADER and not self.quiet:
            for node, progress in self.tracker.items():
                if node != self.id and progress.match >= self._mark.get(node, self.last_index):
                    self._caught_up_tick[node] = self.ticks
                    self._mark[node] = self.last_index

    # ---- epochs: a slave meets a master --------------------------------------------------------

    _HANDLERS = {**RaftCore._HANDLERS, MessageType.EPOCH_QUERY: "_on_epoch_query",
                 MessageType.EPOCH_ANSWER: "_on_epoch_answer"}

    def _on_append(self, message: Message) -> None:
        if self._synced_with != (self.term, message.sender):
            self.leader = message.sender
            self.election_elapsed = 0
            if self.role != Role.FOLLOWER:
                self._become_follower(message.term, message.sender)
            if self._query_tick != self.ticks:
                self._query_tick = self.ticks
                self._send(Message(MessageType.EPOCH_QUERY, self.id, message.sender, self.term,
                                   log_term=self.last_term, index=self.last_index))
            return
        super()._on_append(message)

    def epoch_end(self, epoch: int) -> tuple[int, int]:
        """(the largest epoch up to epoch that this log knows, the index after that epoch's last entry): where an
        entry of a later epoch starts, or the log's end."""
        end = self.last_index + 1
        for entry in self.log:
            if entry.term > epoch:
                end = entry.index
                break
        known = self.term_at(end - 1)
        return (known if known is not None else self.snapshot.term), end

    def _on_epoch_query(self, message: Message) -> None:
        """As master: answer where the slave's last epoch ends here, and replicate from there."""
        if self.role != Role.LEADER or message.sender not in self.tracker:
            return
        epoch, end = self.epoch_end(message.log_term)
        self._send(Message(MessageType.EPOCH_ANSWER, self.id, message.sender, self.term, log_term=epoch, index=end,
                           context=message.log_term, reject_hint=message.index))  # the query it answers
        progress = self.tracker[message.sender]
        progress.become_probe()
        progress.next = max(progress.match + 1, min(end, message.index + 1))
        self._send_append(message.sender)

    def _on_epoch_answer(self, message: Message) -> None:
        """As slave: truncate past the last entry both logs agree on (never below the commit: committed entries
        are in every later master's log), then accept this master's entries. A truncation is written with the
        next entries (they replace the log from their index on); if the slave restarts first, it asks again."""
        if message.sender != self.leader or self.role != Role.FOLLOWER or self._synced_with == (self.term, self.leader):
            return  # a late answer would truncate entries accepted (and acknowledged) since
        if (message.context, message.reject_hint) != (self.last_term, self.last_index):
            return  # an answer to a query about another log end (before a restart, or entries since)
        _, own_end = self.epoch_end(message.log_term)
        keep = max(min(message.index, own_end) - 1, self.commit, self.snapshot.index)
        if keep < self.last_index:
            del self.log[keep - self.snapshot.index:]
            self.stable_index = min(self.stable_index, keep)
            self._reload_configuration()
        self._synced_with = (self.term, message.sender)
