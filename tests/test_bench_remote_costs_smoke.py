"""bench/remote_costs.py in its smallest form: the server under callgrind, a handful of round
trips over WebSocket, the figure printed. Nothing here judges the figure beyond its being a
plausible count (that is the bench's job). Under CI=true it never skips (.ci/run installs valgrind)."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.timeout(300)
@pytest.mark.slow
def test_the_remote_costs_bench_counts_the_servers_instructions_per_round_trip():
    if shutil.which("valgrind") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("CI must run the remote costs bench: valgrind is missing (.ci/run installs it)")
        pytest.skip("valgrind is not installed")
    command = ["bench/remote_costs.py", "--workload", "C", "--scheme", "ws", "--small", "10", "--large", "30"]
    done = subprocess.run([sys.executable, *command], cwd=REPO, capture_output=True, timeout=290)
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    found = re.fullmatch(
        r"C over ws: ([\d,]+) server instructions per round trip \(10 and 30\)\n", done.stdout.decode()
    )
    assert found, done.stdout.decode()
    assert 10_000 < int(found.group(1).replace(",", "")) < 10_000_000
