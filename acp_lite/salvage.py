"""What can still be read of a line that does not decode, so that bad input is answered as
precisely as it can be. Used only on the rare lines that take this path.
"""

import json
import re
from typing import Any, List, Optional, Tuple

# An oversized or unreadable frame is dropped; if its first bytes show a top-level id (after
# nothing but "jsonrpc"/"method" strings), the request can still be answered or the call failed.
HEAD_ID = re.compile(
    rb'\s*\{(?P<before>(?:\s*"(?:jsonrpc|method)"\s*:\s*"[^"\\]*"\s*,)*)'
    rb'\s*"id"\s*:\s*(?P<id>-?\d+|"[^"\\]*")\s*,\s*"(?P<next>\w+)"'
)


def read_leniently(text: bytes) -> Any:
    """A line msgspec refused, as the json module reads it (it accepts lone surrogates), or None if that fails too."""
    try:
        return json.loads(text.decode("utf-8"))  # (json.loads of bytes would let encoded surrogates through)
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        return None


# A UTF-16 code unit of a surrogate pair, alone: in a str that json.loads read, only a lone one.
_SURROGATE = re.compile("[\ud800-\udfff]")
_WHERE_LIMIT = 200  # characters of the JSON path an answer names (keys may be long)


def lone_surrogate(value: Any) -> Optional[str]:
    """Where a value ``read_leniently`` read holds a lone surrogate (valid JSON, but no Unicode
    text: msgspec refuses it with a message about truncation or pairs), said for the peer, e.g.
    ``$.params.path holds a lone surrogate (\\ud800)``; None when it holds none."""
    pending: List[Tuple[str, Any]] = [("$", value)]
    while pending:  # no recursion: json.loads accepted nesting deeper than the stack has left
        path, item = pending.pop()
        if isinstance(item, str):
            found = _SURROGATE.search(item)
            if found:
                where = path if len(path) <= _WHERE_LIMIT else path[:_WHERE_LIMIT] + "..."
                return f"{where} holds a lone surrogate (\\u{ord(found.group()):04x})"
        elif isinstance(item, dict):
            # The keys go on top, so they are checked before a path is named after them.
            pending.extend((f"{path}.{key}", member) for key, member in item.items())
            pending.extend((f"a key of {path}", key) for key in item)
        elif isinstance(item, list):
            pending.extend((f"{path}[{index}]", member) for index, member in enumerate(item))
    return None
