"""``RawPeer``: the far end of a connection under test, driven byte by byte by the test.

The connection gets ``peer.transport_for_connection``; the peer writes straight into that
transport's input pipe, so that several lines written at once reach the connection's reader in
one read (a burst), and a thread of its own reads back what the connection writes, so the test
can wait for each frame with a timeout.
"""

import json
import os
import queue
import threading
from typing import Any, Optional

from acp_lite.wire import Transport

WAIT = 10  # seconds the peer waits for a frame that should come at once


class RawPeer:
    """The far end of a connection. Call it from the test's threads; its own reader thread only
    queues the frames that arrive."""

    def __init__(self, **transport_options: Any) -> None:
        """``transport_options`` go to the connection's transport (``max_message_size``,
        ``closed_error``, ...)."""
        to_connection, self._feed = os.pipe()
        from_connection, replies = os.pipe()
        self.transport_for_connection = Transport(to_connection, replies, name="raw-a", **transport_options)
        self._replies = Transport(from_connection, os.open(os.devnull, os.O_WRONLY), name="raw-b")
        self.frames: queue.Queue[Optional[bytes]] = queue.Queue()
        self._reader = threading.Thread(target=self._read, name="raw-peer-reader", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while True:
            batch = self._replies.read_frames()
            if batch is None:
                self.frames.put(None)
                return
            for frame in batch:
                self.frames.put(frame)

    def write(self, data: bytes) -> None:
        """Write the bytes as they are (newlines included) in one write."""
        view = memoryview(data)
        while view:
            view = view[os.write(self._feed, view) :]

    def send(self, *messages: Any) -> None:
        """Write the messages' lines in one write: two or more arrive as one burst."""
        self.write(b"".join(json.dumps(m, separators=(",", ":")).encode() + b"\n" for m in messages))

    def recv_bytes(self) -> Optional[bytes]:
        """The next frame the connection wrote; None once it closed its end."""
        return self.frames.get(timeout=WAIT)

    def recv(self) -> Any:
        frame = self.recv_bytes()
        assert frame is not None, "the connection closed its end"
        return json.loads(frame)

    def ping(self) -> None:
        """Round-trip a ``test/ping`` request, which the connection answers ``"pong"``: someone is
        reading, and the connection wrote nothing else in between (its answer is the next frame)."""
        self.send({"jsonrpc": "2.0", "id": "ping", "method": "test/ping"})
        assert self.recv() == {"jsonrpc": "2.0", "id": "ping", "result": "pong"}

    def end_stream(self) -> None:
        """Close the peer's writing end: the connection reads end of stream."""
        if self._feed >= 0:
            os.close(self._feed)
            self._feed = -1

    def close(self) -> None:
        self.end_stream()
        self._replies.close()
        self._reader.join(WAIT)
