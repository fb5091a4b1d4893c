"""A stand-in for a synchronous editor host, running the plugin against the example agent.

    python -m acp_lite.tools.vendor examples/plugin/acp_plugin/_acp.py   # once, and after each upgrade
    python examples/plugin/host.py [-- AGENT_COMMAND...]

The "editor" has one main thread that runs whatever is posted to it, in order; its permission
dialog is answered by a scripted user who allows once. It opens a session with the agent
(``examples/agent.py`` by default), asks one question, asks a slow one and cancels it as soon as
text streams in, then prints the panel and the two stop reasons.
"""

import os
import queue
import sys
import time
from pathlib import Path
from typing import Any, Callable, List, Optional

from acp_plugin.plugin import AgentSession

EXAMPLE_AGENT = Path(__file__).resolve().parent.parent / "agent.py"


class EditorHost:
    """The editor's main loop: one thread runs posted functions in order."""

    def __init__(self) -> None:
        self._posted: queue.Queue[Callable[[], Any]] = queue.Queue()

    def post(self, fn: Callable[[], Any]) -> None:
        """Run ``fn()`` on the main thread soon. Any thread."""
        self._posted.put(fn)

    def show_choices(self, title: str, labels: List[str], on_done: Callable[[Optional[int]], None]) -> None:
        """A choice list answered by the scripted user (allow once), later, on the main thread."""
        choice = next((i for i, label in enumerate(labels) if label.lower().startswith("allow")), None)
        print(f"[dialog] {title} {labels} -> {labels[choice] if choice is not None else 'dismissed'}")
        self.post(lambda: on_done(choice))

    def run_until(self, condition: Callable[[], bool], timeout: float = 30.0) -> None:
        """Run posted functions on this (the main) thread until ``condition()`` holds."""
        deadline = time.monotonic() + timeout
        while not condition():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("the host loop waited too long")
            try:
                fn = self._posted.get(timeout=remaining)
            except queue.Empty:
                continue
            fn()


def main(argv: List[str]) -> int:
    agent_command = argv[argv.index("--") + 1 :] if "--" in argv else [sys.executable, str(EXAMPLE_AGENT)]
    host = EditorHost()
    session = AgentSession(host, agent_command, cwd=os.getcwd())
    try:
        ready: List[Optional[BaseException]] = []
        session.start(ready.append)
        host.run_until(lambda: bool(ready))
        if ready[0] is not None:
            print(f"[error] {ready[0]}")
            return 1

        stop_reasons: List[str] = []
        session.ask("Check this project for configuration issues", stop_reasons.append)
        host.run_until(lambda: len(stop_reasons) == 1)

        session.ask("wait: slow full-repo analysis", stop_reasons.append)
        host.run_until(lambda: session.panel.lines[-1].startswith("Long analysis"))
        session.cancel()
        host.run_until(lambda: len(stop_reasons) == 2)
    finally:
        session.close()

    for line in session.panel.lines:
        print(f"[panel] {line}")
    print(f"[stop] {' '.join(stop_reasons)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
