"""An agent named by a URL instead of a command: ``acp-lite run -- https://host/acp``.

The commands that take ``-- AGENT_CMD...`` (``run``, ``bench``, ``tap``, ``check``) take a single
``http://``, ``https://``, ``ws://`` or ``wss://`` URL there too, and then talk to that remote
agent (``acp_lite.remote``, which needs the extra ``acp-lite[remote]``) instead of spawning one.
"""

import re
from typing import Optional, Sequence

_URL = re.compile(r"(?i)(https?|wss?)://\S+\Z")


def agent_url(agent_command: Optional[Sequence[str]]) -> Optional[str]:
    """The URL when the agent command is one, else None."""
    if agent_command is not None and len(agent_command) == 1 and _URL.match(agent_command[0]):
        return agent_command[0]
    return None
