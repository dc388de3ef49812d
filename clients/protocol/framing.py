"""Frames on the RM's stream socket: a 4-byte big-endian length, then that many bytes of UTF-8 JSON.

No I/O here: `encode` turns a message into bytes and `FrameDecoder` turns a byte
stream, fed in arbitrary pieces, back into frame bodies.  The size limit is
checked on the length prefix, before a single body byte is buffered, so a peer
announcing a 2 GiB frame costs us four bytes of memory, not two gigabytes.
"""

from __future__ import annotations

import json
import struct
from typing import Any

from .errors import CodError

HEADER = struct.Struct(">I")
HEADER_SIZE = HEADER.size
# Largest frame body either side accepts (1 MiB): a batch of a few thousand facts fits easily.
MAX_FRAME_BYTES = 1 << 20


class FrameError(CodError):
    """The byte stream cannot be framed any more; the connection must be closed."""


class FrameTooLarge(FrameError):
    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"frame of {size} bytes exceeds the limit of {limit} bytes")
        self.size = size
        self.limit = limit


def encode_body(body: bytes, max_bytes: int = MAX_FRAME_BYTES) -> bytes:
    if len(body) > max_bytes:
        raise FrameTooLarge(len(body), max_bytes)
    return HEADER.pack(len(body)) + body


# json.dumps with arguments builds an encoder per call; one built once writes the same text.
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)


def encode(message: Any, max_bytes: int = MAX_FRAME_BYTES) -> bytes:
    """One frame holding `message` as compact JSON."""
    body = _ENCODER.encode(message).encode("utf-8")
    return encode_body(body, max_bytes)


class FrameDecoder:
    """Incremental decoder: `feed` bytes as they arrive, get back every complete frame body."""

    def __init__(self, max_bytes: int = MAX_FRAME_BYTES) -> None:
        self.max_bytes = max_bytes
        self._buf = bytearray()
        self._need: int | None = None  # body length of the frame being read, once its header is in

    def feed(self, data: bytes) -> list[bytes]:
        if not self._buf and self._need is None and len(data) >= HEADER_SIZE:
            # The usual case of a request-reply channel: one whole frame in one read.
            (size,) = HEADER.unpack_from(data)
            if size + HEADER_SIZE == len(data) and size <= self.max_bytes:
                return [bytes(data[HEADER_SIZE:])]
        self._buf += data
        bodies: list[bytes] = []
        while True:
            if self._need is None:
                if len(self._buf) < HEADER_SIZE:
                    break
                (size,) = HEADER.unpack_from(self._buf)
                if size > self.max_bytes:
                    raise FrameTooLarge(size, self.max_bytes)
                del self._buf[:HEADER_SIZE]
                self._need = size
            if len(self._buf) < self._need:
                break
            bodies.append(bytes(self._buf[: self._need]))
            del self._buf[: self._need]
            self._need = None
        return bodies

    @property
    def pending_bytes(self) -> int:
        """Bytes of an incomplete frame held; non-zero at end of stream means a truncated frame."""
        return len(self._buf) + (HEADER_SIZE if self._need is not None else 0)
