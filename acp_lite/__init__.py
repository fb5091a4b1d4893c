"""acp_lite: a sync-first, embeddable runtime for the Agent Client Protocol (ACP v1).

Layers, bottom up; each knows nothing of the ones above it:

- ``errors``  the exception hierarchy (every error carries its JSON-RPC code).
- ``schema``  generated msgspec types for every ACP v1 definition, and the method table.
- ``codec``   strict-then-lenient decoding into those types, exact encoding.
- ``wire``    newline-delimited framing over byte streams: pipes, stdio, sockets, in-memory.
- ``rpc``     JSON-RPC 2.0 connection: reader thread, correlation table, handler dispatch,
              host-thread delivery, cancellation. Knows nothing of ACP methods.
- ``agent`` / ``client``  the two sides of ACP v1 on top of ``rpc``.
"""
__version__ = "0.1.0"
