"""acp_lite: a sync-first, embeddable runtime for the Agent Client Protocol (ACP v1; v2 opt-in).

Modules, bottom up; each imports only the ones listed before it:

- ``errors``     the exception hierarchy (every error carries its JSON-RPC code).
- ``codec``      strict-then-lenient decoding, exact encoding.
- ``schema``     generated msgspec types for every ACP v1 definition, and the method table.
- ``beneath``    opening files beneath a directory handle, never outside it.
- ``proctree``   finding and killing every descendant of a process.
- ``outcomes``   settling futures once (``settle``), the outcome of a blocking call.
- ``framing``    cutting newline-delimited messages out of bytes, without I/O.
- ``transport``  the seam: ``MessageTransport``, what a connection needs of a transport
                 (``LoopReadable``: one an event loop can read).
- ``wire``       stream transports over byte streams: pipes, stdio, sockets, in-memory.
- ``delivery``   who runs callbacks, in which order, on which thread: the delivery queue (its
                 ``Lane`` interface), the worker pool.
- ``host_delivery``  ``HostDelivery``: callbacks on the host's own thread, inside ``pump()``.
- ``process``    agent subprocesses: start, stderr, stop (with their whole tree).
- ``deadlines``  one thread for the process that times out every future given a ``timeout``.
- ``watching``   one thread for the process that looks at the connections whose reader runs
                 application code, so that one stuck there is taken over.
- ``envelopes``, ``outgoing``, ``error_rules``, ``salvage``  what ``jsonrpc`` decodes in one
                 pass, what it writes (checked and encoded), which error answers a failed
                 handler, what it can still read of a line that does not decode.
- ``records``    what the JSON-RPC core keeps: routes, pending calls, batch replies, counters.
- ``jsonrpc``    JSON-RPC 2.0 without I/O: envelopes, routing, the call and request tables.
- ``answering``  an incoming request (``RequestContext``, ``CancelToken``) and its life: its
                 start in its turn, its handler, its answer.
- ``aio``        coroutines on the connection's threads: ``async def`` handlers as tasks on an
                 event loop, awaiting a call's answer; ``asyncio`` imported on first use.
- ``reading``    a connection's reading: the read loop, routing a read, the requests the reader
                 runs itself, the watcher's look, the read-ahead bound; or an event loop reading.
- ``rpc``        the connection: the threads and the transport around ``jsonrpc``.
                 Knows nothing of ACP methods.
- ``updates``    builders for the values written most (content, updates, tool calls, plans).
- ``peer``       what both sides share: handler registration, each request's two forms.
- ``client_base``  ``Client``: what an editor offers an agent, and its capabilities.
- ``terminal_waits``  the client side's order between a terminal's waits and its release.
- ``agent`` / ``client``  the two sides of ACP v1.
- ``files``      a session's root set; reading and atomic writing beneath it.
- ``terminals``  commands run under a supervisor, their output and exit, within limits.
- ``workspace``  ``WorkspaceClient``: file-system and terminal handlers confined to a session.

Beside them, and not vendored: ``acp_lite.tools`` (the command-line tools) and ``acp_lite.v2``
(the opt-in v2 draft, built on ``agent``, ``client`` and ``rpc``).

A library never prints: every module logs to a child of the ``acp_lite`` logger (``acp_lite.rpc``,
``acp_lite.delivery``, ...), which holds a ``NullHandler``, so without logging configured by the
application nothing reaches stderr (Python's last-resort handler would print warnings there,
which an editor embedding us shows as errors).
"""

import logging

from .agent import Agent, PromptTurn, RemoteClient, serve, serve_stdio
from .client import Client, RemoteAgent
from .codec import Undecodable
from .errors import AcpError
from .rpc import HostDelivery
from .sockets import connect_tcp, connect_unix, listen_tcp, listen_unix
from .wire import memory_pair, stdio_transport
from .workspace import WorkspaceClient

__version__ = "0.1.0"

# Set before anything logs: importing the package logs nothing.
logging.getLogger("acp_lite").addHandler(logging.NullHandler())

__all__ = [
    "AcpError",
    "Agent",
    "Client",
    "HostDelivery",
    "PromptTurn",
    "RemoteAgent",
    "RemoteClient",
    "Undecodable",
    "WorkspaceClient",
    "connect_tcp",
    "connect_unix",
    "listen_tcp",
    "listen_unix",
    "memory_pair",
    "serve",
    "serve_stdio",
    "stdio_transport",
]
