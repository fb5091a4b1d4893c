"""The chat panel's widgets: the conversation, the permission question, the prompt entry.

Pure GTK, no protocol: ``session.py`` says what to show, the panel says what the user did, through
the callbacks it is given. Rules it keeps:

- Everything runs on gedit's main thread.
- What arrives between two flushes is queued (``ChatView.text``, ``note``, ``keyed``) and written
  to the ``Gtk.TextBuffer`` by ``flush()``: consecutive streamed texts in one insertion, a line
  rewritten many times once (its last text), one scroll per flush; a flush given a budget stops at
  it and leaves the rest queued, so a backlog never holds the main loop.
- A tool call (and the plan) is one line updated in place as its status changes, found again by
  its key; the streamed text of one message continues its line.
- The conversation keeps at most ``MAX_CHARS`` characters: older lines are dropped, so an agent
  that streams for hours cannot grow gedit without bound.
"""

import collections
import time
from typing import Any, Callable, Deque, Dict, List, Optional, Sequence, Tuple

from gi.repository import Gdk, GLib, Gtk, Pango

MAX_CHARS = 1_000_000
STYLES = {  # tag name -> its look
    "prompt": {"weight": Pango.Weight.BOLD},
    "tool": {"foreground": "#1c5fa8"},
    "plan": {"foreground": "#6b4fa0"},
    "meta": {"foreground": "#777777", "style": Pango.Style.ITALIC},
    "error": {"foreground": "#c01c28"},
}


class ChatView(Gtk.ScrolledWindow):
    """The conversation, read-only: prompts, streamed text, tool call and plan lines, notes."""

    def __init__(self) -> None:
        super().__init__(hexpand=True, vexpand=True)
        self.view = Gtk.TextView(editable=False, cursor_visible=False, wrap_mode=Gtk.WrapMode.WORD_CHAR)
        self.view.set_left_margin(6)
        self.view.set_right_margin(6)
        self.buffer = self.view.get_buffer()
        for name, look in STYLES.items():
            self.buffer.create_tag(name, **look)
        self.add(self.view)
        # Queued since the last flush: ("text", [pieces], message id) / ("line", text, tag) / ("keyed", key, text, tag)
        self._pending: Deque[Tuple[Any, ...]] = collections.deque()
        self._streaming: Optional[str] = None  # the buffer ends inside this message's text
        self._keyed: Dict[str, Tuple[Gtk.TextMark, int]] = {}  # key -> (start of its line, its length)
        # key -> where its rewrite waits: its index in _pending plus _flushed, the ops flushed so far
        # (a backlog can be long while the view catches up: nothing here is linear in it)
        self._pending_keys: Dict[str, int] = {}
        self._flushed = 0

    # -- what the session says --------------------------------------------------------------------
    def text(self, text: str, message_id: Optional[str]) -> None:
        """Agent text as it streams: continues the message it belongs to while that goes on."""
        last = self._pending[-1] if self._pending else None
        if last is not None and last[0] == "text" and last[2] == (message_id or ""):
            last[1].append(text)
        else:
            self._append(("text", [text], message_id or ""))

    def note(self, line: str, tag: str = "meta") -> None:
        """A line of its own: a prompt, a stop reason, an error."""
        self._append(("line", line, tag))

    def keyed(self, key: str, line: str, tag: str) -> None:
        """A line (or lines) shown once and rewritten in place on each call with the same key."""
        queued = self._pending_keys.get(key)
        if queued is not None:  # rewritten again before the flush: only the last text is shown
            self._pending[queued - self._flushed] = ("keyed", key, line, tag)
            return
        self._pending_keys[key] = self._flushed + len(self._pending)
        self._append(("keyed", key, line, tag))

    def _append(self, op: Tuple[Any, ...]) -> None:
        # A streamed text no longer continued becomes one str: a queue of ops made of str alone
        # is left alone by Python's garbage collector, while one of lists (tens of thousands of
        # them while the view catches up) made each full collection hold gedit's main loop 15 ms.
        last = self._pending[-1] if self._pending else None
        if last is not None and last[0] == "text":
            self._pending[-1] = ("text", "".join(last[1]), last[2])
        self._pending.append(op)

    @property
    def has_pending(self) -> bool:
        """True while something queued is not shown yet."""
        return bool(self._pending)

    def flush(self, budget: Optional[float] = None) -> None:
        """Write what was queued, for about ``budget`` seconds if given (the rest waits for the
        next flush: a long backlog must not hold gedit's main loop), then keep the end in view."""
        if not self._pending:
            return
        deadline = float("inf") if budget is None else time.perf_counter() + budget
        pending = self._pending
        while pending and time.perf_counter() < deadline:
            if pending[0][0] == "text":  # consecutive streamed texts go in at once: each insert costs a layout pass
                texts = []
                while pending and pending[0][0] == "text":
                    op = pending.popleft()
                    texts.append((op[1] if type(op[1]) is str else "".join(op[1]), op[2]))
                self._flushed += len(texts)
                self._stream(texts)
                continue
            op = pending.popleft()
            if op[0] == "line":
                self._line(op[1], op[2])
            else:
                if self._pending_keys[op[1]] == self._flushed:
                    del self._pending_keys[op[1]]
                self._rewrite(op[1], op[2], op[3])
            self._flushed += 1
        self._trim()
        self.buffer.place_cursor(self.buffer.get_end_iter())  # once per flush: each move costs the view work
        self.view.scroll_mark_onscreen(self.buffer.get_insert())

    def contents(self) -> str:
        start, end = self.buffer.get_bounds()
        return str(self.buffer.get_text(start, end, False))

    # -- the buffer -------------------------------------------------------------------------------
    def _stream(self, texts: List[Tuple[str, str]]) -> None:
        # One insert for many messages' texts: each insert costs the view a layout pass.
        if not texts:
            return
        end = self.buffer.get_end_iter()
        at_line_start = end.get_offset() == 0 or end.starts_line()
        pieces: List[str] = []
        for text, message_id in texts:
            if self._streaming != message_id and not at_line_start:
                pieces.append("\n")  # another message starts on a line of its own
                at_line_start = True
            if text:
                pieces.append(text)
                at_line_start = text.endswith("\n")
            self._streaming = message_id
        self.buffer.insert(end, "".join(pieces))

    def _line(self, text: str, tag: str) -> None:
        self._new_line()
        self.buffer.insert_with_tags_by_name(self.buffer.get_end_iter(), text, tag)
        self._streaming = None

    def _rewrite(self, key: str, text: str, tag: str) -> None:
        known = self._keyed.get(key)
        if known is None:
            self._new_line()
            start = self.buffer.get_end_iter().get_offset()
            self._line(text, tag)
            # Right gravity: text inserted at the mark (by the line before, rewritten) goes before it.
            self._keyed[key] = (self.buffer.create_mark(None, self.buffer.get_iter_at_offset(start), False), len(text))
            return
        mark, length = known
        begin = self.buffer.get_iter_at_mark(mark)
        offset = begin.get_offset()
        self.buffer.delete(begin, self.buffer.get_iter_at_offset(offset + length))
        self.buffer.insert_with_tags_by_name(self.buffer.get_iter_at_offset(offset), text, tag)
        self.buffer.move_mark(mark, self.buffer.get_iter_at_offset(offset))
        self._keyed[key] = (mark, len(text))

    def _new_line(self) -> None:
        end = self.buffer.get_end_iter()
        if end.get_offset() > 0 and not end.starts_line():
            self.buffer.insert(end, "\n")
        self._streaming = None

    def _trim(self) -> None:
        excess = self.buffer.get_char_count() - MAX_CHARS
        if excess <= 0:
            return
        cut = self.buffer.get_iter_at_offset(excess + MAX_CHARS // 4)
        cut.forward_line()  # whole lines go
        gone = cut.get_offset()
        for key, (mark, _) in list(self._keyed.items()):  # in the order of their lines: stop at the first kept
            if self.buffer.get_iter_at_mark(mark).get_offset() >= gone:
                break
            self.buffer.delete_mark(mark)
            del self._keyed[key]
        self.buffer.delete(self.buffer.get_start_iter(), cut)


class PermissionBar(Gtk.Box):
    """The agent's question, with one button per option; Escape picks the first rejection.

    Questions asked while one is shown wait their turn. ``ask`` returns nothing: the answer goes to
    the ``answer`` callback given with the question (the option's index, or None when withdrawn).
    A click is answered once GTK is done with it (the buttons go then); ``after_click()`` then
    puts the focus back where the user types."""

    def __init__(self, after_click: Callable[[], Any]) -> None:
        super().__init__(orientation=Gtk.Orientation.VERTICAL, spacing=4, no_show_all=True)
        self.label = Gtk.Label(xalign=0.0, wrap=True)
        self.buttons = Gtk.FlowBox(selection_mode=Gtk.SelectionMode.NONE, max_children_per_line=4)
        self.pack_start(self.label, False, False, 0)
        self.pack_start(self.buttons, False, False, 0)
        self._questions: List[Tuple[str, Sequence[Tuple[str, str]], Callable[[Optional[int]], Any]]] = []
        self._after_click = after_click

    def ask(self, question: str, options: Sequence[Tuple[str, str]], answer: Callable[[Optional[int]], Any]) -> None:
        """``options``: (label, kind) pairs, kind as ACP names it (allow_once, reject_always, ...)."""
        self._questions.append((question, options, answer))
        if len(self._questions) == 1:
            self._show_first()

    def reject(self) -> bool:
        """Answer the shown question with its first rejecting option (Escape); False if none shows."""
        if not self._questions:
            return False
        _, options, _ = self._questions[0]
        kinds = [kind for _, kind in options]
        rejecting = next((i for i, kind in enumerate(kinds) if kind.startswith("reject")), len(kinds) - 1)
        self._answered(rejecting)
        return True

    def withdraw_all(self) -> None:
        """The turn was cancelled: every question goes away unanswered."""
        questions, self._questions = self._questions, []
        self.hide()
        for _, _, answer in questions:
            answer(None)

    def _show_first(self) -> None:
        for child in self.buttons.get_children():
            self.buttons.remove(child)
        if not self._questions:
            self.hide()
            return
        question, options, _ = self._questions[0]
        self.label.set_text(question)
        for index, (label, kind) in enumerate(options):
            button = Gtk.Button(label=label)
            if kind.startswith("allow"):
                button.get_style_context().add_class("suggested-action")
            button.connect("clicked", self._clicked, index)
            self.buttons.add(button)
        self.buttons.set_sensitive(True)
        self.show()
        self.label.show()
        self.buttons.show_all()

    def _clicked(self, _button: Gtk.Button, index: int) -> None:
        self.buttons.set_sensitive(False)  # one answer per question
        GLib.idle_add(self._answer_click, index)

    def _answer_click(self, index: int) -> bool:
        if self._questions:  # (unless withdrawn meanwhile)
            self._answered(index)
        self._after_click()
        return False  # (once)

    def _answered(self, index: int) -> None:
        _, _, answer = self._questions.pop(0)
        self._show_first()
        answer(index)


class ChatPanel(Gtk.Box):
    """The side panel: the conversation, the question bar, the prompt entry, Send and Cancel.

    ``on_prompt(text)`` when the user sends, ``on_cancel()`` on the Cancel button or Escape (with
    no question shown: Escape answers a question first)."""

    def __init__(self, on_prompt: Callable[[str], Any], on_cancel: Callable[[], Any]) -> None:
        super().__init__(orientation=Gtk.Orientation.VERTICAL, spacing=4, border_width=4)
        self.chat = ChatView()
        self.entry = Gtk.Entry(placeholder_text="Ask the agent…", hexpand=True)
        self.permission = PermissionBar(after_click=self.entry.grab_focus)
        self.cancel_button = Gtk.Button(label="Cancel", sensitive=False, tooltip_text="Cancel the turn (Escape)")
        row = Gtk.Box(orientation=Gtk.Orientation.HORIZONTAL, spacing=4)
        row.pack_start(self.entry, True, True, 0)
        row.pack_start(self.cancel_button, False, False, 0)
        self.pack_start(self.chat, True, True, 0)
        self.pack_start(self.permission, False, False, 0)
        self.pack_start(row, False, False, 0)
        self._on_prompt = on_prompt
        self._on_cancel = on_cancel
        self.entry.connect("activate", self._send)
        self.cancel_button.connect("clicked", self._cancel_clicked)
        self.connect("key-press-event", self._key)

    def set_turn_running(self, running: bool) -> None:
        self.cancel_button.set_sensitive(running)

    def _send(self, entry: Gtk.Entry) -> None:
        text = entry.get_text().strip()
        if text:
            entry.set_text("")
            self._on_prompt(text)

    def _cancel_clicked(self, _button: Gtk.Button) -> None:
        self._on_cancel()
        self.entry.grab_focus()  # the button goes insensitive when the turn ends: the focus would go with it

    def _key(self, _widget: Gtk.Widget, event: Gdk.EventKey) -> bool:
        if event.keyval != Gdk.KEY_Escape:
            return False
        if not self.permission.reject():
            self._on_cancel()
        return True
