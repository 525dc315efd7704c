"""The KV state of the node's shards on LevelDB (plyvel), in a directory of its own: derived state, written without
sync and rebuilt by re-applying the groups' Raft logs (the "redo the commitlog" of RIP-22). KvIndex lists its keys."""

from __future__ import annotations

import hashlib
import shutil
import struct
from collections.abc import Iterable, Iterator
from pathlib import Path

import plyvel

from rocket import limits
from rocket.errors import Code, RocketError
from rocket.store.kv import PUT, KeyState, KvChange

_u16 = struct.Struct(">H")
_u32 = struct.Struct(">I")
_u64 = struct.Struct(">Q")
_state = struct.Struct(">QQQQ")  # revision, create revision, version, expires ms
_event = struct.Struct(">BH")  # kind, key length; then the key, then _state and the value (a put's)
_shard_record = struct.Struct(">QQI")  # group, revision, history
_record_head = struct.Struct(">II")  # a snapshot record: key length, value length
_TOMBSTONE = b""


def shard_prefix(bucket: str, shard: int) -> bytes:
    return bucket.encode() + b"\0" + _u32.pack(shard)


def _prefix_end(prefix: bytes) -> bytes | None:
    """The smallest key greater than every key that starts with prefix (None: no bound)."""
    trimmed = prefix.rstrip(b"\xff")
    return trimmed[:-1] + bytes([trimmed[-1] + 1]) if trimmed else None


def _encode_state(state: KeyState) -> bytes:
    return _state.pack(state.revision, state.create_revision, state.version, state.expires_ms) + state.value


def _decode_state(raw: bytes) -> KeyState:
    return KeyState(raw[_state.size:], *_state.unpack_from(raw))


def _history_key(shard: bytes, key: bytes, revision: int) -> bytes:
    return b"v" + shard + _u16.pack(len(key)) + key + _u64.pack(revision)


def _expiry_key(group: int, expires_ms: int, shard: bytes, key: bytes) -> bytes:
    return b"x" + _u64.pack(group) + _u64.pack(expires_ms) + _u16.pack(len(shard)) + shard + key


class KvIndex:
    """The KV LevelDB, in the store's directory kv/ (Store.open). Each group's last applied entry is written with its
    changes, so a restart re-applies exactly what LevelDB lost; the store syncs it before a snapshot lets the log be
    compacted, and a snapshot carries the KV state of its group (snapshot_chunks, restore).

    Keys (a shard is bucket \\0 shard as u32, so one shard is one range of keys):
      k shard key                   -> the key's current state (_state) and value
      v shard len(key) key revision -> an older revision of the key (bucket history > 1), or a tombstone (its deletion)
      e shard revision              -> the change at that revision, for watches (the last kv_events_kept_default)
      x group expires_ms shard key  -> revision: keys with a TTL, in the order they expire
      r shard                       -> the group that holds the shard, and the shard's revision
      a group                       -> the group's last entry applied"""

    def __init__(self, path: Path):
        self.path = path
        self._db = plyvel.DB(str(path), create_if_missing=True)

    def destroy_and_reopen(self) -> None:
        self._db.close()
        shutil.rmtree(self.path)
        self._db = plyvel.DB(str(self.path), create_if_missing=True)

    def close(self) -> None:
        self._db.close()

    def sync(self) -> None:
        """Make every write before it durable: a synced write syncs LevelDB's log, which holds them all."""
        self._db.put(b"m/sync", b"", sync=True)

    # ---- what the machine starts from ----------------------------------------------------------------

    def applied(self) -> dict[int, int]:
        return {_u64.unpack(key[1:])[0]: _u64.unpack(value)[0] for key, value in self._db.iterator(prefix=b"a")}

    def shards(self) -> dict[tuple[str, int], list[int]]:
        """(bucket, shard) -> [group, revision, history]"""
        found = {}
        for key, value in self._db.iterator(prefix=b"r"):
            bucket, shard = key[1:-_u32.size - 1].decode(), _u32.unpack(key[-_u32.size:])[0]
            found[(bucket, shard)] = list(_shard_record.unpack(value))
        return found

    # ---- writes --------------------------------------------------------------------------------------

    def apply(self, groups: list[tuple[list[KvChange], dict[tuple[str, int], list[int]], int, int]]) -> None:
        """Record groups' changes, the revisions of the shards they touched and their last entries applied, each
        given as (changes, shards, group, applied), in one write without sync."""
        with self._db.write_batch(sync=False) as batch:
            for changes, shards, group, applied in groups:
                for change in changes:
                    self._write_change(batch, group, change)
                self._write_shards(batch, shards)
                batch.put(b"a" + _u64.pack(group), _u64.pack(applied))

    @staticmethod
    def _write_shards(batch, shards: dict[tuple[str, int], list[int]]) -> None:
        for (bucket, shard), record in shards.items():
            batch.put(b"r" + shard_prefix(bucket, shard), _shard_record.pack(*record))

    def _write_change(self, batch, group: int, change: KvChange) -> None:
        shard = shard_prefix(change.bucket, change.shard)
        key = change.key.encode()
        state, previous = change.state, change.previous
        if state is not None:
            batch.put(b"k" + shard + key, _encode_state(state))
        else:
            batch.delete(b"k" + shard + key)
        if previous is not None and previous.expires_ms:
            batch.delete(_expiry_key(group, previous.expires_ms, shard, key))
        if state is not None and state.expires_ms:
            batch.put(_expiry_key(group, state.expires_ms, shard, key), _u64.pack(state.revision))
        if change.history > 1:
            if previous is not None:
                batch.put(_history_key(shard, key, previous.revision), _encode_state(previous))
            if state is None:
                batch.put(_history_key(shard, key, change.revision), _TOMBSTONE)
            self._trim_history(batch, shard, key, change.history - 1)
        event = _event.pack(change.kind, len(key)) + key
        if state is not None:
            event += _encode_state(state)
        batch.put(b"e" + shard + _u64.pack(change.revision), event)
        gone = change.revision - limits.kv_events_kept_default
        if gone > 0:
            batch.delete(b"e" + shard + _u64.pack(gone))

    def _trim_history(self, batch, shard: bytes, key: bytes, kept: int) -> None:
        """Keep the newest `kept` older revisions of a key; the one being written counts (it is newer than all)."""
        prefix = b"v" + shard + _u16.pack(len(key)) + key
        with self._db.iterator(prefix=prefix, reverse=True, include_value=False) as older:
            for number, found in enumerate(older, start=2):
                if number > kept:
                    batch.delete(found)

    # ---- reads ---------------------------------------------------------------------------------------

    def get(self, bucket: str, shard: int, key: str) -> KeyState | None:
        raw = self._db.get(b"k" + shard_prefix(bucket, shard) + key.encode())
        return _decode_state(raw) if raw is not None else None

    def get_at(self, bucket: str, shard: int, key: str, revision: int) -> KeyState | None:
        """The key as it was at a revision of its shard, if that revision is kept (bucket history)."""
        current = self.get(bucket, shard, key)
        if current is not None and current.revision <= revision:
            return current
        prefix = b"v" + shard_prefix(bucket, shard) + _u16.pack(len(key.encode())) + key.encode()
        with self._db.iterator(start=prefix, stop=prefix + _u64.pack(revision + 1), reverse=True) as older:
            for _, raw in older:
                return _decode_state(raw) if raw != _TOMBSTONE else None
        return None

    def keys(self, bucket: str, shard: int, prefix: str, limit: int) -> list[str]:
        start = b"k" + shard_prefix(bucket, shard)
        found = []
        with self._db.iterator(prefix=start + prefix.encode(), include_value=False) as keys:
            for raw in keys:
                found.append(raw[len(start):].decode())
                if len(found) >= limit:
                    break
        return found

    def pin(self):
        """A LevelDB snapshot: reads through it (range's source) see the state as of now. Close it when done."""
        return self._db.snapshot()

    def range(self, bucket: str, shard: int, start: str, end: str | None, after: str | None, limit: int,
              bytes_max: int, now_ms: int, keys_only: bool = False,
              source=None) -> tuple[list[tuple[str, KeyState]], bool]:
        """Live keys in [start, end) after `after`, sorted, up to limit keys and about bytes_max bytes (at least
        one): (keys with their states, whether more follow). keys_only leaves the values out; source: a pin()."""
        prefix = b"k" + shard_prefix(bucket, shard)
        first = prefix + (after.encode() + b"\0" if after is not None and after >= start else start.encode())
        stop = prefix + end.encode() if end is not None else _prefix_end(prefix)
        found, size = [], 0
        with (self._db if source is None else source).iterator(start=first, stop=stop) as items:
            for raw_key, raw in items:
                state = _decode_state(raw)
                if state.expired(now_ms):
                    continue
                if len(found) >= limit or found and size + len(raw_key) + len(state.value) > bytes_max:
                    return found, True
                if keys_only:
                    state = KeyState(b"", state.revision, state.create_revision, state.version, state.expires_ms)
                found.append((raw_key[len(prefix):].decode(), state))
                size += len(raw_key) + len(state.value)
        return found, False

    def count(self, bucket: str, shard: int, start: str, end: str | None, now_ms: int) -> int:
        prefix = b"k" + shard_prefix(bucket, shard)
        stop = prefix + end.encode() if end is not None else _prefix_end(prefix)
        with self._db.iterator(start=prefix + start.encode(), stop=stop) as items:
            return sum(1 for _, raw in items if not _decode_state(raw).expired(now_ms))

    def oldest_event(self, bucket: str, shard: int, revision: int) -> int:
        """The oldest revision a watch can resume from: the first event kept, else the next one."""
        prefix = b"e" + shard_prefix(bucket, shard)
        with self._db.iterator(prefix=prefix, include_value=False) as events:
            for raw in events:
                return _u64.unpack(raw[len(prefix):])[0]
        return revision + 1

    def events(self, bucket: str, shard: int, from_revision: int, prefix: str, limit: int,
               bytes_max: int) -> tuple[list[dict], int]:
        """Changes from a revision on whose keys start with prefix, in revision order: (events, the revision after
        the last one looked at). Up to limit events and about bytes_max bytes (at least one)."""
        shard_key = b"e" + shard_prefix(bucket, shard)
        wanted = prefix.encode()
        found, size, next_revision = [], 0, from_revision
        with self._db.iterator(start=shard_key + _u64.pack(from_revision), stop=_prefix_end(shard_key)) as events:
            for raw_key, raw in events:
                kind, length = _event.unpack_from(raw)
                key = raw[_event.size:_event.size + length]
                revision = _u64.unpack(raw_key[len(shard_key):])[0]
                if key.startswith(wanted):
                    if len(found) >= limit or found and size + len(raw) > bytes_max:
                        break
                    event = {"kind": kind, "key": key.decode(), "revision": revision, "value": b"",
                             "create_revision": 0, "version": 0, "expires_ms": 0}
                    if kind == PUT:
                        state = _decode_state(raw[_event.size + length:])
                        event.update(value=state.value, create_revision=state.create_revision, version=state.version,
                                     expires_ms=state.expires_ms)
                    found.append(event)
                    size += len(raw)
                next_revision = revision + 1
        return found, next_revision

    def next_expiry_ms(self, group: int) -> int | None:
        """When the group's first key with a TTL expires; None if none has one."""
        prefix = b"x" + _u64.pack(group)
        with self._db.iterator(prefix=prefix, include_value=False) as keys:
            for raw_key in keys:
                return _u64.unpack_from(raw_key, len(prefix))[0]
        return None

    def expiring(self, group: int, until_ms: int, limit: int) -> list[tuple[str, int, str, int]]:
        """(bucket, shard, key, revision) of a group's keys whose TTL passed by until_ms, the oldest first."""
        prefix = b"x" + _u64.pack(group)
        found = []
        with self._db.iterator(start=prefix, stop=prefix + _u64.pack(until_ms + 1)) as expiring:
            for raw_key, raw in expiring:
                (length,) = _u16.unpack_from(raw_key, len(prefix) + 8)
                shard = raw_key[len(prefix) + 10:len(prefix) + 10 + length]
                found.append((shard[:-_u32.size - 1].decode(), _u32.unpack(shard[-_u32.size:])[0],
                              raw_key[len(prefix) + 10 + length:].decode(), _u64.unpack(raw)[0]))
                if len(found) >= limit:
                    break
        return found

    def digest(self, bucket: str, shard: int) -> tuple[int, int, str]:
        """(keys, bytes of keys and values, a digest of every key's state): equal on replicas that applied the same
        entries, and after a rebuild from the log."""
        prefix = b"k" + shard_prefix(bucket, shard)
        digest = hashlib.blake2b(digest_size=16)
        keys = size = 0
        with self._db.iterator(prefix=prefix) as items:
            for raw_key, raw in items:
                digest.update(_u32.pack(len(raw_key)) + raw_key + _u32.pack(len(raw)) + raw)
                keys += 1
                size += len(raw_key) - len(prefix) + len(raw) - _state.size
        return keys, size, digest.hexdigest()

    # ---- snapshots -----------------------------------------------------------------------------------

    def snapshot_chunks(self, group: int, shards: Iterable[tuple[str, int]]) -> Iterator[bytes]:
        """A group's KV records as of the call (a LevelDB snapshot), in chunks of about
        limits.snapshot_chunk_bytes_max; iterate it in any thread. Watch events are not carried."""
        snapshot = self._db.snapshot()
        prefixes = [kind + shard_prefix(bucket, shard) for bucket, shard in shards for kind in (b"k", b"v")]
        prefixes.append(b"x" + _u64.pack(group))

        def chunks() -> Iterator[bytes]:
            parts, size = [], 0
            for prefix in prefixes:
                with snapshot.iterator(prefix=prefix) as items:
                    for raw_key, raw in items:
                        parts.append(_record_head.pack(len(raw_key), len(raw)) + raw_key + raw)
                        size += len(parts[-1])
                        if size >= limits.snapshot_chunk_bytes_max:
                            yield b"".join(parts)
                            parts, size = [], 0
            if parts:
                yield b"".join(parts)
            snapshot.close()
        return chunks()

    def restore(self, group: int, shards: dict[tuple[str, int], list[int]], chunks: Iterable[bytes],
                applied: int) -> None:
        """Make a group's KV state that of a snapshot: its shards' keys, history and expiries replaced, their watch
        events dropped (a watch from before resumes with COMPACTED)."""
        dropped = [kind + shard_prefix(bucket, shard) for bucket, shard in shards for kind in (b"k", b"v", b"e")]
        dropped += [b"x" + _u64.pack(group)]
        with self._db.write_batch(sync=False) as batch:
            for prefix in dropped:
                with self._db.iterator(prefix=prefix, include_value=False) as keys:
                    for raw_key in keys:
                        batch.delete(raw_key)
        for chunk in chunks:
            view = memoryview(chunk)
            at = 0
            with self._db.write_batch(sync=False) as batch:
                while at < len(view):
                    try:
                        key_length, length = _record_head.unpack_from(view, at)
                    except struct.error:
                        raise RocketError(Code.CORRUPT_DATA, "a KV snapshot chunk ends inside a record") from None
                    at += _record_head.size
                    batch.put(bytes(view[at:at + key_length]), bytes(view[at + key_length:at + key_length + length]))
                    at += key_length + length
                if at != len(view):
                    raise RocketError(Code.CORRUPT_DATA, "a KV snapshot chunk ends inside a record")
        with self._db.write_batch(sync=False) as batch:
            self._write_shards(batch, shards)
            batch.put(b"a" + _u64.pack(group), _u64.pack(applied))

