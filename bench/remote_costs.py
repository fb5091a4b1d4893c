"""What acp_lite's remote server spends, in instructions, on each update it streams (workload A)
and on each round trip it answers (workload C, sequential), over Streamable HTTP and WebSocket.

    python bench/remote_costs.py [--workload A|C] [--scheme http|ws] [--small N] [--large N]

The server (``lite.py agent --serve``) runs under valgrind's callgrind and serves a real client in
a process of its own (``lite.py client-a`` or ``client-c``, not counted). The figure is
(I(large) - I(small)) / (large - small), where I is every instruction the server's threads ran
from start to exit, so start-up and shutdown cancel out. An instruction count is the same from
run to run whatever else the machine does (within about 1%), so it shows a change to the server's
hot paths where the load moves timings by 2x; it does not see what waking a thread costs
(``remote_speed`` measures the whole). Needs valgrind; each figure takes a minute or two. Run
with ``PYTHONPATH=ROOT`` to measure another build (a folder holding an ``acp_lite`` package).

Valgrind runs the server about 50 times slower, which changes what the server decides by the
clock: over WebSocket an agent's frame that follows the last by more than 50 us is written by the
agent's thread itself (``server_routes.RemoteConnection.route``), so under valgrind every update
of A is, where a real turn's updates are batched by the loop. A over WebSocket is therefore left
out unless asked for (``--workload A --scheme ws``), and its figure is not a real turn's.
"""

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import List

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(BENCH.parent / "tests" / "interop"))

import run  # noqa: E402
from remote_speed import Server  # noqa: E402
from streams import stream_file  # noqa: E402

# Valgrind runs Python about 50 times slower: its start-up alone takes seconds.
_SERVER_START_SECONDS = 120.0
_CLIENT_SECONDS = 600.0


def server_instructions(workload: str, scheme: str, count: int, scratch: Path) -> int:
    """Every instruction of one server process that streams ``count`` updates in one turn (A) or
    answers ``count`` sequential pings (C) to one client, then exits."""
    lite = run.acp_lite_peer()
    out = scratch / f"callgrind-{workload}-{scheme}-{count}"
    out.mkdir()
    updates = count if workload == "A" else 0
    agent = lite.agent(updates, stream_file(scratch, "mix", max(updates, 1)))
    valgrind = ["valgrind", "--quiet", "--tool=callgrind", f"--callgrind-out-file={out}/out.%p"]
    server = Server([*valgrind, *agent], scratch / "port", start_seconds=_SERVER_START_SECONDS)
    try:
        url = f"{scheme}://127.0.0.1:{server.port}/acp"
        client = lite.client_a([url]) if workload == "A" else lite.client_c(count, 1, [url])
        subprocess.run(client, stdout=subprocess.DEVNULL, check=True, timeout=_CLIENT_SECONDS)
    finally:
        server.stop(wait_seconds=_SERVER_START_SECONDS)
    totals = [int(m.group(1)) for f in out.iterdir() for m in re.finditer(r"^totals: (\d+)", f.read_text(), re.M)]
    if not totals:
        raise RuntimeError(f"callgrind wrote no totals in {out}")
    return sum(totals)


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(prog="python bench/remote_costs.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", choices=["A", "C"], action="append", help="A, C or both (default both)")
    parser.add_argument(
        "--scheme", choices=["http", "ws"], action="append", help="http, ws or both (default: http for A, both for C)"
    )
    parser.add_argument("--small", type=int, help="updates (A) or requests (C) of the smaller run")
    parser.add_argument("--large", type=int, help="... of the larger run")
    args = parser.parse_args(argv)
    if shutil.which("valgrind") is None:
        print("remote_costs: valgrind is not installed (Debian: apt-get install valgrind)", file=sys.stderr)
        return 2
    sizes = {"A": (5_000, 50_000), "C": (200, 1_200)}
    with tempfile.TemporaryDirectory(prefix="acp-remote-costs-") as scratch:
        for workload in args.workload or ["A", "C"]:
            small, large = args.small or sizes[workload][0], args.large or sizes[workload][1]
            if large <= small:
                parser.error("--large must be over --small")
            for scheme in args.scheme or (["http"] if workload == "A" else ["http", "ws"]):
                counts = [server_instructions(workload, scheme, n, Path(scratch)) for n in (small, large)]
                per = (counts[1] - counts[0]) / (large - small)
                unit = "update" if workload == "A" else "round trip"
                print(f"{workload} over {scheme}: {per:,.0f} server instructions per {unit} ({small:,} and {large:,})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
