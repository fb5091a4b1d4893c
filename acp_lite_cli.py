"""The ``acp-lite`` command's entry point (pyproject.toml's ``[project.scripts]``; ``python -m
acp_lite`` runs it too).

A module of its own, outside the package: importing ``acp_lite`` (msgspec, the generated schema,
the tools) takes seconds on a loaded machine, and a Ctrl-C meanwhile must end the command as one
later does (one line, exit status 130, no traceback). An entry point inside the package could not
catch it: Python imports the package before any of its modules' code runs. So this module
imports nothing of acp_lite until its handler is in place.
"""

import sys

# The status of cli.py's "interrupted" (exits.INTERRUPTED), which cannot be imported before the
# handler is in place.
_INTERRUPTED = 130


def main() -> int:
    """Run the command line ``sys.argv[1:]``; returns the exit status."""
    try:
        from acp_lite.tools.cli import main as cli_main

        return cli_main()
    except KeyboardInterrupt:  # while importing, or building the parser: cli.main handles the rest
        try:
            sys.stderr.write("acp-lite: interrupted\n")
        except OSError:  # stderr is gone (a closed terminal)
            pass
        return _INTERRUPTED
