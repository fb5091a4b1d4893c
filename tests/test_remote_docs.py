"""The server snippet of docs/remote.md runs as pasted (on a free port instead of 8000) and serves."""

import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from remote_driver import initialize

DOC = Path(__file__).resolve().parent.parent / "docs" / "remote.md"


@pytest.mark.timeout(60)
def test_the_server_snippet_serves_and_stops_on_ctrl_c(tmp_path):
    server_half = DOC.read_text().split("# Remote agents: the server side", 1)[1]
    code = re.search(r"```python\n(.*?)```", server_half, re.S).group(1)
    assert "port=8000" in code
    script = tmp_path / "serve.py"
    script.write_text(code.replace("port=8000", "port=0"))
    process = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        line = process.stdout.readline().decode()
        assert line.startswith("serving at http://127.0.0.1:"), line + process.stderr.read().decode()
        port = int(line.split()[2].rsplit(":", 1)[1].split("/")[0])
        initialize(("127.0.0.1", port))
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(20)
        process.stdout.close()
        process.stderr.close()
