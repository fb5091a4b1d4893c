"""Where the interop tests find their peers (the official SDKs, and acpx, a real headless client),
and how they get there.

The TypeScript SDK and acpx are installed with npm into ``tests/interop/.peers/node`` and the Python SDK into
its own venv ``tests/interop/.peers/py`` (it must never share a venv with acp_lite). Both folders are
git-ignored. ``.ci/run`` installs them before the tests with::

    python tests/interop/interop_peers.py

which is idempotent (a peer already at its pinned version is left alone) and always exits 0: a peer
that cannot be installed (no node, registry unreachable) is reported on stderr, and the tests that
need it skip, naming the reason; under CI (the ``CI`` environment variable set) they fail instead,
so that a CI run never passes with its interop tests quietly skipped. The tests themselves never
install anything.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, NoReturn, Optional, Tuple

HERE = Path(__file__).resolve().parent
PEERS = HERE / ".peers"
NODE_PREFIX = PEERS / "node"
PY_VENV = PEERS / "py"

TS_SDK, TS_SDK_VERSION = "@agentclientprotocol/sdk", "2.4.0"
PY_SDK, PY_SDK_VERSION = "agent-client-protocol", "0.12.1"
# The remote transports' peers: the Python SDK's ``http`` extra (httpx, websockets) and an ASGI server
# for its ``create_asgi_app``; ``ws`` for the TypeScript SDK's WebSocket server and client.
PY_SDK_EXTRA = "http"
UVICORN, UVICORN_VERSION = "uvicorn", "0.35.0"
WS, WS_VERSION = "ws", "8.23.1"
# The last acpx release whose engines accept node 18 and 20 (later ones want node >= 22.12).
ACPX, ACPX_VERSION = "acpx", "0.1.15"

# A registry that does not answer must not hold CI up for long: the package clients give up
# after these, and the whole step after INSTALL_SECONDS.
INSTALL_SECONDS = 300
_NPM_NETWORK = ["--fetch-timeout=30000", "--fetch-retries=1"]
_PIP_NETWORK = ["--timeout", "30", "--retries", "1"]


def _npm_package(name: str, version: str) -> Optional[Tuple[Path, Dict[str, Any]]]:
    """The folder and package.json of an npm package installed at ``version``, or None."""
    package_json = NODE_PREFIX / "node_modules" / name / "package.json"
    if not package_json.exists():
        return None
    manifest = json.loads(package_json.read_text())
    return (package_json.parent, manifest) if manifest.get("version") == version else None


def ts_sdk_entry() -> Optional[Path]:
    """The pinned TypeScript SDK's public entry module, or None when it is not installed."""
    found = _npm_package(TS_SDK, TS_SDK_VERSION)
    return found[0] / found[1]["exports"]["."]["import"] if found else None


def ts_sdk_v2_entry() -> Optional[Path]:
    """The pinned TypeScript SDK's experimental v2 module, or None when it is not installed."""
    found = _npm_package(TS_SDK, TS_SDK_VERSION)
    return found[0] / found[1]["exports"]["./experimental/v2"]["import"] if found else None


def ts_ws_installed() -> bool:
    """Whether the pinned ``ws`` (the TypeScript SDK's WebSocket peer) is installed."""
    return _npm_package(WS, WS_VERSION) is not None


def acpx_cli() -> Optional[Path]:
    """The pinned acpx's command-line script (run it with node), or None when it is not installed."""
    found = _npm_package(ACPX, ACPX_VERSION)
    return found[0] / found[1]["bin"]["acpx"] if found else None


def unavailable(reason: str) -> NoReturn:
    """Skip the calling test because a peer is missing, or fail it under CI (see the docstring)."""
    import pytest  # only the tests call this; the installer runs without pytest

    if os.environ.get("CI"):
        pytest.fail(f"{reason} (under CI an interop peer must be there: run python tests/interop/interop_peers.py)")
    pytest.skip(reason)


def node_package_or_unavailable(what: str, located: Optional[Path]) -> Path:
    """``located`` (a path in an npm package, None when it is not installed), else skip the
    calling test, or fail it under CI, saying why: no node, or ``what`` not installed."""
    problem = why_no_node()
    if problem is not None:
        unavailable(f"{what} unavailable: {problem}")
    if located is None:
        unavailable(f"{what} is not installed (run: python tests/interop/interop_peers.py; .ci/run does)")
    return located


def py_sdk_python() -> Optional[Path]:
    """The interpreter of the venv holding the pinned Python SDK, or None when it is not there."""
    python = PY_VENV / "bin" / "python"
    if not python.exists():
        return None
    # The http extra and the ASGI server too: a venv from before they were pinned lacks them.
    probe = f"import importlib.metadata as m, httpx, websockets; print(m.version({PY_SDK!r}), m.version({UVICORN!r}))"
    done = subprocess.run([str(python), "-c", probe], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    if done.returncode != 0 or done.stdout.decode().split() != [PY_SDK_VERSION, UVICORN_VERSION]:
        return None
    return python


def why_no_node() -> Optional[str]:
    """Why the TypeScript peer cannot run here, or None when node and npm are on PATH."""
    missing = [tool for tool in ("node", "npm") if shutil.which(tool) is None]
    return f"{' and '.join(missing)} not on PATH" if missing else None


def _install(argv: List[str]) -> Optional[str]:
    """Run an install command; None on success, else the reason it failed."""
    try:
        done = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=INSTALL_SECONDS)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    if done.returncode != 0:
        return "\n".join(done.stdout.decode(errors="replace").strip().splitlines()[-5:])
    return None


def install_typescript_sdk() -> Optional[str]:
    """Install the pinned TypeScript SDK unless present; None on success, else why not."""
    if ts_sdk_entry() is not None:
        return None
    return _npm_install(f"{TS_SDK}@{TS_SDK_VERSION}")


def install_ws() -> Optional[str]:
    """Install the pinned ``ws`` unless present; None on success, else why not."""
    if ts_ws_installed():
        return None
    return _npm_install(f"{WS}@{WS_VERSION}")


def install_acpx() -> Optional[str]:
    """Install the pinned acpx unless present; None on success, else why not."""
    if acpx_cli() is not None:
        return None
    return _npm_install(f"{ACPX}@{ACPX_VERSION}")


def _npm_install(package: str) -> Optional[str]:
    problem = why_no_node()
    if problem is not None:
        return problem
    NODE_PREFIX.mkdir(parents=True, exist_ok=True)
    package_json = NODE_PREFIX / "package.json"
    if not package_json.exists():
        package_json.write_text('{"private": true}\n')
    npm = [shutil.which("npm") or "npm", "install", "--prefix", str(NODE_PREFIX), "--no-audit", "--no-fund"]
    return _install(npm + _NPM_NETWORK + [package])


def install_python_sdk() -> Optional[str]:
    """Create the peer venv and install the pinned Python SDK unless present; None on success."""
    if py_sdk_python() is not None:
        return None
    python = PY_VENV / "bin" / "python"
    if not python.exists():
        problem = _install([sys.executable, "-m", "venv", str(PY_VENV)])
        if problem is not None:
            return problem
    packages = [f"{PY_SDK}[{PY_SDK_EXTRA}]=={PY_SDK_VERSION}", f"{UVICORN}=={UVICORN_VERSION}"]
    return _install([str(python), "-m", "pip", "install", "-q", *_PIP_NETWORK, *packages])


def main() -> int:
    for name, install in (
        (f"{TS_SDK}@{TS_SDK_VERSION}", install_typescript_sdk),
        (f"{WS}@{WS_VERSION}", install_ws),
        (f"{ACPX}@{ACPX_VERSION}", install_acpx),
        (f"{PY_SDK}[{PY_SDK_EXTRA}]=={PY_SDK_VERSION} and {UVICORN}=={UVICORN_VERSION}", install_python_sdk),
    ):
        problem = install()
        if problem is None:
            print(f"interop peer ready: {name}", file=sys.stderr)
        else:
            print(f"interop peer unavailable, its tests will skip: {name}: {problem}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
