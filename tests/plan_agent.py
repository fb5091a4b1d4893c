"""An agent for tests/test_vim_plugin.py: answers every prompt with a plan, then one message in
two chunks, then ``end_turn``."""

from acp_lite import schema, updates
from acp_lite.agent import Agent, serve_stdio


class PlanAgent(Agent):
    agent_info = schema.Implementation(name="plan-agent", title="Plan Agent", version="0.1.0")

    def new_session(self, params):
        return schema.NewSessionResponse(session_id="sess-plan")

    def prompt(self, params, turn):
        turn.send(updates.plan([("Read the code", "high", "completed"), ("Write the fix", "medium", "in_progress")]))
        turn.send(updates.text_chunk("Fixing ", message_id="m1"))
        turn.send(updates.text_chunk("it now.", message_id="m1"))
        return "end_turn"


if __name__ == "__main__":
    serve_stdio(PlanAgent())
