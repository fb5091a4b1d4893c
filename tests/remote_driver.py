"""A raw driver for the remote server tests: http.client for POST/DELETE, an SSE reader over a
plain HTTP response, and a blocking WebSocket client on wsproto (the server's own library only
parses frames; the client side here is independent of the server's framing code)."""

import http.client
import json
import socket
from typing import Any, Dict, List, Optional, Tuple

from wsproto import WSConnection
from wsproto.connection import ConnectionType
from wsproto.events import AcceptConnection, CloseConnection, Ping, Pong, RejectConnection, Request, TextMessage

TIMEOUT = 10.0
JSON_HEADERS = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}


def raw_frame(opcode: int, payload: bytes, fin: bool = True, key: bytes = b"", first_bits: int = 0) -> bytes:
    """One WebSocket frame written by hand, broken ones included, with the shortest header for its
    size: masked with ``key`` if one is given (as a client must), else not (as a server must);
    ``first_bits`` sets bits of the first byte (the reserved ones)."""
    first = (0x80 if fin else 0) | first_bits | opcode
    mask_bit = 0x80 if key else 0
    size = len(payload)
    if size < 126:
        head = bytes((first, mask_bit | size))
    elif size < 65536:
        head = bytes((first, mask_bit | 126)) + size.to_bytes(2, "big")
    else:
        head = bytes((first, mask_bit | 127)) + size.to_bytes(8, "big")
    if not key:
        return head + payload
    mask = (key * (size // 4 + 1))[:size]  # (masked here, not by acp_lite's code under test)
    return head + key + (int.from_bytes(payload, "big") ^ int.from_bytes(mask, "big")).to_bytes(size, "big")


class Reply:
    def __init__(self, status: int, headers: Dict[str, str], body: bytes):
        self.status = status
        self.headers = headers
        self.body = body

    def json(self) -> Any:
        return json.loads(self.body)


def request(
    address: Tuple[str, int], method: str, body: Any = None, headers: Optional[Dict[str, str]] = None, path="/acp"
) -> Reply:
    """One request on a new socket; the whole reply."""
    conn = http.client.HTTPConnection(*address, timeout=TIMEOUT)
    try:
        data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
        all_headers = dict(JSON_HEADERS) if method == "POST" else {}
        all_headers.update(headers or {})
        conn.request(method, path, data, all_headers)
        response = conn.getresponse()
        return Reply(response.status, {k.lower(): v for k, v in response.getheaders()}, response.read())
    finally:
        conn.close()


def rpc(method: str, params: Any, id: Any = None) -> Dict[str, Any]:
    message: Dict[str, Any] = {"jsonrpc": "2.0", "method": method, "params": params}
    if id is not None:
        message["id"] = id
    return message


INITIALIZE = rpc("initialize", {"protocolVersion": 1, "clientCapabilities": {}}, id=0)


def initialize(address: Tuple[str, int], headers: Optional[Dict[str, str]] = None) -> str:
    """A new connection; its id."""
    reply = request(address, "POST", INITIALIZE, headers)
    assert reply.status == 200, (reply.status, reply.body)
    assert reply.json()["result"]["protocolVersion"] == 1
    return reply.headers["acp-connection-id"]


class _Messages:
    def message(self) -> Any:
        raise NotImplementedError

    def messages_until(self, predicate: Any) -> List[Any]:
        """Messages up to and including the first one ``predicate`` accepts."""
        seen = []
        while True:
            message = self.message()
            seen.append(message)
            if predicate(message):
                return seen


class SseStream(_Messages):
    """A GET on the connection or a session stream, read event by event."""

    def __init__(self, address: Tuple[str, int], connection_id: str, session: Optional[str] = None, **headers: str):
        self.conn = http.client.HTTPConnection(*address, timeout=TIMEOUT)
        all_headers = {"Accept": "text/event-stream", "Acp-Connection-Id": connection_id}
        if session is not None:
            all_headers["Acp-Session-Id"] = session
        all_headers.update(headers)
        self.conn.request("GET", "/acp", headers=all_headers)
        self.response = self.conn.getresponse()
        self.status = self.response.status
        self.headers = {k.lower(): v for k, v in self.response.getheaders()}
        self.comments = 0

    def event(self) -> Optional[Tuple[bytes, bytes]]:
        """The next event's raw ``id`` and ``data`` lines' values; None at the end of the stream."""
        fields: Dict[bytes, bytes] = {}
        while True:
            line = self.response.readline()
            if not line:
                return None
            assert line.endswith(b"\n") and not line.endswith(b"\r\n"), line[:100]
            line = line[:-1]
            if not line:
                if fields:
                    return fields.get(b"id", b""), fields[b"data"]
                continue
            if line.startswith(b":"):
                self.comments += 1
                continue
            name, _, value = line.partition(b": ")
            assert name not in fields, f"one {name!r} line per event"
            fields[name] = value

    def message(self) -> Any:
        event = self.event()
        assert event is not None, "the stream ended"
        return json.loads(event[1])

    def close(self) -> None:
        self.conn.close()


class WsClient(_Messages):
    """A blocking WebSocket client on wsproto."""

    def __init__(self, address: Tuple[str, int], path: str = "/acp", **headers: str):
        self.sock = socket.create_connection(address, timeout=TIMEOUT)
        self.ws = WSConnection(ConnectionType.CLIENT)
        extra = [(k.lower().encode(), v.encode()) for k, v in headers.items()]
        self.sock.sendall(self.ws.send(Request(host="127.0.0.1", target=path, extra_headers=extra)))
        self.accepted: Optional[AcceptConnection] = None
        self.rejected: Optional[RejectConnection] = None
        self.closed: Optional[CloseConnection] = None
        self.pings = 0
        self.pongs: List[bytes] = []
        self._messages: List[str] = []
        self._parts: List[str] = []
        while self.accepted is None and self.rejected is None:
            self._pump()

    @property
    def connection_id(self) -> str:
        assert self.accepted is not None
        return dict(self.accepted.extra_headers)[b"acp-connection-id"].decode()

    def send(self, message: Any) -> None:
        text = message if isinstance(message, str) else json.dumps(message)
        self.sock.sendall(self.ws.send(TextMessage(data=text)))

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def message(self) -> Any:
        while not self._messages:
            if self.closed is not None:
                raise EOFError(f"closed {self.closed.code}")
            self._pump()
        return json.loads(self._messages.pop(0))

    def wait_closed(self) -> int:
        while self.closed is None:
            self._pump()
        return self.closed.code

    def _pump(self) -> None:
        data = self.sock.recv(1 << 20)
        self.ws.receive_data(data or None)
        for event in self.ws.events():
            if isinstance(event, AcceptConnection):
                self.accepted = event
            elif isinstance(event, RejectConnection):
                self.rejected = event
            elif isinstance(event, TextMessage):
                self._parts.append(event.data)
                if event.message_finished:
                    self._messages.append("".join(self._parts))
                    self._parts = []
            elif isinstance(event, Pong):
                self.pongs.append(event.payload)
            elif isinstance(event, Ping):
                self.pings += 1
                self.sock.sendall(self.ws.send(event.response()))
            elif isinstance(event, CloseConnection):
                self.closed = event
                try:
                    self.sock.sendall(self.ws.send(event.response()))
                except Exception:
                    pass

    def close(self) -> None:
        self.sock.close()
