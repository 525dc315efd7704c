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
