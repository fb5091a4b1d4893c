"""``acp-lite check -- URL``: a remote agent behind the face of an agent process.

The probe (``check_probe``) drives an ``AgentProcess``: it writes lines to its stdin, reads lines
from its stdout, closes its stdin, and asks for its exit status and stderr. ``RemoteAgentProcess``
offers the same over a remote connection (``acp_lite.remote``): each line written is one message
sent, each message received is one line on ``stdout`` (a pipe a thread fills), closing stdin
closes the connection, the "exit status" is 0 once the connection has ended, and there is no
stderr. Thread: ``acp-check-remote`` (the pump), ended by ``stop``.
"""

import os
import threading
from typing import Any, Optional

from ..errors import AgentStartError, ConnectionClosed, UsageError


class _Lines:
    """The "stdin": complete lines become messages; ``write`` returns what it took."""

    def __init__(self, channel: Any):
        self._channel = channel
        self._partial = b""

    def write(self, data: Any) -> int:
        *lines, self._partial = (self._partial + bytes(data)).split(b"\n")
        try:
            for line in lines:
                self._channel.send(line)
        except (ConnectionClosed, UsageError) as exc:
            raise BrokenPipeError(str(exc)) from None
        return len(data)

    def close(self) -> None:
        self._channel.close()


class RemoteAgentProcess:
    """See the module docstring."""

    def __init__(self, url: str):
        try:
            from ..remote.client import open_url
            from ..remote.dial import Endpoint

            self.channel = open_url(Endpoint(url))
        except (ConnectionClosed, ImportError) as exc:
            raise AgentStartError(f"cannot reach the agent at {url}: {exc}") from exc
        self.pid = 0
        self.stdin = _Lines(self.channel)
        read_end, self._write_end = os.pipe()
        self.stdout = os.fdopen(read_end, "rb", buffering=0)
        self._pump = threading.Thread(target=self._copy_out, name="acp-check-remote", daemon=True)
        self._pump.start()

    def _copy_out(self) -> None:
        try:
            for blocks in iter(self.channel.read_blocks, None):
                data = memoryview(b"".join(block + b"\n" for block in blocks if isinstance(block, bytes)))
                while data:
                    data = data[os.write(self._write_end, data) :]
        except OSError:
            pass  # the probe stopped reading
        finally:
            os.close(self._write_end)

    def returncode(self) -> Optional[int]:
        return 0 if self.channel.ended else None

    def closed_error(self) -> ConnectionClosed:
        return self.channel.closed_error()

    def stderr_tail(self) -> str:
        return ""

    def stop(self, timeout: float = 5.0) -> None:
        self.channel.close(timeout)
        self._pump.join(timeout)
        self.stdout.close()
