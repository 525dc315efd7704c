"""The tier manifest of each queue (TierQueue): the pieces offloaded to the object store and where local data starts,
and how a tier command changes it (apply). Pure: the storage state machine holds the manifests.
"""

from __future__ import annotations

import dataclasses

import orjson

from rocket import limits
from rocket.errors import invariant
from rocket.serde.piece import Piece
from rocket.store.values import QueueStats

TierChange = tuple[str, int, bytes, int | None]  # topic, queue, the manifest (JSON), drop local entries below or None


@dataclasses.dataclass(slots=True)
class TierQueue:
    """A queue's tier manifest: pieces offloaded (in order, tiling [pieces[0].from, tiered_to)), where the
    local index starts (local_from <= tiered_to: local data is dropped only once offloaded, or truncated
    by retention), and counters."""

    pieces: list[Piece] = dataclasses.field(default_factory=list)
    tiered_to: int = 0
    local_from: int = 0
    offloaded_bytes: int = 0  # bytes ever offloaded
    dropped_bytes: int = 0  # bytes of local data dropped (offloaded before)
    truncated_bytes: int = 0  # bytes of local data that total retention removed before any offload

    def to_wire(self) -> list[object]:
        return [[piece.to_wire() for piece in self.pieces], self.tiered_to, self.local_from, self.offloaded_bytes,
                self.dropped_bytes, self.truncated_bytes]

    @classmethod
    def from_wire(cls, wire: list) -> "TierQueue":
        pieces, tiered_to, local_from, offloaded_bytes, dropped_bytes, *truncated = wire  # 5 items before truncation
        return cls([Piece.from_wire(piece) for piece in pieces], tiered_to, local_from, offloaded_bytes, dropped_bytes,
                   *truncated)

    def piece_at(self, offset: int) -> Piece | None:
        """The piece holding offset, or the first piece for an offset before every piece (expired)."""
        if not self.pieces or offset >= self.tiered_to:
            return None
        low, high = 0, len(self.pieces) - 1
        while low < high:
            middle = (low + high + 1) // 2
            if self.pieces[middle].from_offset <= offset:
                low = middle
            else:
                high = middle - 1
        return self.pieces[low]


def apply(manifests: dict[tuple[str, int], TierQueue], stats: QueueStats | None, request: dict) -> TierChange | None:
    """Apply a tier command (see store/commands.py) to the queue's manifest if it still fits it: a command a
    leader computed from state that moved on changes nothing (None). Returns the change to persist."""
    key = (request["topic"], request["queue"])
    if stats is None:
        return None
    state = manifests.get(key)
    drop_below = None
    if request["op"] == "offloaded":
        piece = Piece.from_wire(request["piece"])
        if state is not None and piece.from_offset != state.tiered_to or piece.to_offset > stats.next_offset:
            return None
        if state is None:
            state = manifests[key] = TierQueue(tiered_to=piece.from_offset, local_from=piece.from_offset)
        if len(state.pieces) >= limits.tier_pieces_per_queue_max:
            return None
        state.pieces.append(piece)
        state.tiered_to = piece.to_offset
        state.offloaded_bytes += piece.size
    elif request["op"] == "truncate":
        state = state if state is not None else TierQueue()
        if state.pieces or state.local_from != request["from"] or not (
                state.local_from < request["to"] <= stats.next_offset and state.tiered_to <= request["to"]):
            return None
        manifests[key] = state
        state.tiered_to = state.local_from = drop_below = request["to"]
        state.truncated_bytes += request["bytes"]
    elif request["op"] == "drop_local":
        to_offset = request["to"]
        if state is None or not state.local_from < to_offset <= state.tiered_to:
            return None
        if not any(piece.to_offset == to_offset for piece in state.pieces):
            return None
        state.dropped_bytes += sum(piece.size for piece in state.pieces
                                   if state.local_from <= piece.from_offset < to_offset)
        state.local_from = drop_below = to_offset
    else:
        invariant(request["op"] == "expire", f"unknown tier command {request['op']!r}")
        to_offset = request["to"]
        if state is None or not any(piece.to_offset == to_offset for piece in state.pieces):
            return None
        if state.local_from < to_offset:
            state.dropped_bytes += sum(piece.size for piece in state.pieces
                                       if state.local_from <= piece.from_offset < to_offset)
            state.local_from = drop_below = to_offset
        state.pieces = [piece for piece in state.pieces if piece.to_offset > to_offset]
    return key[0], key[1], orjson.dumps(state.to_wire()), drop_below
