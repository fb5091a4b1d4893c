"""``argparse`` types for the command line's options, so that a bad value is a usage error (exit
status 2) before anything starts: no agent is spawned, no check runs, for a result that could
never be written or a timeout that can never be met.

Each type takes the option's text and returns the value, or raises ``ArgumentTypeError`` with
what is wrong; argparse prints it with the option's name.
"""

import argparse
import math
import os


def positive_seconds(text: str) -> float:
    """A duration in seconds, greater than zero and finite."""
    try:
        seconds = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not (seconds > 0 and math.isfinite(seconds)):
        raise argparse.ArgumentTypeError(f"must be a number of seconds greater than 0, not {text}")
    return seconds


def existing_directory(text: str) -> str:
    """An existing directory, made absolute."""
    path = os.path.abspath(text)
    if not os.path.exists(path):
        raise argparse.ArgumentTypeError(f"no such directory: {text}")
    if not os.path.isdir(path):
        raise argparse.ArgumentTypeError(f"not a directory: {text}")
    return path


def writable_file(text: str) -> str:
    """A file that can be created or overwritten: its directory exists (none is created), and
    the file can be opened for writing there, which is tried (a file that did not exist is
    removed again; one that did is left as it was): permissions alone do not tell, for root or
    on a special file system such as /proc."""
    directory = os.path.dirname(os.path.abspath(text))
    if os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text} is a directory, not a file")
    if not os.path.isdir(directory):
        raise argparse.ArgumentTypeError(f"cannot write {text}: no directory {directory} (it is not created)")
    existed = os.path.exists(text)
    try:
        fd = os.open(text, os.O_WRONLY | os.O_APPEND if existed else os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    except OSError as exc:
        raise argparse.ArgumentTypeError(f"cannot write {text}: {exc.strerror or exc}") from None
    os.close(fd)
    if not existed:
        os.unlink(text)
    return text


def writable_file_or_stdout(text: str) -> str:
    """``-`` for standard output, or a ``writable_file``."""
    return text if text == "-" else writable_file(text)
