"""How ``acp-lite run`` shows things: colour, and what a tool call is about.

Rules: colour only on a terminal and never when ``NO_COLOR`` is set (https://no-color.org); the
agent's text keeps the terminal's own colour, everything else is marked by kind. What a tool call
is about (its kind, the paths it touches, a diff for an edit, the command for an execute, the
reason of a failure) is shown in a bounded number of lines, each of bounded width, whatever the
agent sent: a permission question must never scroll its options out of sight.
"""

import difflib
import json
import os
from typing import IO, Any, Dict, Iterable, List, Optional

from ..codec import UnknownVariant
from ..schema import Content, Diff, Terminal, TextContent

# At most this many lines of detail (a diff, a command, a failure's reason), each this wide.
DETAIL_LINES = 12
DETAIL_WIDTH = 160

_CODES = {"dim": "2", "bold": "1", "red": "31", "green": "32", "yellow": "33", "cyan": "36", "magenta": "35"}


class Style:
    """ANSI colour for one stream, or none: ``paint`` returns the text as it is when off."""

    def __init__(self, stream: IO[str]):
        self.on = _is_terminal(stream) and "NO_COLOR" not in os.environ

    def paint(self, text: str, *styles: str) -> str:
        if not self.on or not styles:
            return text
        codes = ";".join(_CODES[style] for style in styles)
        return f"\033[{codes}m{text}\033[0m"


def _is_terminal(stream: IO[str]) -> bool:
    try:
        return stream.isatty()
    except (ValueError, OSError):  # closed
        return False


def clip(text: str, width: int = DETAIL_WIDTH) -> str:
    """One line of at most ``width`` characters (control characters shown escaped)."""
    line = text.replace("\r", "\\r").replace("\t", "    ")
    line = "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in line)
    return line if len(line) <= width else line[: width - 1] + "…"


def bounded(lines: Iterable[str], limit: int = DETAIL_LINES) -> List[str]:
    """The first ``limit`` lines, clipped, and a line saying how many more there were."""
    taken: List[str] = []
    more = 0
    for line in lines:
        if len(taken) < limit:
            taken.append(clip(line))
        else:
            more += 1
    if more:
        taken.append(f"… ({more} more line{'s' if more > 1 else ''})")
    return taken


def tool_call_details(call: Dict[str, Any]) -> List[str]:
    """What a tool call is about, as lines: where it acts, then its content (a diff for an edit,
    the command for an execute, text otherwise). ``call`` holds what the agent has said of it so
    far (``locations``, ``content``, ``raw_input``, ``kind``)."""
    lines = [
        f"at {location.path}" + (f":{location.line}" if location.line is not None else "")
        for location in call.get("locations") or ()
    ][:DETAIL_LINES]
    command = _command(call.get("raw_input"))
    if command and call.get("kind") == "execute":
        lines.append(f"$ {command}")
    for item in call.get("content") or ():
        lines.extend(_content_lines(item))
    return bounded(lines, DETAIL_LINES * 2)


def _command(raw_input: Any) -> Optional[str]:
    """The command line an execute tool call carries in its raw input, if it says one."""
    if not isinstance(raw_input, dict):
        return None
    command = raw_input.get("command") or raw_input.get("cmd")
    if isinstance(command, list):
        return " ".join(str(part) for part in command)
    return str(command) if command else None


def _content_lines(item: Any) -> List[str]:
    if isinstance(item, Diff):
        diff = difflib.unified_diff(
            (item.old_text or "").splitlines(),
            item.new_text.splitlines(),
            fromfile=item.path if item.old_text is not None else "/dev/null",
            tofile=item.path,
            lineterm="",
        )
        return bounded(diff)
    if isinstance(item, Terminal):
        return [f"[terminal {item.terminal_id}]"]
    if isinstance(item, Content):
        return bounded(block_text(item.content).splitlines())
    if isinstance(item, UnknownVariant):
        return [f"[{item.tag or 'content'}]"]
    return []


def block_text(block: Any) -> str:
    """A content block as text: its text, or what it is."""
    if isinstance(block, TextContent):
        return block.text
    uri = getattr(block, "uri", None)
    return f"[{getattr(block, 'type', 'content')}{' ' + uri if uri else ''}]"


def failure_reason(call: Dict[str, Any]) -> List[str]:
    """Why a failed tool call failed, as the agent said it: its text content, else its raw output."""
    texts = [block_text(item.content) for item in call.get("content") or () if isinstance(item, Content)]
    if texts:
        return bounded("\n".join(texts).splitlines(), 6)
    output = call.get("raw_output")
    if output is None:
        return []
    text = output if isinstance(output, str) else json.dumps(output, ensure_ascii=False)
    return bounded(text.splitlines(), 6)
