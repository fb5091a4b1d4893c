"""What the CLI's bench and the benchmark suite in ``bench/`` share, defined once: workload A's
update mix and the extension method that times a round trip.

Rule: this module imports nothing but the standard library and builds plain JSON objects, so that
``bench/``'s scripts can load it by path in the venvs of the official SDKs, which have neither
acp_lite nor msgspec. ``acp-lite bench`` decodes the same objects into ``acp_lite.schema`` types.

The mix: nine in ten updates are ``agent_message_chunk`` with about 60 characters of text and a
``messageId``; every tenth is a ``tool_call_update`` with a status and one text content item. The
text differs from update to update, deterministically.
"""

from typing import Any, Dict

# The extension request whose answer times a round trip: the bench's agents answer it with ``{}``;
# an agent that does not know it answers -32601, the cheapest reply any conforming agent gives.
PING_METHOD = "_acp_lite/bench/ping"

TOOL_STATUSES = ("in_progress", "completed", "failed", "pending")
_WORDS = "lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor".split()


def text(i: int, length: int) -> str:
    """Deterministic prose of exactly ``length`` characters that differs from update to update."""
    out = f"{i:08d} "
    w = i
    while len(out) < length:
        out += _WORDS[w % len(_WORDS)] + " "
        w += 7
    return out[:length]


def message_chunk(i: int, length: int = 60) -> Dict[str, Any]:
    return {
        "sessionUpdate": "agent_message_chunk",
        "content": {"type": "text", "text": text(i, length)},
        "messageId": f"msg-{i // 100:06d}",
    }


def tool_call_update(i: int, length: int = 60) -> Dict[str, Any]:
    return {
        "sessionUpdate": "tool_call_update",
        "toolCallId": f"call-{i // 10:06d}",
        "status": TOOL_STATUSES[(i // 10) % len(TOOL_STATUSES)],
        "content": [{"type": "content", "content": {"type": "text", "text": text(i, length)}}],
    }


def mix_update(i: int) -> Dict[str, Any]:
    """Update ``i`` of workload A's mix."""
    return tool_call_update(i) if i % 10 == 9 else message_chunk(i)
