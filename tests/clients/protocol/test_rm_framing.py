"""Frame encoding and incremental decoding, on bytes alone."""

from __future__ import annotations

import json
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cod.protocol.framing import MAX_FRAME_BYTES, FrameDecoder, FrameTooLarge, encode, encode_body


@pytest.mark.parametrize("message", [{}, {"a": 1}, [1, 2, 3], "ünïcødé", {"facts": ["x(1)"] * 1000}])
def test_encode_then_decode_gives_the_message_back(message):
    frame = encode(message)
    (size,) = struct.unpack(">I", frame[:4])
    assert size == len(frame) - 4
    bodies = FrameDecoder().feed(frame)
    assert [json.loads(b) for b in bodies] == [message]


@given(st.lists(st.binary(max_size=300), max_size=8), st.integers(min_value=1, max_value=17))
def test_any_split_of_a_stream_yields_the_same_frames(bodies, chunk):
    stream = b"".join(encode_body(b) for b in bodies)
    dec = FrameDecoder()
    got = []
    for i in range(0, len(stream), chunk):
        got.extend(dec.feed(stream[i : i + chunk]))
    assert got == bodies
    assert dec.pending_bytes == 0


@pytest.mark.parametrize("size", [MAX_FRAME_BYTES + 1, 2 << 30, 0xFFFFFFFF])
def test_oversized_length_prefix_is_refused_before_any_body_is_read(size):
    dec = FrameDecoder()
    with pytest.raises(FrameTooLarge) as err:
        dec.feed(struct.pack(">I", size))
    assert str(size) in str(err.value)


def test_frame_at_the_limit_is_accepted_and_one_past_is_not():
    dec = FrameDecoder(max_bytes=10)
    assert dec.feed(encode_body(b"x" * 10, 10)) == [b"x" * 10]
    with pytest.raises(FrameTooLarge):
        encode_body(b"x" * 11, 10)


@pytest.mark.parametrize("cut", [1, 3, 4, 8])
def test_truncated_frame_leaves_pending_bytes(cut):
    frame = encode_body(b"hello")
    dec = FrameDecoder()
    assert dec.feed(frame[:cut]) == []
    assert dec.pending_bytes == cut
