"""The SSE reader under every line ending, any cut of the bytes, and hostile sizes; the writer's output."""

import json
import random
import tracemalloc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from acp_lite.remote.sse import (
    KEEP_ALIVE,
    SseEvent,
    SseEvents,
    SseReader,
    ascii_json,
    encode_event,
    encode_events,
    event_pieces,
)

pytestmark = pytest.mark.timeout(30)


def events(items):
    """Items as (data, event type, id) per event; an event inside a run of ``SseEvents`` but its
    last has no id of its own (``None``): the run carries the id seen after it."""
    found = []
    for item in items:
        if isinstance(item, SseEvents):
            found += [(data, None, None) for data in item.data[:-1]] + [(item.data[-1], None, item.id)]
        else:
            found.append((item.data, item.event, item.id) if isinstance(item, SseEvent) else item)
    return found


def read_all(stream: bytes, cuts=(), limit=1 << 20):
    """Feed ``stream`` cut at ``cuts``; the items, data as bytes and oversized as (size, head)."""
    reader = SseReader(limit)
    items = []
    start = 0
    for cut in [*sorted(set(cuts)), len(stream)]:
        items.extend(reader.feed(stream[start:cut]))
        start = cut
    return [item[0] if isinstance(item, tuple) else ("oversized", item.size, item.head) for item in events(items)]


def every_cut(stream: bytes):
    """The stream fed whole, then cut at each single position, then byte by byte."""
    yield ()
    for cut in range(1, len(stream)):
        yield (cut,)
    yield tuple(range(1, len(stream)))


@pytest.mark.parametrize("eol", [b"\n", b"\r\n", b"\r"], ids=["LF", "CRLF", "CR"])
def test_every_line_ending_at_every_cut(eol):
    stream = eol.join([b"id: 1", b'data: {"a":1}', b"", b": comment", b"event: message", b"data: x", b"data: y", b""])
    stream += eol
    for cuts in every_cut(stream):
        assert read_all(stream, cuts) == [b'{"a":1}', b"x\ny"], cuts


def test_ids_carry_over_to_the_events_without_one_whether_read_whole_or_line_by_line():
    # Whole events of the writer's shape are read at once, others line by line: the same ids.
    stream = b"id: 5\ndata: a\n\ndata: b\n\nid: x\0y\ndata: c\n\nevent: e\ndata: d\n\nid: 6\ndata:e\n\n"
    for cuts in every_cut(stream):
        reader = SseReader(1 << 20)
        start, found = 0, []
        for cut in [*cuts, len(stream)]:
            found += reader.feed(stream[start:cut])
            start = cut
        expected = [(b"a", None, "5"), (b"b", None, "5"), (b"c", None, "5"), (b"d", "e", "5"), (b"e", None, "6")]
        assert [e if e[2] is not None else (e[0], e[1], x[2]) for e, x in zip(events(found), expected)] == expected


def test_mixed_line_endings_and_a_crlf_split_across_reads_is_one_line_end():
    stream = b"data: a\r\ndata: b\rdata: c\n\r\n"
    for cuts in every_cut(stream):
        assert read_all(stream, cuts) == [b"a\nb\nc"], cuts


def test_utf8_split_across_reads_is_handed_over_whole():
    message = json.dumps({"text": "é 漢字 😀"}, ensure_ascii=False).encode()
    stream = b"data: " + message + b"\n\n"
    for cuts in every_cut(stream):
        assert read_all(stream, cuts) == [message], cuts


def test_bom_comments_retry_unknown_fields_and_events_without_data():
    stream = b"\xef\xbb\xbf: hello\nretry: 3000\nfoo: bar\nnocolon\n\nevent: ping\n\nid: 7\ndata:x\n\n"
    for cuts in every_cut(stream):
        assert read_all(stream, cuts) == [b"x"], cuts
    reader = SseReader(100)
    assert events(reader.feed(b"event: update\nid: 7\ndata: 1\n\n")) == [(b"1", "update", "7")]
    assert events(reader.feed(b"data: 2\n\n")) == [(b"2", None, "7")]  # the last id stays; the type is per event


def test_data_field_forms():
    # "data" alone is an empty line of data; only one space after the colon is dropped.
    assert read_all(b"data\ndata:  two\ndata:three\n\n") == [b"\n two\nthree"]
    assert read_all(b"data:\n\n") == [b""]


def test_an_unfinished_event_is_not_an_event():
    assert read_all(b"data: 1\n\ndata: 2\n") == [b"1"]


def test_an_oversized_event_is_reported_once_with_its_head_and_the_stream_goes_on():
    big = b'{"id":5,' + b"x" * 1000 + b"}"
    stream = b"data: " + big + b"\n\ndata: small\n\n"
    for cuts in [(), (10,), (10, 500, 1005), tuple(range(1, len(stream), 7))]:
        (oversized, small) = read_all(stream, cuts, limit=100)
        assert oversized[:2] == ("oversized", len(big)), cuts
        assert big.startswith(oversized[2]) and oversized[2].startswith(b'{"id":5,'), cuts
        assert small == b"small"


def test_many_data_lines_over_the_limit_count_whole():
    stream = b"data: 12345\n" * 50 + b"\n" + b"data: ok\n\n"
    (oversized, ok) = read_all(stream, (13, 200), limit=100)
    assert oversized[:2] == ("oversized", 50 * 5 + 49)
    assert ok == b"ok"


def test_a_huge_comment_or_field_line_is_never_buffered():
    reader = SseReader(1000)
    reader.feed(b": " + b"c" * 100)
    for _ in range(200):
        assert reader.feed(b"c" * 10_000) == []
        assert reader._partial_size == 0  # dropped as it arrives
    assert [e[0] for e in events(reader.feed(b"\ndata: after\n\n"))] == [b"after"]
    reader.feed(b"event: " + b"e" * 5000)
    assert reader._partial_size <= 1000 + 64
    assert [e[0] for e in events(reader.feed(b"e" * 5000 + b"\ndata: z\n\n"))] == [b"z"]


@pytest.mark.parametrize("lines", [1, 128], ids=["one-line", "many-lines"])
def test_an_event_over_the_limit_costs_the_limit_at_most_never_copies_of_it(lines):
    # The kept part of an event is joined only for its head once the event goes over the limit
    # (it was joined whole: three times the limit at the peak for one line, twice for many).
    limit = 4 * 1024 * 1024
    reader = SseReader(limit)
    line_size = 2 * limit // lines
    tracemalloc.start()
    try:
        for _ in range(lines):
            reader.feed(b"data: ")
            for _ in range(line_size // 65536):
                assert reader.feed(b"x" * 65536) == []  # distinct pieces, as from a socket
            reader.feed(b"\n")
        (oversized,) = reader.feed(b"\n")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert oversized.size == lines * line_size + lines - 1 and oversized.head == b"x" * 512
    assert peak < 1.3 * limit


@pytest.mark.timeout(120)  # hypothesis warms up slowly on a loaded machine (Python 3.9: over 30 s once)
@settings(max_examples=200, deadline=None)
@given(
    messages=st.lists(st.text(max_size=40).map(lambda t: json.dumps(t, ensure_ascii=False).encode()), max_size=8),
    eol=st.sampled_from([b"\n", b"\r\n", b"\r"]),
    comments=st.booleans(),
    seed=st.integers(0, 1 << 30),
)
def test_any_stream_cut_anywhere_gives_the_same_events(messages, eol, comments, seed):
    parts = []
    for i, message in enumerate(messages):
        if comments:
            parts.append(b":" + eol)
        parts.append(b"id: " + str(i).encode() + eol + b"data: " + message + eol + eol)
    stream = b"".join(parts)
    rng = random.Random(seed)
    cuts = [rng.randrange(len(stream) + 1) for _ in range(rng.randrange(8))]
    assert read_all(stream, cuts) == messages


@pytest.mark.timeout(120)
@settings(max_examples=200, deadline=None)
@given(
    messages=st.lists(st.text(max_size=40).map(lambda t: json.dumps(t).encode()), min_size=1, max_size=12),
    with_ids=st.booleans(),
    odd=st.sampled_from([None, b"event: e\n", b"data: \n", b"data: more\n", b"id: 1\0\n", b"retry: 1\n", b":\n"]),
    at=st.integers(0, 11),
    seed=st.integers(0, 1 << 30),
)
def test_runs_of_the_writers_shape_give_the_same_events_and_ids_as_line_by_line(messages, with_ids, odd, at, seed):
    # Whole events of the writer's shape are read as one run; one odd line among them sends the
    # whole chunk line by line. Either way: every event, in order, and the last id seen.
    parts = []
    for i, message in enumerate(messages):
        event = (b"id: %d\n" % i if with_ids else b"") + b"data: " + message + b"\n"
        if odd is not None and i == at % len(messages):
            event = odd + event if odd.startswith((b"id", b"event")) else event + odd
        parts.append(event + b"\n")
    stream = b"".join(parts)
    rng = random.Random(seed)
    cuts = sorted(rng.randrange(len(stream) + 1) for _ in range(rng.randrange(4)))
    reader, found, start = SseReader(1 << 20), [], 0
    for cut in [*cuts, len(stream)]:
        found += reader.feed(stream[start:cut])
        start = cut
    expected = [
        m + b"\nmore" if odd == b"data: more\n" and i == at % len(messages) else m for i, m in enumerate(messages)
    ]
    if odd == b"data: \n":
        expected[at % len(messages)] += b"\n"
    got = events(found)
    assert [e[0] for e in got] == expected
    assert got[-1][2] == (str(len(messages) - 1) if with_ids else None)
    assert [e[1] for e in got] == [
        b"e".decode() if odd == b"event: e\n" and i == at % len(messages) else None for i in range(len(messages))
    ]


def test_lines_that_would_line_up_as_two_events_of_the_writers_shape_are_one_event():
    stream = b"id: 0\ndata: a\nretry: 5\nid: 1\ndata: b\n\n"
    for cuts in every_cut(stream):
        reader, found, start = SseReader(1 << 20), [], 0
        for cut in [*cuts, len(stream)]:
            found += reader.feed(stream[start:cut])
            start = cut
        assert events(found) == [(b"a\nb", None, "1")], cuts


def test_a_run_over_the_size_limit_is_read_event_by_event():
    stream = b"".join(b"id: %d\ndata: %s\n\n" % (i, b"x" * 40) for i in range(10))
    assert read_all(stream, limit=50) == [b"x" * 40] * 10
    assert read_all(stream + b"data: " + b"y" * 60 + b"\n\n", limit=50)[-1][:2] == ("oversized", 60)


# -- writing ---------------------------------------------------------------------------------------
def test_the_writer_is_ascii_only_and_the_json_means_the_same():
    message = json.dumps({"t": 'é\u2028漢😀"\\'}, ensure_ascii=False).encode()
    written = encode_event(message, 3)
    assert written.isascii()
    assert written.startswith(b"id: 3\ndata: ") and written.endswith(b"\n\n")
    ((data, _, _),) = events(SseReader(1000).feed(written))
    assert json.loads(data) == json.loads(message)
    assert b"\\ud83d\\ude00" in written  # a surrogate pair above U+FFFF
    assert ascii_json(b'{"a":1}') == b'{"a":1}'
    assert encode_event(b"{\n}") == b"data: {\ndata: }\n\n"
    assert KEEP_ALIVE == b":\n\n"


def test_event_pieces_are_the_event_and_carry_an_ascii_one_line_message_as_it_is():
    ascii_one_line = b'{"a":"' + b"x" * 100_000 + b'"}'
    for message in [ascii_one_line, '{"t":"\u00e9"}'.encode(), b"{\r\n}"]:
        for event_id in (None, 7):
            assert b"".join(event_pieces(message, event_id)) == encode_event(message, event_id)
    assert event_pieces(ascii_one_line, 7)[1] is ascii_one_line


def test_a_batch_of_events_is_each_message_encoded_in_turn():
    plain = [b'{"a":1}', b"[2]", b'"x"']
    for batch in (plain, [*plain, '{"t":"\u00e9"}'.encode()], [b"{\r\n}", *plain]):
        assert encode_events(batch, 7) == b"".join(encode_event(m, i) for i, m in enumerate(batch, 7))
