"""Stream transports: newline-delimited UTF-8 JSON messages over a pair of byte streams.

``Transport`` implements the seam of ``transport.MessageTransport`` over file descriptors, file
objects and sockets. Rules this module keeps:

- Lines are cut as ``framing`` says (one message per line, split on the byte ``0x0A`` only; a
  line over ``max_message_size``, 64 MiB unless configured, reported as an ``OversizedFrame``
  without being buffered). The encoder above never puts a raw newline inside a message.
- Reads take chunks into a buffer the transport keeps (one system call hands over many
  messages, and no allocation is made and freed per read), sized on demand: small while the
  connection is idle or quiet, up to 1 MiB while a burst lasts. On Linux a pipe the
  transport reads from is enlarged to 1 MiB (where the OS allows), so a streaming peer hands
  over up to that much per read instead of 64 KiB.
- Writes from any number of threads never interleave and are never reordered: one thread at a time
  holds the writer role, and once frames wait in the backlog every later frame goes behind them. A
  lone message is written at once by its sender, in its own thread (no timer, no hop), and so is
  each frame of a short run of quick sends, and a frame whose sender must not block (a call with
  a timeout, a host's UI thread) when its write cannot block (a small frame into a pipe the OS
  reports writable; to a socket, as much as it takes at once, the rest left to the flusher).
  Frames sent while a write is under way, a thread's frames once its quick sends make a long run
  (a stream of updates), and frames whose sender must not block where the write could, are left
  in the backlog for the transport's flusher thread (started on first need), which writes all
  that piled up in one write, so a busy connection makes few, large writes. A sender waits only
  while the frames waiting and the batch being written hold over 8 MiB (the peer stopped
  reading): the bytes a transport holds for writing stay within 8 MiB and the frame that
  crosses it. One that must not block is then refused (``CallTimeout``) once its timeout has
  passed, at once for a timeout of 0.
- ``close()`` flushes the backlog (in bounded time), then stops the flusher thread, wakes a
  reader blocked in a read, and releases the streams once no thread is inside a read or a write
  any more, so a descriptor number is never closed under a thread still using it.

Transports. ``Transport`` wraps any pair of binary streams: file descriptors, binary file objects
(subprocess pipes) or a connected socket. Helpers build the usual ones: ``stdio_transport()``
(this process's stdin/stdout, with stdout protected), ``process_transport()`` (an
``AgentProcess``), ``memory_pair()`` (two connected transports over OS pipes, for tests); the
socket ones are in ``sockets``.
"""

import atexit
import functools
import os
import select
import socket
import stat
import sys
import threading
import time
import weakref
from typing import Any, Callable, List, Optional, Tuple

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None  # type: ignore[assignment]

from .errors import CallTimeout, ConnectionClosed, UsageError
from .framing import DEFAULT_MAX_MESSAGE_SIZE, Block, Frame, LineSplitter, OversizedFrame
from .transport import MessageTransport, in_event_loop, wait_limit

# The read buffer is sized on demand: it starts at _READ_FIRST (what an idle connection keeps),
# grows fourfold each time a read fills it, up to _READ_CHUNK (a burst of small messages then
# costs one system call per few thousand of them), and shrinks back after _SHRINK_AFTER reads in
# a row that _READ_FIRST would have held (the burst is over).
_READ_FIRST = 16 * 1024
_READ_CHUNK = 1024 * 1024
_SHRINK_AFTER = 64

# The size asked for a pipe the transport reads from (Linux ``F_SETPIPE_SZ``; 1031 where the
# fcntl module predates the name). The default 64 KiB makes a fast writer and its reader take
# turns every few hundred messages, and every turn costs both a wake-up.
_PIPE_SIZE = 1024 * 1024
_F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031) if sys.platform.startswith("linux") else None

# A sender waits while more than this many bytes wait to be written, in the backlog or in the
# batch the flusher is writing: the peer is not reading, and letting the backlog grow without
# bound would only move the problem into our memory. The batch being written counts until its
# write returns: a write blocked on a peer that reads nothing still holds all of it.
_WRITE_BACKLOG_LIMIT = 8 * 1024 * 1024

# A send from the thread that last wrote, arriving less than this many seconds after the writer
# role was given up, continues a run of quick sends (a loop sending updates leaves a few
# microseconds between frames). Once a run is ``_STREAM_RUN`` frames long it is a stream, and its
# frames are left to the flusher thread, so that the stream goes out in large writes. A shorter
# run is written frame by frame by its sender: a paced sender that fell behind catches up with a
# few quick sends and then computes again, and while it computes the flusher would wait for the
# GIL, up to a switch interval (5 ms), before it could write them. 64 frames are a 5,000/s stream
# catching up after a 13 ms stall, and cost a long stream 64 writes of their own. Lone messages,
# and frames the peer waits for (requests and answers, even several in a row), are always written
# at once by their sender.
_STREAM_GAP = 30e-6
_STREAM_RUN = 64

# The flusher exits once it has had nothing to write for this long: an idle connection holds no
# flusher thread (a stream starts one again at its 64th frame).
_FLUSHER_IDLE_SECONDS = 2.0

# The flusher is a daemon thread, which the interpreter stops dead at exit: a program that ends
# without closing its connection would lose the frames still waiting for it. An exit hook
# flushes every transport that has a flusher, for at most this many seconds in all (a peer
# that stopped reading must not hold the exit).
_EXIT_FLUSH_SECONDS = 2.0
_TRANSPORTS_WITH_FLUSHERS: "weakref.WeakSet[Transport]" = weakref.WeakSet()


def _flush_transports_at_exit() -> None:
    deadline = time.monotonic() + _EXIT_FLUSH_SECONDS
    for transport in list(_TRANSPORTS_WITH_FLUSHERS):
        transport.flush(max(0.0, deadline - time.monotonic()))


# Exit hooks run once the program's own (non-daemon) threads have ended, while daemon threads,
# the flushers among them, still run.
atexit.register(_flush_transports_at_exit)


def _stream_io(stream: Any, reading: bool) -> Tuple[Callable[..., Any], Optional[int], Callable[[], None]]:
    """(read-into-or-write function, its descriptor or None, close function) for one stream (a
    socket's descriptor only when reading: a socket is written with ``sendall``).

    Reading fills a writable buffer and returns the byte count (0 at end of stream). A socket
    uses recv_into/sendall; anything with a descriptor is read and written through it with
    ``os.readv``/``os.write`` (no Python-level buffering in the way); a file object without one
    falls back to its own methods.
    """
    if isinstance(stream, socket.socket):
        if reading:
            return stream.recv_into, stream.fileno(), stream.close
        return stream.sendall, None, stream.close
    if isinstance(stream, int):
        fd, close = stream, lambda: os.close(stream)
    else:
        try:
            fd = stream.fileno()
        except (AttributeError, OSError, ValueError):
            fd = -1
        close = stream.close
        if fd < 0:
            if reading:
                return _copying_reader(getattr(stream, "read1", stream.read)), None, close
            return _flushing_writer(stream), None, close
    if reading:
        if hasattr(os, "readv"):
            return lambda buffer: os.readv(fd, (buffer,)), fd, close
        return _copying_reader(lambda size: os.read(fd, size)), fd, close
    return functools.partial(_write_all_fd, fd), fd, close  # (no Python frame of its own, unlike a lambda)


def _copying_reader(read: Callable[[int], bytes]) -> Callable[[bytearray], int]:
    def read_into(buffer: bytearray) -> int:
        data = read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    return read_into


def _enlarge_pipe(fd: Optional[int]) -> None:
    if fd is None or _F_SETPIPE_SZ is None:
        return
    try:
        if stat.S_ISFIFO(os.fstat(fd).st_mode):
            fcntl.fcntl(fd, _F_SETPIPE_SZ, _PIPE_SIZE)
    except OSError:
        pass  # over the per-user pipe memory limit, or not allowed: the default size works too


def _pipe_room_poll(fd: Optional[int]) -> Optional[Any]:
    """A poll object that tells whether the pipe ``fd`` writes to has room, or None (not a pipe,
    or no ``poll`` here): a sender that must not block (a call with a timeout) then writes its
    small frame itself instead of waking the flusher thread for it (a thread hop per call)."""
    if fd is None or not hasattr(select, "poll") or not hasattr(select, "PIPE_BUF"):
        return None
    try:
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            return None
    except OSError:
        return None
    poll = select.poll()
    poll.register(fd, select.POLLOUT)
    return poll


def _nowait_socket(stream: Any) -> Optional[socket.socket]:
    """``stream`` if it is a blocking socket that a send may ask not to block (``MSG_DONTWAIT``),
    else None: a sender that must not block (a call with a timeout) then writes its frame itself,
    as much as the socket takes at once, instead of waking the flusher thread for all of it."""
    if isinstance(stream, socket.socket) and hasattr(socket, "MSG_DONTWAIT") and stream.gettimeout() is None:
        return stream
    return None


def _flushing_writer(stream: Any) -> Callable[[bytes], None]:
    def write(data: bytes) -> None:
        stream.write(data)
        stream.flush()

    return write


def _write_all_fd(fd: int, data: bytes) -> None:
    written = os.write(fd, data)
    if written < len(data):  # a full pipe took part of it: the rest goes without copying
        view = memoryview(data)[written:]
        while view:
            view = view[os.write(fd, view) :]


class Transport(MessageTransport):
    """A bidirectional stream of newline-delimited frames.

    ``reader`` and ``writer`` are file descriptors, binary file objects or sockets (the same
    socket may be both); the transport owns them and closes them in ``close()``.
    ``closed_error``, when given, builds the ``ConnectionClosed`` the layer above raises once the
    stream has ended (a process transport puts the exit code and stderr tail in it).

    Thread affinity: ``read_blocks``/``read_frames`` are for one reader thread at a time (the
    caller hands the reading from one thread to another under a lock of its own); ``send``,
    ``flush``, ``close`` and ``closed_error`` may be called from any thread. The transport starts
    one thread of its own, the flusher (``acp-flusher-<name>``), when a backlog is left to it and
    none runs; it ends once idle for ``_FLUSHER_IDLE_SECONDS``, or at ``close``.
    """

    def __init__(
        self,
        reader: Any,
        writer: Any,
        *,
        max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
        name: str = "transport",
        closed_error: Optional[Callable[[], ConnectionClosed]] = None,
    ):
        if max_message_size < 1:
            raise UsageError(f"max_message_size must be positive, not {max_message_size}")
        self.name = name
        self.max_message_size = max_message_size
        self._closed_error_hook = closed_error
        self._read, read_fd, close_reader = _stream_io(reader, reading=True)
        self._write, write_fd, close_writer = _stream_io(writer, reading=False)
        self._closers = [close_reader] if reader is writer else [close_reader, close_writer]
        self._sockets = [s for s in (reader, writer) if isinstance(s, socket.socket)]
        # Where a reader can wait on two descriptors at once, it also watches a wake-up pipe, so
        # that close() can interrupt a read that would otherwise block until the peer writes.
        self._poll: Optional[Any] = None
        self._wake: Optional[Tuple[int, int]] = None
        if read_fd is not None and hasattr(select, "poll"):
            self._wake = os.pipe()
            self._poll = select.poll()
            self._poll.register(read_fd, select.POLLIN)
            self._poll.register(self._wake[0], select.POLLIN)
        self._watchable_fd: Optional[int] = None
        if read_fd is not None and self._poll is not None and not stat.S_ISREG(os.fstat(read_fd).st_mode):
            self._watchable_fd = read_fd
        _enlarge_pipe(read_fd)
        self._pipe_room = _pipe_room_poll(write_fd)
        self._nowait = _nowait_socket(writer)
        # Reader state (reader thread only). The buffer is allocated at the first read.
        self._buffer: Optional[bytearray] = None
        self._small_reads = 0  # reads in a row that a _READ_FIRST buffer would have held
        self._lines = LineSplitter(max_message_size)
        self._eof = False
        # Shared state, under one lock: the write backlog, the writer role and the close protocol.
        # ``_cond`` is notified only when a thread waits on it (``_waiting``): a lone send then
        # costs two plain lock acquisitions around its write.
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._waiting = 0
        self._senders_held = 0  # senders waiting for room in the backlog
        self._backlog: List[bytes] = []  # frames without their newlines
        self._backlog_size = 0
        self._batch_size = 0  # bytes of the batch the flusher is writing
        self._writing = False  # a thread (a sender or the flusher) holds the writer role
        # Writes begun and writes done, counted so that flush() waits for what was sent before
        # it and not for a stream that goes on.
        self._batches_taken = 0
        self._batches_written = 0
        self._last_writer: Optional[int] = None  # the thread that last took the role by sending
        self._idle_since = float("-inf")  # when the writer role was last given up
        self._quick_sends = 0  # the length of the last writer's current run of quick sends
        self._flusher: Optional[threading.Thread] = None
        self._flusher_cond = threading.Condition(self._lock)
        self._flusher_has_role = False
        self._write_failed = False
        self._active = 0  # threads inside a read, or holding the writer role
        self._closing = False
        self._reading_stopped = False
        self._released = False

    # -- reading (reader thread) --------------------------------------------------------------
    def read_blocks(self) -> Optional[List[Block]]:
        """Block until at least one complete line arrives; return what was read, in stream order:
        blocks (the bytes of one or more whole lines, joined by ``b"\\n"``, without the last
        newline; a line may be empty or end in ``\\r``) and ``OversizedFrame`` reports. At end
        of stream the unterminated last line, if any, comes as a block of its own; after that,
        and once ``close()`` has begun, returns None. Reader thread only.
        """
        while not self._eof:
            blocks = self._read_once(True)
            if blocks is None or blocks:
                return blocks
        return None

    @property
    def read_descriptor(self) -> Optional[int]:
        """The descriptor an event loop may watch (``transport.LoopReadable``): a pipe's, a socket's or a
        terminal's, not a regular file's (which a poll always finds readable). None where there is none."""
        return self._watchable_fd

    def read_ready(self) -> Optional[List[Block]]:
        """Once ``read_descriptor`` is readable: what one read brought, as ``read_blocks`` returns it (perhaps an
        empty list); None as ``read_blocks``. Reader only."""
        return None if self._eof else self._read_once(False)

    def _read_once(self, wait: bool) -> Optional[List[Block]]:
        size = self._read_chunk(wait)
        if size is None:  # close() began: a partial line is not a message
            self._eof = True
            return None
        if not size:
            self._eof = True
            return self._lines.at_end()
        assert self._buffer is not None
        blocks = self._lines.feed(self._buffer, size)
        self._size_buffer(size)
        return blocks

    def read_frames(self) -> Optional[List[Frame]]:
        """Like ``read_blocks``, one line (or ``OversizedFrame``) per item. Reader thread only."""
        blocks = self.read_blocks()
        if blocks is None:
            return None
        frames: List[Frame] = []
        for block in blocks:
            if isinstance(block, OversizedFrame):
                frames.append(block)
            else:
                frames.extend(block.split(b"\n"))
        return frames

    def stop_reading(self) -> None:
        """End the reading: a read under way returns None at once (where the transport can wake
        it), and so does every later one; writing goes on until ``close()``. Any thread."""
        with self._lock:
            if self._reading_stopped:
                return
            self._reading_stopped = True
            if self._wake is not None and not self._released:
                os.write(self._wake[1], b"x")

    def _size_buffer(self, read: int) -> None:
        # Reader thread, once what the last read brought has left the buffer (see _READ_FIRST).
        assert self._buffer is not None
        size = len(self._buffer)
        if read == size and size < _READ_CHUNK:
            self._buffer = bytearray(min(4 * size, _READ_CHUNK))
            self._small_reads = 0
        elif size > _READ_FIRST:
            self._small_reads = self._small_reads + 1 if read <= _READ_FIRST else 0
            if self._small_reads >= _SHRINK_AFTER:
                self._buffer = bytearray(_READ_FIRST)
                self._small_reads = 0

    def _read_chunk(self, wait: bool = True) -> Optional[int]:
        """Read into the buffer (``wait``: once readable or woken, else at once, the descriptor readable); the byte
        count, 0 at end of stream, None once ``close()`` (or ``stop_reading()``) has begun."""
        with self._lock:
            if self._closing or self._reading_stopped:
                return None
            self._active += 1
        try:
            if self._buffer is None:
                self._buffer = bytearray(_READ_FIRST)
            if wait and self._poll is not None:
                assert self._wake is not None
                wake = self._wake[0]
                for fd, _ in self._poll.poll():
                    if fd == wake:
                        return None
            return self._read(self._buffer)
        except (OSError, ValueError):
            # A reset socket, or a stream closed under us by its owner: the stream ended.
            return 0
        finally:
            self._leave_io()

    # -- writing (any thread) -----------------------------------------------------------------
    def send(self, frame: bytes, timeout: Optional[float] = None) -> None:
        """Write one frame (without its newline, which is added here). Any thread.

        Returns once the frame is written or queued behind the frames already waiting, which
        the thread holding the writer role (possibly the flusher) writes next; ``close()`` or
        ``flush()`` before the process exits makes sure the queue went out (an exit hook
        flushes too, for up to a couple of seconds). With a ``timeout`` (on a thread that runs
        an event loop, always: 0 if None) the sender never blocks longer than that: it waits
        for room in the backlog at most that long (``CallTimeout`` if there is none), and
        writes the frame itself only when the write cannot block (a frame of less than
        ``PIPE_BUF`` bytes into a pipe with room; to a socket, what it takes at once); else it
        leaves the write (or its rest) to the flusher (a write blocks while the peer does not
        read). Raises
        ``ConnectionClosed`` when the transport is closed (at once) or a write failed (then the
        ``closed_error`` of the stream), ``UsageError`` when the frame contains a newline.
        """
        if 10 in frame:  # (faster than ``b"\\n" in frame``, which first tries b"\\n" as an int)
            raise UsageError("a frame must not contain a newline byte")
        # The lock is taken explicitly: on CPython 3.11 ``with`` costs a good part of what the
        # rest of a queued send does.
        self._lock.acquire()
        try:
            if self._backlog_size + self._batch_size > _WRITE_BACKLOG_LIMIT:
                self._wait_for_room(wait_limit(timeout))
            refused = self._closing or self._write_failed
            if not refused:
                # None: queued (behind another writer, or for the flusher); else: must its own write not block.
                bounded = None if self._writing else self._take_writer_role(timeout is not None, len(frame))
                if bounded is None:
                    self._backlog.append(frame)
                    self._backlog_size += len(frame) + 1
                    return
        finally:
            self._lock.release()
        if refused:
            if self._closing:
                raise ConnectionClosed(f"{self.name}: the transport was closed")
            raise self.closed_error()  # outside the lock: a process's hook waits for the exit
        try:
            if bounded and self._nowait is not None:
                if not self._send_without_blocking(frame + b"\n"):
                    return  # the rest is the flusher's
            else:
                self._write(frame + b"\n")
        except (OSError, ValueError) as exc:  # ValueError: a file object closed by its owner
            with self._lock:
                self._end_write(failed=True)
            raise self.closed_error() from exc
        except BaseException:  # a Ctrl-C in the write: part of the frame may be out, the stream is broken
            with self._lock:
                self._end_write(failed=True)
            raise
        with self._lock:
            self._batches_written += 1
            if self._backlog:  # other threads' frames arrived during the write
                self._hand_to_flusher()
            else:
                self._end_write(failed=False)

    def _take_writer_role(self, bounded: bool, size: int) -> Optional[bool]:
        # Under the lock, the role being free: take it. None when the role went to the flusher,
        # which writes what piles up meanwhile in one go: the frame ends a run of _STREAM_RUN
        # quick sends from the same thread, or the sender must not block (``bounded``, or on a
        # thread that runs an event loop) and the write could. Else the sender writes its frame
        # at once: whether that write must not block.
        writer = threading.get_ident()
        self._writing = True
        self._active += 1
        if writer == self._last_writer and time.monotonic() - self._idle_since < _STREAM_GAP:
            self._quick_sends += 1
            if self._quick_sends >= _STREAM_RUN:
                self._hand_to_flusher()
                return None
        else:
            self._quick_sends = 0
        bounded = bounded or in_event_loop()  # (asked only here, where the sender would write)
        if bounded and not self._room_for(size):
            self._hand_to_flusher()
            return None
        self._last_writer = writer
        self._batches_taken += 1
        return bounded

    def _room_for(self, size: int) -> bool:
        # Under the lock, holding the writer role: True when the sender may write ``size`` bytes
        # and its newline without blocking. A socket: always, as much as it takes at once (see
        # _send_without_blocking). A pipe: only we write to it, and the role is ours; a pipe the
        # OS reports writable has room for PIPE_BUF bytes (Linux: a free page; the BSDs and
        # macOS check that much), and a write of at most PIPE_BUF bytes goes in whole.
        if self._nowait is not None:
            return True
        return self._pipe_room is not None and size < select.PIPE_BUF and bool(self._pipe_room.poll(0))

    def _send_without_blocking(self, data: bytes) -> bool:
        # Holding the writer role, a sender that must not block: the socket takes what it has
        # room for; True if that was all. Else the rest goes to the flusher, ahead of the frames
        # queued meanwhile, and the role with it; the batch this sender took is not counted, the
        # flusher's next one (with the rest in it) is, so that flush() waits for the rest.
        assert self._nowait is not None
        try:
            sent = self._nowait.send(data, socket.MSG_DONTWAIT)
        except BlockingIOError:
            sent = 0
        if sent == len(data):
            return True
        with self._lock:
            rest = data[sent:-1]  # a backlog frame is without its newline
            self._backlog.insert(0, rest)
            self._backlog_size += len(rest) + 1
            self._batches_taken -= 1
            self._hand_to_flusher()
        return False

    def _hand_to_flusher(self) -> None:
        # Under the lock, with the writer role held: the flusher thread takes the role over.
        self._flusher_has_role = True
        if self._flusher is None:
            self._flusher = threading.Thread(target=self._flush_loop, name=f"acp-flusher-{self.name}", daemon=True)
            _TRANSPORTS_WITH_FLUSHERS.add(self)
            try:
                self._flusher.start()
            except RuntimeError as exc:  # out of threads: nothing can write the backlog, ever
                self._flusher = None
                self._end_write(failed=True)
                raise ConnectionClosed(f"{self.name}: cannot start the thread that writes ({exc})") from exc
        else:
            self._flusher_cond.notify()

    def _end_write(self, failed: bool) -> None:
        # Under the lock: the thread holding the writer role gives it up. After a failed write
        # the backlog can never be written: it is dropped and every later send is refused.
        if failed:
            self._write_failed = True
            self._backlog = []
            self._backlog_size = 0
        self._writing = False
        self._flusher_has_role = False
        self._idle_since = time.monotonic()
        if self._waiting:
            self._cond.notify_all()  # senders held back by the backlog limit, flush()
        self._active -= 1
        if self._closing and self._active == 0:
            self._release()

    def _flush_loop(self) -> None:
        # The flusher thread: each time the writer role is handed to it, write the backlog in
        # as few writes as it takes until nothing is left; exit once the transport closes.
        written = False
        while True:
            with self._lock:
                self._batch_size = 0  # written, or failed
                if written:
                    self._batches_written += 1
                batch = self._next_flusher_batch()
            if batch is None:
                return
            batch.append(b"")  # so that the last frame gets its newline too
            try:
                self._write(b"\n".join(batch))
                written = True
            except (OSError, ValueError):  # later senders get the stream's closed_error
                written = False
                with self._lock:
                    self._end_write(failed=True)

    def _next_flusher_batch(self) -> Optional[List[bytes]]:
        # Under the lock, in the flusher thread: the frames to write next, once the role is
        # handed over; the role is given up when nothing is left. None once closing.
        while True:
            if not self._flusher_has_role:
                if self._closing:
                    return None
                if not self._flusher_cond.wait(_FLUSHER_IDLE_SECONDS) and not self._flusher_has_role:
                    self._flusher = None  # idle: it ends, and the next hand-over starts another
                    return None
            elif self._backlog:
                batch = self._backlog
                self._backlog = []
                self._batch_size, self._backlog_size = self._backlog_size, 0
                self._batches_taken += 1
                if self._waiting:
                    self._cond.notify_all()  # senders held back by the backlog limit, flush()
                return batch
            else:
                self._end_write(failed=False)

    def _wait_for_room(self, timeout: Optional[float]) -> None:
        # Under the lock: a sender's wait for room in the backlog. (Apart from ``send``, whose
        # every call would otherwise make a cell for the ``self`` this lambda reads.)
        self._senders_held += 1
        try:
            room = self._wait(
                lambda: (
                    self._backlog_size + self._batch_size <= _WRITE_BACKLOG_LIMIT or self._closing or self._write_failed
                ),
                timeout,
            )
        finally:
            self._senders_held -= 1
        if not room:
            within = "" if timeout == 0 else f" within {timeout} s"
            raise CallTimeout(
                f"{self.name}: no room to send{within}: over {_WRITE_BACKLOG_LIMIT >> 20} MiB wait to be "
                "written (the peer is not reading)"
            )

    def _wait(self, predicate: Callable[[], bool], timeout: Optional[float] = None) -> bool:
        # Under the lock: wait on the condition, counted so that writers know to notify.
        self._waiting += 1
        try:
            return self._cond.wait_for(predicate, timeout)
        finally:
            self._waiting -= 1

    def flush(self, timeout: Optional[float] = None) -> bool:
        """Wait until every frame handed to ``send`` before this call is written (frames sent
        meanwhile are not waited for); True if so. Any thread."""
        with self._lock:
            # Frames in the backlog go out in the next batch the writer takes.
            target = self._batches_taken + (1 if self._backlog else 0)
            return self._wait(lambda: not self._writing or self._batches_written >= target, timeout)

    @property
    def backed_up(self) -> bool:
        """True while a sender waits for room in the write backlog: the peer has stopped reading
        what it was sent. Any thread."""
        return self._senders_held > 0

    # -- closing (any thread) -----------------------------------------------------------------
    @property
    def closed(self) -> bool:
        """True once ``close()`` has begun. Any thread."""
        return self._closing

    def closed_error(self) -> ConnectionClosed:
        """The ``ConnectionClosed`` describing why this stream ended. Any thread."""
        if self._closed_error_hook is not None:
            return self._closed_error_hook()
        return ConnectionClosed(f"{self.name}: connection closed")

    def close(self, timeout: float = 5.0) -> None:
        """Flush what is waiting to be written (up to ``timeout`` seconds), then close both
        streams. A blocked read returns at once; a write blocked on a peer that does not read
        keeps the stream open (and the flusher thread alive) until it fails. Idempotent. Any
        thread."""
        deadline = time.monotonic() + timeout
        self.flush(timeout)
        with self._lock:
            if self._closing:
                return
            self._closing = True
            self._cond.notify_all()  # senders waiting on the backlog limit
            self._flusher_cond.notify()
            flusher = self._flusher
            released = self._active == 0
            if released:
                self._release()
            elif self._wake is not None:
                os.write(self._wake[1], b"x")
        for sock in self._sockets if not released else ():
            try:
                sock.shutdown(socket.SHUT_RDWR)  # fails a write blocked on a peer that does not read
            except OSError:
                pass
        if flusher is not None and flusher.ident is not None and flusher is not threading.current_thread():
            flusher.join(max(0.0, deadline - time.monotonic()))

    def _leave_io(self) -> None:
        with self._lock:
            self._active -= 1
            if self._closing and self._active == 0:
                self._release()

    def _release(self) -> None:
        # Called under the lock by whoever is last out: no thread is inside a read or a write.
        if self._released:
            return
        self._released = True
        for close in self._closers:
            try:
                close()
            except OSError:
                pass
        if self._wake is not None:
            os.close(self._wake[0])
            os.close(self._wake[1])


# -- ready-made transports --------------------------------------------------------------------
def memory_pair(*, max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE) -> Tuple[Transport, Transport]:
    """Two transports connected to each other through two OS pipes (for tests and in-process
    peers). Closing one makes the other read end-of-stream. Any thread."""
    a_read, b_write = os.pipe()
    b_read, a_write = os.pipe()
    return (
        Transport(a_read, a_write, max_message_size=max_message_size, name="memory-a"),
        Transport(b_read, b_write, max_message_size=max_message_size, name="memory-b"),
    )


def stdio_transport(*, max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE) -> Transport:
    """This process's stdin/stdout as a transport, with stdout protected. Call once, from the
    main thread, before starting other threads that print.

    The protocol gets private duplicates of descriptors 0 and 1. Descriptor 1 is then pointed at
    descriptor 2, so ``print``, ``sys.stdout`` and any library or child process writing to
    stdout land on stderr instead of corrupting the stream; descriptor 0 is pointed at the null
    device, so nothing else can consume protocol bytes from stdin. Neither is restored by
    ``close()``: the process is expected to end with its protocol session.
    """
    if sys.stdout is not None:
        sys.stdout.flush()
    protocol_in = os.dup(0)
    protocol_out = os.dup(1)
    os.dup2(2, 1)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    return Transport(protocol_in, protocol_out, max_message_size=max_message_size, name="stdio")


def process_transport(process: Any, *, max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE) -> Transport:
    """A transport over an ``AgentProcess``'s stdout (read) and stdin (write), whose
    ``closed_error`` carries the agent's exit code and stderr tail. Any thread."""
    return Transport(
        process.stdout,
        process.stdin,
        max_message_size=max_message_size,
        name=f"agent-{process.pid}",
        closed_error=process.closed_error,
    )
