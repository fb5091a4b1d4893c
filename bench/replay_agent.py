"""A fast ACP agent that replays a file of ``session/update`` lines: the agent every client under test talks to.

    python replay_agent.py STREAM_FILE [--sessions K] [--v2]

Stdlib only and deliberately dumb, so that a client's figure measures the client: it answers
``initialize`` and ``session/new``, and answers ``session/prompt`` by writing the stream file in
large chunks followed by the prompt result. With ``--sessions K`` it waits until K prompts are
pending and then interleaves their streams chunk by chunk (each line carrying its own session id),
which is how workload E puts 16 sessions on one connection at once. It also answers the extension
request ``workload.PING_METHOD`` (see shared.py) with ``{}``, which makes it the agent half of the
bare ping-pong ceiling.
With ``--v2`` it speaks ACP v2: a v2 initialize answer, each prompt acknowledged before its stream
and its turn ended by an ``idle`` state update instead of the result (the stream's updates are
valid v2 as they are). Anything else gets -32601.
"""

import json
import os
import sys

from shared import workload

CHUNK_BYTES = 1 << 20
STREAM_SESSION_ID = b"sess-0"  # the id the stream files are written with (bench.streams.SESSION_ID)


def _write_all(data) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(1, view) :]


def _send(message: dict) -> None:
    _write_all(json.dumps(message, separators=(",", ":")).encode() + b"\n")


def _chunks(path: str):
    """The file in pieces of about CHUNK_BYTES that each end at a line boundary."""
    with open(path, "rb") as f:
        rest = b""
        while True:
            block = f.read(CHUNK_BYTES)
            if not block:
                break
            block = rest + block
            cut = block.rfind(b"\n") + 1
            rest = block[cut:]
            if cut:
                yield block[:cut]
        if rest:
            yield rest


def _end_turn(request_id, session_id: str, v2: bool) -> None:
    if v2:
        _send(
            {
                "jsonrpc": "2.0",
                "method": "session/update",
                "params": {
                    "sessionId": session_id,
                    "update": {"sessionUpdate": "state_update", "state": "idle", "stopReason": "end_turn"},
                },
            }
        )
    else:
        _send({"jsonrpc": "2.0", "id": request_id, "result": {"stopReason": "end_turn"}})


def _stream_turns(path: str, prompts: list, v2: bool) -> None:
    """Stream one copy of the file per pending prompt, interleaved, then end each turn (v2:
    acknowledge each prompt first)."""
    turns = []
    for session_id, request_id in prompts:
        wire_id = json.dumps(session_id).encode()[1:-1]
        if v2:
            _send({"jsonrpc": "2.0", "id": request_id, "result": {"messageId": f"user-{request_id}"}})
        turns.append((_chunks(path), wire_id, request_id, session_id))
    while turns:
        still_going = []
        for chunks, wire_id, request_id, session_id in turns:
            chunk = next(chunks, None)
            if chunk is None:
                _end_turn(request_id, session_id, v2)
                continue
            if wire_id != STREAM_SESSION_ID:
                chunk = chunk.replace(b'"sessionId":"' + STREAM_SESSION_ID + b'"', b'"sessionId":"' + wire_id + b'"')
            _write_all(chunk)
            still_going.append((chunks, wire_id, request_id, session_id))
        turns = still_going


def main() -> None:
    path = sys.argv[1]
    sessions_per_turn = int(sys.argv[sys.argv.index("--sessions") + 1]) if "--sessions" in sys.argv else 1
    v2 = "--v2" in sys.argv
    sessions = 0
    pending = []
    for line in sys.stdin.buffer:
        message = json.loads(line)
        method, request_id = message.get("method"), message.get("id")
        if request_id is None:
            continue  # notifications such as session/cancel: nothing to cancel in a replay
        if method == "initialize" and v2:
            result = {
                "protocolVersion": 2,
                "capabilities": {"session": {}},
                "info": {"name": "bench-replay-agent", "version": "1"},
            }
        elif method == "initialize":
            result = {
                "protocolVersion": 1,
                "agentCapabilities": {},
                "authMethods": [],
                "agentInfo": {"name": "bench-replay-agent", "version": "1"},
            }
        elif method == "session/new":
            result = {"sessionId": f"sess-{sessions}"}
            sessions += 1
        elif method == workload.PING_METHOD:
            result = {}
        elif method == "session/prompt":
            pending.append((message["params"]["sessionId"], request_id))
            if len(pending) == sessions_per_turn:
                _stream_turns(path, pending, v2)
                pending = []
            continue
        else:
            _send(
                {
                    "jsonrpc": "2.0",
                    "id": request_id,
                    "error": {"code": -32601, "message": f"method not found: {method}"},
                }
            )
            continue
        _send({"jsonrpc": "2.0", "id": request_id, "result": result})


if __name__ == "__main__":
    main()
