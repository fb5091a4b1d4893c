"""A mock editor that spawns ``agent.py`` and walks the whole lifecycle, with one cancellation.

    python examples/editor.py [--protocol-version N]

It initializes (showing the negotiated version), creates a session, runs a prompt whose permission
question it answers with ``allow_once``, then starts a slow ``wait:`` prompt and cancels it after
300 ms. The last two lines it prints are the two turns' stop reasons.
"""

import argparse
import os
import sys
import threading
from pathlib import Path

from acp_lite import schema, updates
from acp_lite.client import Client, RemoteAgent

AGENT = Path(__file__).with_name("agent.py")


class MockEditor(Client):
    client_info = schema.Implementation(name="mock-editor", title="Mock Editor", version="0.1.0")

    def session_update(self, params):
        update = params.update
        status = getattr(update, "status", None)
        text = getattr(getattr(update, "content", None), "text", None)
        kind = updates.variant_tag(update)
        if kind == "tool_call_update":
            kind = "tool_call"  # the line shows the tool call's status, whichever update set it
        print(f"[update] {kind}" + (f":{status}" if status else "") + (f" {text}" if text else ""))

    def request_permission(self, params):
        # A real editor shows a dialog here; the mock always allows once.
        option = next(o for o in params.options if o.kind == "allow_once")
        return updates.select_permission(option.option_id)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--protocol-version", type=int, default=schema.PROTOCOL_VERSION)
    args = parser.parse_args()

    def forward_log(line: str) -> None:  # the agent's stderr is its log
        print(line, file=sys.stderr)

    with RemoteAgent.spawn([sys.executable, str(AGENT)], MockEditor(), on_stderr_line=forward_log) as agent:
        init = agent.initialize(protocol_version=args.protocol_version)
        agent_name = init.agent_info.name if init.agent_info else "(unnamed)"
        print(f"[init] agent={agent_name} v{init.protocol_version}")
        session = agent.new_session(cwd=os.getcwd())
        print(f"[session] {session.session_id}")
        turn1 = agent.prompt(session.session_id, "Check this project for configuration issues")
        print(f"[turn1] stopReason={turn1.stop_reason}")

        threading.Timer(0.3, agent.cancel, args=[session.session_id]).start()
        turn2 = agent.prompt(session.session_id, "wait: slow full-repo analysis")
        print(f"[turn2] stopReason={turn2.stop_reason}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
