"""Remaining protocol rules, each over a real connection: method names, the session's cwd, plans,
listed sessions, config option values, and one agent instance per connection."""

import sys
import textwrap
from functools import partial

import pytest
from acp_harness import WAIT, TextsClient, agent_and_client, background, client_with_raw_agent, initialized, refused

from acp_lite import schema, updates
from acp_lite.agent import Agent, serve
from acp_lite.client import Client, RemoteAgent
from acp_lite.codec import convert
from acp_lite.errors import UsageError
from acp_lite.rpc import Connection
from acp_lite.wire import memory_pair


@pytest.mark.req("ACP-V1-JSONRPC-RPC-PREFIX-RESERVED")
def test_method_names_starting_with_rpc_dot_are_never_sent_or_served():
    ours, theirs = memory_pair()
    connection = Connection(ours)
    try:
        with pytest.raises(UsageError):
            connection.on_request("rpc.discover", lambda params, ctx: None)
        connection.start()
        for send in (lambda: connection.call("rpc.discover", timeout=WAIT), lambda: connection.notify("rpc.ping")):
            with pytest.raises(UsageError):
                send()
    finally:
        connection.close()
        theirs.close()


CWD_AGENT = textwrap.dedent(
    """
    import os
    from acp_lite import schema, updates
    from acp_lite.agent import Agent, serve_stdio

    class WhereAmI(Agent):
        def new_session(self, params):
            self.cwd = params.cwd
            return schema.NewSessionResponse(session_id="s")

        def prompt(self, params, turn):
            # Relative paths resolve against the session's cwd, not the process's.
            turn.send(updates.text_chunk(os.getcwd() + "|" + os.path.join(self.cwd, "src/main.py")))
            return "end_turn"

    serve_stdio(WhereAmI())
    """
)


@pytest.mark.timeout(30)
@pytest.mark.req("ACP-V1-SETUP-CWD-USED-REGARDLESS-OF-SPAWN", "ACP-V1-SETUP-CWD-RELATIVE-BASE")
def test_the_session_cwd_reaches_the_agent_whatever_the_process_cwd(tmp_path):
    script = tmp_path / "where.py"
    script.write_text(CWD_AGENT)
    spawn_dir = tmp_path / "spawned-here"
    spawn_dir.mkdir()
    client = TextsClient()
    with RemoteAgent.spawn([sys.executable, str(script)], client, cwd=str(spawn_dir)) as remote:
        remote.initialize()
        session = remote.new_session("/work/project").session_id
        remote.prompt(session, "where?")
    assert client.texts == [f"{spawn_dir}|/work/project/src/main.py"]


class Plans(Client):
    def __init__(self):
        self.plans = []

    def session_update(self, params):
        self.plans.append([entry.content for entry in params.update.entries])


@pytest.mark.req(
    "ACP-V1-PLAN-CLIENT-REPLACE", "ACP-V1-PLAN-COMPLETE-LIST", "ACP-V1-PLAN-REPORT-UPDATES", "ACP-V1-PLAN-DYNAMIC-MAY"
)
def test_each_plan_update_arrives_as_the_complete_plan_to_replace_the_last():
    class Planner(Agent):
        def new_session(self, params):
            return schema.NewSessionResponse(session_id="s")

        def prompt(self, params, turn):
            turn.send(
                updates.plan([("read", "high", "in_progress"), ("fix", "high", "pending"), ("test", "low", "pending")])
            )
            turn.send(updates.plan([("fix", "high", "in_progress"), ("ship", "medium", "pending")]))
            return "end_turn"

    client = Plans()
    with agent_and_client(Planner(), client) as remote:
        remote.initialize()
        remote.prompt(remote.new_session("/w").session_id, "plan")
    assert client.plans == [["read", "fix", "test"], ["fix", "ship"]]


@pytest.mark.timeout(10)
@pytest.mark.req("ACP-V1-PLAN-CLIENT-REPLACE")
def test_each_plan_from_the_wire_reaches_the_client_whole():
    def plan(*entries):
        return {
            "sessionUpdate": "plan",
            "entries": [{"content": c, "priority": "high", "status": "pending"} for c in entries],
        }

    client = Plans()
    with client_with_raw_agent(client) as (remote, raw):
        initialized(remote, raw)
        for update in (plan("read", "fix", "test"), plan("fix", "ship"), plan()):
            raw.notify("session/update", {"sessionId": "s", "update": update})
        raw.send({"jsonrpc": "2.0", "id": 1, "method": "x/after", "params": {}})
        assert raw.recv()["id"] == 1  # answered after the updates before it were delivered
    assert client.plans == [["read", "fix", "test"], ["fix", "ship"], []]


class Roots(Client):
    def __init__(self):
        self.roots = {}

    def on_session(self, session_id, cwd, additional_directories):
        self.roots[session_id] = [cwd, *additional_directories]


@pytest.mark.req("ACP-V1-LIST-CLIENT-NO-MERGE-ADDITIONAL-DIRS", "ACP-V1-LIST-ADDITIONAL-DIRS-MAY")
def test_listed_additional_directories_are_reported_as_sent_and_never_merged_into_roots():
    caps = {"sessionCapabilities": {"list": {}, "additionalDirectories": {}, "resume": {}}}
    client = Roots()
    with client_with_raw_agent(client) as (remote, raw):
        initialized(remote, raw, caps)
        pending = background(remote.list_sessions)
        request = raw.recv()
        listed = {"sessionId": "old", "cwd": "/w", "additionalDirectories": ["/lib", "/docs"]}
        raw.send({"jsonrpc": "2.0", "id": request["id"], "result": {"sessions": [listed]}})
        (info,) = pending.result(WAIT).sessions
        assert info.additional_directories == ["/lib", "/docs"]
        assert client.roots == {}  # listing a session does not make its directories ours
        pending = background(remote.resume_session, "old", "/w", additional_directories=["/lib"])
        request = raw.recv()
        assert request["params"]["additionalDirectories"] == ["/lib"]  # only what we chose to send
        raw.send({"jsonrpc": "2.0", "id": request["id"], "result": {}})
        pending.result(WAIT)
    assert client.roots == {"old": ["/w", "/lib"]}


@pytest.mark.req("ACP-V1-CONFIG-SET-VALUE-VALID")
def test_config_option_values_must_fit_the_option_the_agent_described():
    model = {
        "type": "select",
        "id": "model",
        "name": "Model",
        "currentValue": "fast",
        "options": [{"value": "fast", "name": "Fast"}, {"value": "deep", "name": "Deep"}],
    }
    think = {"type": "boolean", "id": "think", "name": "Think", "currentValue": False}
    with client_with_raw_agent(Client()) as (remote, raw):
        initialized(remote, raw)
        pending = background(remote.new_session, "/w")
        request = raw.recv()
        raw.send({"jsonrpc": "2.0", "id": request["id"], "result": {"sessionId": "s", "configOptions": [model, think]}})
        pending.result(WAIT)
        for config_id, value in (("model", True), ("model", "turbo"), ("think", "yes")):
            refused(partial(remote.set_config_option, "s", config_id, value), UsageError)
        raw.expect_silence()
        pending = background(remote.set_config_option, "s", "think", True)
        request = raw.recv()
        assert request["params"] == {"sessionId": "s", "configId": "think", "type": "boolean", "value": True}
        raw.send(
            {
                "jsonrpc": "2.0",
                "id": request["id"],
                "result": {"configOptions": [model, dict(think, currentValue=True)]},
            }
        )
        pending.result(WAIT)


class FormFiller(Client):
    elicitation_modes = ("form",)

    def __init__(self):
        self.asked, self.completed = [], []

    def create_elicitation(self, params):
        self.asked.append(params.message)
        return schema.ElicitationAcceptAction(content={"name": "Ada"})

    def complete_elicitation(self, params):
        self.completed.append(params.elicitation_id)


@pytest.mark.timeout(20)
@pytest.mark.req("ACP-V1-ELIC-AGENT-BIND-CONNECTION", "ACP-V1-ELIC-AGENT-COMPLETE-SAME-CLIENT")
def test_an_agent_instance_serves_one_connection_so_its_elicitations_stay_bound_to_it():
    form = {
        "mode": "form",
        "message": "Name?",
        "sessionId": "s",
        "requestedSchema": {"type": "object", "properties": {}},
    }

    class Single(Agent):
        def new_session(self, params):
            return schema.NewSessionResponse(session_id="s")

        def prompt(self, params, turn):
            answer = self.client.create_elicitation(convert(form, schema.CreateElicitationRequest))
            self.client.complete_elicitation("e-1")
            return "end_turn" if answer.content == {"name": "Ada"} else "refusal"

    agent = Single()
    first, first_peer = memory_pair()
    served = serve(agent, first)
    second, second_peer = memory_pair()
    first_client, second_client = FormFiller(), FormFiller()
    first_remote = RemoteAgent.connect(first_peer, first_client)
    second_remote = RemoteAgent.connect(second_peer, second_client)
    try:
        with pytest.raises(UsageError, match="one per client"):
            serve(agent, second)
        first_remote.initialize()
        session = first_remote.new_session("/w").session_id
        assert first_remote.prompt(session, "ask me", timeout=WAIT).stop_reason == "end_turn"
        assert agent.client is served
    finally:
        first_remote.close()
        second_remote.close()
        served.connection.close()
        second.close()
    assert (first_client.asked, first_client.completed) == (["Name?"], ["e-1"])
    assert (second_client.asked, second_client.completed) == ([], [])


@pytest.mark.timeout(30)
@pytest.mark.req("ACP-V1-TERM-AGENT-RELEASE")
def test_closing_a_session_or_the_connection_releases_the_terminals_it_left():
    from acp_lite.workspace import WorkspaceClient

    pids = []

    class Sleeper(Agent):
        def new_session(self, params):
            return schema.NewSessionResponse(session_id=f"s{len(pids)}")

        def close_session(self, params):
            return None

        def prompt(self, params, turn):
            terminal = self.client.create_terminal(
                turn.session_id,
                sys.executable,
                ["-c", "import os,time; print(os.getpid(), flush=True); time.sleep(60)"],
            )
            while not self.client.terminal_output(turn.session_id, terminal.terminal_id).output:
                turn.wait_cancelled(0.02)
            pids.append(int(self.client.terminal_output(turn.session_id, terminal.terminal_id).output))
            return "end_turn"

    def alive(pid):
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0] != "Z"
        except FileNotFoundError:
            return False

    with agent_and_client(Sleeper(), WorkspaceClient(terminals=True)) as remote:
        remote.initialize()
        first = remote.new_session("/tmp").session_id
        remote.prompt(first, "run")
        second = remote.new_session("/tmp").session_id
        remote.prompt(second, "run")
        assert all(alive(pid) for pid in pids)
        remote.close_session(first)
        assert not alive(pids[0]) and alive(pids[1])
    assert not alive(pids[1])
