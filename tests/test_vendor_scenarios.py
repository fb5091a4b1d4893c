"""Protocol scenarios written once against a module object, so that the very same code runs against
the acp_lite package and against a vendored single file (test_vendor_runs.py runs both).

    python test_vendor_scenarios.py MODULE SCENARIO

imports MODULE (``acp_lite``, or a single file such as ``my_plugin._acp``), runs SCENARIO and
prints ``ok``. Standard library only, and no pytest: the single-file run happens in a process
where nothing but the standard library, msgspec and the file can be imported.

The scenarios address the API as ``acp.agent.Agent``, ``acp.schema.X``, ``acp.updates.f``: the
package's submodules, or the single file's module objects of the same names.
"""

import contextlib
import importlib
import importlib.util
import json
import os
import select
import sys
import threading
import time

WAIT = 10.0


def load(name):
    """The module ``name``; for the package, with the submodules the scenarios use imported."""
    acp = importlib.import_module(name)
    if hasattr(acp, "__path__"):
        for sub in ("agent", "client", "codec", "errors", "schema", "updates", "wire"):
            importlib.import_module(f"{name}.{sub}")
    return acp


def scenario_agent(acp):
    """An agent whose prompt turn streams "hi", then acts on the prompt text: ``wait`` waits to be
    cancelled, ``permission`` asks the editor and reports the choice."""

    class ScenarioAgent(acp.agent.Agent):
        def new_session(self, params):
            return acp.schema.NewSessionResponse(session_id="s1")

        def prompt(self, params, turn):
            text = params.prompt[0].text
            turn.send(acp.updates.text_chunk("hi"))
            if text == "wait":
                return "cancelled" if turn.wait_cancelled(WAIT) else "end_turn"
            if text == "permission":
                options = acp.updates.permission_options(("yes", "Yes", "allow_once"), ("no", "No", "reject_once"))
                answer = self.client.request_permission(turn.session_id, acp.updates.tool_call_ref("t1"), options)
                turn.send(acp.updates.text_chunk(f"chose {acp.updates.selected_option(answer)}"))
            return "end_turn"

    return ScenarioAgent()


def recording_client(acp):
    """An editor that records streamed text and the permission questions, and answers ``yes``."""

    class RecordingClient(acp.client.Client):
        def __init__(self):
            self.texts = []
            self.questions = []
            self.first_update = threading.Event()

        def session_update(self, params):
            self.texts.append(params.update.content.text)
            self.first_update.set()

        def request_permission(self, params):
            self.questions.append([option.option_id for option in params.options])
            return acp.updates.select_permission("yes")

    return RecordingClient()


@contextlib.contextmanager
def agent_and_editor(acp):
    """The scenario agent served over an in-memory pair, and a ``RemoteAgent`` talking to it."""
    agent_end, editor_end = acp.wire.memory_pair()
    served = acp.agent.serve(scenario_agent(acp), agent_end)
    client = recording_client(acp)
    remote = acp.client.RemoteAgent.connect(editor_end, client)
    try:
        yield remote, client
    finally:
        remote.close()
        served.connection.close()


def lifecycle(acp):
    with agent_and_editor(acp) as (remote, client):
        init = remote.initialize()
        assert init.protocol_version == acp.schema.PROTOCOL_VERSION, init
        session = remote.new_session(cwd="/tmp")
        assert session.session_id == "s1", session
        response = remote.prompt("s1", "permission")
        assert response.stop_reason == "end_turn", response
        assert client.texts == ["hi", "chose yes"], client.texts
        assert client.questions == [["yes", "no"]], client.questions


def cancellation(acp):
    with agent_and_editor(acp) as (remote, client):
        remote.initialize()
        remote.new_session(cwd="/tmp")
        turn = remote.prompt_future("s1", "wait")
        assert client.first_update.wait(WAIT), "no update before the cancel"
        remote.cancel("s1")
        assert turn.result(WAIT).stop_reason == "cancelled"


def bad_input(acp):
    """An invalid JSON line gets -32700 with a null id, and the connection keeps working."""
    to_agent_r, to_agent_w = os.pipe()
    from_agent_r, from_agent_w = os.pipe()
    served = acp.agent.serve(scenario_agent(acp), acp.wire.Transport(to_agent_r, from_agent_w))
    try:
        os.write(to_agent_w, b'{"jsonrpc": "2.0", "id": 1, "method": "initialize",\n')
        reply = read_json_line(from_agent_r)
        assert reply["id"] is None and reply["error"]["code"] == -32700 and "result" not in reply, reply
        initialize = {"jsonrpc": "2.0", "id": 2, "method": "initialize", "params": {"protocolVersion": 1}}
        os.write(to_agent_w, json.dumps(initialize).encode() + b"\n")
        reply = read_json_line(from_agent_r)
        assert reply["id"] == 2 and reply["result"]["protocolVersion"] == 1, reply
    finally:
        os.close(to_agent_w)
        served.connection.close()
        os.close(from_agent_r)


def read_json_line(fd):
    """The next line from ``fd``, decoded; fails after WAIT seconds."""
    data = b""
    deadline = time.monotonic() + WAIT
    while not data.endswith(b"\n"):
        remaining = deadline - time.monotonic()
        assert remaining > 0 and select.select([fd], [], [], remaining)[0], f"no complete line in {WAIT}s: {data!r}"
        chunk = os.read(fd, 1)
        assert chunk, f"end of stream after {data!r}"
        data += chunk
    return json.loads(data)


def codec_round_trip(acp):
    """msgspec resolves the generated types' postponed annotations (forward references, unions
    chosen under ``if TYPE_CHECKING:``) through the module's globals, wherever it is imported."""
    wire = (
        b'{"sessionId":"s1","update":{"sessionUpdate":"tool_call","toolCallId":"t1","title":"Read",'
        b'"content":[{"type":"content","content":{"type":"resource_link","uri":"file:///a","name":"a"}}]}}'
    )
    notification = acp.codec.decode(wire, acp.schema.SessionNotification)
    assert isinstance(notification.update, acp.schema.ToolCall), notification
    assert isinstance(notification.update.content[0].content, acp.schema.ResourceLink), notification
    assert json.loads(acp.codec.encode(notification)) == json.loads(wire)
    try:
        acp.codec.decode(b'{"sessionId": 5}', acp.schema.CancelNotification)
    except acp.errors.SchemaError as error:
        assert error.code == -32602, error
    else:
        raise AssertionError("a malformed CancelNotification decoded")


SCENARIOS = {f.__name__: f for f in (lifecycle, cancellation, bad_input, codec_round_trip)}


def main(argv):
    module_name, scenario = argv
    if module_name != "acp_lite":
        assert importlib.util.find_spec("acp_lite") is None, "acp_lite is importable in the single-file run"
    SCENARIOS[scenario](load(module_name))
    print("ok")


if __name__ == "__main__":
    main(sys.argv[1:])
