"""WebSocket frames without sockets (``acp_lite.remote.frames``): what each end writes, as wsproto
reads it, and what ``MessageReader`` makes of a peer's bytes however they are cut, broken frames
included (RFC 6455, sections 5 and 7.4)."""

import os
import random
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from remote_driver import raw_frame
from wsproto.frame_protocol import FrameProtocol, Opcode

from acp_lite.framing import OversizedFrame
from acp_lite.remote.frames import (
    OP_BINARY,
    OP_CLOSE,
    OP_CONTINUATION,
    OP_PING,
    OP_PONG,
    OP_TEXT,
    FrameError,
    MessageReader,
    frame,
)
from acp_lite.remote.sse import OVERSIZED_HEAD

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("size", [0, 1, 125, 126, 65535, 65536, 1 << 20])
@pytest.mark.parametrize("masked", [True, False], ids=["client", "server"])
def test_frames_are_final_masked_by_clients_only_and_sized_as_rfc_6455_says(size, masked):
    text = "".join(chr(97 + i % 26) for i in range(size))
    frames = [frame(OP_TEXT, text.encode(), masked), frame(OP_TEXT, text.encode(), masked)]
    assert bool(frames[0][1] & 0x80) is masked
    if masked:
        assert frames[0] != frames[1]  # each with a key of its own
    reader = FrameProtocol(client=not masked, extensions=[])  # refuses a frame masked the wrong way
    reader.receive_bytes(b"".join(frames))
    received = list(reader.received_frames())
    assert [(f.opcode, f.frame_finished, f.message_finished, f.payload) for f in received] == [
        (Opcode.TEXT, True, True, text)
    ] * 2


@settings(max_examples=300, deadline=None)
@given(
    messages=st.lists(
        st.tuples(
            st.sampled_from([OP_TEXT, OP_BINARY, OP_PING, OP_PONG]),
            st.sampled_from([0, 1, 125, 126, 256, 1027, 65536]),
            st.integers(1, 3),
        ),
        min_size=1,
        max_size=10,
    ),
    masked=st.booleans(),
    pings_inside=st.booleans(),
    seed=st.integers(0, 1 << 30),
)
def test_messages_read_the_same_however_their_bytes_are_cut(messages, masked, pings_inside, seed):
    # Whole final text frames are read in a tight loop, the rest frame by frame, a frame split
    # across reads piece by piece, masked or not, a ping between the fragments of a message:
    # the same messages, in order, binary ones dropped, whatever the cuts.
    rng = random.Random(seed)
    stream, expected = b"", []
    for index, (opcode, size, fragments) in enumerate(messages):
        letter = "aé€😀"[index % 4].encode()  # 1 to 4 bytes: fragments cut inside a character too
        payload = (letter * size)[:size] if opcode != OP_TEXT else (letter * size)
        if opcode >= OP_CLOSE:
            payload, fragments = payload[:125], 1
        cut_at = [len(payload) * i // fragments for i in range(fragments + 1)]
        for i in range(fragments):
            key = os.urandom(4) if masked else b""
            piece = payload[cut_at[i] : cut_at[i + 1]]
            stream += raw_frame(opcode if i == 0 else OP_CONTINUATION, piece, i == fragments - 1, key)
            if pings_inside and i < fragments - 1:
                stream += raw_frame(OP_PING, b"p", key=os.urandom(4) if masked else b"")
                expected.append((OP_PING, b"p"))
        if opcode != OP_BINARY:
            expected.append((opcode, payload))
    # (a fragmented message's inner pings come out before it: it ends after them)
    cuts = sorted({rng.randrange(len(stream) + 1) for _ in range(rng.randrange(8))})
    reader, found, start = MessageReader(masked, 1 << 30), [], 0
    for cut in [*cuts, len(stream)]:
        found += reader.feed(stream[start:cut])
        start = cut
    assert found == expected


@pytest.mark.parametrize(
    ("masked", "data", "code"),
    [
        (True, raw_frame(OP_TEXT, b"{}"), 1002),  # a client's frame unmasked
        (False, raw_frame(OP_TEXT, b"{}", key=b"abcd"), 1002),  # a server's frame masked
        (True, raw_frame(OP_TEXT, b"{}", key=b"abcd", first_bits=0x40), 1002),  # RSV1, no extension
        (True, raw_frame(0x3, b"{}", key=b"abcd"), 1002),  # a reserved data opcode
        (True, raw_frame(0xB, b"", key=b"abcd"), 1002),  # a reserved control opcode
        (True, raw_frame(OP_PING, b"x" * 126, key=b"abcd"), 1002),  # a control frame over 125 bytes
        (True, raw_frame(OP_PING, b"x", fin=False, key=b"abcd"), 1002),  # a fragmented control frame
        (True, raw_frame(OP_CONTINUATION, b"{}", key=b"abcd"), 1002),  # a continuation of nothing
        (True, raw_frame(OP_TEXT, b"{", fin=False, key=b"abcd") + raw_frame(OP_TEXT, b"}", key=b"abcd"), 1002),
        (True, raw_frame(OP_TEXT, b'"\xff"', key=b"abcd"), 1007),  # text that is not UTF-8
        (True, raw_frame(OP_TEXT, b'"\xe2\x82', fin=False, key=b"abcd") + raw_frame(0, b'"', key=b"abcd"), 1007),
        (True, raw_frame(OP_CLOSE, b"\x03", key=b"abcd"), 1002),  # a close body of one byte
        (True, raw_frame(OP_CLOSE, struct.pack("!H", 1005), key=b"abcd"), 1002),  # a code never sent
        (True, raw_frame(OP_CLOSE, struct.pack("!H", 999), key=b"abcd"), 1002),
        (True, raw_frame(OP_CLOSE, struct.pack("!H", 1000) + b"\xff", key=b"abcd"), 1007),  # a reason not UTF-8
    ],
)
def test_a_broken_frame_raises_its_close_code_and_keeps_what_came_before_it(masked, data, code):
    key = b"wxyz" if masked else b""
    before = raw_frame(OP_TEXT, b'{"a":1}', key=key) + raw_frame(OP_TEXT, '{"é":2}'.encode(), key=key)
    reader = MessageReader(masked, 1000)
    with pytest.raises(FrameError) as raised:
        reader.feed(before + data)
    assert raised.value.code == code
    assert raised.value.before == [(OP_TEXT, b'{"a":1}'), (OP_TEXT, '{"é":2}'.encode())]


@pytest.mark.parametrize("code", [1000, 1001, 1011, 1014, 3000, 4999])
def test_a_valid_close_comes_out_with_its_body(code):
    body = struct.pack("!H", code) + "bye é".encode()
    assert MessageReader(True, 1000).feed(raw_frame(OP_CLOSE, body, key=b"abcd")) == [(OP_CLOSE, body)]
    assert MessageReader(True, 1000).feed(raw_frame(OP_CLOSE, b"", key=b"abcd")) == [(OP_CLOSE, b"")]


def test_a_message_over_the_limit_is_told_as_it_arrives_and_only_its_head_is_kept():
    reader = MessageReader(True, 1000)
    declared = raw_frame(OP_TEXT, b" " * 2000, key=b"abcd")  # declares 2,000 bytes
    assert reader.feed(declared[:900]) == [] and not reader.oversized
    assert reader.feed(declared[900:1100]) == [] and reader.oversized  # past the limit, not yet whole
    (opcode, message), *rest = reader.feed(declared[1100:] + raw_frame(OP_TEXT, b"{}", key=b"abcd"))
    assert opcode == OP_TEXT and isinstance(message, OversizedFrame) and message.size == 2000
    assert message.head == b" " * OVERSIZED_HEAD
    ((_, whole_at_once),) = MessageReader(True, 1000).feed(declared)  # one piece: its head too, no more
    assert whole_at_once.size == 2000 and whole_at_once.head == b" " * OVERSIZED_HEAD
    assert rest == [(OP_TEXT, b"{}")] and not reader.oversized
    fragments = MessageReader(False, 1000)
    found = fragments.feed(
        b"".join(raw_frame(OP_CONTINUATION if i else OP_TEXT, b"x" * 125, fin=False) for i in range(9))
    )
    assert found == [] and fragments.oversized
    ((_, message),) = fragments.feed(raw_frame(OP_CONTINUATION, b"x"))
    assert isinstance(message, OversizedFrame) and message.size == 9 * 125 + 1 and message.head == b"x" * OVERSIZED_HEAD


@settings(max_examples=500, deadline=None)
@given(
    data=st.lists(
        st.one_of(
            st.binary(max_size=64),
            st.sampled_from([b"\x81", b"\x01", b"\x80", b"\x88", b"\x89", b"\x8a", b"\xfe", b"\xff", b"\x7e", b"\x7f"]),
        ),
        max_size=40,
    ),
    masked=st.booleans(),
)
def test_any_bytes_give_messages_or_a_frame_error(data, masked):
    # A hostile peer: whatever it sends, in whatever pieces, the reader returns what it read or
    # raises FrameError, never anything else (what it may hold: see the oversized test above).
    reader = MessageReader(masked, 100)
    try:
        for piece in data:
            for opcode, payload in reader.feed(piece):
                assert opcode in (OP_TEXT, OP_PING, OP_PONG, OP_CLOSE)
                if opcode == OP_TEXT and isinstance(payload, bytes):
                    assert len(payload) <= 100
    except FrameError as exc:
        assert exc.code in (1002, 1007)
