"""``python -m acp_lite``: the ``acp-lite`` command (``acp_lite_cli``, beside the package).

Python imports the package itself before this module, so a Ctrl-C during that first part of the
import still ends in a traceback here; the rest (the tools) ends as with the ``acp-lite`` command:
one line, exit status 130.
"""

import sys

from acp_lite_cli import main

if __name__ == "__main__":
    sys.exit(main())
