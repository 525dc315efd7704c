"""A nursery for tasks that outlive the call that starts them (a link's sender, a pooled connection, a watch's
followers): run() holds it until cancelled."""

from __future__ import annotations

import trio


class Background:
    _nursery: trio.Nursery | None = None  # set once run() started

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            await trio.sleep_forever()
