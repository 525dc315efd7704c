"""A file-tailing source that keeps its read position in a KV bucket and survives kill -9 without sending a line
twice or skipping one.

Each batch of lines and the new position go into the bucket in ONE transaction, guarded by the position's revision:
either both land or neither does, and a second copy of the source that raced this one fails its compare instead of
writing twice. The lines land as keys {SOURCE}/line/<number>; the hash tag {SOURCE} puts them and the position in one
shard, which is what makes the transaction possible.

    python examples/kv_checkpoint.py access.log --bucket tail [--source web-1] [--follow] [--server HOST:PORT]

Restart it after a crash with the same arguments: it resumes after the last batch that landed.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import orjson
import trio

from rocket.client import connect
from rocket.client.kv import KV
from rocket.errors import Code, RocketError

BATCH_LINES = 100  # lines per transaction, under the server's 128 operations
POLL_S = 0.2  # --follow: how often to look for new lines


async def checkpoint(kv: KV, bucket: str, source: str) -> tuple[int, int, int]:
    """(byte offset, lines done, revision of the position key; 0 when there is none yet)"""
    try:
        entry = await kv.get(bucket, f"{{{source}}}/position")
    except RocketError as error:
        if error.code != Code.NOT_FOUND:
            raise
        return 0, 0, 0
    position = orjson.loads(entry.value)
    return position["offset"], position["lines"], entry.revision


async def tail(path: Path, bucket: str, source: str, server: str | None, follow: bool) -> int:
    async with connect(server) as channel:
        kv = KV(channel)
        if not any(info["name"] == bucket for info in await kv.list_buckets()):
            try:
                await kv.create_bucket(bucket)
            except RocketError as error:
                if error.code != Code.BUCKET_EXISTS:
                    raise
        offset, lines_done, revision = await checkpoint(kv, bucket, source)
        with path.open("rb") as handle:
            while True:
                handle.seek(offset)
                batch = []
                for line in handle:
                    if not line.endswith(b"\n"):
                        break  # a line still being written: take it once it is whole
                    batch.append(line)
                    if len(batch) == BATCH_LINES:
                        break
                if not batch:
                    if not follow:
                        return lines_done
                    await trio.sleep(POLL_S)
                    continue
                end = offset + sum(len(line) for line in batch)
                position = orjson.dumps({"offset": end, "lines": lines_done + len(batch)})
                guard = {"key": f"{{{source}}}/position", "op": "==", "number": revision,
                         "target": "revision" if revision else "create_revision"}
                puts = [{"op": "put", "key": f"{{{source}}}/line/{lines_done + number:012}", "value": line[:-1]}
                        for number, line in enumerate(batch, start=1)]
                result = await kv.txn(bucket, [guard], [*puts, {"op": "put", "key": f"{{{source}}}/position",
                                                                "value": position}])
                if not result["succeeded"]:  # another copy of this source moved on: continue from its position
                    offset, lines_done, revision = await checkpoint(kv, bucket, source)
                    continue
                offset, lines_done, revision = end, lines_done + len(batch), result["results"][-1]["revision"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("file", type=Path)
    parser.add_argument("--bucket", required=True)
    parser.add_argument("--source", help="The name positions and lines are kept under (the file's name by default).")
    parser.add_argument("--follow", action="store_true", help="Keep waiting for new lines.")
    parser.add_argument("--server", default=os.environ.get("ROCKET_SERVER"))
    arguments = parser.parse_args()
    done = trio.run(tail, arguments.file, arguments.bucket, arguments.source or arguments.file.name, arguments.server,
                    arguments.follow)
    print(f"{done} lines checkpointed")


if __name__ == "__main__":
    main()
