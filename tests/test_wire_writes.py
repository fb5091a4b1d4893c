"""The write path of acp_lite.wire: ordering, coalescing of streams, flush, close and failures,
over real pipes (and a counting file object where the number of writes is the point)."""

import io
import json
import os
import socket
import subprocess
import sys
import threading
import time

import pytest

from acp_lite.errors import ConnectionClosed
from acp_lite.wire import Transport, memory_pair

pytestmark = pytest.mark.timeout(30)


def read_all(transport):
    frames = []
    while True:
        batch = transport.read_frames()
        if batch is None:
            return frames
        frames.extend(batch)


def background(target, *args):
    thread = threading.Thread(target=target, args=args)
    thread.start()
    return thread


def flushers():
    return [t.name for t in threading.enumerate() if t.name.startswith("acp-flusher-")]


class CountingSink:
    """A binary file object without a descriptor: the transport writes through ``write``, one
    call per system write it would make. Each write takes a little while, as a pipe to a busy
    peer does, so that a sender can get ahead of the writer."""

    def __init__(self, fail_after=None):
        self.writes = []
        self.fail_after = fail_after

    def write(self, data):
        if self.fail_after is not None and len(self.writes) >= self.fail_after:
            raise BrokenPipeError("the peer went away")
        time.sleep(0.0002)
        self.writes.append(bytes(data))

    def flush(self):
        pass

    def close(self):
        pass


def sink_transport(**options):
    sink = CountingSink(**options)
    return Transport(io.BytesIO(b""), sink, name="sink"), sink


@pytest.mark.req("ACP-V1-TRANSPORT-STDIO-NEWLINE-DELIMITED")
def test_a_fast_single_sender_arrives_whole_and_in_order():
    a, b = memory_pair()
    received = []
    reader = background(lambda: received.extend(read_all(b)))
    frames = [b'{"i":%d,"pad":"%s"}' % (i, b"x" * (i % 700)) for i in range(20_000)]
    for frame in frames:
        a.send(frame)
    a.close()
    assert flushers() == []  # close() stops the flusher before it returns
    reader.join()
    assert received == frames
    b.close()


@pytest.mark.req("ACP-V1-TRANSPORT-STDIO-NEWLINE-DELIMITED")
def test_several_streaming_threads_each_keep_their_order():
    a, b = memory_pair()
    threads, per_thread = 4, 5_000
    received = []
    reader = background(lambda: received.extend(read_all(b)))

    def stream(k):
        for i in range(per_thread):
            a.send(b'{"t":%d,"i":%d}' % (k, i))

    senders = [background(stream, k) for k in range(threads)]
    for sender in senders:
        sender.join()
    a.close()
    reader.join()
    assert len(received) == threads * per_thread
    seen = {k: [] for k in range(threads)}
    for frame in received:
        message = json.loads(frame)
        seen[message["t"]].append(message["i"])
    assert seen == {k: list(range(per_thread)) for k in range(threads)}
    b.close()


def test_a_lone_send_is_on_the_wire_when_send_returns():
    read_fd, feed = os.pipe()
    drain, write_fd = os.pipe()
    os.set_blocking(drain, False)
    transport = Transport(read_fd, write_fd)
    transport.send(b'{"first":1}')
    assert os.read(drain, 1000) == b'{"first":1}\n'

    # After a stream has gone out and the connection is quiet again, the next message is a
    # lone one once more: written by its sender, not left to the flusher.
    stream = b"".join(b'{"s":%d}\n' % i for i in range(2_000))
    got = b""
    for i in range(2_000):
        transport.send(b'{"s":%d}' % i)
        got += _read_available(drain)
    assert transport.flush()
    got += _read_available(drain)
    assert got == stream
    time.sleep(0.2)  # quiet: far longer than the gap between the frames of a stream
    transport.send(b'{"lone":1}')
    assert os.read(drain, 1000) == b'{"lone":1}\n'

    lone_from_another_thread = background(transport.send, b'{"other":1}')
    lone_from_another_thread.join()
    assert os.read(drain, 1000) == b'{"other":1}\n'
    transport.close()
    os.close(feed)
    os.close(drain)


def drained_transport(name):
    """A transport writing into a pipe whose reading end ``drain`` never blocks: what a send
    wrote is there to read at once. Returns (transport, feed, drain); close all three."""
    read_fd, feed = os.pipe()
    drain, write_fd = os.pipe()
    os.set_blocking(drain, False)
    return Transport(read_fd, write_fd, name=name), feed, drain


def _read_available(fd):
    try:
        return os.read(fd, 1 << 20)
    except BlockingIOError:
        return b""


def test_a_stream_from_one_thread_goes_out_in_fewer_writes_than_frames():
    transport, sink = sink_transport()
    frames = [b'{"i":%d}' % i for i in range(3_000)]
    for frame in frames:
        transport.send(frame)
    transport.close()
    assert b"".join(sink.writes) == b"".join(frame + b"\n" for frame in frames)
    assert len(sink.writes) < len(frames)
    assert flushers() == []


def test_a_short_run_of_quick_sends_is_written_by_its_sender():
    # A paced sender that fell behind catches up with a few sends back to back and then computes
    # again; a flusher thread would wait for the GIL all that time. Each frame of such a run is
    # written by its sender: on the wire when the run ends, with no flusher started.
    transport, feed, drain = drained_transport("catching-up")
    try:
        for burst in range(3):
            frames = [b'{"burst":%d,"i":%d}' % (burst, i) for i in range(20)]
            for frame in frames:
                transport.send(frame)
            assert flushers() == []
            assert _read_available(drain) == b"".join(frame + b"\n" for frame in frames)
            time.sleep(0.01)  # the sender computes, then falls behind again
    finally:
        transport.close()
    os.close(feed)
    os.close(drain)


def _recv_available(sock):
    try:
        return sock.recv(1 << 20, socket.MSG_DONTWAIT)
    except BlockingIOError:
        return b""


def _recv_until(sock, ending, timeout=10.0):
    got = b""
    deadline = time.monotonic() + timeout
    while not got.endswith(ending) and time.monotonic() < deadline:
        got += _recv_available(sock)
    return got


def _bounded_transport(kind):
    """A transport whose writes can be read at once, over a pipe or a socket: (transport, what
    arrived so far, a function closing the rest)."""
    if kind == "pipe":
        transport, feed, drain = drained_transport("bounded-pipe")
        return transport, lambda: _read_available(drain), lambda: (os.close(feed), os.close(drain))
    ours, peer = socket.socketpair()
    return Transport(ours, ours, name="bounded-socket"), lambda: _recv_available(peer), peer.close


@pytest.mark.parametrize("kind", ["pipe", "socket"])
def test_a_bounded_send_that_cannot_block_is_written_by_its_sender(kind):
    # A call with a timeout must never block in its write. When the pipe has room for the whole
    # frame the write cannot block; a socket is asked not to block and takes it. Either way the
    # sender makes the write itself: no flusher thread is woken for it (a thread hop per call,
    # which cost a sequential round trip about 50 µs here).
    transport, arrived, close_rest = _bounded_transport(kind)
    try:
        for i in range(3):
            transport.send(b'{"call":%d}' % i, timeout=1.0)
            assert arrived() == b'{"call":%d}\n' % i
        transport.send(b'{"cancel":1}', timeout=0)
        assert arrived() == b'{"cancel":1}\n'
        assert flushers() == []
    finally:
        transport.close()
        close_rest()


def test_a_bounded_send_into_a_full_pipe_returns_at_once_and_the_frame_follows():
    # No room: the frame is left to the flusher and the sender returns without blocking; once
    # the peer reads again, the frame goes out after what filled the pipe.
    read_fd, feed = os.pipe()
    drain, write_fd = os.pipe()
    os.set_blocking(drain, False)
    os.set_blocking(write_fd, False)
    filled = 0
    try:
        while True:
            filled += os.write(write_fd, b"x" * 4096)
    except BlockingIOError:
        pass
    os.set_blocking(write_fd, True)
    transport = Transport(read_fd, write_fd, name="full")
    try:
        started = time.monotonic()
        transport.send(b'{"late":1}', timeout=0.5)
        assert time.monotonic() - started < 0.4
        got = b""
        deadline = time.monotonic() + 10
        while not got.endswith(b'{"late":1}\n') and time.monotonic() < deadline:
            got += _read_available(drain)
        assert got == b"x" * filled + b'{"late":1}\n'
    finally:
        transport.close()
    os.close(feed)
    os.close(drain)


def test_a_bounded_send_into_a_full_socket_returns_at_once_and_the_frame_follows():
    ours, peer = socket.socketpair()
    ours.setblocking(False)
    filled = 0
    try:
        while True:
            filled += ours.send(b"x" * 4096)
    except BlockingIOError:
        pass
    ours.setblocking(True)
    transport = Transport(ours, ours, name="full-socket")
    try:
        started = time.monotonic()
        transport.send(b'{"late":1}', timeout=0.5)
        assert time.monotonic() - started < 0.4
        assert _recv_until(peer, b'{"late":1}\n') == b"x" * filled + b'{"late":1}\n'
    finally:
        transport.close()
        peer.close()


class _TakesFiveBytes(socket.socket):
    """A socket whose ``send`` takes at most five bytes: the part of a frame a full socket takes."""

    def send(self, data, flags=0):
        return super().send(data[:5], flags)


def test_the_rest_of_a_bounded_send_goes_out_before_what_was_sent_after_it():
    # The socket takes part of the frame at once; the sender leaves the rest to the flusher and
    # returns. A frame sent next must not overtake that rest, and flush() waits for it.
    plain, peer = socket.socketpair()
    ours = _TakesFiveBytes(fileno=plain.detach())
    transport = Transport(ours, ours, name="partial-socket")
    try:
        transport.send(b'{"call":1,"pad":"%s"}' % (b"y" * 3000), timeout=1.0)
        transport.send(b'{"next":2}')
        assert transport.flush(5.0)
        expected = b'{"call":1,"pad":"%s"}\n{"next":2}\n' % (b"y" * 3000)
        assert _recv_until(peer, b'{"next":2}\n') == expected
    finally:
        transport.close()
        peer.close()


def test_flush_waits_for_what_was_sent_before_it_not_for_a_stream_that_goes_on():
    a, b = memory_pair()
    reader = background(read_all, b)
    stop = threading.Event()
    sent = []

    def stream():
        i = 0
        while not stop.is_set():
            a.send(b'{"i":%d}' % i)
            i += 1
            if i == 1_000:
                sent.append(i)

    sender = background(stream)
    while not sent:
        time.sleep(0.001)
    assert a.flush()  # returns although the sender never pauses
    stop.set()
    sender.join()
    a.close()
    reader.join()
    b.close()


def test_close_during_a_stream_writes_every_accepted_frame_and_stops_the_flusher():
    a, b = memory_pair()
    received = []
    reader = background(lambda: received.extend(read_all(b)))
    accepted = []
    started = threading.Event()

    def stream():
        i = 0
        try:
            while True:
                frame = b'{"i":%d}' % i
                a.send(frame)
                accepted.append(frame)
                i += 1
                if i == 2_000:
                    started.set()
        except ConnectionClosed:
            pass

    sender = background(stream)
    started.wait()
    a.close()
    assert flushers() == []
    sender.join()
    reader.join()
    assert received == accepted
    b.close()


def test_a_peer_that_stops_reading_holds_senders_at_the_limit_and_close_still_returns():
    read_fd, feed = os.pipe()
    drain, write_fd = os.pipe()
    # The peer never reads `drain`: the pipe fills, and so does the transport's backlog.
    transport = Transport(read_fd, write_fd)
    outcomes = []

    def send(frames):
        try:
            for frame in frames:
                transport.send(frame)
            outcomes.append("all sent")
        except ConnectionClosed as exc:
            outcomes.append(exc)

    # The first sender takes the writer role and blocks inside its write (4 MB is more than a
    # pipe holds), the second sends 16 MB behind it: it must stop at the backlog limit.
    blocked_writer = background(send, [b"w" * (4 << 20)])
    blocked_writer.join(0.2)
    assert blocked_writer.is_alive()
    held_back = background(send, [b"x" * (1 << 20)] * 16)
    held_back.join(0.2)
    assert held_back.is_alive()

    transport.close(timeout=0.5)
    held_back.join()  # woken by close(), refused
    assert len(outcomes) == 1 and isinstance(outcomes[0], ConnectionClosed)

    os.close(drain)  # the peer goes away: the blocked write fails, the streams are released
    blocked_writer.join()
    assert len(outcomes) == 2 and isinstance(outcomes[1], ConnectionClosed)
    os.close(feed)


# What a transport may hold to write, the frames waiting and the batch its flusher is writing
# included, before a sender waits (docs/robustness.md).
WRITE_BOUND = 8 << 20


def _settled_while_held(transport, count):
    """``count()`` once the sender is held back (``backed_up``) and it has stopped growing."""
    deadline = time.monotonic() + 20
    last = None
    while time.monotonic() < deadline:
        now = count()
        if transport.backed_up and now == last:
            return now
        last = now
        time.sleep(0.2)
    raise AssertionError("the sender was never held back")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the pipe's size with F_GETPIPE_SZ")
def test_what_a_transport_holds_for_a_peer_that_stops_reading_includes_the_batch_being_written():
    # Bounded sends of frames over PIPE_BUF never write themselves: every frame goes through the
    # backlog to the flusher. The peer reads nothing, then a little (the flusher finishes its
    # batch and takes the whole backlog as the next one), then nothing again. The bytes accepted
    # by send and not read are in the pipe or held by the transport; what it holds must stay
    # within the bound even while its flusher is blocked inside an 8 MiB write.
    import fcntl

    read_fd, feed = os.pipe()
    drain, write_fd = os.pipe()
    pipe_size = fcntl.fcntl(write_fd, getattr(fcntl, "F_GETPIPE_SZ", 1032))
    transport = Transport(read_fd, write_fd, name="held")
    frame = b'{"pad":"%s"}' % (b"p" * 8000)
    accepted = [0]

    def stream():
        try:
            while True:
                transport.send(frame, timeout=60)
                accepted[0] += len(frame) + 1
        except ConnectionClosed:
            pass

    sender = background(stream)
    try:
        held = _settled_while_held(transport, lambda: accepted[0]) - pipe_size
        assert held <= WRITE_BOUND + len(frame) + 1
        read = 0
        while read < 2 << 20:
            read += len(os.read(drain, min(1 << 20, (2 << 20) - read)))
        held = _settled_while_held(transport, lambda: accepted[0]) - read - pipe_size
        assert held <= WRITE_BOUND + len(frame) + 1, f"{held / (1 << 20):.1f} MiB held to write"
    finally:
        transport.close(timeout=0.3)
        os.close(drain)  # the blocked write fails, the flusher ends
        sender.join()
        os.close(feed)


def test_a_stream_to_a_peer_that_stops_reading_ends_with_connection_closed():
    read_fd, feed = os.pipe()
    drain, write_fd = os.pipe()
    transport = Transport(read_fd, write_fd)
    outcome = []

    def stream():
        try:
            for i in range(20_000):
                transport.send(b'{"i":%d,"pad":"%s"}' % (i, b"p" * 1000))
            outcome.append("all sent")
        except ConnectionClosed as exc:
            outcome.append(exc)

    sender = background(stream)
    sender.join(0.3)
    assert sender.is_alive()  # 20 MB cannot fit in a pipe nobody reads plus the backlog
    transport.close(timeout=0.3)
    os.close(drain)
    sender.join()
    assert isinstance(outcome[0], ConnectionClosed)
    os.close(feed)


def test_a_failed_write_in_a_stream_fails_later_sends_with_the_closed_error():
    sink = CountingSink(fail_after=3)
    transport = Transport(io.BytesIO(b""), sink, closed_error=lambda: ConnectionClosed("the peer went away"))
    with pytest.raises(ConnectionClosed, match="the peer went away"):
        i = 0
        while True:  # the failure reaches this thread whichever thread made the failed write
            transport.send(b'{"i":%d}' % i)
            i += 1
    with pytest.raises(ConnectionClosed, match="the peer went away"):
        transport.send(b"{}")
    assert transport.flush()
    transport.close()
    assert flushers() == []


def test_a_failed_lone_write_raises_in_its_sender():
    read_fd, feed = os.pipe()
    drain, write_fd = os.pipe()
    os.close(drain)
    transport = Transport(read_fd, write_fd, closed_error=lambda: ConnectionClosed("reader gone"))
    with pytest.raises(ConnectionClosed, match="reader gone"):
        transport.send(b"{}")
    with pytest.raises(ConnectionClosed, match="reader gone"):
        transport.send(b"{}")
    transport.close()
    os.close(feed)


# -- a stream and the frames after it ---------------------------------------------------------------
def test_a_loop_of_quick_sends_is_a_stream_for_the_flusher():
    transport, sink = sink_transport()
    frames = [b'{"id":%d,"result":null}' % i for i in range(2_000)]
    for frame in frames:
        transport.send(frame)
    assert flushers() == ["acp-flusher-sink"]
    transport.close()
    assert b"".join(sink.writes) == b"".join(frame + b"\n" for frame in frames)
    assert len(sink.writes) < len(frames)


def test_a_frame_after_a_stream_goes_behind_the_frames_waiting_in_the_backlog():
    transport, sink = sink_transport()
    sent = []
    for round_ in range(20):
        # Stream until frames wait for the flusher (each write of the sink takes a while).
        while True:
            frame = b'{"r":%d,"i":%d}' % (round_, len(sent))
            transport.send(frame)
            sent.append(frame)
            if transport._backlog:
                break
        answer = b'{"r":%d,"id":%d,"result":null}' % (round_, len(sent))
        transport.send(answer)
        sent.append(answer)
    transport.close()
    assert b"".join(sink.writes) == b"".join(frame + b"\n" for frame in sent)


# -- a program that exits without closing ------------------------------------------------------------
EXITS_WITHOUT_CLOSE = """
import os, sys
from acp_lite.wire import Transport
transport = Transport(os.open(os.devnull, os.O_RDONLY), 1, name="exiting")
timeout = float(sys.argv[2]) if len(sys.argv) > 2 else None
for i in range(int(sys.argv[1])):
    transport.send(b'{"i":%d}' % i, timeout=timeout)
"""


def _run_exiting_sender(count, stdout, timeout=None):
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=repo)
    argv = [sys.executable, "-c", EXITS_WITHOUT_CLOSE, str(count)] + ([] if timeout is None else [str(timeout)])
    return subprocess.Popen(argv, stdout=stdout, env=env)


@pytest.mark.req("ACP-V1-TRANSPORT-STDIO-NEWLINE-DELIMITED")
def test_a_program_that_exits_without_closing_still_sends_every_frame():
    # The stream goes through the flusher, a daemon thread the interpreter would stop dead at
    # exit; the exit hook flushes first.
    sender = _run_exiting_sender(200_000, subprocess.PIPE)
    out, _ = sender.communicate(timeout=30)
    assert sender.returncode == 0
    assert out == b"".join(b'{"i":%d}\n' % i for i in range(200_000))


@pytest.mark.slow
def test_the_exit_flush_gives_up_on_a_peer_that_does_not_read():
    # More than the pipe holds, nobody reading: the program still exits, after the hook's
    # bounded wait, instead of hanging on the flush. Its sends are bounded (timeout=0), so they
    # queue what the pipe cannot take: an unbounded send may block in a write itself (a sender
    # whose sends are a while apart writes its own frames), and bounding that is the caller's.
    read_end, write_end = os.pipe()
    sender = _run_exiting_sender(100_000, write_end, timeout=0)
    os.close(write_end)
    try:
        assert sender.wait(timeout=20) == 0
    finally:
        if sender.poll() is None:
            sender.kill()
            sender.wait()
        os.close(read_end)
