"""The plugin: an agent panel for an editor whose plugin API runs on one main thread.

Such hosts (Sublime Text, Vim, many IDE scripting layers) let a plugin run code on the main thread
only, and offer a way to post a function there from another thread. The plugin needs from its host
only this much (``host.py`` beside this package is a stand-in that has it)::

    host.post(fn)                                 # any thread: run fn() on the main thread soon
    host.show_choices(title, labels, on_done)     # main thread: let the user pick; later, on the
                                                  # main thread, on_done(index), or on_done(None)

With ``HostDelivery`` every callback of the connection (streamed updates, the permission question,
the completion of a prompt) runs inside ``delivery.pump(budget=...)``, which the plugin posts to
the main thread whenever work arrives: plugin code never runs on acp_lite's threads, so it needs no locks.
The one rule it must keep: no blocking call on the main thread (its answer would wait for a pump
that cannot happen). Every request has a ``_future`` form: setup chains ``initialize_future`` and
``new_session_future``, prompts use ``prompt_future``.
"""

from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence

if TYPE_CHECKING:  # _acp.py is generated: type checkers read the package it is built from
    import acp_lite as _acp
else:
    from . import _acp

PUMP_BUDGET = 0.008  # seconds: the longest the main thread runs the connection's callbacks at once


class AgentPanel:
    """The output panel: the agent's streamed text and its tool calls, as lines. Main thread."""

    def __init__(self) -> None:
        self.lines: List[str] = []
        self._streaming = False  # the last line is message text still being streamed

    def show_text(self, text: str) -> None:
        if self._streaming:
            self.lines[-1] += text
        else:
            self.lines.append(text)
            self._streaming = True

    def show_note(self, note: str) -> None:
        self.lines.append(note)
        self._streaming = False

    def end_message(self) -> None:
        self._streaming = False


class PermissionDialog:
    """The permission question as a choice list; answers through a Future. Main thread."""

    def __init__(self, host: Any) -> None:
        self._host = host

    def ask(self, title: str, options: Sequence[Any]) -> Future:
        answer: Future = Future()

        def chosen(index: Optional[int]) -> None:
            if index is None:  # dismissed: the agent reads it as a rejection of the tool call
                reject = next((o for o in options if o.kind.startswith("reject")), options[-1])
                answer.set_result(_acp.updates.select_permission(reject.option_id))
            else:
                answer.set_result(_acp.updates.select_permission(options[index].option_id))

        self._host.show_choices(title, [option.name for option in options], chosen)
        return answer


class _PanelClient(_acp.Client):
    """What the editor offers the agent. Every method runs on the main thread (inside a pump)."""

    client_info = _acp.schema.Implementation(name="acp-plugin-skeleton", version="0.1.0")

    def __init__(self, panel: AgentPanel, dialog: PermissionDialog) -> None:
        self._panel = panel
        self._dialog = dialog
        self._titles: Dict[str, str] = {}

    def session_update(self, params: Any) -> None:
        update = params.update
        if isinstance(update, _acp.schema.AgentMessageChunk) and hasattr(update.content, "text"):
            self._panel.show_text(update.content.text)
        elif isinstance(update, (_acp.schema.ToolCall, _acp.schema.SessionUpdateToolCallUpdate)):
            title = self._titles.setdefault(update.tool_call_id, update.title or update.tool_call_id)
            self._panel.show_note(f"[tool] {title}: {update.status or 'pending'}")

    def request_permission(self, params: Any) -> Future:
        title = params.tool_call.title or self._titles.get(params.tool_call.tool_call_id, "the agent")
        return self._dialog.ask(f"Allow {title}?", params.options)


class AgentSession:
    """One conversation with an agent subprocess, shown in an ``AgentPanel``.

    Create it and call its methods on the main thread; every callback it takes runs there too.
    """

    def __init__(self, host: Any, argv: Sequence[str], cwd: str) -> None:
        self.panel = AgentPanel()
        self.session_id: Optional[str] = None
        self._host = host
        self._cwd = cwd
        self._delivery = _acp.HostDelivery()  # the creating thread is the one that must pump
        # Bounded pumps keep the editor responsive however fast the agent streams: a pump that
        # leaves work behind calls the wakeup again, which posts the next one.
        self._delivery.set_wakeup(lambda: host.post(lambda: self._delivery.pump(budget=PUMP_BUDGET)))
        client = _PanelClient(self.panel, PermissionDialog(host))
        self._agent = _acp.RemoteAgent.spawn(list(argv), client, delivery=self._delivery, name="plugin")

    def start(self, on_ready: Callable[[Optional[BaseException]], None]) -> None:
        """Initialize and open a session; then ``on_ready(None)``, or ``on_ready(error)``."""

        def initialized(future: Future) -> None:  # done-callbacks: they run on the main thread
            if future.exception() is not None:
                on_ready(future.exception())
            else:
                self._agent.new_session_future(cwd=self._cwd).add_done_callback(created)

        def created(future: Future) -> None:
            if future.exception() is None:
                self.session_id = future.result().session_id
            on_ready(future.exception())

        self._agent.initialize_future().add_done_callback(initialized)

    def ask(self, text: str, on_done: Callable[[str], None]) -> None:
        """Send a prompt; the reply streams into the panel, then ``on_done(stop_reason)``, or
        ``on_done("error: ...")``."""
        if self.session_id is None:
            raise RuntimeError("no session: ask once start() has reported success")
        self.panel.show_note(f"> {text}")

        def finished(future: Future) -> None:  # a done-callback: runs on the main thread
            self.panel.end_message()
            error = future.exception()
            on_done(f"error: {error}" if error is not None else future.result().stop_reason)

        self._agent.prompt_future(self.session_id, text).add_done_callback(finished)

    def cancel(self) -> None:
        """Stop the running turn; its ``on_done`` then gets ``cancelled``."""
        if self.session_id is not None:
            self._agent.cancel(self.session_id)

    def close(self) -> None:
        """Disconnect and stop the agent process."""
        self._agent.close()
