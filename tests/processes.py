"""What the editor-plugin tests (test_vim_plugin.py, test_gedit_plugin.py) ask of /proc: an editor's
child processes (its agents), and whether one of them has exited."""

import time
from pathlib import Path
from typing import List


def children(pid: int) -> List[int]:
    """The child processes of ``pid``, over all its threads."""
    return [
        int(child) for task in Path(f"/proc/{pid}/task").iterdir() for child in (task / "children").read_text().split()
    ]


def gone(pid: int, wait: float = 20.0) -> bool:
    """Whether ``pid`` has exited (and been reaped) within ``wait`` seconds."""
    deadline = time.monotonic() + wait
    while Path(f"/proc/{pid}").exists():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True
