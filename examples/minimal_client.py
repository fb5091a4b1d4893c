import os
import sys

from acp_lite import Client, RemoteAgent


class Printer(Client):
    def session_update(self, params):
        print(params.update.content.text)


agent_command = sys.argv[1:] or [sys.executable, os.path.join(os.path.dirname(__file__), "minimal_agent.py")]
with RemoteAgent.spawn(agent_command, Printer()) as agent:
    agent.initialize()
    session = agent.new_session(cwd=os.getcwd())
    result = agent.prompt(session.session_id, "hello")
    print("stop reason:", result.stop_reason)
