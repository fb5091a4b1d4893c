"""Coverage-guided fuzzing of an agent's connection with atheris (libFuzzer).

Each input is one line written to an ``Agent`` served over OS pipes, followed by a ping. The
target fails when the ping goes unanswered or when anything the agent writes back is not a
well-formed JSON-RPC response (``test_hardening.py`` pins the exact replies). Run it by hand for as long as you like::

    cp -r tests/fuzz/corpus /tmp/corpus   # libFuzzer adds what it finds to its first directory
    .venv/bin/python tests/fuzz/fuzz_agent_connection.py -max_len=4096 /tmp/corpus

``corpus/`` holds valid lines of each kind for it to start from; ``tests/test_hardening.py`` runs
a few thousand inputs from there. The connection is not rebuilt between inputs: the same one
has to survive them all.
"""

import sys
from pathlib import Path

import atheris

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # for acp_harness

with atheris.instrument_imports(include=["acp_lite"]):  # only our code: instrumenting is slow
    from acp_harness import agent_with_raw_client

    from acp_lite.agent import Agent

PING_ID = "fuzz-ping"


class FuzzedAgent(Agent):
    def new_session(self, params):
        return {"sessionId": "s"}

    def list_sessions(self, params):
        return {"sessions": []}

    def prompt(self, params, turn):
        return "end_turn"

    def ext_method(self, method, params):
        return params


def _check_reply(reply):
    for response in reply if isinstance(reply, list) else [reply]:
        assert response["jsonrpc"] == "2.0" and "id" in response and "method" not in response, reply
        assert ("result" in response) != ("error" in response), reply
        if "error" in response:
            assert type(response["error"]["code"]) is int and isinstance(response["error"]["message"], str), reply


def main() -> None:
    with agent_with_raw_client(FuzzedAgent()) as (_, raw):

        def one_input(data: bytes) -> None:
            raw.send_bytes(data.replace(b"\n", b" ") + b"\n")
            raw.send({"jsonrpc": "2.0", "id": PING_ID, "method": "_acme/echo", "params": {}})
            # Handlers run on worker threads, so the replies an input provokes may come after
            # the ping's (and then count for the next input): each must be a response, and the
            # ping must be answered, but how many come before it is not fixed.
            while True:
                reply = raw.recv(timeout=10)
                if isinstance(reply, dict) and reply.get("id") == PING_ID and "method" not in reply:
                    break
                _check_reply(reply)
            assert reply == {"jsonrpc": "2.0", "id": PING_ID, "result": {}}, reply

        atheris.Setup(sys.argv, one_input)
        atheris.Fuzz()


if __name__ == "__main__":
    main()
