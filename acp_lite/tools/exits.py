"""What every ``acp-lite`` command shares when it fails: the exit statuses and the one-line error.

Rules this module keeps: an error reaches the user as one line on stderr, prefixed ``acp-lite:``,
never a traceback; a closed stderr is not an error of its own. The statuses are the ones the
``cli`` module's docstring lists.
"""

import sys

# Ctrl-C (the shell's 128 + SIGINT).
INTERRUPTED = 130
# The agent's command could not be started (the shell's "command not found").
CANNOT_START = 127


def cli_error(text: str) -> None:
    # One write: print() writes the text and its newline apart, and a Ctrl-C between the two
    # would glue the next line to this one.
    try:
        sys.stderr.write(f"acp-lite: {text}\n")
        sys.stderr.flush()
    except OSError:  # stderr is gone (a closed terminal: SIGHUP)
        pass
