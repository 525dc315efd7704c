"""The newest bytes of a direct (O_DIRECT) log, in page-aligned memory of its own: what its writes are made of and
what reads of those bytes are served from.
"""

from __future__ import annotations

import mmap
import threading

from rocket import limits

ALIGN = 4096  # O_DIRECT offsets, lengths and buffers are multiples of the device's block size; 4 KiB covers all


class DirectTail:
    """The newest bytes of a direct log, in page-aligned memory: the source of its O_DIRECT writes and the
    cache its reads of those bytes come from. Each write goes out as whole blocks: from the start of the
    block the previous write ended in (written again, the same bytes), to the end of the block it ends in,
    padded with zeros. Chunks hold contiguous bytes of one segment; when one fills, the next starts with a
    copy of the partial last block. Chunks older than the newest keep_bytes are reused for new ones."""

    def __init__(self, keep_bytes: int):
        self.keep_bytes = keep_bytes
        self.lock = threading.Lock()  # readers copy out under it, so that no chunk is reused under a read
        self.chunks: list[tuple[int, mmap.mmap]] = []  # (log position of byte 0, memory), oldest first
        self._spare: list[mmap.mmap] = []
        self._file_offset = 0  # where byte 0 of the newest chunk lies in the active segment (a block boundary)
        self._fill = 0  # bytes of the newest chunk that hold log bytes

    @property
    def cached_from(self) -> int:
        return self.chunks[0][0] if self.chunks else 0

    def start_segment(self, position: int, tail: bytes = b"", tail_offset: int = 0) -> None:
        """The active segment, starting at log position position, now ends with tail, a partial block at
        file offset tail_offset (empty for a new segment)."""
        self._add_chunk(position + tail_offset, len(tail))
        self.chunks[-1][1][: len(tail)] = tail
        self._file_offset, self._fill = tail_offset, len(tail)

    def _add_chunk(self, position: int, size: int) -> None:
        """A new newest chunk for log bytes from position, with room for size bytes."""
        size = max(limits.direct_log_chunk_bytes, -(-size // ALIGN) * ALIGN)
        chunk = self._spare.pop() if size == limits.direct_log_chunk_bytes and self._spare else mmap.mmap(-1, size)
        with self.lock:
            self.chunks.append((position, chunk))
            while len(self.chunks) > 1 and position - self.chunks[1][0] >= self.keep_bytes:
                old = self.chunks.pop(0)[1]
                if len(old) == limits.direct_log_chunk_bytes and len(self._spare) < limits.direct_log_spare_chunks_max:
                    self._spare.append(old)

    def mark(self) -> tuple[mmap.mmap, int, int]:
        """Where the staged bytes end, for rewind."""
        return self.chunks[-1][1], self._file_offset, self._fill

    def rewind(self, mark: tuple[mmap.mmap, int, int]) -> None:
        """Forget what was staged since mark (its write failed): the next stage copies over it. A chunk that
        stage added is dropped; the chunk that was newest at mark is never released by stage, so it is still here."""
        newest, self._file_offset, self._fill = mark
        with self.lock:
            while self.chunks[-1][1] is not newest:
                self.chunks.pop()

    def stage(self, parts: list[bytes | memoryview], size: int) -> tuple[memoryview, int]:
        """Copy parts (size bytes, the log's next) into memory; returns the blocks to write and their file offset."""
        position, chunk = self.chunks[-1]
        if self._fill + size > len(chunk):
            kept = self._fill % ALIGN
            block = self._fill - kept
            self._add_chunk(position + block, kept + size)
            self.chunks[-1][1][:kept] = chunk[block : self._fill]
            self._file_offset += block
            self._fill = kept
            chunk = self.chunks[-1][1]
        at = self._fill
        for part in parts:
            part_bytes = memoryview(part).nbytes
            chunk[at : at + part_bytes] = part
            at += part_bytes
        first, end = self._fill - self._fill % ALIGN, -(-at // ALIGN) * ALIGN
        chunk[at:end] = bytes(end - at)  # a reused chunk holds old bytes: recovery must find zeros past the end
        self._fill = at
        return memoryview(chunk)[first:end], self._file_offset + first

    def read(self, position: int, length: int) -> bytes | None:
        """The log's bytes at position, if memory still holds all of them (the caller checks that they were
        written: position + length <= end)."""
        with self.lock:
            for start, chunk in reversed(self.chunks):
                if start <= position:
                    if position + length - start > len(chunk):
                        return None
                    return chunk[position - start : position - start + length]
        return None
