"""The plugin's Python half: one conversation with an agent, shown in a chat buffer.

Rules it keeps, because Vim runs every plugin on one thread and has no thread-safe way to be
woken from another:

- Every callback of the connection runs on Vim's thread: the connection delivers through a
  ``HostDelivery`` created here (on Vim's thread), which ``pump()`` drains from a 10 ms timer
  (``autoload/acp_chat.vim``) for at most 8 ms at a time, so typing never waits on the agent.
- No blocking call on Vim's thread: its answer would wait for a pump that cannot run. Setup chains
  ``initialize_future`` and ``new_session_future``, each bounded by ``g:acp_chat_start_timeout`` (a command
  that is no ACP agent would otherwise leave the chat "not ready" for ever); a prompt is a
  ``prompt_future`` (a turn may rightly take long: ``C`` cancels it); the permission question is
  a popup answered through a Future.
- Nothing is printed: a callback that raises, or a request that fails, becomes an ``[error]``
  line in the chat buffer; acp_lite itself logs to its own (silent) loggers.
- The agent is a command the user configures (``g:acp_chat_agent``): inside Vim,
  ``sys.executable`` is not a Python interpreter one could start an agent with.
"""

import os
import time
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, Dict, List, Optional

import vim

if TYPE_CHECKING:  # _acp.py is generated: type checkers read the package it is built from
    import acp_lite as _acp
else:
    from . import _acp

schema = _acp.schema

PUMP_BUDGET = 0.008  # seconds of each 10 ms tick the connection may take


class ChatBuffer:
    """The ``acp://chat`` buffer: prompts, the agent's streamed text, tool calls and plans."""

    def __init__(self, number: int) -> None:
        self._buffer = vim.buffers[number]
        self._streaming: Optional[str] = None  # the last line is text of this message, arriving
        self._changed = False

    def text(self, text: str, message_id: Optional[str]) -> None:
        """Agent text as it streams: continues the last line while the message goes on."""
        pieces = text.split("\n")
        if self._streaming is not None and self._streaming == (message_id or ""):
            self._set_last(self._buffer[-1] + pieces[0])
            pieces = pieces[1:]
        if pieces:
            self._append(pieces)
        self._streaming = message_id or ""

    def note(self, line: str) -> None:
        """A line of its own: a prompt, a tool call, a plan entry, a stop reason, an error."""
        self._append(line.split("\n"))
        self._streaming = None

    def flush(self) -> None:
        """Show what changed: keep the windows on the buffer at its end, redraw once."""
        if not (self._changed and self._buffer.valid):
            return
        self._changed = False
        for window in vim.windows:
            if window.buffer.number == self._buffer.number:
                window.cursor = (len(self._buffer), 0)
        vim.command("redraw")

    def _append(self, lines: List[str]) -> None:
        if not self._buffer.valid:  # the user wiped it out: the chat goes on unseen
            return
        with self._editable():
            if self._buffer[:] == [""]:
                self._buffer[:] = lines
            else:
                self._buffer.append(lines)

    def _set_last(self, line: str) -> None:
        if not self._buffer.valid:
            return
        with self._editable():
            self._buffer[-1] = line

    def _editable(self) -> "_Editable":
        self._changed = True
        return _Editable(self._buffer)


class _Editable:
    """The buffer is read-only to the user; writable while the plugin writes."""

    def __init__(self, buffer: Any) -> None:
        self._buffer = buffer

    def __enter__(self) -> None:
        self._buffer.options["modifiable"] = True

    def __exit__(self, *exc_info: Any) -> None:
        self._buffer.options["modifiable"] = False


class _ChatClient(_acp.Client):
    """What Vim offers the agent. Every method runs on Vim's thread, inside a pump."""

    client_info = schema.Implementation(name="vim-acp-chat", version="0.1.0")

    def __init__(self, chat: ChatBuffer) -> None:
        self._chat = chat
        self._titles: Dict[str, str] = {}
        self._questions: Dict[int, Any] = {}  # popup id -> (Future, options)

    def session_update(self, params: Any) -> None:
        update = params.update
        if isinstance(update, schema.AgentMessageChunk):
            self._chat.text(getattr(update.content, "text", "[non-text content]"), update.message_id)
        elif isinstance(update, (schema.ToolCall, schema.SessionUpdateToolCallUpdate)):
            title = self._titles.setdefault(update.tool_call_id, update.title or update.tool_call_id)
            self._chat.note(f"[tool] {title}: {update.status or 'pending'}")
        elif isinstance(update, schema.Plan):
            for entry in update.entries:
                self._chat.note(f"[plan] {entry.content} ({entry.status})")

    def request_permission(self, params: Any) -> Future:
        answer: Future = Future()
        title = params.tool_call.title or self._titles.get(params.tool_call.tool_call_id, "the agent")
        labels = [option.name for option in params.options]
        popup = int(vim.Function("acp_chat#permission")(f"Allow {title}?", labels))
        self._questions[popup] = (answer, params.options)
        return answer

    def answered(self, popup: int, choice: int) -> None:
        """The popup closed with item ``choice`` (1-based; -1 when dismissed)."""
        answer, options = self._questions.pop(popup, (None, None))
        if answer is None or answer.done():
            return
        if 1 <= choice <= len(options):
            chosen = options[choice - 1]
        else:  # dismissed: a rejection of the tool call
            chosen = next((o for o in options if o.kind.startswith("reject")), options[-1])
        answer.set_result(_acp.updates.select_permission(chosen.option_id))

    def on_cancel(self, session_id: str) -> None:
        # The runtime has answered the open questions "cancelled": their popups go away.
        questions, self._questions = self._questions, {}
        for popup in questions:
            vim.Function("popup_close")(popup)


class ChatSession:
    """One agent subprocess and its session. Create and use it on Vim's thread."""

    def __init__(self, argv: List[str], cwd: str, chat: ChatBuffer, start_timeout: float) -> None:
        self.chat = chat
        self.session_id: Optional[str] = None
        self.delivery = _acp.HostDelivery(on_error=self._report)
        self.client = _ChatClient(chat)
        self.agent = _acp.RemoteAgent.spawn(argv, self.client, cwd=cwd, delivery=self.delivery, name="vim-chat")
        self._cwd = cwd
        self._agent_name = "the agent"
        self._turn: Optional[Future] = None
        self._argv = argv
        self._started = time.monotonic()
        self._start_timeout = start_timeout
        self.agent.initialize_future(timeout=start_timeout).add_done_callback(self._initialized)

    def _initialized(self, future: Future) -> None:
        if self._failed(future, "initialize"):
            return
        info = future.result().agent_info
        self._agent_name = (info.title or info.name) if info else "the agent"
        self.agent.new_session_future(self._cwd, timeout=self._start_timeout).add_done_callback(self._created)

    def _created(self, future: Future) -> None:
        if not self._failed(future, "session/new"):
            self.session_id = future.result().session_id
            self.chat.note(f"[ready] {self._agent_name}: :AcpAsk {{text}} to ask, C in this buffer to cancel")

    def ask(self, text: str) -> None:
        if self.session_id is None:
            if self.agent.connection.closed:
                self.chat.note("[error] the agent is not running: :AcpStart starts it again")
            else:
                waited = time.monotonic() - self._started
                self.chat.note(
                    f"[error] the agent is not ready yet ({waited:.0f} s of {self._start_timeout:g} s waited)"
                )
            return
        self.chat.note(f"> {text}")
        try:
            self._turn = self.agent.prompt_future(self.session_id, text)
        except _acp.AcpError as error:  # not sent: the agent stopped reading (CallTimeout), or is gone
            self.chat.note(f"[error] session/prompt: {error}")
            return
        self._turn.add_done_callback(self._finished)

    def _finished(self, future: Future) -> None:
        if not self._failed(future, "session/prompt"):
            self.chat.note(f"[stop] {future.result().stop_reason}")

    def cancel(self) -> None:
        if self.session_id is not None and self._turn is not None and not self._turn.done():
            try:
                self.agent.cancel(self.session_id)
            except _acp.AcpError as error:  # not sent: the agent stopped reading, or is gone
                self.chat.note(f"[error] session/cancel: {error}")

    def pump(self) -> None:
        self.delivery.pump(budget=PUMP_BUDGET)
        self.chat.flush()

    def close(self) -> None:
        self.agent.close()

    def _failed(self, future: Future, what: str) -> bool:
        error = future.exception()
        if isinstance(error, _acp.errors.CallTimeout) and self.session_id is None:
            self.chat.note(f"[error] {error}: is {' '.join(self._argv)} an ACP agent? It was stopped.")
            self.close()
        elif error is not None:
            self.chat.note(f"[error] {what}: {error}")
        return error is not None

    def _report(self, error: BaseException) -> None:
        self.chat.note(f"[error] {type(error).__name__}: {error}")


# -- the entry points autoload/acp_chat.vim calls -------------------------------------------------
_session: Optional[ChatSession] = None


def start(argv: List[str], buffer_number: int, start_timeout: float) -> None:
    """Start ``argv`` in a chat shown in buffer ``buffer_number``; the agent gets
    ``start_timeout`` seconds to answer ``initialize``, then ``session/new``."""
    global _session
    if _session is not None:
        _session.close()
    chat = ChatBuffer(buffer_number)
    try:
        _session = ChatSession(argv, os.getcwd(), chat, start_timeout)
    except Exception as error:  # the command could not be started
        _session = None
        chat.note(f"[error] cannot start {argv}: {error}")
        chat.flush()


def ask(text: str) -> None:
    if _session is not None:
        _session.ask(text)
        _session.chat.flush()


def cancel() -> None:
    if _session is not None:
        _session.cancel()


def answered(popup: int, choice: int) -> None:
    if _session is not None:
        _session.client.answered(popup, choice)


def pump() -> None:
    if _session is not None:
        _session.pump()


def stop() -> None:
    global _session
    if _session is not None:
        closing = _session
        _session = None
        closing.close()
