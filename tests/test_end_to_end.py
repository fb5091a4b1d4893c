"""Both sides of acp_lite talking to each other over in-process pipes and sockets, under load.

The tests of handlers run each with sync handlers on both sides and with ``async def`` ones on
both sides (``kind``)."""

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from acp_harness import agent_and_client

from acp_lite import schema, updates
from acp_lite.agent import Agent, serve
from acp_lite.client import Client, RemoteAgent
from acp_lite.errors import ConnectionClosed
from acp_lite.sockets import connect_tcp, listen_tcp
from acp_lite.wire import memory_pair

WAIT = 10.0


class Worker(Agent):
    def __init__(self):
        self.waiting = threading.Semaphore(0)  # released by each turn that starts waiting

    def new_session(self, params):
        return schema.NewSessionResponse(session_id="s")

    def prompt(self, params, turn):
        text = params.prompt[0].text
        if text == "read":
            # A nested request from inside the handler while the client keeps streaming.
            content = self.client.read_text_file(turn.session_id, "/w/f.txt").content
            turn.send(updates.text_chunk(content))
        elif text == "wait":
            self.waiting.release()
            turn.wait_cancelled(WAIT)
            return "cancelled"
        for i in range(int(text) if text.isdigit() else 0):
            turn.send(updates.text_chunk(str(i)))
        return "end_turn"

    def ext_method(self, method, params):
        return {"n": params["n"] * 2}


class AsyncWorker(Worker):
    async def new_session(self, params):
        return schema.NewSessionResponse(session_id="s")

    async def prompt(self, params, turn):
        text = params.prompt[0].text
        if text == "read":
            content = (await self.client.read_text_file_async(turn.session_id, "/w/f.txt")).content
            turn.send(updates.text_chunk(content))
        elif text == "wait":
            self.waiting.release()
            try:
                await asyncio.sleep(WAIT)
            except asyncio.CancelledError:
                return "cancelled"
        for i in range(int(text) if text.isdigit() else 0):
            turn.send(updates.text_chunk(str(i)))
        return "end_turn"

    async def ext_method(self, method, params):
        return {"n": params["n"] * 2}


class Editor(Client):
    def __init__(self):
        self.texts = []

    def session_update(self, params):
        self.texts.append(params.update.content.text)

    def read_text_file(self, params):
        return schema.ReadTextFileResponse(content=f"contents of {params.path}")


class AsyncEditor(Editor):
    async def session_update(self, params):
        self.texts.append(params.update.content.text)

    async def read_text_file(self, params):
        await asyncio.sleep(0)
        return schema.ReadTextFileResponse(content=f"contents of {params.path}")


KINDS = {"sync": (Worker, Editor), "async": (AsyncWorker, AsyncEditor)}
both_kinds = pytest.mark.parametrize("kind", list(KINDS))


def _pair(transports=None, agent=None, kind="sync"):
    agent_end, client_end = transports or memory_pair()
    served = serve(agent or KINDS[kind][0](), agent_end)
    editor = KINDS[kind][1]()
    remote = RemoteAgent.connect(client_end, editor)
    remote.initialize()
    session = remote.new_session("/w").session_id
    return served, remote, editor, session


def _close(served, remote):
    remote.close()
    served.connection.close()


@pytest.mark.req("ACP-V1-PROMPT-TOOLS-MAY-USE-CLIENT-CAPABILITIES")
@both_kinds
def test_a_prompt_handler_can_call_the_client_while_the_turn_streams(kind):
    served, remote, editor, session = _pair(kind=kind)
    try:
        assert remote.prompt(session, "read").stop_reason == "end_turn"
        assert editor.texts == ["contents of /w/f.txt"]
        assert remote.prompt(session, "300").stop_reason == "end_turn"
        assert editor.texts[1:] == [str(i) for i in range(300)]
    finally:
        _close(served, remote)


@both_kinds
def test_sixteen_threads_calling_at_once_are_each_answered_correctly(kind):
    served, remote, _, _ = _pair(kind=kind)
    try:
        with ThreadPoolExecutor(16) as pool:
            results = list(pool.map(lambda n: remote.ext_method("_double", {"n": n})["n"], range(2000)))
        assert results == [2 * n for n in range(2000)]
    finally:
        _close(served, remote)


@both_kinds
def test_closing_the_caller_fails_its_pending_calls_promptly(kind):
    served, remote, _, session = _pair(kind=kind)
    try:
        turns = [remote.prompt_future(session, "wait") for _ in range(5)]
        remote.connection.close()
        for turn in turns:
            with pytest.raises(ConnectionClosed):
                turn.result(WAIT)
    finally:
        _close(served, remote)


@pytest.mark.timeout(60)
@pytest.mark.req("ACP-V1-PROMPT-CLIENT-CANCEL-MAY", "ACP-V1-PROMPT-UPDATES-BEFORE-RESPONSE")
@both_kinds
def test_cancel_racing_the_start_of_a_turn_answers_it_once_and_nothing_follows(kind):
    served, remote, editor, session = _pair(kind=kind)
    try:
        for round_ in range(50):
            before = len(editor.texts)
            turn = remote.prompt_future(session, "3")
            remote.cancel(session)
            # The cancel lands before the handler started (the turn is answered cancelled and the
            # handler never runs) or after (the handler, which ignores it, ends the turn): either
            # way every update of the turn came before its answer, and none after it. The chunks
            # that reach session_update after cancel() are dropped, stale: those delivered are the
            # first ones, if any.
            reason = turn.result(WAIT).stop_reason
            sent = {"end_turn": ["0", "1", "2"], "cancelled": []}[reason]
            delivered = editor.texts[before:]
            assert delivered == sent[: len(delivered)], (round_, reason)
        answered = len(editor.texts)
        turn = remote.prompt_future(session, "wait")
        remote.cancel(session)
        assert turn.result(WAIT).stop_reason == "cancelled"
        assert len(editor.texts) == answered, "an update arrived after its turn's answer"
    finally:
        _close(served, remote)


@pytest.mark.req("ACP-V1-CANCEL-INTERNAL-SHOULD")
@both_kinds
def test_an_agent_shutting_down_answers_its_running_turns_cancelled(kind):
    agent = KINDS[kind][0]()
    served, remote, _, session = _pair(agent=agent, kind=kind)
    try:
        turns = [remote.prompt_future(session, "wait") for _ in range(5)]
        for _ in turns:
            assert agent.waiting.acquire(timeout=WAIT)
        served.connection.close()
        assert [turn.result(WAIT).stop_reason for turn in turns] == ["cancelled"] * 5
    finally:
        _close(served, remote)


@pytest.mark.req("ACP-V1-TRANSPORT-CUSTOM-MAY", "ACP-V1-TRANSPORT-CUSTOM-PRESERVE-FORMAT-AND-LIFECYCLE")
def test_the_same_lifecycle_over_a_tcp_socket():
    with listen_tcp("127.0.0.1", 0) as listener:
        accepted = {}
        thread = threading.Thread(target=lambda: accepted.update(t=listener.accept(WAIT)))
        thread.start()
        dialled = connect_tcp(*listener.address, timeout=WAIT)
        thread.join(WAIT)
    served, remote, editor, session = _pair((accepted["t"], dialled))
    try:
        assert remote.prompt(session, "5").stop_reason == "end_turn"
        assert editor.texts == ["0", "1", "2", "3", "4"]
    finally:
        _close(served, remote)


# Values of any JSON type: nothing about them may be assumed.
PROMPT_META = {"tracestate": "k=v", "vendor.retry": 2, "vendor.flags": {"a": [True, None, 1.5]}, "vendor.none": None}


@pytest.mark.req("ACP-V1-EXT-META-NO-ASSUMPTIONS")
def test_meta_given_to_the_high_level_calls_reaches_the_other_side():
    seen = {}

    class MetaAgent(Worker):
        def new_session(self, params):
            seen["new"] = params.meta
            return super().new_session(params)

        def prompt(self, params, turn):
            seen["prompt"] = params.meta
            turn.send(updates.text_chunk("x"), meta={"traceparent": "00-ab-cd-01"})
            return "end_turn"

    class MetaEditor(Editor):
        def session_update(self, params):
            seen["update"] = params.meta

    with agent_and_client(MetaAgent(), MetaEditor()) as remote:
        remote.initialize()
        session = remote.new_session("/w", meta={"vendor.origin": "test", "vendor.n": 1}).session_id
        remote.prompt(session, "go", meta=PROMPT_META)
    assert seen == {
        "new": {"vendor.origin": "test", "vendor.n": 1},
        "prompt": PROMPT_META,
        "update": {"traceparent": "00-ab-cd-01"},
    }


class Tools(Agent):
    """A turn that writes a file, reads it back and runs a command, calling the client."""

    def new_session(self, params):
        return schema.NewSessionResponse(session_id="s")

    def prompt(self, params, turn):
        client, session = self.client, turn.session_id
        client.write_text_file(session, "/w/out.txt", "written")
        turn.send(updates.text_chunk(client.read_text_file(session, "/w/out.txt").content))
        terminal = client.create_terminal(session, "make", ["test"], cwd="/w").terminal_id
        exit_status = client.wait_for_terminal_exit(session, terminal)
        turn.send(updates.text_chunk(client.terminal_output(session, terminal).output))
        client.kill_terminal(session, terminal)
        client.release_terminal(session, terminal)
        return "end_turn" if exit_status.exit_code == 0 else "refusal"


class AsyncTools(Tools):
    async def prompt(self, params, turn):
        client, session = self.client, turn.session_id
        await client.write_text_file_async(session, "/w/out.txt", "written")
        turn.send(updates.text_chunk((await client.read_text_file_async(session, "/w/out.txt")).content))
        terminal = (await client.create_terminal_async(session, "make", ["test"], cwd="/w")).terminal_id
        exit_status = await client.wait_for_terminal_exit_async(session, terminal)
        turn.send(updates.text_chunk((await client.terminal_output_async(session, terminal)).output))
        await client.kill_terminal_async(session, terminal)
        await client.release_terminal_async(session, terminal)
        return "end_turn" if exit_status.exit_code == 0 else "refusal"


class Workbench(Editor):
    """Files in a dict, and one make that always passes."""

    def __init__(self):
        super().__init__()
        self.files = {}
        self.calls = []

    def write_text_file(self, params):
        self.calls.append("write")
        self.files[params.path] = params.content

    def read_text_file(self, params):
        self.calls.append("read")
        return schema.ReadTextFileResponse(content=self.files[params.path])

    def create_terminal(self, params):
        self.calls.append(f"create {params.command} {' '.join(params.args)} in {params.cwd}")
        return schema.CreateTerminalResponse(terminal_id="t1")

    def wait_for_terminal_exit(self, params):
        self.calls.append("wait")
        return schema.WaitForTerminalExitResponse(exit_code=0)

    def terminal_output(self, params):
        self.calls.append("output")
        return schema.TerminalOutputResponse(output="4 passed", truncated=False)

    def kill_terminal(self, params):
        self.calls.append("kill")

    def release_terminal(self, params):
        self.calls.append(f"release {params.terminal_id}")


class AsyncWorkbench(Workbench):
    async def session_update(self, params):
        super().session_update(params)

    async def write_text_file(self, params):
        return super().write_text_file(params)

    async def read_text_file(self, params):
        return super().read_text_file(params)

    async def create_terminal(self, params):
        return super().create_terminal(params)

    async def wait_for_terminal_exit(self, params):
        await asyncio.sleep(0.01)
        return super().wait_for_terminal_exit(params)

    async def terminal_output(self, params):
        return super().terminal_output(params)

    async def kill_terminal(self, params):
        return super().kill_terminal(params)

    async def release_terminal(self, params):
        return super().release_terminal(params)


@pytest.mark.req("ACP-V1-PROMPT-TOOLS-MAY-USE-CLIENT-CAPABILITIES")
@pytest.mark.parametrize("agent_kind", [Tools, AsyncTools], ids=["sync-agent", "async-agent"])
@pytest.mark.parametrize("client_kind", [Workbench, AsyncWorkbench], ids=["sync-client", "async-client"])
def test_file_and_terminal_calls_from_a_turn(agent_kind, client_kind):
    editor = client_kind()
    with agent_and_client(agent_kind(), editor) as remote:
        remote.initialize(timeout=WAIT)
        session = remote.new_session("/w", timeout=WAIT).session_id
        assert remote.prompt(session, "go", timeout=WAIT).stop_reason == "end_turn"
    assert editor.texts == ["written", "4 passed"]
    assert editor.calls == ["write", "read", "create make test in /w", "wait", "output", "kill", "release t1"]
