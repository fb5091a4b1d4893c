"""The two-process example and the stdio agent runtime, as real subprocesses."""

import asyncio
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from acp_harness import TextsClient

from acp_lite import updates
from acp_lite.client import Client, RemoteAgent

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _run_editor(*args):
    return subprocess.run(
        [sys.executable, str(EXAMPLES / "editor.py"), *args], capture_output=True, text=True, timeout=30
    )


@pytest.mark.timeout(40)
@pytest.mark.req(
    "ACP-V1-PROMPT-AGENT-CANCELLED-STOP-REASON",
    "ACP-V1-PROMPT-PERMISSION-MAY",
    "ACP-V1-TRANSPORT-AGENT-STDERR-MAY",
    "ACP-V1-TRANSPORT-STDIO-NEWLINE-DELIMITED",
)
def test_the_editor_example_walks_the_lifecycle_and_ends_with_both_stop_reasons():
    done = _run_editor()
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "[init] agent=mock-coding-agent v1"
    assert lines[1].startswith("[session] sess_")
    assert lines[2:7] == [
        "[update] agent_message_chunk Analyzing request: Check this project for configuration issues",
        "[update] tool_call:pending",
        "[update] tool_call:completed",
        "[update] agent_message_chunk Done (permission: allow_once).",
        "[turn1] stopReason=end_turn",
    ]
    assert lines[-1] == "[turn2] stopReason=cancelled"
    assert "[agent] ready on stdio" in done.stderr


@pytest.mark.timeout(40)
@pytest.mark.req("ACP-V1-INIT-AGENT-LATEST-VERSION")
def test_the_editor_example_shows_version_negotiation():
    done = _run_editor("--protocol-version", "99")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == "[init] agent=mock-coding-agent v1"


NOISY_AGENT = textwrap.dedent(
    """
    import sys, time
    from acp_lite import schema, updates
    from acp_lite.agent import Agent, serve_stdio

    class Noisy(Agent):
        def new_session(self, params):
            print("debug output that must not reach the protocol stream")
            return schema.NewSessionResponse(session_id="s")

        def prompt(self, params, turn):
            print("more noise", flush=True)
            turn.send(updates.text_chunk("hello"))
            turn.wait_cancelled(60)
            return "cancelled"

    serve_stdio(Noisy())
    print("served", file=sys.stderr)
    """
)


@pytest.mark.timeout(30)
@pytest.mark.req("ACP-V1-TRANSPORT-AGENT-STDOUT-ONLY-ACP", "ACP-V1-TRANSPORT-STDIO-SHOULD")
def test_stdio_agent_prints_go_to_stderr_and_stdin_close_ends_the_process(tmp_path):
    script = tmp_path / "noisy_agent.py"
    script.write_text(NOISY_AGENT)
    stderr_lines = []
    client = TextsClient()
    remote = RemoteAgent.spawn([sys.executable, str(script)], client, on_stderr_line=stderr_lines.append)
    try:
        remote.initialize()
        session = remote.new_session("/tmp")
        turn = remote.prompt_future(session.session_id, "hi")
        deadline = time.monotonic() + 10
        while not client.texts and time.monotonic() < deadline:
            time.sleep(0.01)
        assert client.texts == ["hello"]
        assert remote.connection.stats.noise_lines == 0
        # Closing the agent's stdin (what an editor does on exit) cancels the running turn, which
        # still answers, and the process exits by itself, long before the turn's own 60 s.
        started = time.monotonic()
        remote.process.stdin.close()
        assert turn.result(10).stop_reason == "cancelled"
        assert remote.process.stop(timeout=5) == 0
        assert time.monotonic() - started < 10
    finally:
        remote.close()
    assert "debug output that must not reach the protocol stream" in stderr_lines
    assert "more noise" in stderr_lines and "served" in stderr_lines


class Rejecting(Client):
    """Rejects every permission request and keeps what the agent sent."""

    def __init__(self):
        self.updates = []
        self.permission_requests = []

    def session_update(self, params):
        self.updates.append(params.update)

    def request_permission(self, params):
        self.permission_requests.append(params)
        reject = next(option for option in params.options if option.kind == "reject_once")
        return updates.select_permission(reject.option_id)


@pytest.mark.timeout(40)
@pytest.mark.req("ACP-V1-PROMPT-PERMISSION-MAY")
def test_the_example_agent_asks_with_the_tool_calls_details_and_honours_a_reject(tmp_path):
    client = Rejecting()
    with RemoteAgent.spawn([sys.executable, str(EXAMPLES / "agent.py")], client) as remote:
        remote.initialize()
        session = remote.new_session(str(tmp_path))
        for _ in range(2):
            assert remote.prompt(session.session_id, "Check the configuration").stop_reason == "end_turn"
    config = str(tmp_path / "pyproject.toml")
    first, second = client.permission_requests
    assert (first.tool_call.title, first.tool_call.kind) == ("Reading configuration file", "read")
    assert [location.path for location in first.tool_call.locations] == [config]
    calls = [update for update in client.updates if updates.variant_tag(update) == "tool_call"]
    completions = [update for update in client.updates if updates.variant_tag(update) == "tool_call_update"]
    # One tool call per turn, each with an id of its own, each ended by an update of that id.
    assert [call.tool_call_id for call in calls] == [first.tool_call.tool_call_id, second.tool_call.tool_call_id]
    assert len({call.tool_call_id for call in calls}) == 2
    assert [(done.tool_call_id, done.status) for done in completions] == [
        (call.tool_call_id, "failed") for call in calls
    ]
    texts = [update.content.text for update in client.updates if updates.variant_tag(update) == "agent_message_chunk"]
    assert texts[1] == "Did not read pyproject.toml (permission: reject_once)."
    assert not any(text.startswith("Done") for text in texts)


class NotesEditor(Client):
    """An asyncio editor for the async agent example: it allows every write and keeps the files."""

    def __init__(self):
        self.texts = []
        self.statuses = []
        self.files = {}

    async def session_update(self, params):
        update = params.update
        if updates.variant_tag(update) == "agent_message_chunk":
            self.texts.append(update.content.text)
        elif updates.variant_tag(update) in ("tool_call", "tool_call_update"):
            self.statuses.append(update.status)

    async def request_permission(self, params):
        return updates.select_permission("allow")

    async def write_text_file(self, params):
        self.files[params.path] = params.content


@pytest.mark.timeout(60)
@pytest.mark.req("ACP-V1-PROMPT-PERMISSION-MAY", "ACP-V1-PROMPT-AGENT-CANCELLED-STOP-REASON")
def test_the_async_agent_example_streams_asks_writes_and_honours_cancel(tmp_path):
    editor = NotesEditor()

    async def application():
        remote = RemoteAgent.spawn(
            [sys.executable, str(EXAMPLES / "async_agent.py")], editor, loop=asyncio.get_running_loop()
        )
        try:
            await remote.initialize_async()
            session = (await remote.new_session_async(str(tmp_path))).session_id
            done = await remote.prompt_async(session, "plan the week")
            texts, editor.texts = editor.texts, []
            slow = remote.prompt_future(session, "slow answer")
            while not editor.texts:
                await asyncio.sleep(0.05)
            remote.cancel(session)
            cancelled = await asyncio.wrap_future(slow)
            return done.stop_reason, "".join(texts), cancelled.stop_reason
        finally:
            remote.close()

    stop_reason, text, cancelled = asyncio.run(application())
    assert (stop_reason, cancelled) == ("end_turn", "cancelled")
    assert text.startswith("You asked: plan the week.")
    assert editor.statuses == ["pending", "completed"]
    assert editor.files == {str(tmp_path / "NOTES.md"): "# Notes\n\nplan the week\n"}
