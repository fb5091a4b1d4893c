import os
import sys
from typing import Union

from acp_lite import Client, RemoteAgent, Undecodable, updates
from acp_lite.schema import RequestPermissionRequest, RequestPermissionResponse, SessionNotification


class Printer(Client):
    def session_update(self, params: Union[SessionNotification, Undecodable]) -> None:
        if isinstance(params, Undecodable):  # params the v1 types do not fit: kept, with the reason
            print(f"[undecodable] {params.error}")
            return
        update = params.update  # every kind: message chunks, tool calls, plans, ...
        content = getattr(update, "content", None)
        detail = getattr(content, "text", None) or getattr(update, "title", None) or getattr(update, "status", None)
        print(f"[{updates.variant_tag(update)}] {detail or ''}".rstrip())

    def request_permission(self, params: RequestPermissionRequest) -> RequestPermissionResponse:
        # Allow with the first allow option, else the first one.
        option = next((o for o in params.options if o.kind.startswith("allow")), params.options[0])
        print(f"[permission] {params.tool_call.title or params.tool_call.tool_call_id}: {option.name}")
        return updates.select_permission(option.option_id)


agent_command = sys.argv[1:] or [sys.executable, os.path.join(os.path.dirname(__file__), "minimal_agent.py")]
with RemoteAgent.spawn(agent_command, Printer()) as agent:
    agent.initialize()
    session = agent.new_session(cwd=os.getcwd())
    result = agent.prompt(session.session_id, "hello")
    print("stop reason:", result.stop_reason)
