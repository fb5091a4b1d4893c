"""Nothing the agent sends vanishes: what does not decode still reaches the ``Client``, and a
permission request reaches an answer even when the ``Client`` does not handle it.

The agent is played byte by byte over a real pipe pair (``RawPeer``); the lines are what real
agents send (see each test).
"""

import json
import logging
import queue

import pytest
from acp_harness import WAIT, client_with_raw_agent, initialized
from conftest import REPO

from acp_lite.client import Client
from acp_lite.codec import Undecodable, UnknownVariant
from acp_lite.errors import SchemaError
from acp_lite.schema import SessionNotification, UsageUpdate


def recorded_usage_update():
    """The first usage_update claude-agent-acp 0.23.1 sent in a recorded run: it ends each turn
    with one whose ``used`` is the sum of the model's token counts, NaN written as null when the
    model's usage lacks the cache counts. v1 wants an integer there."""
    recording = REPO / "tests" / "data" / "real_agents" / "claude-agent-acp-0.23.1-stub-model"
    for log in sorted(recording.glob("*.jsonl")):
        for entry in map(json.loads, log.read_text(encoding="utf-8").splitlines()):
            params = entry.get("msg", {}).get("params") or {}
            if isinstance(params.get("update"), dict) and params["update"].get("sessionUpdate") == "usage_update":
                return params
    raise AssertionError("no usage_update in the recording")


CLAUDE_USAGE_UPDATE = recorded_usage_update()


class Recorder(Client):
    def __init__(self):
        self.updates = queue.Queue()
        self.undecodable = queue.Queue()

    def session_update(self, params):
        self.updates.put(params)

    def on_undecodable_notification(self, method, raw, error):
        self.undecodable.put((method, raw, error))


def notify(raw, method, params):
    raw.send({"jsonrpc": "2.0", "method": method, "params": params})


@pytest.mark.timeout(30)
def test_an_update_that_does_not_decode_reaches_session_update_with_its_raw_params_and_error():
    client = Recorder()
    with client_with_raw_agent(client) as (remote, raw):
        initialized(remote, raw)
        notify(raw, "session/update", CLAUDE_USAGE_UPDATE)
        session_id = CLAUDE_USAGE_UPDATE["sessionId"]
        notify(
            raw,
            "session/update",
            {"sessionId": session_id, "update": {"sessionUpdate": "usage_update", "used": 7, "size": 200000}},
        )
        notify(
            raw, "session/update", {"sessionId": session_id, "update": {"sessionUpdate": "mood_update", "mood": "ok"}}
        )
        kept, valid, unknown = (client.updates.get(timeout=WAIT) for _ in range(3))
    assert isinstance(kept, Undecodable)
    assert kept.raw == CLAUDE_USAGE_UPDATE and kept.raw["update"]["used"] is None
    assert isinstance(kept.error, SchemaError) and kept.error.path == "$.update.used"
    # The updates around it are unaffected, and an unknown kind is a different thing: a valid
    # notification whose update this version does not know.
    assert valid == SessionNotification(session_id=session_id, update=UsageUpdate(used=7, size=200000))
    assert isinstance(unknown, SessionNotification) and isinstance(unknown.update, UnknownVariant)
    assert unknown.update.tag == "mood_update"


@pytest.mark.timeout(30)
def test_another_notification_that_does_not_decode_reaches_the_hook():
    client = Recorder()
    with client_with_raw_agent(client) as (remote, raw):
        initialized(remote, raw)
        notify(raw, "elicitation/complete", {"elicitationId": 42})
        method, params, error = client.undecodable.get(timeout=WAIT)
    assert (method, params) == ("elicitation/complete", {"elicitationId": 42})
    assert error.path == "$.elicitationId"


@pytest.mark.timeout(30)
def test_the_default_hook_logs_one_warning_with_the_method_and_the_reason(caplog):
    with client_with_raw_agent(Client()) as (remote, raw):
        initialized(remote, raw)
        with caplog.at_level(logging.WARNING, logger="acp_lite.client"):
            notify(raw, "elicitation/complete", {"elicitationId": 42})
            # A request after it: once it is answered, the notification before it was delivered.
            raw.send(
                {
                    "jsonrpc": "2.0",
                    "id": 1,
                    "method": "session/request_permission",
                    "params": {
                        "sessionId": "sess-1",
                        "toolCall": {"toolCallId": "call-1"},
                        "options": [{"optionId": "no", "name": "No", "kind": "reject_once"}],
                    },
                }
            )
            assert raw.recv()["id"] == 1
    hook_lines = [r.getMessage() for r in caplog.records if "elicitation/complete" in r.getMessage()]
    assert len(hook_lines) == 1
    assert "does not decode" in hook_lines[0] and "$.elicitationId" in hook_lines[0]


def permission_request(request_id, *options):
    return {
        "jsonrpc": "2.0",
        "id": request_id,
        "method": "session/request_permission",
        "params": {
            "sessionId": "sess-1",
            "toolCall": {"toolCallId": "call-1", "title": "Read notes.txt", "kind": "read"},
            "options": [{"optionId": option_id, "name": option_id, "kind": kind} for option_id, kind in options],
        },
    }


@pytest.mark.timeout(30)
def test_a_client_without_request_permission_denies_with_the_first_reject_option_and_logs_once(caplog):
    with client_with_raw_agent(Client()) as (remote, raw):
        initialized(remote, raw)
        with caplog.at_level(logging.WARNING, logger="acp_lite.client"):
            raw.send(permission_request(1, ("yes", "allow_once"), ("never", "reject_always"), ("no", "reject_once")))
            first = raw.recv()
            raw.send(permission_request(2, ("yes", "allow_once"), ("always", "allow_always")))
            second = raw.recv()
    assert first == {"jsonrpc": "2.0", "id": 1, "result": {"outcome": {"outcome": "selected", "optionId": "never"}}}
    # No reject option to choose: the request is answered cancelled, never allowed.
    assert second == {"jsonrpc": "2.0", "id": 2, "result": {"outcome": {"outcome": "cancelled"}}}
    denied = [r for r in caplog.records if "request_permission" in r.getMessage()]
    assert len(denied) == 1 and denied[0].levelno == logging.WARNING
    assert "Client does not override request_permission" in denied[0].getMessage()
