"""Serve any ``Agent`` over Streamable HTTP (POST + SSE) and WebSocket, on one port.

    from acp_lite.remote.server import serve_remote

    with serve_remote(MyAgent, port=8765) as server:   # one MyAgent() per connection
        print(server.url)                               # http://127.0.0.1:8765/acp
        server.wait_closed()

Rules this module keeps (the pieces: ``server_loop`` owns the sockets on one thread,
``server_http`` and ``server_ws`` speak the protocols, ``server_routes`` is one ACP connection
and its routing, ``server_hub`` holds what they share):

- Safe by default: binds 127.0.0.1; a request with an ``Origin`` outside ``allowed_origins`` is
  refused 403, and on loopback so is a ``Host`` that is not a loopback name; ``authorize`` sees
  every request and upgrade (see ``server_hub.Authorize``); TLS through ``ssl_context``.
- The API blocks where a caller waits and nowhere else: ``serve_remote`` returns once the port
  listens; ``close(timeout)`` ends every connection (WebSocket peers get 1001, SSE streams end),
  closes every agent core and socket, and joins the loop thread, within its timeout.
- Threads: the loop (``acp-remote-loop``), a closer while connections end
  (``acp-remote-closer``), and each connection's agent core (its reader, delivery and workers).
"""

import ipaddress
import re
import socket
import ssl
import threading
import time
from typing import Any, Callable, Optional, Sequence, Tuple

from ..agent import Agent, serve
from ..errors import UsageError
from .channel import Channel
from .server_http import HttpHandler
from .server_hub import Authorize, Hub, Limits
from .server_loop import Loop, Peer
from .server_routes import Served, Start

__all__ = ["Authorize", "Limits", "RemoteServer", "Served", "Start", "serve_remote", "serve_remote_backend"]


class RemoteServer:
    """A running remote server (from ``serve_remote``). Any thread."""

    def __init__(self, sock: socket.socket, hub: Hub, loop: Loop, tls: bool):
        self._hub = hub
        self._loop = loop
        self._closed = threading.Event()
        self.address: Tuple[str, int] = sock.getsockname()[:2]
        host = self.address[0]
        shown = f"[{host}]" if ":" in host else host
        self.url = f"{'https' if tls else 'http'}://{shown}:{self.address[1]}{hub.path}"
        self.ws_url = f"{'wss' if tls else 'ws'}://{shown}:{self.address[1]}{hub.path}"

    def connection_count(self) -> int:
        """The ACP connections open now."""
        return len(self._hub.connections)

    def wait_closed(self, timeout: Optional[float] = None) -> bool:
        """Block until ``close`` has run (True), or ``timeout`` passes (False)."""
        return self._closed.wait(timeout)

    def close(self, timeout: float = 5.0) -> None:
        """Stop listening, end every connection (WebSocket 1001), close every agent core and
        socket, join the threads; within ``timeout`` seconds. Idempotent. Not from the loop."""
        deadline = time.monotonic() + timeout
        if self._loop.thread.is_alive():
            ended = threading.Event()

            def end_all() -> None:
                self._hub.end_all(1001)
                ended.set()

            self._loop.call_soon(end_all)
            ended.wait(max(0.0, deadline - time.monotonic()))
            self._loop.stop()
            self._loop.thread.join(max(0.0, deadline - time.monotonic()))
        self._hub.join_closer(deadline)
        self._closed.set()

    def __enter__(self) -> "RemoteServer":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()


def serve_remote(
    agent_factory: Callable[[], Agent], host: str = "127.0.0.1", port: int = 0, **options: Any
) -> RemoteServer:
    """Listen on ``host:port`` (port 0 picks a free one: see ``RemoteServer.address``) and serve
    each ACP connection with a new ``agent_factory()``: HTTP POST + SSE at ``path``, and
    WebSocket upgrades there too unless ``websocket`` is False. The options are
    ``serve_remote_backend``'s. Any thread."""

    def start(channel: Channel) -> Served:
        return serve(agent_factory(), channel, name=channel.name).connection

    return serve_remote_backend(start, host, port, **options)


def serve_remote_backend(
    start: Start,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    path: str = "/acp",
    websocket: bool = True,
    authorize: Optional[Authorize] = None,
    allowed_origins: Sequence[str] = (),
    ssl_context: Optional[ssl.SSLContext] = None,
    limits: Optional[Limits] = None,
    affinity_cookie: Optional[Tuple[str, str]] = None,
    node: Optional[str] = None,
    backlog: int = 1024,
) -> RemoteServer:
    """Like ``serve_remote``, each connection served by ``start(channel)``: a backend reading the
    messages the client sends from ``channel`` and sending its own there (``acp-lite serve``
    bridges to an agent process this way). ``affinity_cookie`` (name, value) is set on the
    initialize answer and the 101, for a load balancer's stickiness; with ``node`` every connection
    id starts ``node.``, for one that routes on the id. Any thread."""
    limits = limits if limits is not None else Limits()
    if node is not None and not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", node):
        raise UsageError(f"a node name is 1 to 64 letters, digits, '-' or '_', not {node!r}")
    sock = socket.create_server((host, port), backlog=backlog, family=_family(host))
    hub = Hub(
        start,
        path=path,
        websocket=websocket,
        authorize=authorize,
        allowed_origins=allowed_origins,
        loopback=_is_loopback(host),
        limits=limits,
        affinity_cookie=affinity_cookie,
        node=node,
    )

    def make_handler(peer: Peer) -> HttpHandler:
        return HttpHandler(hub, peer)

    loop = Loop(sock, make_handler, ssl_context=ssl_context, max_sockets=limits.max_sockets, on_tick=hub.tick)
    hub.loop = loop
    server = RemoteServer(sock, hub, loop, ssl_context is not None)
    loop.start()
    return server


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
