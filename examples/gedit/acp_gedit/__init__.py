"""acp_gedit: a chat with a coding agent in gedit's side panel, over the Agent Client Protocol.

``_acp.py`` is acp_lite in one file, generated and not committed: build it with
``python -m acp_lite.tools.vendor examples/gedit/acp_gedit/_acp.py``. Apart from it the plugin
needs only msgspec, installed for the Python that gedit's libpeas loads (Debian's python3).
``panel.py`` holds the widgets, ``session.py`` the connection; this module is the part gedit
loads, one ``AcpGeditPlugin`` per window.

The agent's command is read, at each window's first prompt, from ``CONFIG_FILE`` in the user's
config directory (``~/.config/gedit/acp-chat.json``)::

    {"agent": ["/usr/bin/python3", "/path/to/agent.py"]}

A full path, since gedit's Python is not a command one can start an agent with.
"""

import json
import os
from typing import Any, List, Optional

import gi

gi.require_version("Gedit", "3.0")
gi.require_version("Gtk", "3.0")
gi.require_version("GtkSource", "4")

from gi.repository import Gedit, Gio, GLib, GObject  # noqa: E402

from .panel import ChatPanel  # noqa: E402
from .session import ChatSession  # noqa: E402

CONFIG_FILE = os.path.join("gedit", "acp-chat.json")
FOCUS_ACTION = "acp-chat"  # a window action: show the panel and put the cursor in its prompt entry
FOCUS_KEYS = ["<Primary><Alt>a"]


class AcpGeditPlugin(GObject.Object, Gedit.WindowActivatable):
    """The chat of one gedit window: its side panel page, and its agent once the user asks."""

    __gtype_name__ = "AcpGeditPlugin"
    window = GObject.Property(type=Gedit.Window)

    def __init__(self) -> None:
        GObject.Object.__init__(self)
        self.session: Optional[ChatSession] = None

    def do_activate(self) -> None:
        self.panel = ChatPanel(self._ask, self._cancel)
        self.panel.show_all()
        self.window.get_side_panel().add_titled(self.panel, "AcpGeditPanel", "Agent")
        action = Gio.SimpleAction(name=FOCUS_ACTION)
        action.connect("activate", lambda _action, _parameter: self.focus())
        self.window.add_action(action)
        Gio.Application.get_default().set_accels_for_action(f"win.{FOCUS_ACTION}", FOCUS_KEYS)
        self.panel.chat.note("Ctrl+Alt+A: ask the agent; Escape: cancel the turn")
        self.panel.chat.flush()

    def do_deactivate(self) -> None:
        """The window closes, gedit quits or the plugin is disabled: the agent goes with it."""
        if self.session is not None:
            session, self.session = self.session, None
            session.close()
        self.window.remove_action(FOCUS_ACTION)
        self.window.get_side_panel().remove(self.panel)

    def do_update_state(self) -> None:
        pass

    def focus(self) -> None:
        self.window.lookup_action("side-panel").change_state(GLib.Variant.new_boolean(True))
        self.window.get_side_panel().set_visible_child(self.panel)
        entry = self.panel.entry
        if entry.get_mapped():
            entry.grab_focus()
        else:  # the panel was hidden: focused before it is on screen, the entry would get this key's release
            self._mapping = entry.connect("map", self._mapped)

    def _mapped(self, entry: Any) -> None:
        entry.disconnect(self._mapping)
        entry.grab_focus()

    def _ask(self, text: str) -> None:
        if self.session is None:
            self.session = self._start()
        if self.session is not None:
            self.session.ask(text)

    def _cancel(self) -> None:
        if self.session is not None:
            self.session.cancel()

    def _start(self) -> Optional[ChatSession]:
        chat = self.panel.chat
        path = os.path.join(GLib.get_user_config_dir(), CONFIG_FILE)
        try:
            with open(path, encoding="utf-8") as f:
                argv = json.load(f)["agent"]
            if not (isinstance(argv, list) and argv and all(isinstance(a, str) for a in argv)):
                raise ValueError('"agent" must be a list of strings: the program and its arguments')
        except (OSError, ValueError, KeyError, TypeError) as error:
            chat.note(
                f'[error] no agent configured: write {{"agent": ["/path/to/agent"]}} to {path} ({error})', "error"
            )
            chat.flush()
            return None
        cwd = self._folder()
        try:
            return ChatSession(argv, cwd, self.panel, self._documents)
        except Exception as error:  # the command could not be started
            chat.note(f"[error] cannot start {argv}: {error}", "error")
            chat.flush()
            return None

    def _folder(self) -> str:
        """The active document's folder (the agent's cwd and the only place it may touch), or home."""
        document = self.window.get_active_document()
        location = document.get_file().get_location() if document is not None else None
        parent = location.get_parent() if location is not None else None
        folder = parent.get_path() if parent is not None else None
        return os.path.realpath(folder or GLib.get_home_dir())

    def _documents(self) -> List[Any]:
        return list(self.window.get_documents())
