"""KV commands (RIP-22): buckets, and put, get, cas, del, ls, watch, txn, export and import of keys."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Annotated, Optional

import orjson
import typer
from rich.table import Table

from rocket.cli.common import Serde, Server, Transport, out, plural, runs_client, size, usage_error
from rocket.client import connect
from rocket.client.kv import KV, Entry
from rocket.errors import RocketError
from rocket.model import parse_duration_s

app = typer.Typer(no_args_is_help=True, help="Key-value buckets: put, get, compare-and-set, scan, watch, export.")
bucket_app = typer.Typer(no_args_is_help=True, help="Create, list, describe and delete buckets.")
app.add_typer(bucket_app, name="bucket")

Bucket = Annotated[str, typer.Argument(help="The bucket.", show_default=False)]
Key = Annotated[str, typer.Argument(help="The key.", show_default=False)]
Format = Annotated[str, typer.Option("--format", help="text or json.")]


def _duration_s(text: str | None, option: str) -> float | None:
    if text is None:
        return None
    try:
        return parse_duration_s(text)
    except RocketError as error:
        usage_error(f"{option}: {error.message}")


def _format(output_format: str) -> str:
    if output_format not in ("text", "json"):
        usage_error(f"--format {output_format!r}: expected text or json")
    return output_format


def _entry_json(entry: Entry) -> bytes:
    return orjson.dumps({"key": entry.key, "value": entry.value.decode("utf-8", "replace"),
                         "revision": entry.revision, "create_revision": entry.create_revision,
                         "version": entry.version, "expires_ms": entry.expires_ms}) + b"\n"


def _ttl_text(ttl_ms: int) -> str:
    return f"{ttl_ms / 1000:g}s" if ttl_ms else "none"


# ---- buckets ---------------------------------------------------------------------------------------------

@bucket_app.command("create")
@runs_client
async def bucket_create(name: Bucket,
                        shards: Annotated[int, typer.Option("--shards", help="Storage groups the keys hash onto.")] = 1,
                        history: Annotated[int, typer.Option("--history", help="Revisions kept per key.")] = 1,
                        ttl: Annotated[Optional[str], typer.Option("--ttl", help="The keys' default TTL (30s, 1h); none by default.")] = None,
                        storage_class: Annotated[str, typer.Option("--storage-class", help="The storage class whose groups hold the shards (rocket cluster storage-class list).")] = "raft",
                        server: Server = None, transport: Transport = "tcp", serde: Serde = "lane") -> None:
    """Create a bucket."""
    ttl_s = _duration_s(ttl, "--ttl") or 0
    async with connect(server, transport, serde) as channel:
        info = await KV(channel).create_bucket(name, shards, history, ttl_s, storage_class)
    out.print(f"created bucket [bold]{info['name']}[/bold] with {plural(info['shards'], 'shard')}, history "
              f"{info['history']}, ttl {_ttl_text(info['ttl_ms'])}")


@bucket_app.command("list")
@runs_client
async def bucket_list(output_format: Format = "text", server: Server = None, transport: Transport = "tcp",
                      serde: Serde = "lane") -> None:
    """List buckets."""
    _format(output_format)
    async with connect(server, transport, serde) as channel:
        buckets = await KV(channel).list_buckets()
    if output_format == "json":
        sys.stdout.buffer.write(b"".join(orjson.dumps(info) + b"\n" for info in buckets))
        return
    table = Table("bucket", "shards", "history", "ttl", "created")
    for info in buckets:
        table.add_row(info["name"], str(info["shards"]), str(info["history"]), _ttl_text(info["ttl_ms"]),
                      time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(info["created_ms"] / 1000)))
    out.print(table)


@bucket_app.command("describe")
@runs_client
async def bucket_describe(name: Bucket, output_format: Format = "text", server: Server = None,
                          transport: Transport = "tcp", serde: Serde = "lane") -> None:
    """Each shard's group, leader, revision, keys, bytes and digest (equal on every replica at a revision, and
    after a rebuild from the log). Reads every key: slow on big buckets."""
    _format(output_format)
    async with connect(server, transport, serde) as channel:
        described = await KV(channel).describe_bucket(name)
    if output_format == "json":
        sys.stdout.buffer.write(orjson.dumps(described) + b"\n")
        return
    info = described["bucket"]
    table = Table("shard", "group", "leader", "revision", "keys", "bytes", "digest",
                  title=f"bucket {info['name']}: history {info['history']}, ttl {_ttl_text(info['ttl_ms'])}")
    for shard in described["shards"]:
        table.add_row(str(shard["shard"]), str(shard["group"]), str(shard["leader"]), f"{shard['revision']:,}",
                      f"{shard['keys']:,}", size(shard["bytes"]), shard["digest"])
    out.print(table)


@bucket_app.command("delete")
@runs_client
async def bucket_delete(name: Bucket, server: Server = None, transport: Transport = "tcp",
                        serde: Serde = "lane") -> None:
    """Delete a bucket and every key in it (watchers see the keys go)."""
    async with connect(server, transport, serde) as channel:
        await KV(channel).delete_bucket(name)
    out.print(f"deleted bucket [bold]{name}[/bold]")


# ---- keys ------------------------------------------------------------------------------------------------

@app.command("put")
@runs_client
async def kv_put(bucket: Bucket, key: Key,
                 value: Annotated[str, typer.Argument(help="The value (UTF-8); - reads it from standard input.", show_default=False)],
                 ttl: Annotated[Optional[str], typer.Option("--ttl", help="The key expires after this (30s, 1h); the bucket's TTL by default.")] = None,
                 if_revision: Annotated[Optional[int], typer.Option("--if-revision", help="Put only if the key is at this revision (0: absent): CAS_FAILED otherwise.")] = None,
                 if_absent: Annotated[bool, typer.Option("--if-absent", help="Put only if there is no such key.")] = False,
                 server: Server = None, transport: Transport = "tcp", serde: Serde = "lane") -> None:
    """Put a key; prints its new revision."""
    if if_revision is not None and if_absent:
        usage_error("--if-revision and --if-absent: give one")
    data = sys.stdin.buffer.read() if value == "-" else value.encode()
    ttl_s = _duration_s(ttl, "--ttl")
    async with connect(server, transport, serde) as channel:
        revision = await KV(channel).put(bucket, key, data, ttl_s=ttl_s, if_revision=if_revision, if_absent=if_absent)
    print(revision)


@app.command("get")
@runs_client
async def kv_get(bucket: Bucket, key: Key,
                 revision: Annotated[int, typer.Option("--revision", help="The key as it was at this revision of its shard (the bucket's history).")] = 0,
                 serializable: Annotated[bool, typer.Option("--serializable", help="Let a replica in sync answer, without a read barrier: faster, maybe a little stale.")] = False,
                 output_format: Format = "text", server: Server = None, transport: Transport = "tcp",
                 serde: Serde = "lane") -> None:
    """Print a key's value (NOT_FOUND, exit 1, if there is none)."""
    _format(output_format)
    async with connect(server, transport, serde) as channel:
        entry = await KV(channel).get(bucket, key, revision=revision, serializable=serializable)
    sys.stdout.buffer.write(_entry_json(entry) if output_format == "json" else entry.value + b"\n")


@app.command("cas")
@runs_client
async def kv_cas(bucket: Bucket, key: Key,
                 expected: Annotated[str, typer.Argument(help="The value the key must hold.", show_default=False)],
                 new: Annotated[str, typer.Argument(help="The value to put.", show_default=False)],
                 server: Server = None, transport: Transport = "tcp", serde: Serde = "lane") -> None:
    """Compare-and-set: put NEW if the key holds EXPECTED (CAS_FAILED, exit 1, otherwise); prints the revision."""
    async with connect(server, transport, serde) as channel:
        print(await KV(channel).compare_and_set(bucket, key, expected.encode(), new.encode()))


@app.command("del")
@runs_client
async def kv_del(bucket: Bucket, key: Key,
                 prefix: Annotated[bool, typer.Option("--prefix", help="Delete every key that starts with KEY.")] = False,
                 if_revision: Annotated[Optional[int], typer.Option("--if-revision", help="Delete only if the key is at this revision.")] = None,
                 server: Server = None, transport: Transport = "tcp", serde: Serde = "lane") -> None:
    """Delete a key, or every key with a prefix; prints how many went."""
    async with connect(server, transport, serde) as channel:
        kv = KV(channel)
        deleted = (await kv.delete_prefix(bucket, key) if prefix
                   else await kv.delete(bucket, key, if_revision=if_revision))
    print(deleted)


@app.command("ls")
@runs_client
async def kv_ls(bucket: Bucket,
                prefix: Annotated[str, typer.Argument(help="Only keys that start with it.")] = "",
                limit: Annotated[Optional[int], typer.Option("--limit", help="At most this many keys (all by default).")] = None,
                keys_only: Annotated[bool, typer.Option("--keys-only", help="Keys without their values.")] = False,
                count: Annotated[bool, typer.Option("--count", help="Only how many keys there are.")] = False,
                output_format: Format = "text", server: Server = None, transport: Transport = "tcp",
                serde: Serde = "lane") -> None:
    """List keys in order, page by page across the shards."""
    _format(output_format)
    if limit is not None and limit < 1:
        usage_error(f"--limit {limit}: expected 1 or more")
    async with connect(server, transport, serde) as channel:
        kv = KV(channel)
        if count:
            print(await kv.count(bucket, prefix))
            return
        shown = 0
        async for entry in kv.range(bucket, prefix, keys_only=keys_only):
            if output_format == "json":
                sys.stdout.buffer.write(_entry_json(entry))
            elif keys_only:
                sys.stdout.buffer.write(entry.key.encode() + b"\n")
            else:
                sys.stdout.buffer.write(entry.key.encode() + b"\t" + entry.value + b"\n")
            shown += 1
            if limit is not None and shown >= limit:
                break


def _from_revisions(text: str | None) -> tuple[int, dict[int, int]]:
    """--from-revision R (every shard) or SHARD:R,SHARD:R."""
    if text is None:
        return 0, {}
    try:
        if ":" not in text:
            return int(text), {}
        return 0, {int(shard): int(revision) for shard, revision in (part.split(":") for part in text.split(","))}
    except ValueError:
        usage_error(f"--from-revision {text!r}: expected a revision, or SHARD:REVISION,... per shard")


@app.command("watch")
@runs_client
async def kv_watch(bucket: Bucket,
                   prefix: Annotated[str, typer.Argument(help="Only keys that start with it.")] = "",
                   from_revision: Annotated[Optional[str], typer.Option("--from-revision", help="Start at this revision (every shard), or SHARD:REVISION,...; from now on by default.")] = None,
                   output_format: Format = "text", server: Server = None, transport: Transport = "tcp",
                   serde: Serde = "lane") -> None:
    """Print puts and deletes as they happen, in revision order per shard, until Ctrl-C."""
    _format(output_format)
    first, per_shard = _from_revisions(from_revision)
    async with connect(server, transport, serde) as channel:
        async for event in KV(channel).watch(bucket, prefix, from_revision=first, from_revisions=per_shard):
            if output_format == "json":
                line = orjson.dumps({"shard": event.shard, "revision": event.revision, "kind": event.kind,
                                     "key": event.key, "value": event.value.decode("utf-8", "replace"),
                                     "version": event.version, "expires_ms": event.expires_ms}) + b"\n"
            else:
                line = f"{event.shard}:{event.revision} {event.kind} {event.key}".encode()
                line += (b" " + event.value if event.kind == "put" else b"") + b"\n"
            sys.stdout.buffer.write(line)
            sys.stdout.buffer.flush()


@app.command("txn")
@runs_client
async def kv_txn(bucket: Bucket,
                 file: Annotated[Path, typer.Option("--file", help='JSON {"compare": [...], "success": [...], "failure": [...]}; values are UTF-8 strings.', show_default=False)],
                 server: Server = None, transport: Transport = "tcp", serde: Serde = "lane") -> None:
    """Run a transaction on one shard, like etcd's: compares, then the success or failure operations. Prints the
    result as JSON; exits 1 when the compares did not hold."""
    try:
        spec = orjson.loads(file.read_bytes())
        compare = [{**c, "value": c.get("value", "").encode()} for c in spec.get("compare", [])]
        success, failure = ([{**o, "value": o.get("value", "").encode()} for o in spec.get(branch, [])]
                            for branch in ("success", "failure"))
    except (OSError, orjson.JSONDecodeError, AttributeError, TypeError) as error:
        usage_error(f"--file {file}: {error}")
    async with connect(server, transport, serde) as channel:
        result = await KV(channel).txn(bucket, compare, success, failure)
    for each in result["results"]:
        for found in each["entries"]:
            found["value"] = bytes(found["value"]).decode("utf-8", "replace")
    sys.stdout.buffer.write(orjson.dumps(result) + b"\n")
    if not result["succeeded"]:
        raise typer.Exit(1)


@app.command("export")
@runs_client
async def kv_export(bucket: Bucket,
                    target: Annotated[Path, typer.Option("--out", help="The file to write.", show_default=False)],
                    server: Server = None, transport: Transport = "tcp", serde: Serde = "lane") -> None:
    """Write a bucket to a file: each shard at one revision, streamed, checksummed (the format is in
    rocket/serde/kv_export.py)."""
    partial = target.with_name(target.name + ".partial")
    async with connect(server, transport, serde) as channel:
        with partial.open("wb") as handle:
            written = await KV(channel).export(bucket, handle)
    partial.replace(target)
    out.print(f"exported {plural(written['keys'], 'key')} of bucket [bold]{bucket}[/bold] to {target} at revisions "
              + ", ".join(f"{shard}:{revision}" for shard, revision in sorted(written["shards"].items())))


@app.command("import")
@runs_client
async def kv_import(bucket: Bucket,
                    source: Annotated[Path, typer.Option("--in", help="A file written by rocket kv export.", show_default=False)],
                    mode: Annotated[str, typer.Option("--mode", help="merge (keep keys the file lacks) or replace (delete them).")] = "merge",
                    server: Server = None, transport: Transport = "tcp", serde: Serde = "lane") -> None:
    """Put the keys of an export into a bucket (created with the export's settings if it does not exist)."""
    if mode not in ("merge", "replace"):
        usage_error(f"--mode {mode!r}: expected merge or replace")
    try:
        handle = source.open("rb")
    except OSError as error:
        usage_error(f"--in {source}: {error.strerror}")
    async with connect(server, transport, serde) as channel:
        with handle:
            counts = await KV(channel).import_(bucket, handle, mode)
    out.print(f"imported {plural(counts['keys'], 'key')} into bucket [bold]{bucket}[/bold]"
              + (f"; skipped {plural(counts['skipped'], 'expired key')}" if counts["skipped"] else ""))
