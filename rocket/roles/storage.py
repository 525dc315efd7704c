"""The storage role: hosts the node's store (one group until multi-raft arrives) and its flusher."""

from __future__ import annotations

import trio

from rocket.config import NodeConfig
from rocket.store.group import Store


class StorageRole:
    def __init__(self, config: NodeConfig):
        self.store = Store.open(config.data_dir / "storage" / "group-0", segment_bytes_max=config.segment_bytes)

    async def serve(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Run the group-commit flusher until cancelled; pending appends are flushed on the way out."""
        await self.store.run(task_status=task_status)
