"""One remote ACP connection on the server: its agent, its streams, and where each message goes.

Rules this module keeps (the design's routing rules, which make both official clients work):

- One backend per connection (an ``Agent`` instance served by the core, or a bridge to an agent
  process), started on a ``Channel`` fed with the POST bodies or WebSocket messages received, in
  arrival order.
- Over WebSocket every frame the agent sends goes to the one socket. Over HTTP it goes to a
  *stream*: the connection stream (key None) or the stream of session S (key S), each with a
  queue that waits for its reader (an SSE response) and a per-stream event id.
- An agent message naming ``params.sessionId`` S goes to S's route: the session stream if S was
  named by a result of ours (``session/new``/``fork``), by a session GET, or by a POST carrying
  ``Acp-Session-Id``; the connection stream if S first came in a POST without that header (the
  Python client on ``session/load``), until a later POST for S carries the header. Answers follow
  the route their request recorded; answers to ``session/new``/``fork`` and connection-level
  messages go to the connection stream.
- The answer to ``session/load``/``resume`` posted with ``Acp-Session-Id`` goes on S's stream,
  behind the replay, when that stream has a reader; else on the connection stream. Until that
  answer is routed, every message naming S follows it, whatever stream S gets meanwhile (the
  Python client opens S's stream while its load, posted without the header, is running): the
  replay and the answer share one stream, in order.
- Client answers to agent requests are routed by id: the session header is optional on them.
- Routing reads a frame's head (method, id, ``params.sessionId``), except for a frame that begins
  as the last session/update routed did, through its session id's closing quote: it names the
  same session (a turn's updates). Its stream is chosen by the routes as they are then.
- A pump takes each stream's queue whole under the lock and hands it to the reader in batches
  outside it: a frame of ``LARGE_FRAME`` bytes or more alone, smaller ones up to ``BATCH_BYTES``.
- The connection's outbound bytes are the channel's budget: a frame counts until its last byte is
  on the wire (or dropped), so a slow reader holds the agent's senders, never memory.
- Loop-thread members: ``incoming``, ``attach``, ``detach``, ``pump``, ``end``;
  ``route`` runs in the agent's sending threads and takes the lock.
"""

import bisect
import collections
import functools
import itertools
import threading
import time
from typing import Any, Callable, Deque, Dict, List, Optional, Protocol, Tuple, Union

import msgspec

from ..errors import ConnectionClosed
from .channel import Channel
from .server_loop import Loop

Key = Optional[str]  # a stream: None for the connection stream, else a session id

_SESSION_OPENERS = frozenset({"session/new", "session/fork"})
# A pump hands a stream's frames to its reader in batches of up to this many bytes (a write each,
# not one or more per frame); a frame of LARGE_FRAME bytes or more goes alone, written uncopied.
BATCH_BYTES = 64 * 1024
LARGE_FRAME = 16 * 1024
# A frame sent within this many seconds of the one before belongs to a burst (see route).
_BURST_GAP = 50e-6
_LOADERS = frozenset({"session/load", "session/resume"})


class _Params(msgspec.Struct):
    sessionId: Optional[str] = None


class MessageHead(msgspec.Struct):
    """What routing reads of a JSON-RPC message; the rest is skipped unread."""

    method: Optional[str] = None
    id: Union[int, str, None] = None
    params: Optional[_Params] = None
    result: msgspec.Raw = msgspec.Raw(b"")  # empty when absent

    @property
    def session_id(self) -> Optional[str]:
        return self.params.sessionId if self.params is not None else None


_decode_head = msgspec.json.Decoder(MessageHead).decode
_decode_params = msgspec.json.Decoder(_Params).decode


_NO_HEAD = MessageHead()

# How the notifier's frames begin, up to the session id (each a JSON string, quotes included): a
# frame that begins so is a session/update of that session, and its head need not be decoded.
_UPDATE_HEAD = b'{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":'


def read_head(message: bytes) -> MessageHead:
    """The head of one JSON-RPC message object; ``msgspec.DecodeError`` when it is not one."""
    return _decode_head(message)


def batches(queue: Deque[bytes]) -> List[List[bytes]]:
    """Every frame of ``queue``, taken out in order, in batches: a frame of ``LARGE_FRAME`` bytes
    or more alone, consecutive smaller ones together up to ``BATCH_BYTES`` in all."""
    frames = list(queue)
    queue.clear()
    sizes = list(map(len, frames))
    if max(sizes) >= LARGE_FRAME:  # rare: frame by frame
        found: List[List[bytes]] = []
        room = 0  # left in the last batch; 0 after a large frame
        for frame, size in zip(frames, sizes):
            if size < LARGE_FRAME and size <= room:
                found[-1].append(frame)
                room -= size
            else:
                found.append([frame])
                room = BATCH_BYTES - size if size < LARGE_FRAME else 0
        return found
    # A stream's updates: cut where the running total passes each batch's room, a step per batch.
    totals = list(itertools.accumulate(sizes))
    found, start, before = [], 0, 0
    while start < len(frames):
        end = max(start + 1, bisect.bisect_right(totals, before + BATCH_BYTES, start))
        found.append(frames[start:end])
        start, before = end, totals[end - 1]
    return found


class Served(Protocol):
    """What a backend started on a channel gives back (``rpc.Connection`` is one)."""

    @property
    def closed(self) -> bool:
        """True once the backend's side has ended."""

    def close(self, timeout: float = 5.0) -> None:
        """End the backend and release its threads and processes, within ``timeout``."""


Start = Callable[[Channel], Served]


class Sink:
    """A stream's reader: an SSE response or a WebSocket. Loop thread only, but for
    ``deliver_now``."""

    def deliver(self, frames: List[bytes], first_id: int, release: Callable[[int], None]) -> None:
        """Write ``frames`` (event ids ``first_id`` on: a batch of small ones, or one large one);
        call ``release`` with their total size once all are written or dropped."""
        raise NotImplementedError

    def deliver_now(self, frame: bytes, release: Callable[[int], None]) -> bool:
        """From any thread: write one small frame at once, as ``deliver`` would, and True; or
        False, having done nothing, when it must wait for the loop."""
        return False

    def end(self, code: int = 1000) -> None:
        """End the stream (an SSE final chunk, a WebSocket close with ``code``)."""
        raise NotImplementedError


class Stream:
    """A queue of frames for one reader at a time."""

    def __init__(self) -> None:
        self.queue: Deque[bytes] = collections.deque()
        self.reader: Optional[Sink] = None
        self.next_id = 0


class RemoteConnection:
    """One ACP connection (an ``Acp-Connection-Id`` or one WebSocket) and its agent."""

    def __init__(
        self,
        connection_id: str,
        principal: Any,
        start: Start,
        loop: Loop,
        *,
        websocket: bool,
        max_message_size: int,
        max_pending: int,
        max_buffered: int,
        on_closed: Callable[["RemoteConnection"], None],
    ):
        self.id = connection_id
        self.principal = principal
        self.websocket = websocket
        self.last_activity = time.monotonic()
        self._loop = loop
        self._on_closed = on_closed
        self._lock = threading.Lock()
        self._streams: Dict[Key, Stream] = {None: Stream()}
        self._routes: Dict[str, bool] = {}  # session id -> True for its own stream, False for the connection's
        self._answer_routes: Dict[Union[int, str], Key] = {}  # client request id -> stream of its answer
        self._openers: Dict[Union[int, str], bool] = {}  # ids of our session/new|fork requests in flight
        # Loads and resumes in flight: request id -> session, and session -> its answer's stream.
        self._loaders: Dict[Union[int, str], str] = {}
        self._loading: Dict[str, Key] = {}
        self._pump_scheduled = False
        self._pumping = False  # frames taken from a stream are being handed to its reader
        self._routed_at = 0.0  # when the agent last sent a frame (WebSocket)
        # The prefix of the last session/update routed (HTTP), and its session: one tuple, as the
        # agent's threads route at once. (A first prefix that no frame starts with.)
        self._last_update: Tuple[bytes, str] = (b"\0", "")
        self._initialize_waiter: Optional[Callable[[bytes], None]] = None
        self._initialize_id: Union[int, str, None] = None
        self.ended = False
        self.channel = Channel(
            self.route,
            name=f"remote-{connection_id[:8]}",
            max_message_size=max_message_size,
            max_pending=max_pending,
            max_buffered=max_buffered,
        )
        self.served = start(self.channel)

    # -- inbound (loop thread) -----------------------------------------------------------------
    def wait_for_initialize(self, request_id: Union[int, str, None], answer: Callable[[bytes], None]) -> None:
        """Hand the answer to request ``request_id`` to ``answer`` (the held initialize POST)."""
        with self._lock:
            self._initialize_id = request_id
            self._initialize_waiter = answer

    def give_up_initialize(self) -> None:
        with self._lock:
            self._initialize_waiter = None

    def incoming(self, message: bytes, head: MessageHead, header_session: Optional[str]) -> bool:
        """Route bookkeeping for one message from the client, then feed it to the agent; False
        when the channel has no room for it (the caller holds the POST, or closes the socket)."""
        self.last_activity = time.monotonic()
        session = head.session_id
        with self._lock:
            if session is not None:
                if header_session is not None:
                    self._routes[session] = True
                else:
                    self._routes.setdefault(session, False)
            if head.method is not None and head.id is not None:
                key = self._answer_routes[head.id] = self._answer_key(head.method, session, header_session)
                if head.method in _SESSION_OPENERS:
                    self._openers[head.id] = True
                elif head.method in _LOADERS and session is not None:
                    self._loaders[head.id] = session
                    self._loading[session] = key
        return self.channel.feed(message)

    def _answer_key(self, method: str, session: Optional[str], header_session: Optional[str]) -> Key:
        if session is None or self.websocket:
            return None
        if method in _LOADERS:
            stream = self._streams.get(session)
            return session if header_session is not None and stream is not None and stream.reader else None
        return session if self._routes.get(session) else None

    # -- outbound (the agent's threads) --------------------------------------------------------
    def route(self, frame: bytes) -> None:
        """The channel's router: queue ``frame`` on its stream and have the loop write it. Over
        WebSocket there is one stream and no held initialize: the frame is not read, and when
        nothing waits before it, a small one that does not follow another closely is written at
        once by this thread (``deliver_now``: a reply spares the loop's wake-up; a burst, a
        stream's updates, is the loop's to batch)."""
        if self.websocket and len(frame) < LARGE_FRAME:
            now = time.monotonic()
            lone, self._routed_at = now - self._routed_at >= _BURST_GAP, now
            if lone and self._write_now(frame):
                return
        head: Optional[MessageHead] = None  # None: a session/update of the session the last one named
        update_prefix, update_session = self._last_update
        if self.websocket:
            head = _NO_HEAD
        elif not frame.startswith(update_prefix):
            try:
                head = read_head(frame)
            except msgspec.DecodeError:
                head = _NO_HEAD
            session = head.session_id
            # (Built once a session: an agent whose frames begin otherwise costs a comparison more.)
            if head.method == "session/update" and session is not None and session != update_session:
                self._last_update = (_UPDATE_HEAD + msgspec.json.encode(session), session)
        waiter = None
        lock = self._lock
        lock.acquire()  # (not ``with``, which costs a routed update a twentieth more instructions)
        try:
            if (
                head is not None
                and head.method is None
                and self._initialize_waiter is not None
                and head.id == self._initialize_id
            ):
                waiter, self._initialize_waiter = self._initialize_waiter, None
            else:
                if head is None:
                    key = self._session_key(update_session)
                else:
                    key = None if self.websocket else self._frame_key(head)
                stream = self._streams.get(key)
                if stream is None:
                    stream = self._streams[key] = Stream()
                stream.queue.append(frame)
            schedule = waiter is None and not self._pump_scheduled
            if schedule:
                self._pump_scheduled = True
        finally:
            lock.release()
        if waiter is not None:
            # (A partial, not a lambda: that would make cells of ``self`` and ``frame`` at every call.)
            self._loop.call_soon(functools.partial(self._initialize_answered, waiter, frame))
        elif schedule:
            self._loop.call_soon(self.pump)

    def _write_now(self, frame: bytes) -> bool:
        # The stream held as a pump holds it (what is routed meanwhile queues behind), if nothing
        # waits in it or is being handed over: True once the reader wrote the frame.
        with self._lock:
            stream = self._streams[None]
            reader = stream.reader
            if reader is None or stream.queue or self._pump_scheduled or self._pumping:
                return False
            self._pumping = True
        written = False
        try:
            written = reader.deliver_now(frame, self.channel.sent)
        finally:
            with self._lock:
                self._pumping = False
                if not written:
                    stream.queue.appendleft(frame)  # (it was routed before what queued meanwhile)
                schedule = bool(stream.queue) and not self._pump_scheduled
                if schedule:
                    self._pump_scheduled = True
            if schedule:
                self._loop.call_soon(self.pump)
        return True

    def _initialize_answered(self, waiter: Callable[[bytes], None], frame: bytes) -> None:
        try:
            waiter(frame)
        finally:
            self.channel.sent(len(frame))

    def _frame_key(self, head: MessageHead) -> Key:
        # Under the lock.
        if head.method is None:  # an answer
            key = self._answer_routes.pop(head.id, None) if head.id is not None else None
            loaded = self._loaders.pop(head.id, None) if head.id is not None else None
            if loaded is not None:
                self._loading.pop(loaded, None)
            if head.id is not None and self._openers.pop(head.id, False) and head.result:
                try:
                    session = _decode_params(bytes(head.result)).sessionId
                except msgspec.DecodeError:
                    session = None
                if session is not None:
                    self._routes[session] = True
            return key
        return self._session_key(head.session_id)

    def _session_key(self, session: Optional[str]) -> Key:
        # Under the lock: the stream of a message that names ``session`` (or none).
        if session is None:
            return None
        if session in self._loading:
            return self._loading[session]  # the replay goes where the load's answer will
        return session if self._routes.get(session) else None

    # -- streams (loop thread) -----------------------------------------------------------------
    def can_attach(self, key: Key, max_sessions: int) -> bool:
        """True if a reader may attach to stream ``key``: it has none, or it is a new session
        stream within ``max_sessions``."""
        with self._lock:
            stream = self._streams.get(key)
            if stream is None:
                return len(self._streams) - 1 < max_sessions
            return stream.reader is None

    def stream_has_reader(self, key: Key) -> bool:
        with self._lock:
            stream = self._streams.get(key)
            return stream is not None and stream.reader is not None

    def attach(self, key: Key, reader: Sink) -> bool:
        """Make ``reader`` the reader of stream ``key`` (created if unknown; a session stream's
        route becomes that stream); False if it has a reader already."""
        with self._lock:
            stream = self._streams.get(key)
            if stream is None:
                stream = self._streams[key] = Stream()
            if stream.reader is not None:
                return False
            stream.reader = reader
            if key is not None:
                self._routes[key] = True
        self.last_activity = time.monotonic()
        self.pump()
        return True

    def detach(self, key: Key, reader: Sink) -> None:
        with self._lock:
            stream = self._streams.get(key)
            if stream is not None and stream.reader is reader:
                stream.reader = None
        self.last_activity = time.monotonic()

    def has_reader(self) -> bool:
        with self._lock:
            return any(stream.reader is not None for stream in self._streams.values())

    def pump(self) -> None:
        """Hand every queued frame to its stream's reader, in batches (``BATCH_BYTES``), dropping
        each once handed over (a reader writes it again, as an SSE event: a budget's worth queued
        must not be held twice)."""
        taken: List[Tuple[Stream, Sink, Deque[bytes]]] = []
        with self._lock:
            self._pump_scheduled = False
            if self._pumping:  # a frame is being written from another thread: it pumps after it
                return
            # Each queue is taken whole and cut into batches once the lock is let go: the agent's
            # threads route meanwhile (into a new queue). Only a pump touches ``next_id``.
            for stream in self._streams.values():
                if stream.reader is not None and stream.queue:
                    taken.append((stream, stream.reader, stream.queue))
                    stream.queue = collections.deque()
            # (a local: once the lock is let go, a direct write may set _pumping for itself)
            pumping = self._pumping = bool(taken)
        try:
            work: Deque[Tuple[Stream, Sink, List[bytes]]] = collections.deque()
            for stream, reader, queue in taken:
                work.extend((stream, reader, batch) for batch in batches(queue))  # (it empties the queue)
            while work:
                stream, reader, frames = work.popleft()
                first_id = stream.next_id
                stream.next_id += len(frames)
                reader.deliver(frames, first_id, self.channel.sent)
                del frames
        finally:
            if pumping:
                with self._lock:
                    self._pumping = False

    # -- the end -------------------------------------------------------------------------------
    def end(self, code: int = 1000) -> None:
        """End every stream and the agent's side (its core is closed off the loop). Loop thread."""
        if self.ended:
            return
        self.ended = True
        self.give_up_initialize()
        with self._lock:
            readers = [s.reader for s in self._streams.values() if s.reader is not None]
            dropped = sum(len(frame) for s in self._streams.values() for frame in s.queue)
            for stream in self._streams.values():
                stream.reader = None
                stream.queue.clear()
        for reader in readers:
            reader.end(code)
        self.channel.sent(dropped)
        self.channel.end(ConnectionClosed(f"remote connection {self.id[:8]} ended"))
        self._on_closed(self)

    def close_core(self, timeout: float) -> None:
        """Close the backend and join its threads. Any thread but the loop."""
        self.served.close(timeout)
