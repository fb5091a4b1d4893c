"""Answers are bounded in memory (issue 33, item 3): an answer over the transport's
``max_message_size`` is refused, naming its size, before it is encoded; large answers hold room in
the connection's answer budget from before they are built until they are written, so requests
whose answers the peer does not read cannot make the editor hold more than that; and every one is
answered once the peer reads again.

Played over real connections with small limits (a 1 MiB message limit, files and terminal output
of 150 KiB of NULs, which JSON writes six times larger as ``\\u0000``), so that the mechanism shows
in a few MiB: without the budget the same requests make the editor hold tens of MiB."""

import json
import random
import sys
import time
import tracemalloc
from typing import Any, Dict, List

import pytest
from raw_peer import RawPeer
from workspace_editor import PATIENCE, SESSION, editor_for

from acp_lite import outgoing
from acp_lite.codec import ENCODER
from acp_lite.rpc import Connection

pytestmark = pytest.mark.timeout(60)

INTERNAL_ERROR = -32603
REQUEST_CANCELLED = -32800
LIMIT = 1024 * 1024  # the transport's max_message_size, and so the answer budget
NULS = 150 * 1024  # a text of this many NULs takes 900 KiB encoded: under LIMIT, two do not fit
CONCURRENT = 32
# What the editor may hold while the agent reads nothing: the one answer in flight (its frame,
# the copy made to write it, its text) within the budget, and the rest of a connection.
HELD_AT_MOST = 3 * LIMIT + 1024 * 1024
# Long enough for every handler to have built its answer had nothing held them back (each takes
# a millisecond or two).
SETTLE_SECONDS = 1.0


def test_the_measured_size_of_a_text_is_what_the_encoder_writes():
    rng = random.Random(33)
    alphabet = [chr(code) for code in range(0x90)] + ["\u00e9", "\u2028", "\ufffd", "\U0001f600"]
    texts = ["", "\x00", '"\\', "plain"] + ["".join(rng.choices(alphabet, k=n)) for n in (1, 7, 300, 5000)]
    texts.append("".join(rng.choices(alphabet, k=1536 * 1024)))  # measured in more than one slice
    for text in texts:
        assert outgoing.json_text_size(text) == len(ENCODER.encode(text))


def _peak_while(action: Any) -> int:
    """The most memory (bytes, as tracemalloc counts Python's allocations) held above the start
    while ``action()`` runs."""
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        action()
        return tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()


def test_a_read_whose_escaped_answer_exceeds_the_message_limit_is_refused_naming_its_size(root):
    (root / "zeros.txt").write_bytes(b"\0" * (2 * NULS))  # valid UTF-8, 1.8 MiB once escaped
    (root / "notes.txt").write_text("mine")
    with editor_for(root, max_message_size=LIMIT) as editor:
        answers: List[Dict[str, Any]] = []
        peak = _peak_while(lambda: answers.append(editor.call("fs/read_text_file", path=str(root / "zeros.txt"))))
        error = answers[0]["error"]
        assert error["code"] == INTERNAL_ERROR
        encoded = 6 * 2 * NULS + 2
        assert f"the answer to fs/read_text_file would take {encoded} bytes encoded" in error["message"]
        assert f"over the limit of {LIMIT} bytes" in error["message"]
        assert peak < encoded  # measured, never built
        # The connection goes on.
        assert editor.result("fs/read_text_file", path=str(root / "notes.txt"))["content"] == "mine"


def _unread_answers_then_read(editor: Any, method: str, params: Dict[str, Any]) -> List[Dict[str, Any]]:
    """Send CONCURRENT requests at once, read nothing while their handlers run, check the memory
    held meanwhile, then read every answer (by id)."""
    ids = list(range(5000, 5000 + CONCURRENT))
    lines = b"".join(
        json.dumps({"jsonrpc": "2.0", "id": i, "method": method, "params": {"sessionId": SESSION, **params}}).encode()
        + b"\n"
        for i in ids
    )
    peak = _peak_while(lambda: (editor.raw.send_bytes(lines), time.sleep(SETTLE_SECONDS)))
    assert peak < HELD_AT_MOST, f"{peak} bytes held for answers the agent does not read"
    answers = {}
    while len(answers) < CONCURRENT:
        answer = editor.raw.recv(PATIENCE)
        answers[answer["id"]] = answer
    assert sorted(answers) == ids
    return [answers[i] for i in ids]


def test_concurrent_reads_the_agent_does_not_read_hold_at_most_the_budget_and_are_all_answered(root):
    (root / "zeros.txt").write_bytes(b"\0" * NULS)
    with editor_for(root, max_message_size=LIMIT) as editor:
        answers = _unread_answers_then_read(editor, "fs/read_text_file", {"path": str(root / "zeros.txt")})
        assert all(answer.get("result", {}).get("content") == "\0" * NULS for answer in answers)
        assert editor.result("fs/read_text_file", path=str(root / "zeros.txt"), limit=1)["content"] == "\0" * NULS


def test_concurrent_terminal_outputs_the_agent_does_not_read_hold_at_most_the_budget_and_are_all_answered(root):
    with editor_for(root, max_message_size=LIMIT) as editor:
        terminal = editor.result(
            "terminal/create",
            command=sys.executable,
            args=["-c", f"import sys; sys.stdout.write('\\0' * {NULS})"],
        )["terminalId"]
        assert editor.finished_output(terminal)["output"] == "\0" * NULS
        answers = _unread_answers_then_read(editor, "terminal/output", {"terminalId": terminal})
        assert all(answer.get("result", {}).get("output") == "\0" * NULS for answer in answers)


def test_the_answers_of_a_batch_hold_at_most_the_message_limit_together(root):
    # Each answer fits in a message alone (900 KiB); a batch's answer is one message, and its
    # answers wait for its last one: the second and third are refused, naming the size, and the
    # batch is answered as one array within the limit. The connection goes on.
    (root / "zeros.txt").write_bytes(b"\0" * NULS)
    (root / "notes.txt").write_text("mine")
    path = str(root / "zeros.txt")
    with editor_for(root, max_message_size=LIMIT) as editor:
        batch = [
            {
                "jsonrpc": "2.0",
                "id": f"b{i}",
                "method": "fs/read_text_file",
                "params": {"sessionId": SESSION, "path": path},
            }
            for i in range(3)
        ]
        editor.raw.send_bytes(json.dumps(batch).encode() + b"\n")
        frame = editor.raw.recv_line(PATIENCE)
        assert frame is not None and len(frame) <= LIMIT
        answers = {answer["id"]: answer for answer in json.loads(frame)}
        assert sorted(answers) == ["b0", "b1", "b2"]
        results = [answer for answer in answers.values() if "result" in answer]
        refused = [answer["error"] for answer in answers.values() if "error" in answer]
        assert len(results) == 1 and results[0]["result"]["content"] == "\0" * NULS
        assert len(refused) == 2
        for error in refused:
            assert error["code"] == INTERNAL_ERROR
            assert "over what the answers of this connection's unfinished batches may hold together" in error["message"]
        assert editor.result("fs/read_text_file", path=str(root / "notes.txt"))["content"] == "mine"
        # What they held is given back: a batch of one such read fits again.
        editor.raw.send_bytes(json.dumps(batch[:1]).encode() + b"\n")
        assert "result" in json.loads(editor.raw.recv_line(PATIENCE))[0]


def test_a_read_waiting_for_room_is_cancelled_unread(root):
    (root / "zeros.txt").write_bytes(b"\0" * NULS)
    path = str(root / "zeros.txt")
    with editor_for(root, max_message_size=LIMIT) as editor:
        first = editor.raw.request("fs/read_text_file", {"sessionId": SESSION, "path": path})
        second = editor.raw.request("fs/read_text_file", {"sessionId": SESSION, "path": path})
        time.sleep(SETTLE_SECONDS)  # the first answer fills the pipe the agent does not read
        editor.raw.notify("$/cancel_request", {"requestId": second})
        time.sleep(SETTLE_SECONDS)  # the cancel ends the wait (read now, the room would come first)
        answers = {answer["id"]: answer for answer in (editor.raw.recv(PATIENCE), editor.raw.recv(PATIENCE))}
        assert answers[first]["result"]["content"] == "\0" * NULS
        assert answers[second]["error"]["code"] == REQUEST_CANCELLED


def test_a_result_whose_size_shows_only_once_encoded_is_refused_and_the_connection_goes_on():
    peer = RawPeer(max_message_size=LIMIT)
    connection = Connection(peer.transport_for_connection, name="sized")
    connection.on_request("test/blob", lambda params, ctx: {"blob": ["\0" * 1024] * 200})  # 1.2 MiB encoded
    connection.on_request("test/ping", lambda params, ctx: "pong")
    connection.start()
    try:
        peer.send({"jsonrpc": "2.0", "id": 1, "method": "test/blob"})
        error = peer.recv()["error"]
        assert error["code"] == INTERNAL_ERROR
        assert "the answer to test/blob would take 1229" in error["message"]
        assert f"over the limit of {LIMIT} bytes" in error["message"]
        peer.ping()
    finally:
        connection.close()
        peer.close()
