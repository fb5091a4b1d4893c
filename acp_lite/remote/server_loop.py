"""The remote server's selector loop: one thread, ``acp-remote-loop``, owns every socket.

Rules this module keeps:

- Only the loop thread touches a socket, a ``Peer`` or a protocol handler. Other threads (the
  agents' cores) hand work over with ``call_soon``, which wakes the loop through a socketpair.
- Sockets are non-blocking. A peer's output is a queue of byte pieces; a piece may carry a charge
  (bytes of an ACP connection's budget), released once the piece is wholly on the wire. Large
  pieces go to ``send`` as they are; small ones are copied together into buffers of up to
  ``_BUFFER_BYTES`` (their charges added), since a queue entry per piece cost more than the
  bytes of a small SSE event or WebSocket frame: a budget of them took twice its size.
- TLS is an ``ssl.SSLContext`` wrapping each accepted socket; the handshake runs in the loop and
  counts against the header deadline.
- The listener is never blocked by a peer: a peer over the socket cap gets a fixed 503 and is
  closed; each handler decides its own deadlines in ``tick``, run every ``TICK_SECONDS``.
- Output progress (``stalled_for``) is a send that took bytes, or, where the system tells
  (``SIOCOUTQ``: Linux), the socket's send queue shrinking: the kernel takes bytes in bursts
  (on loopback over a megabyte at a time), and a slow reader that keeps reading must not look
  stalled between them.
- ``stop`` ends the loop; the loop closes every socket it owns before its thread ends.
"""

import collections
import errno
import logging
import selectors
import socket
import ssl
import struct
import sys
import threading
import time
from typing import Any, Callable, Deque, Dict, List, Optional, Tuple, Union

try:
    import fcntl
    import termios
except ImportError:  # Windows
    fcntl = termios = None  # type: ignore[assignment]

log = logging.getLogger("acp_lite.remote.server")

# How often handlers are asked about their deadlines (keep-alives, header time, stalls).
TICK_SECONDS = 0.25

_RECV_BYTES = 65536

# Pieces under _SMALL_BYTES are copied into the queue's last buffer while it stays under
# _BUFFER_BYTES.
_SMALL_BYTES = 16 * 1024
_BUFFER_BYTES = 64 * 1024

# Linux's SIOCOUTQ (the name TIOCOUTQ stands for it): a socket's unsent bytes.
_SIOCOUTQ = getattr(termios, "TIOCOUTQ", None) if sys.platform.startswith("linux") else None

# A piece of output: the bytes, and the budget it gives back once sent (a callable and a count).
Release = Callable[[int], None]
Piece = Union[bytes, bytearray, memoryview]


class Handler:
    """What the loop asks of a peer's protocol (HTTP or WebSocket). Loop thread only."""

    def on_data(self, data: bytes) -> None:
        raise NotImplementedError

    def on_eof(self) -> None:
        """The peer closed its sending half, or the socket failed: the peer is closed after this."""

    def tick(self, now: float) -> None:
        """A chance to act on deadlines."""


class Peer:
    """One accepted socket and its output queue. Loop thread only, but for ``write_now`` (the
    output and the socket's writes are under ``output_lock`` for it)."""

    def __init__(self, loop: "Loop", sock: socket.socket, address: Any):
        self.loop = loop
        self.sock = sock
        self.address = address
        self.handler: Handler = Handler()
        self.accepted_at = time.monotonic()
        self.last_sent = self.accepted_at
        self._progress_at = self.accepted_at  # the last send, or the send queue seen shrinking
        self._queued = 0  # the send queue's bytes when last looked at
        self._out: Deque[Tuple[Piece, Optional[Release], int]] = collections.deque()
        self.out_bytes = 0
        self.closed = False
        self._close_when_sent = False
        self.reading = True
        self.handshaking = isinstance(sock, ssl.SSLSocket)
        self._mask = 0
        self._broken = False  # a send failed: the loop closes the socket
        self._tls = isinstance(sock, ssl.SSLSocket)  # (TLS objects are for one thread at a time)
        # The output and the socket's writes, for write_now; a handler that ends its output takes it
        # to say so (its last frame is then the last on the wire).
        self.output_lock = threading.Lock()

    # -- output --------------------------------------------------------------------------------
    def write(self, data: bytes, release: Optional[Release] = None, charge: int = 0) -> None:
        """Queue ``data``; ``release(charge)`` runs once it is all sent (or dropped at close)."""
        with self.output_lock:
            if not self.closed and data:
                self._queue(data, release, charge)
                self.out_bytes += len(data)
                release = None
            done = [] if self.handshaking else self._flush()
        if release is not None and charge:
            done.append((release, charge))
        self._settle(done)

    def write_now(self, data: bytes, release: Release, charge: int, still_open: Callable[[], bool]) -> bool:
        """From another thread than the loop's: send ``data`` at once, as far as the socket takes
        it (the rest queued for the loop), when nothing waits before it on a plain socket and
        ``still_open()`` (asked under the output's lock: a handler's end and its last frame take
        it too); else False, having done nothing. Spares a reply the loop's wake-up."""
        with self.output_lock:
            if self.closed or self._out or self.handshaking or self._tls or not still_open():
                return False
            try:
                sent = self.sock.send(data)
            except (BlockingIOError, InterruptedError):
                sent = 0
            except OSError:  # the loop finds the socket broken and closes it
                return False
            self.last_sent = time.monotonic()
            if sent < len(data):
                self._out.append((memoryview(data)[sent:], release, charge))
                self.out_bytes += len(data) - sent
        if sent < len(data):
            self.loop.call_soon(self._update_mask)  # the loop writes the rest when it may
        elif charge:
            release(charge)
        return True

    def _queue(self, data: bytes, release: Optional[Release], charge: int) -> None:
        if len(data) < _SMALL_BYTES:
            # The last buffer takes it, unless it is the head (perhaps partly sent) or full, or
            # another budget's.
            last = self._out[-1] if len(self._out) > 1 else None
            if (
                last is not None
                and type(last[0]) is bytearray
                and len(last[0]) + len(data) <= _BUFFER_BYTES
                and (release is None or last[1] is None or release == last[1])
            ):
                last[0].extend(data)
                self._out[-1] = (last[0], last[1] or release, last[2] + charge)
                return
            self._out.append((bytearray(data), release, charge))
            return
        self._out.append((data, release, charge))

    def stalled_for(self, now: float) -> float:
        """Seconds the queued output has made no progress (0 when nothing is queued)."""
        if not self._out:
            return 0.0
        queued = _send_queue(self.sock)
        if queued is not None and queued < self._queued:
            self._progress_at = now
        self._queued = queued or 0
        return now - max(self._progress_at, self.last_sent)

    def close_when_sent(self) -> None:
        """Close once the queued output is on the wire (at once if there is none)."""
        self._close_when_sent = True
        self.pause_reading()
        with self.output_lock:
            sent = not self._out
        if sent:
            self.close()

    def pause_reading(self) -> None:
        self.reading = False
        self._update_mask()

    def resume_reading(self) -> None:
        if not self._close_when_sent:
            self.reading = True
            self._update_mask()

    def close(self) -> None:
        if self.closed:
            return
        self.loop.forget(self)
        with self.output_lock:
            self.closed = True
            dropped = [(release, charge) for _, release, charge in self._out if release is not None and charge]
            self._out.clear()
            self.out_bytes = 0
            try:
                self.sock.close()
            except OSError:
                pass
        for release, charge in dropped:
            release(charge)
        try:
            self.handler.on_eof()
        except Exception:
            log.exception("closing handler failed")

    # -- loop side -----------------------------------------------------------------------------
    def _flush(self) -> List[Tuple[Release, int]]:
        # Under output_lock: send what the socket takes; returns the releases now due (see _settle).
        done: List[Tuple[Release, int]] = []
        while self._out:
            view, release, charge = self._out[0]
            try:
                sent = self.sock.send(view)
            except (BlockingIOError, ssl.SSLWantWriteError, ssl.SSLWantReadError):
                return done
            except OSError:
                self._broken = True
                return done
            self.out_bytes -= sent
            self.last_sent = time.monotonic()
            if sent < len(view):
                self._out[0] = (memoryview(view)[sent:], release, charge)
                return done
            self._out.popleft()
            if release is not None and charge:
                done.append((release, charge))
        return done

    def _send_queued(self) -> None:
        # Loop thread: what waits goes out, as far as the socket takes it.
        with self.output_lock:
            done = self._flush()
        self._settle(done)

    def _settle(self, done: List[Tuple[Release, int]]) -> None:
        # Loop thread, outside output_lock: run the releases a flush made due; close a broken socket,
        # or one to close once its output is sent.
        for release, charge in done:
            release(charge)
        if not self.closed and (self._broken or (self._close_when_sent and not self._out)):
            self.close()
        else:
            self._update_mask()

    def _handshake(self) -> None:
        assert isinstance(self.sock, ssl.SSLSocket)
        try:
            self.sock.do_handshake()
        except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
            return
        except (OSError, ValueError) as exc:
            log.debug("TLS handshake with %s failed: %s", self.address, exc)
            self.close()
            return
        self.handshaking = False
        self._send_queued()

    def _read(self) -> None:
        chunks: List[bytes] = []
        eof = False
        while True:
            try:
                data = self.sock.recv(_RECV_BYTES)
            except (BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
                break
            except OSError:
                eof = True
                break
            if not data:
                eof = True
                break
            chunks.append(data)
            # TLS may hold decrypted bytes that select() cannot see; a plain socket is read again
            # only when select says so.
            if not (isinstance(self.sock, ssl.SSLSocket) and self.sock.pending()):
                break
        if chunks:
            self.handler.on_data(b"".join(chunks))
        if eof and not self.closed:
            self.close()

    def on_ready(self, mask: int) -> None:
        if self.handshaking:
            self._handshake()
        else:
            if mask & selectors.EVENT_WRITE and not self.closed:
                self._send_queued()
            if mask & selectors.EVENT_READ and not self.closed:
                self._read()
        self._update_mask()

    def _update_mask(self) -> None:
        if self.closed:
            return
        mask = selectors.EVENT_READ if (self.reading or self.handshaking) else 0
        if self._out or (self.handshaking and self._mask & selectors.EVENT_WRITE):
            mask |= selectors.EVENT_WRITE
        if mask == self._mask:
            return
        selector = self.loop.selector
        if not self._mask:
            selector.register(self.sock, mask, self)
        elif not mask:
            selector.unregister(self.sock)
        else:
            selector.modify(self.sock, mask, self)
        self._mask = mask

    def forget_registration(self) -> None:
        if self._mask:
            try:
                self.loop.selector.unregister(self.sock)
            except (KeyError, ValueError):
                pass
            self._mask = 0


class Loop:
    """The selector loop around one listening socket.

    ``make_handler(peer)`` builds the protocol handler of each accepted socket, or returns None
    when the socket must be refused (it has written its refusal already). Start with ``start``,
    end with ``stop`` (any thread); ``call_soon`` from any thread.
    """

    def __init__(
        self,
        listener: socket.socket,
        make_handler: Callable[[Peer], Optional[Handler]],
        *,
        ssl_context: Optional[ssl.SSLContext] = None,
        max_sockets: int,
        on_tick: Callable[[float], None],
    ):
        self.selector = selectors.DefaultSelector()
        self._listener = listener
        listener.setblocking(False)
        self._make_handler = make_handler
        self._ssl_context = ssl_context
        self._max_sockets = max_sockets
        self._on_tick = on_tick
        self.peers: Dict[int, Peer] = {}
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._calls: Deque[Callable[[], None]] = collections.deque()
        self._calls_lock = threading.Lock()
        self._woken = False
        self._stopping = False
        self.selector.register(listener, selectors.EVENT_READ, "listener")
        self.selector.register(self._wake_r, selectors.EVENT_READ, "wake")
        self.thread = threading.Thread(target=self._run, name="acp-remote-loop", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def in_loop(self) -> bool:
        return threading.current_thread() is self.thread

    def call_soon(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` on the loop thread, in call order. Any thread."""
        with self._calls_lock:
            self._calls.append(fn)
            if self._woken:
                return
            self._woken = True
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass  # the loop is gone, or already woken with a full pipe

    def stop(self) -> None:
        """Make the loop close every socket and end. Any thread; join ``thread`` to wait."""

        def stopping() -> None:
            self._stopping = True

        self.call_soon(stopping)

    def forget(self, peer: Peer) -> None:
        peer.forget_registration()
        self.peers.pop(id(peer), None)

    # -- the loop thread -----------------------------------------------------------------------
    def _run(self) -> None:
        next_tick = time.monotonic() + TICK_SECONDS
        try:
            while not self._stopping:
                timeout = max(0.0, next_tick - time.monotonic())
                for key, mask in self.selector.select(timeout):
                    if key.data == "listener":
                        self._accept()
                    elif key.data == "wake":
                        self._drain_wake()
                    else:
                        self._guarded(key.data, key.data.on_ready, mask)
                self._run_calls()
                now = time.monotonic()
                if now >= next_tick:
                    next_tick = now + TICK_SECONDS
                    self._tick(now)
        except Exception:
            log.exception("the remote server loop failed")
        finally:
            self._shutdown()

    def _guarded(self, peer: Peer, fn: Callable[[Any], None], arg: Any) -> None:
        # A handler's bug closes its own socket, never the loop.
        try:
            fn(arg)
        except Exception:
            log.exception("remote peer %s failed", peer.address)
            peer.close()

    def _tick(self, now: float) -> None:
        for peer in list(self.peers.values()):
            if not peer.closed:
                self._guarded(peer, peer.handler.tick, now)
        self._on_tick(now)

    def _run_calls(self) -> None:
        while True:
            with self._calls_lock:
                if not self._calls:
                    self._woken = False
                    return
                fn = self._calls.popleft()
            try:
                fn()
            except Exception:
                log.exception("remote server call failed")

    def _drain_wake(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except OSError:
            pass

    def _accept(self) -> None:
        for _ in range(64):  # a bounded batch: a flood must not starve the other sockets
            try:
                sock, address = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    log.warning("cannot accept: %s", exc)
                return
            sock.setblocking(False)
            if sock.family in (socket.AF_INET, socket.AF_INET6):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if len(self.peers) >= self._max_sockets:
                _refuse_busy(sock)
                continue
            if self._ssl_context is not None:
                try:
                    sock = self._ssl_context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
                except (OSError, ValueError):
                    sock.close()
                    continue
            peer = Peer(self, sock, address)
            self.peers[id(peer)] = peer
            handler = self._make_handler(peer)
            if handler is None:
                peer.close()
                continue
            peer.handler = handler
            if peer.handshaking:
                peer._handshake()
            peer._update_mask()

    def _shutdown(self) -> None:
        # Last chance for what the peers have queued (closing frames, final chunks), then close.
        deadline = time.monotonic() + 0.5
        while any(p._out for p in self.peers.values()) and time.monotonic() < deadline:
            for key, mask in self.selector.select(0.05):
                if isinstance(key.data, Peer):
                    key.data.on_ready(mask & selectors.EVENT_WRITE or mask)
        for peer in list(self.peers.values()):
            peer.close()
        self._run_calls()
        for sock in (self._listener, self._wake_r, self._wake_w):
            try:
                sock.close()
            except OSError:
                pass
        self.selector.close()


def _send_queue(sock: socket.socket) -> Optional[int]:
    """The bytes in the socket's send queue not yet taken by the peer; None where unknown."""
    if _SIOCOUTQ is None:
        return None
    try:
        return int(struct.unpack("i", fcntl.ioctl(sock.fileno(), _SIOCOUTQ, b"\0\0\0\0"))[0])
    except OSError:
        return None


_BUSY = (
    b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nContent-Type: text/plain\r\n"
    b"Content-Length: 20\r\nConnection: close\r\n\r\ntoo many connections"
)


def _refuse_busy(sock: socket.socket) -> None:
    # Over the socket cap: one best-effort write, no state kept, no TLS.
    try:
        sock.send(_BUSY)
    except OSError:
        pass
    sock.close()
