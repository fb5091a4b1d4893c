"""Test doubles that speak raw JSON lines, so tests can assert exactly what is on the wire.

``RawPeer`` is the far end of an OS pipe pair: it writes whatever bytes a test gives it and reads
the other side's messages back with a timeout. ``agent_with_raw_client`` serves an ``Agent`` to a
``RawPeer`` playing the editor; ``client_with_raw_agent`` connects a ``RemoteAgent`` to a
``RawPeer`` playing the agent.
"""

import contextlib
import json
import os
import select
import threading
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple, Type

import pytest

from acp_lite.agent import Agent, RemoteClient, serve
from acp_lite.client import Client, RemoteAgent
from acp_lite.errors import MethodNotFound
from acp_lite.framing import DEFAULT_MAX_MESSAGE_SIZE
from acp_lite.wire import Transport, memory_pair

WAIT = 5.0
# How long a call refused before sending may take: it waits for nothing, so a refusal that
# regressed into a sent request (which then waits for an answer) fails in a second.
REFUSAL_WAIT = 1.0


class RawPeer:
    """One end of a connection driven by hand. Test thread only."""

    def __init__(self, read_fd: int, write_fd: int):
        self._read_fd = read_fd
        self._write_fd = write_fd
        self._buffer = b""
        self._next_id = 1000

    def send_bytes(self, data: bytes) -> None:
        os.write(self._write_fd, data)

    def send(self, message: Dict[str, Any]) -> None:
        self.send_bytes(json.dumps(message).encode() + b"\n")

    def request(self, method: str, params: Any = None, id: Any = None) -> Any:
        """Send a request; return its id."""
        if id is None:
            self._next_id += 1
            id = self._next_id
        message: Dict[str, Any] = {"jsonrpc": "2.0", "id": id, "method": method}
        if params is not None:
            message["params"] = params
        self.send(message)
        return id

    def notify(self, method: str, params: Any = None) -> None:
        message: Dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            message["params"] = params
        self.send(message)

    def recv_line(self, timeout: float = WAIT) -> Optional[bytes]:
        """The next raw line (without its newline); None at end of stream."""
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"no message within {timeout} s; buffered {self._buffer[:200]!r}")
            ready, _, _ = select.select([self._read_fd], [], [], remaining)
            if not ready:
                continue
            chunk = os.read(self._read_fd, 65536)
            if not chunk:
                if self._buffer:
                    line, self._buffer = self._buffer, b""
                    return line
                return None
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line

    def recv(self, timeout: float = WAIT) -> Dict[str, Any]:
        line = self.recv_line(timeout)
        if line is None:
            raise EOFError("the other side closed the stream")
        return json.loads(line)

    def recv_until_response(self, id: Any, timeout: float = WAIT) -> Tuple[List[Dict[str, Any]], Dict[str, Any]]:
        """Messages received before the response to ``id``, and that response."""
        before = []
        while True:
            message = self.recv(timeout)
            if "method" not in message and message.get("id") == id:
                return before, message
            before.append(message)

    def call(self, method: str, params: Any = None, timeout: float = WAIT) -> Dict[str, Any]:
        """Send a request and return its response, failing if anything else arrives first."""
        id = self.request(method, params)
        before, response = self.recv_until_response(id, timeout)
        assert before == [], f"unexpected messages before the response: {before}"
        return response

    def expect_silence(self, seconds: float = 0.2) -> None:
        """Assert nothing arrives for ``seconds``."""
        ready, _, _ = select.select([self._read_fd], [], [], seconds)
        assert not ready and b"\n" not in self._buffer, (
            f"unexpected bytes: {self._buffer or os.read(self._read_fd, 4096)!r}"
        )

    def close_writing(self) -> None:
        if self._write_fd >= 0:
            os.close(self._write_fd)
            self._write_fd = -1

    def close(self) -> None:
        self.close_writing()
        if self._read_fd >= 0:
            os.close(self._read_fd)
            self._read_fd = -1


def _raw_pair(name: str, max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE) -> Tuple[Transport, RawPeer]:
    ours_read, theirs_write = os.pipe()
    theirs_read, ours_write = os.pipe()
    transport = Transport(ours_read, ours_write, max_message_size=max_message_size, name=name)
    return transport, RawPeer(theirs_read, theirs_write)


INIT_PARAMS = {"protocolVersion": 1, "clientCapabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}


@contextlib.contextmanager
def agent_with_raw_client(
    agent: Agent, initialize: Optional[Dict[str, Any]] = INIT_PARAMS
) -> Iterator[Tuple[RemoteClient, RawPeer]]:
    """Serve ``agent``; the test plays the editor through the ``RawPeer``. Initializes first
    unless ``initialize`` is None."""
    transport, raw = _raw_pair("agent-under-test")
    client = serve(agent, transport)
    try:
        if initialize is not None:
            response = raw.call("initialize", initialize)
            assert "result" in response, response
        yield client, raw
    finally:
        raw.close_writing()
        client.connection.close()
        raw.close()


class TextsClient(Client):
    """A ``Client`` that keeps the text of each ``session_update`` it gets, in order, in ``texts``."""

    def __init__(self) -> None:
        self.texts: List[str] = []

    def session_update(self, params: Any) -> None:
        self.texts.append(params.update.content.text)


@contextlib.contextmanager
def client_with_raw_agent(
    client: Optional[Client] = None, *, max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE, **connect: Any
) -> Iterator[Tuple[RemoteAgent, RawPeer]]:
    """A ``RemoteAgent`` whose agent is played by the test through the ``RawPeer``; its transport
    carries messages up to ``max_message_size`` bytes; ``connect`` goes to ``RemoteAgent.connect``
    (``protocol_versions=...``)."""
    transport, raw = _raw_pair("client-under-test", max_message_size)
    remote = RemoteAgent.connect(transport, client, **connect)
    try:
        yield remote, raw
    finally:
        raw.close_writing()
        remote.close()
        raw.close()


def answer_initialize(
    raw: RawPeer, agent_capabilities: Optional[Dict[str, Any]] = None, **extra: Any
) -> Dict[str, Any]:
    """Play the agent's side of ``initialize``: read the request, answer it; return the request."""
    request = raw.recv()
    assert request["method"] == "initialize", request
    result = {"protocolVersion": 1, "agentCapabilities": agent_capabilities or {}, **extra}
    raw.send({"jsonrpc": "2.0", "id": request["id"], "result": result})
    return request


def background(fn: Any, *args: Any, **kwargs: Any) -> "Future[Any]":
    """Run ``fn`` on a fresh thread; its result (or exception) arrives in the returned Future."""
    future: Future[Any] = Future()

    def run() -> None:
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as exc:  # the test inspects it
            future.set_exception(exc)

    threading.Thread(target=run, name="test-background", daemon=True).start()
    return future


def capability_cases(checks: Dict[str, Tuple[Any, ...]]) -> Tuple[List[Tuple[str, Any]], List[str]]:
    """For a table of capability checks (name -> (call, method, refusing shapes, allowing shape)):
    a (name, capabilities) case per refusing shape, and a readable test id for each.

    A check whose allowing shape is one capability also gets the shape "everything else": every
    other check's capability advertised, its own left out (id ``name:everything-else``), so that
    no capability unlocks a method another one stands for."""
    everything: Dict[str, Any] = {}
    for check in checks.values():
        _merge(everything, check[3])
    cases = [(name, shape) for name, check in checks.items() for shape in check[2]]
    ids = [f"{name.replace(' ', '-')}:{json.dumps(shape, separators=(',', ':'))}" for name, shape in cases]
    for name, check in checks.items():
        if _leaves(check[3]) == 1:
            cases.append((name, _without(everything, check[3])))
            ids.append(f"{name.replace(' ', '-')}:everything-else")
    return cases, ids


def _merge(into: Dict[str, Any], shape: Dict[str, Any]) -> None:
    for key, value in shape.items():
        if isinstance(value, dict) and value and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = json.loads(json.dumps(value))


def _leaves(shape: Any) -> int:
    if isinstance(shape, dict) and shape:
        return sum(_leaves(value) for value in shape.values())
    return 1


def _without(everything: Dict[str, Any], shape: Dict[str, Any]) -> Dict[str, Any]:
    """``everything`` less the capabilities ``shape`` advertises."""
    kept = {}
    for key, value in everything.items():
        if key not in shape:
            kept[key] = value
        elif isinstance(shape[key], dict) and shape[key]:
            kept[key] = _without(value, shape[key])
    return kept


def refused(call: Callable[[], Any], error: Type[BaseException]) -> BaseException:
    """Assert that ``call()`` raises ``error`` at once, without waiting for the peer; returns it."""
    pending = background(call)
    try:
        exc = pending.exception(REFUSAL_WAIT)
    except FutureTimeout:
        pytest.fail(f"not refused within {REFUSAL_WAIT} s: the call is waiting for an answer, so it was sent")
    assert isinstance(exc, error), f"expected {error.__name__}, got {exc!r}"
    return exc


def sent(raw: RawPeer, call: Callable[[], Any]) -> Dict[str, Any]:
    """Run ``call()``, which must send a request: answer it with an error and return the request."""
    pending = background(call)
    request = raw.recv()
    raw.send({"jsonrpc": "2.0", "id": request["id"], "error": {"code": -32603, "message": "answered by the test"}})
    pending.exception(WAIT)  # settled: the error (whatever the call made of it)
    return request


def initialized(
    remote: RemoteAgent, raw: RawPeer, agent_capabilities: Optional[Dict[str, Any]] = None, **extra: Any
) -> Dict[str, Any]:
    """Run ``remote.initialize()`` against the raw agent; return the request it sent."""
    pending = background(remote.initialize)
    request = answer_initialize(raw, agent_capabilities, **extra)
    pending.result(WAIT)
    return request


@contextlib.contextmanager
def agent_and_client(agent: Agent, client: Client) -> Iterator[RemoteAgent]:
    """Both sides of acp_lite over an in-memory pair: yields the client's ``RemoteAgent``
    (not yet initialized) and closes both ends afterwards."""
    agent_end, client_end = memory_pair()
    served = serve(agent, agent_end)
    remote = RemoteAgent.connect(client_end, client)
    try:
        yield remote
    finally:
        remote.close()
        served.connection.close()


async def _ext_method(self: Any, method: str, params: Any) -> Any:
    raise MethodNotFound(f"Method not found: {method}")


def sync_and_async(sync_kind: type, async_kind: type) -> Any:
    """Run the test with each kind of handlers (or callbacks), as its ``kind`` argument: sync ones; ``async def``
    ones, with the connection read by the event loop they run on (an ``async def ext_method``, which starts on the
    loop, lets the loop read: ``Connection.start``); and the same read by a reading thread, as where the transport
    offers the loop no descriptor (``-threads``, see conftest's ``reading_threads_only``). The wire must not tell the
    three apart."""
    read_by_loop = type(async_kind.__name__, (async_kind,), {"ext_method": _ext_method})
    return pytest.mark.parametrize(
        "kind", [sync_kind, read_by_loop, read_by_loop], ids=["sync", "async", "async-threads"]
    )
