"""The schema version each peer said when its Raft link last connected, kept in the data dir (PEER_VERSIONS_FILE), so
that a node restarted while a peer is unreachable still knows what release it runs (Engine.replicas_speak)."""

from __future__ import annotations

import logging
from pathlib import Path

import orjson
import trio

from rocket.disk.files import replace_durably

log = logging.getLogger("rocket.raft")

PEER_VERSIONS_FILE = "peer_versions.json"


def load(path: Path) -> dict[int, int]:
    """peer -> version, as kept; none from a missing or unreadable file (each is learnt again as its link connects)."""
    try:
        return {int(node): int(version) for node, version in orjson.loads(path.read_bytes()).items()}
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, TypeError, AttributeError) as error:
        log.warning("%s: cannot read the peers' schema versions (%s): each is learnt again when its link connects",
                    path, error)
        return {}


async def keep(path: Path, versions: dict[int, int]) -> None:
    """Write the map whole (in a worker thread: it fsyncs); a file that cannot be written (a full disk) is logged, and
    the versions stay known until the node restarts."""
    data = orjson.dumps({str(node): version for node, version in versions.items()})
    try:
        await trio.to_thread.run_sync(replace_durably, path, data)
    except OSError as error:
        log.warning("%s: cannot keep the peers' schema versions: %s", path, error)
