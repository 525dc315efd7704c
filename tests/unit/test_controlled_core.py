"""ControlledCore alone (the simulator in tests/sim/test_controller_sim.py tries it under faults): what a master waits
for before it acknowledges."""

from __future__ import annotations

from rocket.raft.controlled import Control, ControlledCore
from rocket.raft.types import Config, Message, MessageType, Role


def persist(core: ControlledCore) -> None:
    """Everything the core asks for is written and sent (to no one), as a host does."""
    while core.has_ready():
        core.advance(core.ready())


def test_a_new_master_alone_in_its_set_acknowledges_at_once_with_its_old_master_down():
    """Elected with the SyncStateSet itself alone, a master commits on its own copy: the old master, down, neither
    holds its commits back as a slave that could join nor for ha_max_lag_s (it once did, for 5 s, in a real failover)."""
    core = ControlledCore(Config(2, (1, 2)))
    core.control(Control(1, 1, frozenset({1, 2}), 1))
    persist(core)
    core.control(Control(2, 2, frozenset({2}), 2, lag_ticks_max=50))
    assert core.role == Role.LEADER and core.term == 2
    for _ in range(3):  # the storage role asks every controller_sync_state_s
        core.tick()
        assert core.sync_state_request() is None  # the old master, silent, is not asked in
    index = core.propose(b"after the failover")
    persist(core)
    assert core.commit >= index


def test_a_slave_that_keeps_up_is_waited_for_and_then_asked_in():
    """A slave outside the set that answers: the commit waits for it (so that it soon holds everything committed),
    then the master asks the controller to add it; until the answer, the commit waits for it too."""
    core = ControlledCore(Config(2, (1, 2)))
    core.control(Control(2, 2, frozenset({2}), 2, lag_ticks_max=50))
    first = core.propose(b"one")
    persist(core)
    assert core.commit >= first
    core.step(Message(MessageType.APPEND_RESPONSE, 1, 2, 2, index=core.last_index))
    core.tick()
    request = core.sync_state_request()
    assert request is not None and request.sync_state_set == frozenset({1, 2})
    second = core.propose(b"two")
    persist(core)
    assert core.commit < second  # the slave asked in must hold it first
    core.step(Message(MessageType.APPEND_RESPONSE, 1, 2, 2, index=second))
    assert core.commit >= second


def test_a_replica_is_replaced_as_a_learner_then_a_slave_and_the_old_one_removed_only_out_of_the_set():
    """Master 2 with slave 1 in its set; node 3 replaces node 1. A learner, then a voter outside the set that the
    master asks in once it keeps up; node 1 may be removed only once the controller dropped it from the set, and the
    commit then waits for it no more."""
    from rocket.errors import Code, RocketError

    core = ControlledCore(Config(2, (1, 2)))
    core.control(Control(2, 2, frozenset({1, 2}), 2, lag_ticks_max=50))
    persist(core)
    core.propose_conf_change("add_learner", 3)
    persist(core)
    core.step(Message(MessageType.APPEND_RESPONSE, 1, 2, 2, index=core.last_index))
    persist(core)
    assert 3 in core.learners and core.commit == core.last_index  # the learner holds nothing back
    core.propose_conf_change("promote", 3)
    persist(core)
    for node in (1, 3):
        core.step(Message(MessageType.APPEND_RESPONSE, node, 2, 2, index=core.last_index))
    persist(core)
    core.tick()
    request = core.sync_state_request()
    assert 3 in core.voters and request is not None and request.sync_state_set == frozenset({1, 2, 3})
    try:
        core.propose_conf_change("remove", 1)
        raise AssertionError("removed a member of the SyncStateSet")
    except RocketError as error:
        assert error.code == Code.UNAVAILABLE and "SyncStateSet" in error.message
    core.control(Control(2, 2, frozenset({2, 3}), 4, lag_ticks_max=50))  # node 3 in, node 1 dropped by the controller
    core.propose_conf_change("remove", 1)
    persist(core)
    core.step(Message(MessageType.APPEND_RESPONSE, 3, 2, 2, index=core.last_index))
    assert 1 not in core.voters and core.commit == core.last_index  # node 1, gone, holds nothing back
