"""The node's pool of channels to its peers (rocket.transport.pool.ChannelPool) as the node shuts down."""

from __future__ import annotations

import trio

from rocket.transport.pool import ChannelPool


async def test_a_call_that_a_shutdown_cancels_ends_cancelled_not_on_the_closed_pool():
    """A heartbeat takes the pool's free opening lock just as SIGTERM cancels the node: the lock's last checkpoint is
    shielded, so the pool's nursery may close before the call goes on. The call ends Cancelled, as every task of the
    node does, and never raises RuntimeError ("Nursery is closed to new arrivals"), which crashed a stopping node.
    Which task trio runs first in a batch is random: 40 rounds meet the race about 20 times."""
    for _ in range(40):
        pool = ChannelPool()
        async with trio.open_nursery() as nursery:
            await nursery.start(pool.run)
            nursery.start_soon(pool.channel, ("127.0.0.1", 9))
            await trio.lowlevel.checkpoint()  # the call now waits in the lock's shielded checkpoint
            nursery.cancel_scope.cancel()
