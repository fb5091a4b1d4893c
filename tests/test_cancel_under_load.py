"""Stop under a slow UI: a client whose ``session_update`` takes 1 ms, and an acp_lite agent that
streams message chunks as fast as it can, over a real pipe pair.

The agent runs tens of thousands of updates ahead of the UI (its transport holds up to 8 MiB to
write, the pipe and the client's read-ahead the rest). Delivered one by one, they would hold the
answer of a cancelled turn for a minute or two; ``RemoteAgent.cancel`` drops the session's chunks
still queued and still coming instead, so the answer comes within a second or two, while what is
not stale (another session's updates, the turn's tool call update, other notifications) is still
delivered, in order, before the answer that follows it.
"""

import asyncio
import itertools
import threading
import time

import pytest

from acp_lite import schema, updates
from acp_lite.agent import Agent, serve
from acp_lite.client import Client, RemoteAgent
from acp_lite.updates import variant_tag
from acp_lite.wire import memory_pair

pytestmark = pytest.mark.timeout(60)

WAIT = 20.0
SLOW_UI_SECONDS = 0.001
BACKLOG = 30_000  # updates sent and not yet delivered when the user cancels
OTHER_UPDATES = 200  # the other session's, all to be delivered
CANCEL_BOUND = 2.0  # seconds from cancel() to the turn's answer (delivered one by one: minutes)


class Flooder(Agent):
    """A "flood" turn streams until cancelled, then sends a tool call update and an extension
    notification (both still to be delivered) and ends ``cancelled``. Any other turn waits until
    the flood is under way, then sends its ``OTHER_UPDATES`` among the flood's."""

    def __init__(self):
        self.sent = 0
        self.flowing = threading.Event()
        self.other_done = threading.Event()
        self._ids = itertools.count(1)

    def new_session(self, params):
        return schema.NewSessionResponse(session_id=f"s{next(self._ids)}")

    def prompt(self, params, turn):
        if params.prompt[0].text == "flood":
            while not turn.cancelled:
                turn.send(updates.text_chunk("x"))
                self.sent += 1
                if self.sent == 10_000:
                    self.flowing.set()
            turn.send(updates.tool_call_update("c1", status="failed"))
            self.client.ext_notification("_test/stopped", {"sessionId": turn.session_id})
            return "cancelled"
        self.flowing.wait(WAIT)
        for i in range(OTHER_UPDATES):
            turn.send(updates.text_chunk(str(i)))
        self.other_done.set()
        return "end_turn"


class SlowUi(Client):
    def __init__(self):
        self.events = []
        self.fast = threading.Event()  # set at the end, so that closing does not wait for the UI

    def session_update(self, params):
        if not self.fast.is_set():
            time.sleep(SLOW_UI_SECONDS)
        self.record(params)

    def record(self, params):
        update = params.update
        text = update.content.text if variant_tag(update) == "agent_message_chunk" else None
        self.events.append((params.session_id, variant_tag(update), text))

    def ext_notification(self, method, params):
        self.events.append((params["sessionId"], method, None))


class AsyncSlowUi(SlowUi):
    async def session_update(self, params):
        if not self.fast.is_set():
            await asyncio.sleep(SLOW_UI_SECONDS)
        self.record(params)


@pytest.mark.req(
    "ACP-V1-PROMPT-CLIENT-CANCEL-MAY",
    "ACP-V1-PROMPT-UPDATES-AFTER-CANCEL-MAY",
    "ACP-V1-PROMPT-UPDATES-BEFORE-RESPONSE",
    "ACP-V1-PROMPT-CLIENT-ACCEPT-LATE-UPDATES",
    "ACP-V1-PROMPT-AGENT-CANCELLED-STOP-REASON",
)
@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_cancelled_turn_answers_within_seconds_behind_a_flood_and_a_slow_ui(kind):
    agent_end, client_end = memory_pair()
    agent = Flooder()
    served = serve(agent, agent_end)
    ui = {"sync": SlowUi, "async": AsyncSlowUi}[kind]()
    remote = RemoteAgent.connect(client_end, ui)
    try:
        remote.initialize(timeout=WAIT)
        flooding = remote.new_session("/w", timeout=WAIT).session_id
        other = remote.new_session("/w", timeout=WAIT).session_id
        other_turn = remote.prompt_future(other, "count")
        flood = remote.prompt_future(flooding, "flood")
        # Runs where the answer is delivered, in order with the updates.
        flood.add_done_callback(lambda _: ui.events.append((flooding, "answer", None)))
        assert agent.other_done.wait(WAIT)
        deadline = time.monotonic() + WAIT
        while agent.sent - len(ui.events) < BACKLOG:
            assert time.monotonic() < deadline, f"only {agent.sent - len(ui.events)} updates ahead of the UI"
            time.sleep(0.01)

        started = time.monotonic()
        remote.cancel(flooding)
        delivered_at_cancel = len(ui.events)
        assert len([e for e in ui.events[:delivered_at_cancel] if e[0] == other]) < OTHER_UPDATES
        assert flood.result(CANCEL_BOUND).stop_reason == "cancelled"
        assert time.monotonic() - started < CANCEL_BOUND
        assert other_turn.result(WAIT).stop_reason == "end_turn"

        after = ui.events[delivered_at_cancel:]
        # At most the chunk being delivered when cancel() was called; then what is not stale.
        chunks_after = [e for e in after if e[0] == flooding and e[1] == "agent_message_chunk"]
        assert len(chunks_after) <= 1
        flood_events = [e[1] for e in after if e[0] == flooding and e[1] != "agent_message_chunk"]
        assert flood_events == ["tool_call_update", "_test/stopped", "answer"]
        # Every update of the other session arrived, in order, whether before the cancel or after.
        assert [e[2] for e in ui.events if e[0] == other] == [str(i) for i in range(OTHER_UPDATES)]
    finally:
        ui.fast.set()
        remote.close()
        served.connection.close()
