"""A storage node's last assignment on its own disk (`assignment.json` in the data directory), so that a node
restarted while no nameserver answers rejoins its groups from it; the next heartbeat's answer reconciles. The file is
an 8-digit hex CRC-32C of the body, a newline, and the body: JSON of the node, the metadata version, groups and nodes.
"""

from __future__ import annotations

import logging
from pathlib import Path

import orjson
from crc32c import crc32c

from rocket.disk.files import replace_durably

log = logging.getLogger("rocket.storage")

FILE_NAME = "assignment.json"
FORMAT = 1


def encode(node: int, assignment: dict) -> bytes:
    body = orjson.dumps({"format": FORMAT, "node": node, "version": assignment["version"],
                         "groups": assignment["groups"], "nodes": assignment["nodes"]})
    return b"%08x\n" % crc32c(body) + body


def decode(node: int, data: bytes) -> dict:
    """The assignment a file holds; ValueError says why it cannot be used."""
    checksum, newline, body = data[:8], data[8:9], data[9:]
    try:
        expected = int(checksum, 16)
    except ValueError:
        raise ValueError("it does not start with a checksum") from None
    if newline != b"\n" or crc32c(body) != expected:
        raise ValueError("its checksum does not match (damaged)")
    saved = orjson.loads(body)
    if saved.get("format") != FORMAT:
        raise ValueError(f"its format is {saved.get('format')!r}, not {FORMAT}")
    if saved.get("node") != node:
        raise ValueError(f"it is node {saved.get('node')}'s, not node {node}'s")
    return {"version": saved["version"], "groups": saved["groups"], "nodes": saved["nodes"], "unchanged": False}


def save(directory: Path, node: int, assignment: dict) -> None:
    """Write the assignment whole (replace_durably: a temporary, fsync, rename, directory fsync)."""
    replace_durably(directory / FILE_NAME, encode(node, assignment))


def load(directory: Path, node: int) -> dict | None:
    """The assignment saved last, or None when there is none or it is damaged (reported: the node then waits for a
    nameserver, as a new node does)."""
    path = directory / FILE_NAME
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    try:
        return decode(node, data)
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        log.error("%s cannot be used, so this node waits for a nameserver to learn its groups: %s", path, error)
        return None
