"""Transports over stream sockets: TCP and Unix-domain, dialled or accepted.

Socket framing. Over TCP and Unix-domain sockets the byte stream is exactly the one of the stdio
transport: UTF-8 JSON-RPC 2.0 messages, each followed by a single ``\\n``, with no header, length
prefix or handshake. Either side may send first once the connection is accepted; the side that
dials plays whichever ACP role the application gives it (usually the client). Closing the socket
(or shutting down its sending half) ends the session exactly as closing a stdio pipe does.
"""

import os
import socket
from typing import Any, Optional

from .errors import CallTimeout, ConnectionClosed
from .wire import DEFAULT_MAX_MESSAGE_SIZE, Transport


def socket_transport(sock: socket.socket, *, max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE) -> Transport:
    """A transport over a connected stream socket, which it owns from now on. Any thread."""
    sock.settimeout(None)
    if sock.family in (socket.AF_INET, socket.AF_INET6):
        # Messages are small and latency matters more than packet count.
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        peer = sock.getpeername()
    except OSError:
        peer = "?"
    return Transport(sock, sock, max_message_size=max_message_size, name=f"socket-{peer}")


def connect_tcp(
    host: str, port: int, *, timeout: Optional[float] = None, max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE
) -> Transport:
    """Dial ``host:port`` over TCP; ``timeout`` bounds the connect only. Any thread."""
    try:
        sock = socket.create_connection((host, port), timeout=timeout)
    except OSError as exc:
        raise ConnectionClosed(f"cannot connect to {host}:{port}: {exc}") from exc
    return socket_transport(sock, max_message_size=max_message_size)


def connect_unix(
    path: str, *, timeout: Optional[float] = None, max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE
) -> Transport:
    """Dial the Unix-domain socket at ``path``. Any thread (POSIX only)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect(path)
    except OSError as exc:
        sock.close()
        raise ConnectionClosed(f"cannot connect to {path}: {exc}") from exc
    return socket_transport(sock, max_message_size=max_message_size)


class Listener:
    """A listening socket that hands out one transport per accepted connection.

    ``address`` is where peers dial (``(host, port)`` for TCP, a path for Unix sockets).
    ``accept`` may be called from any thread; ``close`` from any thread, and it removes the
    socket file of a Unix listener.
    """

    def __init__(self, sock: socket.socket, *, max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE):
        self._sock = sock
        self._max_message_size = max_message_size
        self.address = sock.getsockname()

    def accept(self, timeout: Optional[float] = None) -> Transport:
        """Wait up to ``timeout`` seconds (forever if None) for a peer and return its transport.
        Raises ``CallTimeout`` on timeout and ``ConnectionClosed`` once the listener is closed."""
        self._sock.settimeout(timeout)
        try:
            conn, _ = self._sock.accept()
        except socket.timeout as exc:
            raise CallTimeout(f"no connection on {self.address} within {timeout} s") from exc
        except OSError as exc:
            raise ConnectionClosed(f"listener {self.address} closed") from exc
        return socket_transport(conn, max_message_size=self._max_message_size)

    def close(self) -> None:
        """Stop listening. Idempotent. Any thread."""
        if self._sock.fileno() < 0:
            return
        try:
            self._sock.shutdown(socket.SHUT_RDWR)  # wakes a blocked accept() on Linux
        except OSError:
            pass
        self._sock.close()
        if self._sock.family == getattr(socket, "AF_UNIX", None) and isinstance(self.address, str) and self.address:
            try:
                os.unlink(self.address)
            except OSError:
                pass

    def __enter__(self) -> "Listener":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()


def listen_tcp(
    host: str = "127.0.0.1", port: int = 0, *, backlog: int = 8, max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE
) -> Listener:
    """Listen on ``host:port`` (port 0 picks a free one; see ``Listener.address``). Any thread."""
    sock = socket.create_server((host, port), backlog=backlog)
    return Listener(sock, max_message_size=max_message_size)


def listen_unix(path: str, *, backlog: int = 8, max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE) -> Listener:
    """Listen on a Unix-domain socket at ``path`` (which must not exist). Any thread (POSIX)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(path)
        sock.listen(backlog)
    except OSError:
        sock.close()
        raise
    return Listener(sock, max_message_size=max_message_size)
