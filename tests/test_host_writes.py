"""Host mode never blocks the host thread on a write. While the agent does not read, what the host
thread sends (requests from ``*_future``, notifications, answers; inside ``pump()`` and outside)
is queued for the transport's flusher thread, up to the write backlog's bound; past it a request
or notification raises ``CallTimeout`` at once and an answer is dropped with an error logged.
Once the agent reads again, everything accepted arrives, in order. Over real pipes and sockets,
against a raw agent."""

import gc
import json
import logging
import os
import re
import socket
import threading
import time

import pytest
from acp_harness import WAIT, RawPeer, background, initialized

from acp_lite import HostDelivery, RemoteAgent, client, schema, wire
from acp_lite.answering import NEVER_WAITING_THREAD
from acp_lite.errors import CallTimeout

# What one pump, or one send on the host thread, may take: either needs about a millisecond, but on
# a loaded machine the test thread may wait for a core (a load of 100 on 2 cores happens here); a
# write blocked until the agent reads takes _DEAF_SECONDS. The budget tells the two apart with a
# margin of five either way; it is no speed target. (The garbage collector is off meanwhile: a full
# collection, 55 ms at a load of 5 on 2 cores, would be the test's pause, not the library's.)
_BUDGET = 2.0
# The agent reads again after this long even if the host never reached the bound: where the host
# thread blocks in a write, the test then fails on its timings instead of hanging.
_DEAF_SECONDS = 10.0
# Each message the host sends is this large, so that the bound is reached in about 50 ticks.
_PAD = "p" * (32 * 1024)


def _pipes():
    ours_read, theirs_write = os.pipe()
    theirs_read, ours_write = os.pipe()
    return wire.Transport(ours_read, ours_write, name="host-pipe"), RawPeer(theirs_read, theirs_write)


def _sockets():
    ours, theirs = socket.socketpair()
    fd = theirs.detach()
    return wire.Transport(ours, ours, name="host-socket"), RawPeer(fd, os.dup(fd))


class _Host:
    """The host's side: every send on the host thread is timed and recorded, in the order made,
    as (kind, marker); each refused one is kept."""

    def __init__(self):
        self.remote = None
        self.attempted = []
        self.refused = []
        self.timings = []

    def send(self, tag):
        for kind, send in (
            ("prompt", lambda: self.remote.prompt_future("s1", f"{tag}|{_PAD}")),
            ("note", lambda: self.remote.ext_notification("_host/note", {"tag": tag, "pad": _PAD})),
        ):
            self.attempted.append((kind, tag))
            started = time.monotonic()
            try:
                send()
            except CallTimeout as exc:
                self.refused.append(exc)
            self.timings.append((time.monotonic() - started, kind, tag))


class _Editor(client.Client):
    """Sends from inside the pump on each update, and answers each file read with a large text."""

    def __init__(self, host):
        self.host = host

    def session_update(self, params):
        self.host.send(f"in-{params.update.content.text}")

    def read_text_file(self, params):
        self.host.attempted.append(("answer", int(params.path.rsplit("/", 1)[1])))
        # Large (over answering.LARGE_ANSWER): it takes room in the answer budget, which the host
        # thread never waits for either.
        return schema.ReadTextFileResponse(content=_PAD * 3)


def _marker(message):
    if "method" not in message:
        return ("answer", message["id"])
    if message["method"] == "session/prompt":
        return ("prompt", message["params"]["prompt"][0]["text"].split("|", 1)[0])
    return ("note", message["params"]["tag"])


@pytest.mark.timeout(60)
@pytest.mark.parametrize("make", [_pipes, _sockets], ids=["pipe", "socket"])
def test_the_host_thread_never_blocks_on_an_agent_that_stops_reading(make, caplog):
    caplog.set_level(logging.ERROR, logger="acp_lite.rpc")
    transport, raw = make()
    host = _Host()
    errors = []
    delivery = HostDelivery(on_error=errors.append)
    remote = host.remote = RemoteAgent.connect(transport, _Editor(host), delivery=delivery)
    resume, done = threading.Event(), threading.Event()
    received = []  # (marker, bytes) of each line the agent reads once it reads again

    def agent_reads_when_resumed():
        resume.wait(_DEAF_SECONDS)
        while True:
            try:
                line = raw.recv_line(timeout=0.2)
            except TimeoutError:
                if done.is_set():
                    return
                continue
            if line is None:
                return
            received.append((_marker(json.loads(line)), len(line) + 1))

    reader = None
    try:
        initialized(remote, raw)
        created = background(remote.new_session, "/work")
        raw.send({"jsonrpc": "2.0", "id": raw.recv()["id"], "result": {"sessionId": "s1"}})
        created.result(WAIT)
        reader = threading.Thread(target=agent_reads_when_resumed, name="test-agent-reader")
        reader.start()  # the agent reads nothing more until resumed
        gc.disable()
        tick, refused_at = 0, None
        # On past the bound for a few ticks, until an answer was dropped too: each refused at once.
        while refused_at is None or tick < refused_at + 3 or not caplog.records:
            assert tick < 200, "the host never reached the bound"
            raw.notify(
                "session/update",
                {
                    "sessionId": "s1",
                    "update": {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": str(tick)}},
                },
            )
            raw.request("fs/read_text_file", {"sessionId": "s1", "path": f"/work/{tick}"}, id=tick)
            host.send(f"out-{tick}")  # the *_future forms and a notification, outside pump()
            started = time.monotonic()
            delivery.pump(budget=0.008)  # answers, requests and notifications sent inside it
            host.timings.append((time.monotonic() - started, "pump", tick))
            slowest = max(host.timings, key=lambda timing: timing[0])
            assert slowest[0] < _BUDGET, f"the host thread was held {slowest}"
            if refused_at is None and (host.refused or caplog.records):
                refused_at = tick
            tick += 1
            time.sleep(0.002)

        # The refusals: every one said why, at once; nothing the host sent after the first went out.
        for exc in host.refused:
            assert f"not sent, {NEVER_WAITING_THREAD} never waits for room" in str(exc)
            assert "over 8 MiB wait to be written (the peer is not reading)" in str(exc)
        dropped = f"dropped, {NEVER_WAITING_THREAD} never waits"
        dropped_answers = [r for r in caplog.records if dropped in r.getMessage()]
        assert len(dropped_answers) == len(caplog.records)
        assert all(re.search(r'answer \{"jsonrpc":"2.0","id":\d+,"result"', r.getMessage()) for r in dropped_answers)
        accepted = len(host.attempted) - len(host.refused) - len(dropped_answers)
        resume.set()
        deadline = time.monotonic() + WAIT * 2
        while len(received) < accepted and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.1)  # (nothing more may come)
    finally:
        gc.enable()
        resume.set()
        done.set()
        if reader is not None:
            reader.join(WAIT)
        raw.close_writing()
        remote.close()
        raw.close()
    assert errors == []
    assert host.refused, "no request or notification was refused"
    # Everything accepted arrived, in the order sent, and is what the bound let in.
    assert [marker for marker, _ in received] == host.attempted[:accepted]
    sent_bytes = sum(size for _, size in received)
    assert wire._WRITE_BACKLOG_LIMIT < sent_bytes < wire._WRITE_BACKLOG_LIMIT + (2 << 20)
