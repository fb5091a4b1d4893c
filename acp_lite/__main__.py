"""``python -m acp_lite``: the command-line tool (see ``acp_lite.tools.cli``)."""

import sys

from .tools.cli import main

if __name__ == "__main__":
    sys.exit(main())
