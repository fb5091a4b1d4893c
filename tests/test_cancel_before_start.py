"""A prompt cancelled before, while or after its handler starts: no update follows the response.

The runtime answers a turn cancelled before its handler started ``cancelled`` itself; the
handler must then never run (what it would send would land after the answer). Checked on the
wire, from a raw client that writes the prompt and its cancel in one write, and at
``Client.session_update`` through ``RemoteAgent``. Each runs with a sync and an ``async def``
prompt handler (and session_update).
"""

import asyncio
import threading
from typing import Any, Dict, List

import pytest
from raw_peer import RawPeer

from acp_lite import schema, updates
from acp_lite.agent import Agent, serve
from acp_lite.client import Client, RemoteAgent
from acp_lite.wire import memory_pair

pytestmark = pytest.mark.timeout(60)

WAIT = 10.0
TURNS = 100


class Echo(Agent):
    """Sends the prompt's text back as one update, then ends the turn; "wait" turns tell the
    test they started and send their update only once cancelled."""

    def __init__(self) -> None:
        self.started = threading.Semaphore(0)

    def new_session(self, params: Any) -> Any:
        return schema.NewSessionResponse(session_id="s")

    def prompt(self, params: Any, turn: Any) -> Any:
        text = params.prompt[0].text
        if text.startswith("wait"):
            self.started.release()
            turn.wait_cancelled(WAIT)
        turn.send(updates.text_chunk(text))
        return "cancelled" if turn.cancelled else "end_turn"


class AsyncEcho(Echo):
    """The same in a coroutine: a "wait" turn's cancel arrives as ``CancelledError``, which it
    catches to go on the way the sync one does."""

    async def prompt(self, params: Any, turn: Any) -> Any:
        text = params.prompt[0].text
        if text.startswith("wait"):
            self.started.release()
            try:
                await asyncio.sleep(WAIT)
            except asyncio.CancelledError:
                pass
        turn.send(updates.text_chunk(text))
        return "cancelled" if turn.cancelled else "end_turn"


both_kinds = pytest.mark.parametrize("kind", ["sync", "async"])


def _request(request_id: Any, method: str, params: Dict[str, Any]) -> Dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}


def _prompt(request_id: int, text: str) -> Dict[str, Any]:
    return _request(request_id, "session/prompt", {"sessionId": "s", "prompt": [{"type": "text", "text": text}]})


CANCEL = {"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": "s"}}


def _frames_until_answer(peer: RawPeer, request_id: Any) -> List[Any]:
    frames = []
    while True:
        frame = peer.recv()
        frames.append(frame)
        if frame.get("id") == request_id and "method" not in frame:
            return frames


@pytest.mark.req("ACP-V1-PROMPT-AGENT-STOP-ON-CANCEL", "ACP-V1-PROMPT-AGENT-CANCELLED-STOP-REASON")
@both_kinds
def test_on_the_wire_no_update_follows_the_answer_of_a_turn_cancelled_before_during_or_after_its_start(kind: str):
    peer = RawPeer()
    agent = {"sync": Echo, "async": AsyncEcho}[kind]()
    served = serve(agent, peer.transport_for_connection)
    try:
        peer.send(_request(0, "initialize", {"protocolVersion": 1}))
        _frames_until_answer(peer, 0)
        peer.send(_request("new", "session/new", {"cwd": "/w", "mcpServers": []}))
        _frames_until_answer(peer, "new")
        frames: List[Any] = []
        for n in range(1, TURNS + 1):
            peer.send(_prompt(n, f"before{n}"), CANCEL)  # one write: cancelled before it starts
            frames += _frames_until_answer(peer, n)
        peer.send(_prompt("during", "wait"))
        assert agent.started.acquire(timeout=WAIT)
        peer.send(CANCEL)
        frames += _frames_until_answer(peer, "during")
        peer.send(_prompt("after", "after"))
        frames += _frames_until_answer(peer, "after")
        peer.send(CANCEL)
        peer.send(_request("last", "session/new", {"cwd": "/w", "mcpServers": []}))  # all that came before
        frames += _frames_until_answer(peer, "last")

        answered: Dict[str, str] = {}
        late = []
        for frame in frames:
            if frame.get("method") == "session/update":
                text = frame["params"]["update"]["content"]["text"]
                turn = "during" if text == "wait" else text
                if turn in answered:
                    late.append(text)
            elif "result" in frame and isinstance(frame["result"], dict) and "stopReason" in frame["result"]:
                answered[f"before{frame['id']}" if isinstance(frame["id"], int) else frame["id"]] = frame["result"][
                    "stopReason"
                ]
        assert late == []
        assert answered["during"] == "cancelled" and answered["after"] == "end_turn"
        assert len(answered) == TURNS + 2  # every turn answered (either way: the invariant is the order)
    finally:
        served.connection.close()
        peer.close()


class Recorder(Client):
    """Records, in delivery order, each update's text and each turn's answer."""

    def __init__(self) -> None:
        self.events: List[Any] = []

    def session_update(self, params: Any) -> None:
        self.events.append(("update", params.update.content.text))


class AsyncRecorder(Recorder):
    async def session_update(self, params: Any) -> None:
        self.events.append(("update", params.update.content.text))


@pytest.mark.req("ACP-V1-PROMPT-AGENT-STOP-ON-CANCEL")
@both_kinds
def test_at_session_update_no_update_follows_the_answer_of_a_turn_cancelled_at_once(kind: str):
    agent_end, client_end = memory_pair()
    served = serve({"sync": Echo, "async": AsyncEcho}[kind](), agent_end)
    editor = {"sync": Recorder, "async": AsyncRecorder}[kind]()
    remote = RemoteAgent.connect(client_end, editor)
    try:
        remote.initialize(timeout=WAIT)
        session = remote.new_session("/w").session_id
        for n in range(TURNS):
            turn = remote.prompt_future(session, f"t{n}")
            remote.cancel(session)
            # Runs where the answer is delivered, in order with the updates (or here at once,
            # when it already was: every update before it was then delivered too).
            turn.add_done_callback(lambda _, text=f"t{n}": editor.events.append(("answered", text)))
            turn.result(WAIT)
        remote.new_session("/w")  # a round trip: every update sent before it has been delivered
        answered = set()
        late = []
        for kind, text in list(editor.events):
            if kind == "answered":
                answered.add(text)
            elif text in answered:
                late.append(text)
        assert late == []
        assert len(answered) == TURNS
    finally:
        remote.close()
        served.connection.close()
