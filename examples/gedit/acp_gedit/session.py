"""The plugin's connection: one agent subprocess and one session, shown in a ``ChatPanel``.

Rules it keeps, because gedit runs its UI (and every plugin) on one thread, the GLib main loop's:

- Every callback of the connection runs on gedit's thread: the connection delivers through a
  ``HostDelivery`` created here, whose wake-up function (called on acp_lite's threads) only calls
  ``GLib.idle_add(pump)``, which GLib allows from any thread. The pump then runs on the main loop
  at ``PUMP_PRIORITY``, below input and GTK's redrawing, above the text view's background layout
  (which would otherwise starve it for hundreds of ms after each large insert), for about
  ``PUMP_BUDGET`` seconds in all. The chat view is flushed at most every ``FRAME`` while a stream
  keeps the pumps busy (each flush costs GTK a layout and a redraw), and then gets what the
  callbacks left of the budget (at least ``MIN_FLUSH``): what it could not show waits for the
  next flush. A pump that leaves work behind is woken again at once, so a fast agent gets the
  main loop's spare time in slices and the UI stays responsive. Nothing polls: while the agent
  is quiet, the plugin costs nothing. Two settings of gedit's Python keep a pump within its
  budget: what lives when a session starts is frozen out of the cyclic garbage collector's sight
  (``gc.freeze``), and a thread hands the GIL back after ``SWITCH_INTERVAL``.
- No blocking call on gedit's thread (its answer would wait for a pump that cannot run): setup
  chains ``initialize_future`` and ``new_session_future``, a prompt is a ``prompt_future``, and
  each of them is given up after its timeout (``REQUEST_TIMEOUT``, ``TURN_TIMEOUT``); the
  permission question is answered through a Future the panel settles.
- Nothing is printed to stderr: a callback that raises, a request that fails, a flush or a
  document reload that fails all become an ``[error]`` line in the chat; acp_lite logs to its
  own (silent) loggers.
- The agent works in one directory, the active document's folder when the first prompt is sent:
  its ``cwd``, and the only place ``WorkspaceClient`` lets it read and write. A read of a file
  open in gedit with unsaved edits gets them; a write to a file open in gedit and not modified
  there reloads that document.
- ``close()`` (the window closing, gedit quitting, the plugin disabled) stops the agent and its
  whole process tree (``RemoteAgent.close``).
"""

import gc
import os
import sys
import time
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional

from gi.repository import GLib, GtkSource

from .panel import ChatPanel

if TYPE_CHECKING:  # _acp.py is generated: type checkers read the package it is built from
    import acp_lite as _acp
else:
    from . import _acp

schema = _acp.schema

# Seconds a pump aims to hold the main loop; it may overshoot by a callback or a GIL hand-over.
PUMP_BUDGET = 0.004
SWITCH_INTERVAL = 0.001  # seconds (sys.setswitchinterval), for the whole of gedit's Python
PUMP_PRIORITY = GLib.PRIORITY_HIGH_IDLE + 22  # after GTK's redraw (+20), before GtkTextView's layout (+25)
FRAME = 0.05  # seconds between two flushes of the chat view while a stream keeps the pumps busy
MIN_FLUSH = 0.001  # seconds the chat view's flush gets however long the callbacks before it took
REQUEST_TIMEOUT = 30.0  # seconds for initialize and session/new
TURN_TIMEOUT = 1800.0  # seconds a prompt turn may last before it is cancelled as the Cancel button does


class _ChatClient(_acp.WorkspaceClient):
    """What gedit offers the agent: files inside the session's folder, questions, the chat.
    Every method runs on gedit's thread, inside a pump."""

    client_info = schema.Implementation(name="gedit-acp-chat", version="0.1.0")

    def __init__(self, panel: ChatPanel, documents: Callable[[], List[Any]]) -> None:
        super().__init__()
        self._panel = panel
        self._documents = documents
        self._titles: Dict[str, str] = {}

    def session_update(self, params: Any) -> None:
        update, chat = params.update, self._panel.chat
        if isinstance(update, schema.AgentMessageChunk):
            chat.text(getattr(update.content, "text", "[non-text content]"), update.message_id)
        elif isinstance(update, (schema.ToolCall, schema.SessionUpdateToolCallUpdate)):
            if update.title:  # (an update may rename the tool call; most carry only a status)
                self._titles[update.tool_call_id] = update.title
            title = self._titles.get(update.tool_call_id, update.tool_call_id)
            chat.keyed(update.tool_call_id, f"[tool] {title}: {update.status or 'pending'}", "tool")
        elif isinstance(update, schema.Plan):  # each plan replaces the one before
            lines = [f"[plan] {entry.content} ({entry.status})" for entry in update.entries]
            chat.keyed("\0plan", "\n".join(lines), "plan")

    def request_permission(self, params: Any) -> Future:
        answer: Future = Future()
        call = params.tool_call
        title = call.title or self._titles.get(call.tool_call_id, "the agent's tool call")
        options = list(params.options)

        def answered(index: Optional[int]) -> None:
            if answer.done():  # the turn was cancelled: the runtime answered already
                return
            if index is None:
                answer.set_result(_acp.updates.cancelled_permission())
            else:
                answer.set_result(_acp.updates.select_permission(options[index].option_id))

        self._panel.permission.ask(f"Allow {title}?", [(o.name, o.kind) for o in options], answered)
        return answer

    def on_cancel(self, session_id: str) -> None:
        # The runtime has answered the open questions "cancelled": their buttons go away.
        self._panel.permission.withdraw_all()

    def read_text_file(self, params: Any) -> Any:
        """The file as the user sees it: from its unsaved document if gedit has one, else from the
        disk. (The disk read always happens: it is what keeps the path inside the session's folder.)"""
        read = super().read_text_file(params)
        document = self._document(params.path)
        if document is None or not document.get_modified():
            return read
        text = document.get_text(*document.get_bounds(), False)
        if document.get_implicit_trailing_newline():
            text += "\n"
        lines = text.splitlines(keepends=True)[(params.line or 1) - 1 :]
        if params.limit is not None:
            lines = lines[: params.limit]
        return schema.ReadTextFileResponse(content="".join(lines))

    def write_text_file(self, params: Any) -> Any:
        written = super().write_text_file(params)
        if isinstance(written, Future):  # approved later, on another thread
            written.add_done_callback(lambda done: GLib.idle_add(self._reflect, params.path, done))
        else:
            try:
                self._reflect(params.path, None)
            except Exception as error:  # the file is written: the agent hears of that, not of this
                self._panel.chat.note(f"[error] reloading {params.path}: {error}", "error")
        return written

    def _reflect(self, path: str, done: Optional[Future]) -> bool:
        """A file the agent wrote: reload its document if gedit has it open and unmodified."""
        if done is not None and (done.cancelled() or done.exception() is not None):
            return False
        document = self._document(path)
        if document is None:
            pass
        elif document.get_modified():
            self._panel.chat.note(f"[write] {path}: changed on disk, your unsaved edits kept", "error")
        else:
            loader = GtkSource.FileLoader.new(document, document.get_file())
            loader.load_async(GLib.PRIORITY_DEFAULT, None, None, None, self._reloaded, path)
        return False  # (as an idle callback: once)

    def _document(self, path: str) -> Any:
        """gedit's open document of the file ``path``, or None."""
        wanted = os.path.realpath(path)
        for document in self._documents():
            location = document.get_file().get_location()
            if location is not None and location.get_path() and os.path.realpath(location.get_path()) == wanted:
                return document
        return None

    def _reloaded(self, loader: Any, result: Any, path: str) -> None:
        try:
            loader.load_finish(result)
            self._panel.chat.note(f"[write] {path}: reloaded")
        except GLib.Error as error:
            self._panel.chat.note(f"[error] reloading {path}: {error.message}", "error")
        self._panel.chat.flush(PUMP_BUDGET)


class ChatSession:
    """One agent subprocess and its session, in ``cwd``. Create and use it on gedit's thread."""

    def __init__(self, argv: List[str], cwd: str, panel: ChatPanel, documents: Callable[[], List[Any]]) -> None:
        self.panel = panel
        self.chat = panel.chat
        self.session_id: Optional[str] = None
        self.delivery = _acp.HostDelivery(on_error=self._report)
        self.client = _ChatClient(panel, documents)
        self._cwd = cwd
        self._agent_name = "the agent"
        self._turn: Optional[Future] = None
        self._queued: Optional[str] = None  # the prompt sent before the session was ready
        self._closed = False
        self._shown_at = 0.0  # when the chat view was last flushed (time.perf_counter())
        # gedit's Python heap (its plugins, GObject wrappers, this module) lives as long as gedit:
        # out of the cyclic collector's sight, a full collection during a stream scans only what
        # came since (measured: 10 to 19 ms per full collection, on gedit's main loop, otherwise).
        # What is garbage now is collected first, so nothing is frozen with it.
        gc.collect()
        gc.freeze()
        # acp_lite's reader thread, decoding a burst, hands the GIL back to gedit's thread after
        # at most this long (Python's default, 5 ms, is more than half a pump's budget).
        sys.setswitchinterval(SWITCH_INTERVAL)
        self.agent = _acp.RemoteAgent.spawn(argv, self.client, cwd=cwd, delivery=self.delivery, name="gedit-chat")
        self.delivery.set_wakeup(self._wake)
        self._expect(self.agent.initialize_future(), "initialize", REQUEST_TIMEOUT, self._initialized)

    # -- the main loop ----------------------------------------------------------------------------
    def _wake(self) -> None:
        """On acp_lite's threads: schedule a pump on the main loop."""
        GLib.idle_add(self.pump, priority=PUMP_PRIORITY)

    def pump(self) -> bool:
        """Run what arrived, then show it, in about PUMP_BUDGET. (An idle callback: runs once. What
        is left is pumped again: the callbacks by the delivery's wake-up, the view's by _show's.)"""
        if self._closed:
            return False
        started = time.perf_counter()
        show = started - self._shown_at >= FRAME
        self.delivery.pump(budget=PUMP_BUDGET / 2 if show else PUMP_BUDGET)
        if self.chat.has_pending and (show or not self.delivery.has_work):
            self._show(max(MIN_FLUSH, PUMP_BUDGET - (time.perf_counter() - started)))
            self._shown_at = time.perf_counter()
        return False

    def _show(self, budget: float = PUMP_BUDGET) -> None:
        """Flush the chat view for about ``budget``; a pump shows the rest (a turn's end, say,
        arrives behind a backlog the view has yet to show)."""
        try:
            self.chat.flush(budget)
        except Exception as error:  # a bug of ours must not reach gedit's stderr
            self.chat.note(f"[error] showing the chat: {type(error).__name__}: {error}", "error")
        if self.chat.has_pending:
            self._wake()

    # -- requests, each with its timeout ----------------------------------------------------------
    def _expect(self, future: Future, what: str, timeout: float, then: Callable[[Any], Any]) -> None:
        """``then(result)`` once ``future`` succeeds; an ``[error]`` line if it fails, and if it
        has not settled within ``timeout`` seconds it is cancelled (the agent is told)."""
        timer: List[int] = []

        def give_up() -> bool:
            timer.clear()
            future.cancel()
            return False  # (once)

        def settled(done: Future) -> None:
            if timer:
                GLib.source_remove(timer.pop())
            if done.cancelled():
                self.chat.note(f"[error] {what}: no answer within {timeout:g} s", "error")
            elif done.exception() is not None:
                self.chat.note(f"[error] {what}: {done.exception()}", "error")
            else:
                then(done.result())
            self._show()

        timer.append(GLib.timeout_add(int(timeout * 1000), give_up))
        future.add_done_callback(settled)

    def _initialized(self, result: Any) -> None:
        info = result.agent_info
        self._agent_name = (info.title or info.name) if info else "the agent"
        self._expect(self.agent.new_session_future(self._cwd), "session/new", REQUEST_TIMEOUT, self._created)

    def _created(self, result: Any) -> None:
        self.session_id = result.session_id
        self.chat.note(f"[ready] {self._agent_name} in {self._cwd}")
        if self._queued is not None:
            text, self._queued = self._queued, None
            self._send(text)

    # -- what the user does -----------------------------------------------------------------------
    def ask(self, text: str) -> None:
        """The user's prompt: sent now, or once the session is ready."""
        if self._queued is not None or (self._turn is not None and not self._turn.done()):
            self.chat.note("[error] a turn is running: wait for it, or cancel it (Escape)", "error")
        else:
            self.chat.note(f"> {text}", "prompt")
            if self.session_id is None:
                self._queued = text
            else:
                self._send(text)
        self._show()

    def _send(self, text: str) -> None:
        assert self.session_id is not None
        try:
            turn = self._turn = self.agent.prompt_future(self.session_id, text)
        except _acp.AcpError as error:  # not sent: the agent stopped reading (CallTimeout), or is gone
            self.chat.note(f"[error] session/prompt: {error}", "error")
            return
        self.panel.set_turn_running(True)
        turn.add_done_callback(self._finished)
        GLib.timeout_add_seconds(int(TURN_TIMEOUT), lambda: self._overdue(turn))

    def _overdue(self, turn: Future) -> bool:
        if not turn.done() and turn is self._turn:
            self.chat.note(f"[error] the turn took over {TURN_TIMEOUT:g} s: cancelled", "error")
            self.cancel()
        return False

    def _finished(self, future: Future) -> None:
        self.panel.set_turn_running(False)
        error = None if future.cancelled() else future.exception()
        if future.cancelled() or error is not None:
            self.chat.note(f"[error] session/prompt: {error or 'given up'}", "error")
        else:
            self.chat.note(f"[stop] {future.result().stop_reason}")
        self._show()

    def cancel(self) -> None:
        if self.session_id is not None and self._turn is not None and not self._turn.done():
            try:
                self.agent.cancel(self.session_id)
            except _acp.AcpError as error:  # not sent: the agent stopped reading, or is gone
                self.chat.note(f"[error] session/cancel: {error}", "error")
                self._show()

    def close(self) -> None:
        """Stop the agent and its process tree (waits a few seconds at most)."""
        self._closed = True
        self.delivery.set_wakeup(None)
        self.agent.close()

    def _report(self, error: BaseException) -> None:
        self.chat.note(f"[error] {type(error).__name__}: {error}", "error")
