"""bench/remote_scaleout.py in its smallest form, through a real HAProxy: clients on both nodes, no
request routed to a node other than its connection's, and after one node is killed its clients
reconnect to the other, load their session from the shared store and prompt again. No timing is
judged; nothing may be left running."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.timeout(120)
@pytest.mark.slow
@pytest.mark.skipif(shutil.which("haproxy") is None, reason="needs haproxy (Debian: apt-get install haproxy)")
def test_haproxy_routes_by_connection_and_a_killed_nodes_clients_reconnect_to_the_other():
    done = subprocess.run(
        [sys.executable, "-m", "bench.remote_scaleout", "--clients", "8", "--rate", "10"],
        cwd=REPO,
        capture_output=True,
        timeout=110,
    )
    assert done.returncode == 0, done.stdout.decode()[-3000:] + done.stderr.decode()[-3000:]
    result = json.loads(done.stdout)
    assert result["errors"] == 0
    assert set(result["clients_per_node"]) == {"n1", "n2"}
    assert result["before_kill"]["404s"] == 0 and result["before_kill"]["cross_node"] == 0
    assert result["reconnects"] == result["clients_on_killed_node"] > 0
    assert set(result["reconnects_landed_per_node"]) == {"n1"}
    assert result["updates_delivered"] == result["updates_expected"] == 8 * 2 * 10
    assert result["replayed_by_load"] == result["replayed_expected"]
    assert result["processes_left"] == 0  # HAProxy, the nodes and every agent, the killed ones too
