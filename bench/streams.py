"""The update streams the workloads replay, written once as files of ready-to-send JSON-RPC lines.

Stdlib only: the replay agent and the peer adapters read these files, and the peer adapters run
in venvs that have neither msgspec nor acp_lite.

Two kinds of stream:

* ``mix``: workload A's turn, the mix ``acp-lite bench`` generates too (``workload.mix_update``,
  see shared.py). Nine in ten updates are ``agent_message_chunk`` with about 60 characters of text
  and a ``messageId``; every tenth is a ``tool_call_update`` with a status and one text content
  item.
* ``size:BYTES``: workload E's payload growth. 100 B and smaller are agent message chunks of that
  many characters; anything larger is a ``tool_call_update`` carrying a diff whose ``newText`` has
  that many characters in 80-column lines, like a rewritten file.

Every line names session ``SESSION_ID``; the replay agent swaps in another id when it streams one
turn per session.
"""

import json
import os
from pathlib import Path

from shared import workload

SESSION_ID = "sess-0"
# The agents under test cycle through this many distinct prebuilt updates, so that a turn measures
# sending updates rather than building them.
AGENT_DISTINCT_UPDATES = 1000


def _file_text(i: int, length: int) -> str:
    """``length`` characters of source-like text in 80-column lines."""
    line = workload.text(i, 79) + "\n"
    return (line * (length // 80 + 1))[:length]


def diff_update(i: int, length: int) -> dict:
    return {
        "sessionUpdate": "tool_call_update",
        "toolCallId": f"call-{i:06d}",
        "status": "in_progress",
        "content": [{"type": "diff", "path": f"/src/module_{i}.py", "oldText": None, "newText": _file_text(i, length)}],
    }


def sized_update(i: int, size: int) -> dict:
    return workload.message_chunk(i, size) if size <= 100 else diff_update(i, size)


def notification_line(update: dict) -> bytes:
    message = {"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": SESSION_ID, "update": update}}
    return json.dumps(message, separators=(",", ":")).encode() + b"\n"


def stream_file(directory: Path, kind: str, n: int) -> Path:
    """The path of the ``kind`` stream of ``n`` updates under ``directory``, written if missing.

    Files are named by their content, so repeated runs reuse them; a half-written file never
    keeps its final name.
    """
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{kind.replace(':', '-')}-{n}.jsonl"
    if path.exists():
        return path
    if kind == "mix":
        make = workload.mix_update
    elif kind.startswith("size:"):
        size = int(kind[5:])
        make = lambda i: sized_update(i, size)  # noqa: E731
    else:
        raise ValueError(f"unknown stream kind {kind!r}")
    partial = path.with_suffix(f".{os.getpid()}.part")
    with open(partial, "wb") as f:
        batch = []
        for i in range(n):
            batch.append(notification_line(make(i)))
            if len(batch) == 4096:
                f.write(b"".join(batch))
                batch.clear()
        f.write(b"".join(batch))
    partial.replace(path)
    return path


def agent_updates(path: Path) -> list:
    """The updates an agent under test sends, as JSON objects: the first ones of a stream file."""
    with open(path, "rb") as f:
        return [json.loads(line)["params"]["update"] for line, _ in zip(f, range(AGENT_DISTINCT_UPDATES))]
