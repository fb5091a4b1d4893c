"""Framing and transports (acp_lite.wire): bytes in, frames out, over real pipes and sockets."""

import json
import os
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading

import pytest

from acp_lite import sockets
from acp_lite.errors import CallTimeout, ConnectionClosed, UsageError
from acp_lite.wire import OversizedFrame, Transport, memory_pair

pytestmark = pytest.mark.timeout(20)


def read_all(transport):
    """Every frame until end of stream."""
    frames = []
    while True:
        batch = transport.read_frames()
        if batch is None:
            return frames
        frames.extend(batch)


def pipe_transport(**options):
    """A transport reading from a fresh pipe (and writing to another); the write end of the
    first and the read end of the second are returned for the test to drive."""
    read_fd, feed_fd = os.pipe()
    drain_fd, write_fd = os.pipe()
    return Transport(read_fd, write_fd, **options), feed_fd, drain_fd


@pytest.mark.req("ACP-V1-TRANSPORT-STDIO-NEWLINE-DELIMITED", "ACP-V1-TRANSPORT-UTF8")
def test_frames_split_on_newline_bytes_only():
    transport, feed, drain = pipe_transport()
    # U+2028/U+2029 and a lone \r are ordinary characters inside a message, never separators.
    first = json.dumps({"text": "a\u2028b\u2029c\rd"}, ensure_ascii=False).encode()
    os.write(feed, first + b"\n" + b'{"x":1}\r\n' + b"\n" + b'{"tail":true}')
    os.close(feed)
    assert read_all(transport) == [first, b'{"x":1}\r', b"", b'{"tail":true}']
    transport.close()
    os.close(drain)


@pytest.mark.req("ACP-V1-TRANSPORT-STDIO-NEWLINE-DELIMITED")
def test_a_frame_may_arrive_in_many_reads():
    transport, feed, drain = pipe_transport()
    message = b'{"jsonrpc":"2.0","method":"m","params":{"text":"' + b"x" * 300_000 + b'"}}'

    def trickle():
        for start in range(0, len(message), 7001):
            os.write(feed, message[start : start + 7001])
        os.write(feed, b"\n")
        os.close(feed)

    writer = threading.Thread(target=trickle)
    writer.start()
    assert read_all(transport) == [message]
    writer.join()
    transport.close()
    os.close(drain)


def test_an_oversized_line_is_reported_and_the_stream_resynchronizes():
    transport, feed, drain = pipe_transport(max_message_size=1000)
    big = b'{"jsonrpc":"2.0","id":7,"method":"m","params":"' + b"y" * 50_000 + b'"}'

    def write():
        os.write(feed, b'{"before":1}\n')
        for start in range(0, len(big), 999):
            os.write(feed, big[start : start + 999])
        os.write(feed, b'\n{"after":2}\n' + b"z" * 1000 + b"\n" + b"w" * 1001 + b"\n")
        os.close(feed)

    writer = threading.Thread(target=write)
    writer.start()
    frames = []
    while True:
        batch = transport.read_frames()
        if batch is None:
            break
        frames.extend(batch)
        # The oversized line is dropped as it arrives, never accumulated.
        assert transport._lines._partial_size <= 1000
    writer.join()
    assert frames[0] == b'{"before":1}'
    assert isinstance(frames[1], OversizedFrame)
    assert frames[1].size == len(big)
    assert big.startswith(frames[1].head) and len(frames[1].head) >= 100
    assert frames[2:4] == [b'{"after":2}', b"z" * 1000]  # exactly the limit is allowed
    assert isinstance(frames[4], OversizedFrame) and frames[4].size == 1001
    transport.close()
    os.close(drain)


def test_an_oversized_unterminated_tail_is_reported_at_end_of_stream():
    transport, feed, drain = pipe_transport(max_message_size=10)
    os.write(feed, b"0123456789abc")
    os.close(feed)
    frames = read_all(transport)
    assert len(frames) == 1 and isinstance(frames[0], OversizedFrame) and frames[0].size == 13
    transport.close()
    os.close(drain)


@pytest.mark.req("ACP-V1-TRANSPORT-STDIO-NEWLINE-DELIMITED")
def test_concurrent_senders_never_interleave_or_reorder():
    a, b = memory_pair()
    threads, per_thread = 16, 300

    def sender(k):
        for i in range(per_thread):
            # Sizes vary so that some writes are partial and many are coalesced.
            a.send(json.dumps({"t": k, "i": i, "pad": "p" * ((k * 131 + i * 17) % 5000)}).encode())

    workers = [threading.Thread(target=sender, args=(k,)) for k in range(threads)]
    received = []

    def reader():
        while len(received) < threads * per_thread:
            batch = b.read_frames()
            if batch is None:
                return
            received.extend(batch)

    reading = threading.Thread(target=reader)
    reading.start()
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    reading.join()
    last = {}
    for frame in received:
        message = json.loads(frame)
        assert message["i"] == last.get(message["t"], -1) + 1
        last[message["t"]] = message["i"]
    assert last == {k: per_thread - 1 for k in range(threads)}
    a.close()
    b.close()


@pytest.mark.req("ACP-V1-TRANSPORT-STDIO-NEWLINE-DELIMITED")
def test_send_rejects_a_frame_with_a_newline():
    a, b = memory_pair()
    with pytest.raises(UsageError):
        a.send(b'{"a":\n1}')
    a.close()
    b.close()


def test_close_wakes_a_blocked_reader_and_the_peer_sees_end_of_stream():
    a, b = memory_pair()
    result = []
    reader = threading.Thread(target=lambda: result.append(a.read_frames()))
    reader.start()
    a.close()
    reader.join()
    assert result == [None]
    assert b.read_frames() is None
    with pytest.raises(ConnectionClosed):
        a.send(b"{}")
    a.close()  # idempotent
    b.close()


def test_closed_error_comes_from_the_hook_when_given():
    def hook():
        return ConnectionClosed("agent died", exit_code=3, stderr_tail="boom")

    read_fd, write_fd = os.pipe()
    transport = Transport(read_fd, write_fd, closed_error=hook)
    error = transport.closed_error()
    assert error.exit_code == 3 and "boom" in str(error)
    transport.close()
    plain = Transport(*os.pipe(), name="plain")
    assert isinstance(plain.closed_error(), ConnectionClosed) and "plain" in str(plain.closed_error())
    plain.close()


def test_close_flushes_what_is_waiting_to_be_written():
    a, b = memory_pair()
    for i in range(100):
        a.send(b'{"i":%d}' % i)
    a.close()
    assert read_all(b) == [b'{"i":%d}' % i for i in range(100)]
    b.close()


def test_file_objects_work_as_streams():
    read_fd, feed = os.pipe()
    drain, write_fd = os.pipe()
    transport = Transport(os.fdopen(read_fd, "rb", buffering=0), os.fdopen(write_fd, "wb", buffering=0))
    os.write(feed, b'{"a":1}\n')
    os.close(feed)
    assert transport.read_frames() == [b'{"a":1}']
    transport.send(b'{"b":2}')
    assert os.read(drain, 100) == b'{"b":2}\n'
    transport.close()
    os.close(drain)


STDIO_CHILD = textwrap.dedent(
    """
    import os, subprocess, sys
    from acp_lite.wire import stdio_transport
    print("before the transport is taken")  # still the real stdout
    transport = stdio_transport()
    print("print after")
    sys.stdout.write("sys.stdout after\\n")
    sys.stdout.flush()
    os.write(1, b"fd 1 after\\n")
    subprocess.run([sys.executable, "-c", "print('a child process')"], check=True)
    assert sys.stdin.read() == ""  # stdin no longer reaches ordinary code
    frames = transport.read_frames()
    for frame in frames:
        transport.send(b'{"echo":' + frame + b"}")
    transport.close()
    """
)


@pytest.mark.req(
    "ACP-V1-TRANSPORT-AGENT-STDOUT-ONLY-ACP", "ACP-V1-TRANSPORT-STDIO-SHOULD", "ACP-V1-TRANSPORT-AGENT-STDERR-MAY"
)
def test_stdio_transport_protects_stdout():
    child = subprocess.run(
        [sys.executable, "-c", STDIO_CHILD],
        input=b'{"n":1}\n{"n":2}\n',
        capture_output=True,
        timeout=15,
    )
    assert child.returncode == 0, child.stderr.decode()
    assert child.stdout == b'before the transport is taken\n{"echo":{"n":1}}\n{"echo":{"n":2}}\n'
    for noise in (b"print after", b"sys.stdout after", b"fd 1 after", b"a child process"):
        assert noise in child.stderr


@pytest.mark.req(
    "ACP-V1-TRANSPORT-CUSTOM-MAY",
    "ACP-V1-TRANSPORT-CUSTOM-PRESERVE-FORMAT-AND-LIFECYCLE",
    "ACP-V1-TRANSPORT-CUSTOM-DOCUMENT",
)
@pytest.mark.parametrize("family", ["tcp", "unix"])
def test_socket_transports_carry_the_same_framing(family):
    if family == "unix" and not hasattr(socket, "AF_UNIX"):
        pytest.skip("no Unix-domain sockets here")
    # The framing of the socket transports is documented where the README quotes it.
    assert "Socket framing" in sockets.__doc__
    with tempfile.TemporaryDirectory() as directory:
        if family == "tcp":
            listener = sockets.listen_tcp()
            dial = lambda: sockets.connect_tcp(*listener.address[:2], timeout=5)  # noqa: E731
        else:
            listener = sockets.listen_unix(os.path.join(directory, "acp.sock"))
            dial = lambda: sockets.connect_unix(listener.address, timeout=5)  # noqa: E731
        with listener:
            accepted = []
            acceptor = threading.Thread(target=lambda: accepted.append(listener.accept(timeout=10)))
            acceptor.start()
            client = dial()
            acceptor.join()
            server = accepted[0]
            client.send(b'{"jsonrpc":"2.0","method":"hello"}')
            assert server.read_frames() == [b'{"jsonrpc":"2.0","method":"hello"}']
            server.send(b'{"text":"\xe2\x80\xa8"}')
            assert client.read_frames() == [b'{"text":"\xe2\x80\xa8"}']
            client.close()
            assert server.read_frames() is None  # closing one side ends the other's stream
            server.close()
        if family == "unix":
            assert not os.path.exists(listener.address)


def test_listener_accept_times_out():
    with sockets.listen_tcp() as listener:
        with pytest.raises(CallTimeout):
            listener.accept(timeout=0.05)


def test_connect_failure_is_connection_closed():
    with sockets.listen_tcp() as listener:
        port = listener.address[1]
    with pytest.raises(ConnectionClosed):
        sockets.connect_tcp("127.0.0.1", port, timeout=5)


def test_an_oversized_line_costs_at_most_the_limit_in_memory():
    # The reader must hold up to the limit of a line before it knows the line is too long, but
    # no more: once over, its bytes are dropped as they arrive, and the head it keeps (to tell
    # whose message it was) is cut from the first piece, not from a join of everything held.
    import tracemalloc

    limit = 4 * 1024 * 1024
    transport, feed, drain = pipe_transport(max_message_size=limit)
    big = b'{"jsonrpc":"2.0","id":7,"method":"m","params":"' + b"y" * (3 * limit) + b'"}'

    def write():
        view = memoryview(big)
        while view:
            view = view[os.write(feed, view[: 256 * 1024]) :]
        os.write(feed, b'\n{"after":2}\n')
        os.close(feed)

    writer = threading.Thread(target=write)
    tracemalloc.start()
    try:
        writer.start()
        frames = read_all(transport)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        writer.join()
    assert isinstance(frames[0], OversizedFrame) and frames[0].size == len(big)
    assert big.startswith(frames[0].head) and frames[1] == b'{"after":2}'
    # The limit, plus the read buffer (1 MiB) and one read's piece: never twice the limit.
    assert peak < limit + 3 * 1024 * 1024, peak
    transport.close()
    os.close(drain)
