"""Starting an agent for the command line's clients (``run``, ``bench``): the one place that turns
an agent command, or an agent's URL (see ``remote_url``), into a connected ``RemoteAgent``.

Rules: the agent's stdout is watched as it is read, on the reader thread and without holding
anything back: the bytes that arrive and the longest line are counted (``bench`` reports them),
and the first lines that are not JSON-RPC messages are kept, so that an agent that prints a banner
or a log line on stdout (ACP allows only protocol messages there) is told as such rather than as
one that "did not answer". The connection goes on as usual: such lines are answered -32700 by the
runtime, as any peer's are.
"""

from typing import Any, Callable, List, Optional, Sequence, Tuple, cast

from ..client import Client, RemoteAgent
from ..process import AgentProcess
from ..rpc import Connection
from ..wire import OversizedFrame, process_transport
from .remote_url import agent_url

# How many stray stdout lines are kept, and how much of each.
_NOISE_LINES = 3
_NOISE_CHARS = 200


class WatchedTransport:
    """A transport (an agent process's stdio, or a remote agent's channel) that counts, on the
    reader thread, the bytes that arrive and the longest line, and keeps the first lines that are
    not JSON messages; the rest is the transport's."""

    def __init__(self, inner: Any):
        self._inner = inner
        self.max_message_size = inner.max_message_size
        self.bytes_in = 0
        self.longest_line = b""
        self.noise: List[str] = []  # the first lines that are not JSON messages

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def read_blocks(self) -> Any:
        blocks = self._inner.read_blocks()
        for block in blocks or ():
            if isinstance(block, OversizedFrame):  # dropped, but it did arrive
                self.bytes_in += block.size + 1
                continue
            self.bytes_in += len(block) + 1
            lines = block.split(b"\n")
            if len(self.noise) < _NOISE_LINES:
                self.noise.extend(_not_json(lines)[: _NOISE_LINES - len(self.noise)])
            if len(block) > len(self.longest_line):  # a block is never shorter than its lines
                longest = max(lines, key=len)
                if len(longest) > len(self.longest_line):
                    self.longest_line = longest
        return blocks

    def noise_note(self) -> str:
        """A sentence on the stray stdout lines, or "" when there was none."""
        if not self.noise:
            return ""
        shown = "\n".join(f"  {line}" for line in self.noise)
        return (
            "the agent wrote lines that are not JSON-RPC on its stdout "
            f"(ACP allows only protocol messages there):\n{shown}"
        )


def _not_json(lines: Sequence[bytes]) -> List[str]:
    # A JSON-RPC message is an object (or a batch): a line that starts otherwise is not one.
    return [
        line.decode("utf-8", "replace")[:_NOISE_CHARS]
        for line in lines
        if line.strip() and line.lstrip()[:1] not in (b"{", b"[")
    ]


def spawn_agent(
    argv: Sequence[str], client: Client, on_stderr_line: Optional[Callable[[str], None]] = None
) -> Tuple[RemoteAgent, WatchedTransport]:
    """Start ``argv`` and connect ``client`` to it, or connect to the agent at its URL; raises
    ``AgentStartError`` when it cannot be started (``ConnectionClosed`` when the URL cannot be
    reached, ``ImportError`` without the extra). The process is stopped on any failure after it
    started."""
    url = agent_url(argv)
    if url is not None:
        from ..remote.client import open_url
        from ..remote.dial import Endpoint

        transport = WatchedTransport(open_url(Endpoint(url)))
        # (Any until rpc types its transport as the seam's Protocol rather than wire.Transport.)
        return RemoteAgent(Connection(cast(Any, transport), name="agent"), client), transport
    process = AgentProcess(argv, on_stderr_line=on_stderr_line)
    try:
        transport = WatchedTransport(process_transport(process))
        return RemoteAgent(Connection(cast(Any, transport), name="agent"), client, process), transport
    except BaseException:
        process.stop()
        raise
