"""``acp-lite serve --listen HOST:PORT -- AGENT_CMD...``: any stdio agent over HTTP and WebSocket.

Rules this module keeps:

- One agent process per remote connection, spawned when the connection opens (``initialize`` or
  the WebSocket upgrade) and stopped with its whole process tree (``AgentProcess.stop``) when the
  connection ends: DELETE, the WebSocket closed, the connection reaped, the server closed.
- Messages are relayed as they are, one frame per message, by two threads per connection: the
  client's to the agent's stdin, the agent's stdout to the connection. A slow remote reader holds
  the agent's stdout (the channel's budget), never memory.
- An agent that exits ends its connection (WebSocket 1011; HTTP streams end, later POSTs 404).
- The command runs until Ctrl-C or SIGTERM, then closes the server (every agent stopped) and exits
  130 or 128 + N. Each connection's opening and end is one line on stderr; the agents' stderr
  lines go there too, prefixed with their pid.
- ``--token-env VAR`` makes every request and upgrade carry ``Authorization: Bearer <token>``
  (compared in constant time; 401 otherwise); the token comes from the environment, never from
  the command line, where other users can read it. ``--tls-cert``/``--tls-key`` serve TLS.
"""

import argparse
import hmac
import os
import ssl
import threading
from typing import TYPE_CHECKING, Any, List, Mapping, Sequence, Tuple

from ..errors import ConnectionClosed, UsageError
from ..process import AgentProcess
from ..wire import OversizedFrame, process_transport
from .argtypes import positive_seconds
from .exits import cli_error

if TYPE_CHECKING:  # (the remote extra is imported only when the command runs)
    from ..remote.channel import Channel


def listen_address(text: str) -> Tuple[str, int]:
    """``HOST:PORT`` (``[::1]:PORT`` for IPv6; port 0 picks a free one)."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, not {text!r}")
    return host.strip("[]") or "127.0.0.1", int(port)


def configure_serve(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--listen", type=listen_address, default=("127.0.0.1", 8765), metavar="HOST:PORT", help="default 127.0.0.1:8765"
    )
    parser.add_argument("--path", default="/acp", help="the endpoint's path (default /acp)")
    parser.add_argument(
        "--allow-origin", action="append", default=[], metavar="ORIGIN", help="an Origin browsers may call from"
    )
    parser.add_argument("--no-websocket", action="store_true", help="serve HTTP (POST + SSE) only")
    parser.add_argument(
        "--token-env",
        metavar="VAR",
        help="require 'Authorization: Bearer <token>', the token read from environment variable VAR",
    )
    parser.add_argument("--tls-cert", metavar="FILE", help="serve https:// and wss:// with this certificate chain")
    parser.add_argument("--tls-key", metavar="FILE", help="the certificate's private key (default: in --tls-cert)")
    parser.add_argument("--node", help="prefix connection ids with NODE. (a load balancer routes on it)")
    parser.add_argument("--stop-timeout", type=positive_seconds, default=2.0, help="per agent, when it is stopped")


class ProcessBridge:
    """One agent process relayed to one remote connection's channel (a ``server.Served``)."""

    def __init__(self, argv: Sequence[str], channel: "Channel", stop_timeout: float):
        self._channel = channel
        self._stop_timeout = stop_timeout
        self.process = AgentProcess(argv, on_stderr_line=self._stderr_line)
        self._transport = process_transport(self.process, max_message_size=channel.max_message_size)
        self._done = threading.Event()
        self._threads = [
            threading.Thread(target=self._to_agent, name=f"acp-serve-in-{self.process.pid}", daemon=True),
            threading.Thread(target=self._from_agent, name=f"acp-serve-out-{self.process.pid}", daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    def _stderr_line(self, line: str) -> None:
        cli_error(f"agent {self.process.pid}: {line}")

    def _to_agent(self) -> None:
        try:
            while True:
                blocks = self._channel.read_blocks()
                if blocks is None:
                    break
                for block in blocks:
                    if isinstance(block, OversizedFrame):
                        continue  # (the server answered 413 / 1009 already; a Channel never queues more)
                    for frame in block.split(b"\n"):
                        self._transport.send(frame)
        except ConnectionClosed:
            pass
        finally:
            try:
                self.process.stdin.close()  # end of input: a well-behaved agent exits
            except OSError:
                pass

    def _from_agent(self) -> None:
        try:
            while True:
                frames = self._transport.read_frames()
                if frames is None:
                    break
                for frame in frames:
                    if isinstance(frame, OversizedFrame) or not frame.strip():
                        continue
                    self._channel.send(frame)
        except ConnectionClosed:
            pass
        finally:
            self._done.set()

    @property
    def closed(self) -> bool:
        return self._done.is_set()

    def close(self, timeout: float = 5.0) -> None:
        self._channel.stop_reading()
        code = self.process.stop(min(timeout, self._stop_timeout) / 3)
        self._transport.close(0.1)
        for thread in self._threads:
            thread.join(timeout)
        cli_error(f"agent {self.process.pid} ended (exit status {code})")


def serve_command(args: argparse.Namespace) -> int:
    from ..remote.server import serve_remote_backend

    argv: List[str] = args.agent_command
    host, port = args.listen

    def start(channel: "Channel") -> ProcessBridge:
        bridge = ProcessBridge(argv, channel, args.stop_timeout)
        cli_error(f"connection {channel.name}: agent {bridge.process.pid} started")
        return bridge

    authorize = None
    if args.token_env:
        token = os.environ.get(args.token_env)
        if not token:
            cli_error(f"--token-env: the environment variable {args.token_env} is empty or not set")
            return 2
        expected = f"Bearer {token}".encode()

        def authorize(method: str, path: str, headers: Mapping[str, str], peer: Any) -> Any:
            given = headers.get("authorization", "").encode("latin-1", "replace")
            return "bearer" if hmac.compare_digest(given, expected) else None

    context = None
    try:
        if args.tls_cert:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(args.tls_cert, args.tls_key)
            context.set_alpn_protocols(["http/1.1"])
        server = serve_remote_backend(
            start,
            host,
            port,
            path=args.path,
            websocket=not args.no_websocket,
            allowed_origins=args.allow_origin,
            authorize=authorize,
            ssl_context=context,
            node=args.node,
        )
    except (OSError, ssl.SSLError) as exc:
        cli_error(f"cannot serve on {host}:{port}: {exc}")
        return 1
    except UsageError as exc:
        cli_error(str(exc))
        return 2
    try:
        line = f"serving {' '.join(argv)} at {server.url}" + ("" if args.no_websocket else f" and {server.ws_url}")
        print(line, flush=True)
        while not server.wait_closed(0.25):  # (in slices: signals are seen between them)
            pass
        return 0
    finally:
        server.close(10)
