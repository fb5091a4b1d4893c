"""An agent's errors are visible by default: a process that ``serve_stdio`` runs is an
application, so a handler that raises has its traceback on the agent's stderr (unless the agent
configured logging itself), and its error answer says what failed in a short ``data`` (type and
message, never a traceback), which ``acp-lite run`` shows. Embedded, acp_lite stays quiet.
"""

import subprocess
import sys

import pytest
from acp_harness import agent_with_raw_client
from test_readme import write_snippets

from acp_lite import Agent, schema
from acp_lite.error_rules import FAILURE_SHOWN_CHARS

pytestmark = pytest.mark.timeout(150)


def failing_agent(folder, configure_logging=""):
    """The README's minimal agent, with a prompt that raises."""
    source = write_snippets(folder)["minimal_agent.py"].read_text(encoding="utf-8")
    send = '        turn.send(updates.text_chunk(f"You said: {text}"))\n'
    assert send in source
    source = source.replace(send, '        raise ConnectionError(f"the model is unreachable ({text})")\n')
    if configure_logging:
        source = source.replace(
            'if __name__ == "__main__":\n', f'if __name__ == "__main__":\n    {configure_logging}\n'
        )
    path = folder / "failing_agent.py"
    path.write_text(source, encoding="utf-8")
    return path


def run_once(agent):
    return subprocess.run(
        [sys.executable, "-m", "acp_lite", "run", "--", sys.executable, str(agent)],
        input="hello\n",
        capture_output=True,
        text=True,
        timeout=120,  # generous: acp-lite run and the agent both start Python on a loaded machine
    )


@pytest.mark.slow
def test_a_prompt_that_raises_shows_its_traceback_on_the_agents_stderr_and_its_cause_in_acp_lite_run(tmp_path):
    done = run_once(failing_agent(tmp_path))
    assert done.returncode == 1
    # acp-lite run relays the agent's stderr (to its own stderr, without a terminal).
    assert "Traceback (most recent call last):" in done.stderr
    assert "ConnectionError: the model is unreachable (hello)" in done.stderr
    assert "acp_lite.rpc ERROR: client: handler for session/prompt failed" in done.stderr
    # The cause, on the screen where the turn's failure is reported.
    failure = next(line for line in done.stderr.splitlines() if "[turn] failed" in line)
    assert '"type":"ConnectionError"' in failure and "the model is unreachable (hello)" in failure


@pytest.mark.slow
def test_an_agent_that_configured_logging_keeps_its_own_configuration(tmp_path):
    configure = "import logging; logging.basicConfig(level=logging.CRITICAL)"
    done = run_once(failing_agent(tmp_path, configure))
    assert done.returncode == 1
    assert "Traceback" not in done.stderr  # it asked for critical errors only
    assert "the model is unreachable (hello)" in done.stderr  # on the screen all the same


class Raises(Agent):
    def new_session(self, params):
        raise KeyError("x" * 1000)


def test_the_error_answer_carries_the_type_and_a_bounded_message_and_no_traceback(capfd):
    with agent_with_raw_client(Raises()) as (_, raw):
        response = raw.call("session/new", {"cwd": "/tmp", "mcpServers": []})
    error = response["error"]
    assert error["code"] == -32603 and error["message"] == "Internal error"
    assert error["data"]["type"] == "KeyError"
    assert error["data"]["message"] == repr("x" * 1000)[:FAILURE_SHOWN_CHARS] + "..."
    assert set(error["data"]) == {"type", "message"}
    # Embedded (served by the application, not serve_stdio), the library printed nothing.
    assert capfd.readouterr().err == ""


class InventsAStopReason(Agent):
    def new_session(self, params):
        return schema.NewSessionResponse(session_id="s1")

    def prompt(self, params, turn):
        return "done"  # not a v1 stop reason


def test_a_stop_reason_v1_lacks_is_refused_before_sending_with_a_clear_error(caplog):
    with agent_with_raw_client(InventsAStopReason()) as (_, raw):
        raw.call("session/new", {"cwd": "/tmp", "mcpServers": []})
        response = raw.call("session/prompt", {"sessionId": "s1", "prompt": []})
    assert response["error"]["code"] == -32603
    assert response["error"]["data"]["type"] == "UsageError"
    assert "prompt returned the stop reason 'done'; ACP v1 has end_turn" in response["error"]["data"]["message"]
