"""The official SDKs acp_lite is compared with: installing them, and the commands of our adapters.

The Python SDK goes into its own venv ``bench/.peers/py`` (with matplotlib, which draws the chart)
and the TypeScript SDK into ``bench/.peers/node`` with npm; both folders are git-ignored. Installing
is idempotent: a peer whose pinned version is already there is used as is. A peer that cannot be
installed (no network, no node) is skipped with a message saying why, and the bench goes on
without it.
"""

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import List, Optional, Sequence

from shared import workload

BENCH = Path(__file__).resolve().parent
PEERS_DIR = BENCH / ".peers"
PY_SDK, PY_SDK_VERSION = "agent-client-protocol", "0.12.1"
TS_SDK, TS_SDK_VERSION = "@agentclientprotocol/sdk", "2.4.0"
INSTALL_TIMEOUT = 900


class Peer:
    """One runtime under test (acp_lite or an official SDK): the argv of its adapters.

    Every adapter script takes the same command line (see lite.py, peer_py.py, peer_ts.mjs).
    """

    def __init__(self, name: str, version: str, launcher: List[str]):
        self.name = name
        self.version = version
        self.launcher = launcher  # interpreter and adapter script, plus any fixed leading arguments

    def client_a(self, agent_argv: List[str], options: Sequence[str] = ()) -> List[str]:
        return [*self.launcher, "client-a", *options, "--", *agent_argv]

    def agent(self, n: int, stream_file: Path) -> List[str]:
        return [*self.launcher, "agent", "--n", str(n), "--updates", str(stream_file)]

    def client_c(self, k: int, inflight: int, agent_argv: List[str], options: Sequence[str] = ()) -> List[str]:
        return [*self.launcher, "client-c", "--k", str(k), "--inflight", str(inflight), *options, "--", *agent_argv]

    def paced_agent(self) -> List[str]:
        return [*self.launcher, "agent", "--paced"]

    def client_d(self, rates: Sequence[float], seconds: float, agent_argv: List[str]) -> List[str]:
        return [*self.launcher, "client-d", *paced_options(rates, seconds), "--", *agent_argv]


def paced_options(rates: Sequence[float], seconds: float) -> List[str]:
    """The options of a workload D client (its turns: see pacing.py)."""
    return ["--rates", ",".join(f"{rate:g}" for rate in rates), "--seconds", f"{seconds:g}"]


def _run(argv: List[str], what: str) -> bool:
    try:
        done = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=INSTALL_TIMEOUT)
    except (OSError, subprocess.TimeoutExpired) as exc:
        print(f"[peers] skipping {what}: {exc}", file=sys.stderr)
        return False
    if done.returncode != 0:
        tail = done.stdout.decode(errors="replace").strip().splitlines()[-3:]
        print(f"[peers] skipping {what}: install failed:\n    " + "\n    ".join(tail), file=sys.stderr)
        return False
    return True


def _venv_has(python: Path, dist: str, version: str) -> bool:
    if not python.exists():
        return False
    probe = f"import importlib.metadata as m; print(m.version({dist!r}))"
    done = subprocess.run([str(python), "-c", probe], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    return done.returncode == 0 and done.stdout.decode().strip() == version


def peers_python() -> Path:
    return PEERS_DIR / "py" / "bin" / "python"


def install_python_sdk() -> Optional[Peer]:
    python = peers_python()
    if not _venv_has(python, PY_SDK, PY_SDK_VERSION):
        if not python.exists() and not _run(
            [sys.executable, "-m", "venv", str(python.parent.parent)], "the Python SDK (cannot create its venv)"
        ):
            return None
        if not _run(
            [str(python), "-m", "pip", "install", "-q", f"{PY_SDK}=={PY_SDK_VERSION}"],
            f"the Python SDK ({PY_SDK}=={PY_SDK_VERSION} unreachable?)",
        ):
            return None
    return Peer("python-sdk", PY_SDK_VERSION, [str(python), str(BENCH / "peer_py.py")])


def install_chart_tools() -> Optional[Path]:
    """The peers venv's python once matplotlib is in it, else None (the chart is then skipped)."""
    python = peers_python()
    if not python.exists():
        return None
    probe = subprocess.run([str(python), "-c", "import matplotlib"], stderr=subprocess.DEVNULL)
    if probe.returncode == 0 or _run(
        [str(python), "-m", "pip", "install", "-q", "matplotlib"], "the chart (matplotlib unreachable?)"
    ):
        return python
    return None


def install_typescript_sdk() -> Optional[Peer]:
    node, npm = shutil.which("node"), shutil.which("npm")
    if not node or not npm:
        print("[peers] skipping the TypeScript SDK: node and npm are not on PATH", file=sys.stderr)
        return None
    prefix = PEERS_DIR / "node"
    package_json = prefix / "node_modules" / TS_SDK / "package.json"
    if not package_json.exists() or json.loads(package_json.read_text())["version"] != TS_SDK_VERSION:
        prefix.mkdir(parents=True, exist_ok=True)
        if not (prefix / "package.json").exists():
            (prefix / "package.json").write_text('{"private": true}\n')
        if not _run(
            [npm, "install", "--prefix", str(prefix), "--no-audit", "--no-fund", f"{TS_SDK}@{TS_SDK_VERSION}"],
            f"the TypeScript SDK ({TS_SDK}@{TS_SDK_VERSION} unreachable?)",
        ):
            return None
    # The adapter imports the file the package exports as "." so it uses only the public entry point.
    exports = json.loads(package_json.read_text())["exports"]["."]
    entry = package_json.parent / exports["import"]
    return Peer("typescript-sdk", TS_SDK_VERSION, [node, str(BENCH / "peer_ts.mjs"), str(entry), workload.PING_METHOD])


def install_peers() -> List[Peer]:
    return [peer for peer in (install_python_sdk(), install_typescript_sdk()) if peer is not None]
