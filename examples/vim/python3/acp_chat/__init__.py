"""acp_chat: a chat with a coding agent in a Vim buffer, over the Agent Client Protocol.

``_acp.py`` is acp_lite in one file, generated and not committed: build it with
``python -m acp_lite.tools.vendor examples/vim/python3/acp_chat/_acp.py``. Apart from it the
plugin needs only msgspec, installed for the Python that Vim links, which ``missing()`` checks
before anything else is imported (an import error inside Vim is a traceback and a Press-ENTER
prompt). ``chat.py`` is the plugin; ``autoload/acp_chat.vim`` its Vim half.
"""

import importlib.util
import os
import sys
from typing import List

# The plugin's python3 directory: Vim puts it on the import path, so msgspec can live there.
PLUGIN_PYTHON_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def missing() -> List[str]:
    """What the plugin lacks to start, as lines to show with the command that fixes it; [] when
    nothing is missing."""
    if importlib.util.find_spec(f"{__name__}._acp") is None:
        return [
            "acp_lite's single file is missing: build it with",
            f"  python3 -m acp_lite.tools.vendor {os.path.join(os.path.dirname(__file__), '_acp.py')}",
        ]
    try:
        import msgspec  # noqa: F401
    except ImportError:
        version = f"{sys.version_info[0]}.{sys.version_info[1]}"
        return [
            f"msgspec is missing for Vim's Python {version}: install it with",
            f"  python3 -m pip install --target {PLUGIN_PYTHON_DIR} --python-version {version}"
            " --only-binary=:all: msgspec",
        ]
    return []
