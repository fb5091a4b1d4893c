"""Remote agents over Streamable HTTP (POST + server-sent events) and WebSocket.

This subpackage needs the optional extra ``acp-lite[remote]`` (h11 and wsproto, both sans-IO);
the rest of acp_lite stays msgspec-only. ``channel`` (a transport fed by whole messages) and
``sse`` (server-sent events) are shared by both sides.
"""

try:
    import h11  # noqa: F401
    import wsproto  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(f"acp_lite.remote needs the optional extra: pip install 'acp-lite[remote]' ({exc})") from None
