"""bench/remote_load.py in its smallest form: it must run end to end over both transports, deliver
every update, and leave the server's threads back at rest after close. No timing is judged."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.timeout(180)
@pytest.mark.slow
def test_the_remote_load_script_runs_and_the_server_returns_to_rest():
    done = subprocess.run(
        [sys.executable, "-m", "bench.remote_load", "--connections", "6", "--rate", "20", "--idle", "1"],
        cwd=REPO,
        capture_output=True,
        timeout=170,
    )
    assert done.returncode == 0, done.stdout.decode()[-3000:] + done.stderr.decode()[-3000:]
    result = json.loads(done.stdout)
    assert result["errors"] == 0 and result["updates_delivered"] == 6 * 20
    assert result["server_after_close"]["threads"] == result["server_at_rest"]["threads"]
