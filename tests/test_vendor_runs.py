"""The protocol scenarios of test_vendor_scenarios.py, run against the package in this process and
against a freshly built single file in a process where only the standard library, msgspec and
that file (as ``my_plugin._acp``) can be imported; and the plugin skeleton of examples/plugin."""

import ast
import importlib.util
import os
import shutil
import subprocess
import sys
import types
from pathlib import Path

import msgspec
import pytest
import test_vendor_scenarios as scenarios

import acp_lite
from acp_lite.tools import vendor

VENDORED_NAME = "my_plugin._acp"
EXAMPLES = Path(__file__).resolve().parent.parent / "examples"

REQUIREMENTS = {
    "lifecycle": (
        "ACP-V1-INIT-AGENT-RESPONSE",
        "ACP-V1-SETUP-NEW-SESSION-ID",
        "ACP-V1-PROMPT-RESPOND-WITH-STOP-REASON",
        "ACP-V1-PROMPT-PERMISSION-MAY",
        "ACP-V1-PROMPT-UPDATES-BEFORE-RESPONSE",
    ),
    "cancellation": ("ACP-V1-PROMPT-CLIENT-CANCEL-MAY", "ACP-V1-PROMPT-AGENT-CANCELLED-STOP-REASON"),
    "bad_input": ("ACP-V1-SCHEMA-ERROR-OBJECT", "ACP-V1-JSONRPC-RESPONSE-ID-ECHO"),
    "codec_round_trip": ("ACP-V1-SCHEMA-SESSION-UPDATE-VARIANTS",),
}


@pytest.fixture(scope="module")
def msgspec_only(tmp_path_factory):
    """A directory holding nothing but msgspec."""
    deps = tmp_path_factory.mktemp("deps")
    (deps / "msgspec").symlink_to(Path(msgspec.__file__).parent, target_is_directory=True)
    return deps


def run_isolated(path, args, cwd):
    """Run Python with only the standard library and the directories ``path`` importable."""
    # -S: no site-packages, so neither the installed acp_lite nor anything else is importable.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(map(str, path)), "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run([sys.executable, "-S", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=45)


@pytest.fixture(scope="module")
def isolated(tmp_path_factory, msgspec_only):
    """Runs Python where ``my_plugin._acp`` (freshly built) and msgspec are all that can be
    imported beyond the standard library."""
    root = tmp_path_factory.mktemp("plugin_root")
    (root / "my_plugin").mkdir()
    (root / "my_plugin" / "__init__.py").write_text("")
    vendor.build(root / "my_plugin" / "_acp.py")
    shutil.copy(scenarios.__file__, root)  # run from here, so that no path of the repository is on sys.path

    def run(*args):
        return run_isolated([root, msgspec_only], args, cwd=root)

    run.vendored_file = root / "my_plugin" / "_acp.py"
    return run


def scenario_params():
    return [pytest.param(name, marks=pytest.mark.req(*REQUIREMENTS[name])) for name in scenarios.SCENARIOS]


@pytest.mark.timeout(30)
@pytest.mark.parametrize("scenario", scenario_params())
def test_scenario_against_the_package(scenario):
    scenarios.SCENARIOS[scenario](scenarios.load("acp_lite"))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("scenario", scenario_params())
def test_scenario_against_the_single_file(isolated, scenario):
    done = isolated(Path(scenarios.__file__).name, VENDORED_NAME, scenario)
    assert done.returncode == 0 and done.stdout.splitlines()[-1:] == ["ok"], done.stdout + done.stderr


@pytest.mark.timeout(60)
def test_the_single_file_says_v2_is_not_in_it_when_an_application_opts_in(isolated):
    code = (
        "from my_plugin import _acp\n"
        "a, b = _acp.memory_pair()\n"
        "class V2(_acp.Agent):\n"
        "    protocol_versions = (1, 2)\n"
        "try:\n"
        "    _acp.serve(V2(), a)\n"
        "except _acp.UsageError as exc:\n"
        "    print(exc)\n"
        "try:\n"
        "    _acp.RemoteAgent.connect(b, protocol_versions=(2, 1))\n"
        "except _acp.UsageError as exc:\n"
        "    print(exc)\n"
    )
    done = isolated("-c", code)
    assert (
        done.stdout.splitlines()
        == ["ACP v2 (acp_lite.v2) is not part of the vendored single file: install acp_lite to use it"] * 2
    ), done.stderr


@pytest.mark.timeout(60)
def test_single_file_process_cannot_import_the_package(isolated):
    done = isolated("-c", "import sys; print(sys.path); import acp_lite")
    assert done.returncode == 1 and "No module named 'acp_lite'" in done.stderr
    repo = Path(acp_lite.__file__).resolve().parent.parent
    cwd = isolated.vendored_file.parents[1]
    assert [p for p in ast.literal_eval(done.stdout) if (cwd / p).resolve().is_relative_to(repo)] == []


@pytest.mark.timeout(60)
@pytest.mark.skipif(sys.version_info < (3, 10), reason="needs sys.stdlib_module_names (3.10)")
def test_single_file_imports_only_the_standard_library_and_msgspec(isolated):
    roots = set()
    for node in ast.walk(ast.parse(isolated.vendored_file.read_text())):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"relative import left at line {node.lineno}"
            roots.add(node.module.split(".")[0])
    assert roots - sys.stdlib_module_names == {"msgspec"}

    # And at run time: what importing it loads.
    done = isolated("-c", f"import sys, {VENDORED_NAME}; print(sorted(sys.modules))")
    assert done.returncode == 0, done.stderr
    loaded = {name.split(".")[0] for name in ast.literal_eval(done.stdout)}
    assert loaded - sys.stdlib_module_names - {"__main__"} == {"msgspec", "my_plugin"}
    assert "asyncio" not in loaded  # coroutine handlers import it on first use (acp_lite.aio)


@pytest.mark.timeout(60)
def test_single_file_offers_the_package_api(isolated):
    """The package's exports are names of the file, and each module object holds names its
    package module has."""
    spec = importlib.util.spec_from_file_location("acp_single_file_under_test", isolated.vendored_file)
    single = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = single  # msgspec resolves annotations through sys.modules
    try:
        spec.loader.exec_module(single)
        assert [name for name in acp_lite.__all__ if not hasattr(single, name)] == []
        assert single.Agent is single.agent.Agent and single.RemoteAgent is single.client.RemoteAgent
        module_objects = {
            n for n, v in vars(single).items() if isinstance(v, types.ModuleType) and v.__name__ == f"{spec.name}.{n}"
        }
        package_modules = {p.stem for p in Path(acp_lite.__file__).parent.glob("*.py")} - {"__init__", "__main__"}
        assert module_objects == package_modules
        for module_name in module_objects:
            package_module = importlib.import_module(f"acp_lite.{module_name}")
            exposed = [n for n in vars(getattr(single, module_name)) if not n.startswith("__")]
            assert exposed and [n for n in exposed if not hasattr(package_module, n)] == [], module_name
        assert single.schema.NewSessionResponse(session_id="s1").session_id == "s1"
        assert single.errors.ParseError("bad").code == -32700
    finally:
        del sys.modules[spec.name]


@pytest.mark.timeout(60)
@pytest.mark.req(
    "ACP-V1-PROMPT-PERMISSION-MAY", "ACP-V1-PROMPT-CLIENT-CANCEL-MAY", "ACP-V1-PROMPT-AGENT-CANCELLED-STOP-REASON"
)
@pytest.mark.slow
def test_plugin_skeleton_on_a_synchronous_host(tmp_path, msgspec_only):
    """examples/plugin with its vendored file built in, its host loop pumping on the main thread,
    against examples/agent.py (which runs on the installed package)."""
    plugin = tmp_path / "plugin"
    shutil.copytree(EXAMPLES / "plugin", plugin, ignore=shutil.ignore_patterns("_acp.py", "__pycache__"))
    vendor.build(plugin / "acp_plugin" / "_acp.py")
    agent = [sys.executable, str(EXAMPLES / "agent.py")]  # a plain interpreter: site-packages and all
    done = run_isolated([msgspec_only], [str(plugin / "host.py"), "--", *agent], cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines() == [
        "[dialog] Allow Reading configuration file? ['Allow once', 'Reject once'] -> Allow once",
        "[panel] > Check this project for configuration issues",
        "[panel] Analyzing request: Check this project for configuration issues",
        "[panel] [tool] Reading configuration file: pending",
        "[panel] [tool] Reading configuration file: completed",
        "[panel] Done (permission: allow_once).",
        "[panel] > wait: slow full-repo analysis",
        "[panel] Long analysis in progress\u2026",
        "[stop] end_turn cancelled",
    ]


ASYNC_AGENT_ON_THE_SINGLE_FILE = f"""
import asyncio
import {VENDORED_NAME} as acp

class Echo(acp.Agent):
    async def new_session(self, params):
        await asyncio.sleep(0)
        return acp.schema.NewSessionResponse(session_id="s")

    async def prompt(self, params, turn):
        turn.send(acp.updates.text_chunk("hi"))
        return "end_turn"

class Editor(acp.Client):
    async def session_update(self, params):
        print(params.update.content.text)

agent_end, client_end = acp.memory_pair()
served = acp.serve(Echo(), agent_end)
remote = acp.RemoteAgent.connect(client_end, Editor())
remote.initialize()
print(remote.prompt(remote.new_session("/w").session_id, "go").stop_reason)
remote.close()
served.connection.close()
"""


@pytest.mark.timeout(60)
def test_async_handlers_on_the_single_file(isolated):
    done = isolated("-c", ASYNC_AGENT_ON_THE_SINGLE_FILE)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["hi", "end_turn"]
