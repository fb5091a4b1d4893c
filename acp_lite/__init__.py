"""acp_lite: a sync-first, embeddable runtime for the Agent Client Protocol (ACP v1).

Layers, bottom up; each knows nothing of the ones above it:

- ``errors``  the exception hierarchy (every error carries its JSON-RPC code).
- ``schema``  generated msgspec types for every ACP v1 definition, and the method table.
- ``codec``   strict-then-lenient decoding into those types, exact encoding.
- ``wire``    newline-delimited framing over byte streams: pipes, stdio, sockets, in-memory.
- ``rpc``     JSON-RPC 2.0 connection: reader thread, correlation table, handler dispatch,
              host-thread delivery, cancellation. Knows nothing of ACP methods.
- ``agent`` / ``client``  the two sides of ACP v1 on top of ``rpc``.

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
from .wire import connect_tcp, connect_unix, listen_tcp, listen_unix, memory_pair, stdio_transport
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
