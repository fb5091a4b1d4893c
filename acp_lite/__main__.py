"""``python -m acp_lite`` and the ``acp-lite`` command: the command-line tool (see
``acp_lite.tools.cli``).

A Ctrl-C while the tools are still importing (seconds on a loaded machine) ends the command the
way one later does: one line, exit status 130, no traceback.
"""

import sys
from typing import Optional, Sequence


def main(argv: Optional[Sequence[str]] = None) -> int:
    try:
        from .tools.cli import main as cli_main
    except KeyboardInterrupt:
        sys.stderr.write("acp-lite: interrupted\n")
        return 130
    return cli_main(argv)


if __name__ == "__main__":
    sys.exit(main())
