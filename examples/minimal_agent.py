import uuid

from acp_lite import Agent, schema, serve_stdio, updates


class EchoAgent(Agent):
    agent_info = schema.Implementation(name="echo-agent", version="1.0")

    def new_session(self, params):
        return schema.NewSessionResponse(session_id=uuid.uuid4().hex)

    def prompt(self, params, turn):
        text = " ".join(block.text for block in params.prompt if isinstance(block, schema.TextContent))
        turn.send(updates.text_chunk(f"You said: {text}"))
        return "end_turn"


if __name__ == "__main__":
    serve_stdio(EchoAgent())
