"""``python -m acp_lite``: the command-line tool (see ``acp_lite.cli``)."""
import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
