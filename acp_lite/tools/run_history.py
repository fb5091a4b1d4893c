"""The prompt history of ``acp-lite run`` on a terminal: line editing with ``readline`` where
Python has it, and the prompts kept in a file, so that Up recalls them in the next run too.

Rules: the file is ``$XDG_STATE_HOME/acp-lite/run_history`` (``~/.local/state/...`` by default),
private to the user (0600, in a 0700 directory), at most ``_HISTORY_LENGTH`` prompts; ``--no-history``
keeps none (line editing stays). A history that cannot be read or written is said once and then
left alone: it never stops a session. Main thread only.
"""

import os
from typing import Any, Optional

_HISTORY_LENGTH = 1000


def _readline() -> Any:
    # Importing readline changes what input() does (line editing): only on a terminal, here.
    try:
        import readline
    except ImportError:  # Windows, or a Python built without it: plain input()
        return None
    return readline


class PromptHistory:
    """Line editing, and a history file (``path``, or none)."""

    def __init__(self, path: Optional[str]):
        self.path = path
        self._readline = _readline()
        self._broken = False

    @staticmethod
    def default_path() -> str:
        state = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
        return os.path.join(state, "acp-lite", "run_history")

    def load(self) -> str:
        """Read the history file; returns what went wrong, or ""."""
        if self._readline is None or self.path is None:
            return ""
        self._readline.set_history_length(_HISTORY_LENGTH)
        try:
            self._readline.read_history_file(self.path)
            self._readline.write_history_file(self.path)  # trimmed to the last _HISTORY_LENGTH
        except FileNotFoundError:
            pass
        except OSError as exc:
            self._broken = True
            return f"[history] not kept: cannot read {self.path}: {exc.strerror or exc}"
        return ""

    def add(self) -> str:
        """Keep the line just read (readline added it to the session's history already); returns
        what went wrong the first time something does, or ""."""
        if self._readline is None or self.path is None or self._broken:
            return ""
        try:
            os.makedirs(os.path.dirname(self.path), mode=0o700, exist_ok=True)
            if not os.path.exists(self.path):
                os.close(os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o600))
            self._readline.append_history_file(1, self.path)
        except OSError as exc:
            self._broken = True
            return f"[history] not kept: cannot write {self.path}: {exc.strerror or exc}"
        return ""
