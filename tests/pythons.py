"""Find a working interpreter of a given Python version on this machine.

Used by ``tests/test_py39.py`` and by ``.ci/run`` (``python tests/pythons.py 3.9`` prints its path,
or exits 1 when there is none). Looks at pyenv's installed versions (``$PYENV_ROOT``, else
``~/.pyenv``), then ``pythonX.Y`` on the PATH; a candidate counts only when it runs and reports
that version (a pyenv shim for a version that is not active does not).
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Iterator, Optional


def _candidates(version: str) -> Iterator[str]:
    root = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv")
    installed = sorted(
        root.glob(f"versions/{version}.*/bin/python{version}"),
        key=lambda path: [int(part) for part in path.parent.parent.name.split(".") if part.isdigit()],
        reverse=True,
    )  # the newest patch release first
    yield from map(str, installed)
    on_path = shutil.which(f"python{version}")
    if on_path:
        yield on_path


def find_python(version: str) -> Optional[str]:
    """The path of an interpreter that runs as Python ``version`` ("3.9"), or None."""
    for candidate in _candidates(version):
        try:
            done = subprocess.run(
                [candidate, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                capture_output=True,
                text=True,
                timeout=30,
            )
        except (OSError, subprocess.TimeoutExpired):
            continue
        if done.returncode == 0 and done.stdout.strip() == version:
            return candidate
    return None


if __name__ == "__main__":
    found = find_python(sys.argv[1])
    if found is None:
        sys.exit(1)
    print(found)
