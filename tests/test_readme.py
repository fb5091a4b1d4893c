"""The README's promises, and the guides' in docs/: install first, its commands are CI's, every
Python snippet runs as pasted.

Each snippet is written, exactly as the README or a guide shows it, into a temporary directory
(under the name the text tells the reader to save it as) and run from there with this interpreter,
which has acp_lite installed: what a reader who copies it gets.
"""

import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
README = (REPO / "README.md").read_text(encoding="utf-8")
DOCS = {path.name: path.read_text(encoding="utf-8") for path in sorted((REPO / "docs").glob("*.md"))}
PACKAGE_README = (REPO / "README.package.md").read_text(encoding="utf-8")

pytestmark = pytest.mark.timeout(60)


def _code_blocks(language, text=README):
    return re.findall(rf"```{language}\n(.*?)```", text, re.S)


def _section(title):
    start = README.index(f"\n{title}\n")
    end = README.find("\n## ", start + 1)
    return README[start:end]


def write_snippets(folder):
    """Every Python block of the README, then of each guide in docs/, written into ``folder``:
    {file name: path}."""
    names = {}
    text = "\n".join([README, *DOCS.values()])
    blocks = re.finditer(r"(?:Save this as `([\w.]+)`[^\n]*\n\n)?```python\n(.*?)```", text, re.S)
    for number, match in enumerate(blocks):
        name = match.group(1) or f"snippet_{number}.py"
        (folder / name).write_text(match.group(2), encoding="utf-8")
        names[name] = folder / name
    return names


@pytest.fixture(scope="module")
def snippets(tmp_path_factory):
    """Every Python block of the README in a fresh directory: {file name: path}."""
    return write_snippets(tmp_path_factory.mktemp("readme"))


def _run(snippets, name, *args):
    return subprocess.run(
        [sys.executable, name, *args], cwd=snippets[name].parent, capture_output=True, text=True, timeout=40
    )


def test_the_readme_says_the_package_is_not_on_the_index_and_installs_from_a_checkout_first():
    install = _section("## Install")
    assert "**not on the package index yet**: `pip install acp-lite` fails" in install
    assert _code_blocks("sh", install)[0].startswith("python -m pip install path/to/acp-lite ")
    assert README.index("## Install") < README.index("```")
    # The wheel commands are the ones .ci/package runs (build, then install the wheel).
    assert "python -m build" in (REPO / ".ci" / "package").read_text(encoding="utf-8")


def test_the_first_screen_says_what_it_does_beside_the_official_sdks_and_what_it_does_not():
    first_screen = README[: README.index("## Install")]
    assert "| | acp_lite | official Python SDK (`agent-client-protocol`) | official TypeScript SDK |" in first_screen
    assert "What it does not do:" in first_screen
    # Its one figure comes from the benchmark's results file.
    results = (REPO / "bench" / "results" / "latest.md").read_text(encoding="utf-8")
    for figure in re.findall(r"\d{1,3}(?:,\d{3})+/s", first_screen):
        assert figure[:-2] in results, figure


def test_every_relative_link_of_the_readme_and_the_guides_resolves():
    for name, text in [("README.md", README), *((f"docs/{n}", t) for n, t in DOCS.items())]:
        base = (REPO / name).parent
        for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text):
            if not target.startswith(("http://", "https://")):
                assert (base / target).exists(), f"{name} links to {target}, which does not exist"


def test_the_development_commands_are_two_and_ci_runs_the_second():
    commands = _code_blocks("sh", _section("## Developing acp_lite"))[0].strip().splitlines()
    assert len(commands) == 2
    assert commands[1] in (REPO / ".ci" / "run").read_text(encoding="utf-8")


@pytest.mark.parametrize("name", ["minimal_agent.py", "minimal_client.py"])
def test_the_minimal_examples_in_the_readme_are_the_files_and_stay_short(name, snippets):
    source = (REPO / "examples" / name).read_text(encoding="utf-8")
    assert snippets[name].read_text(encoding="utf-8") == source
    assert len(source.strip().splitlines()) <= 32


def test_every_snippet_is_run_by_a_test_here(snippets):
    # snippet_6 and snippet_7 (docs/async.md) are type-checked only (test_typing); examples/async_agent.py,
    # which they abridge, runs in test_examples. snippet_8 and snippet_9 (docs/remote.md) run in
    # tests/interop/test_remote_interop.py and tests/test_remote_docs.py.
    assert sorted(snippets) == [
        "async_echo.py",
        "minimal_agent.py",
        "minimal_client.py",
        "remote_client.py",
        "snippet_2.py",
        "snippet_5.py",
        "snippet_6.py",
        "snippet_7.py",
        "snippet_8.py",
        "snippet_9.py",
        "v2_echo.py",
    ]
    assert "v2_echo.py" in DOCS["v2.md"]  # the guides' snippets are run too


@pytest.mark.slow
def test_the_async_echo_snippet_streams_through_the_minimal_client(snippets):
    done = _run(snippets, "minimal_client.py", sys.executable, "async_echo.py")
    assert done.returncode == 0, done.stderr
    chunks = [line.split("] ", 1)[1] for line in done.stdout.splitlines() if line.startswith("[agent_message_chunk]")]
    assert chunks == ["You", "said:", "hello"]  # (the client prints each chunk stripped)
    assert done.stdout.splitlines()[-1] == "stop reason: end_turn"


@pytest.mark.slow
def test_the_remote_snippets_serve_the_minimal_agent_and_drive_it_over_http_and_websocket(snippets):
    section = _section("### A remote agent")
    serve_line = _code_blocks("sh", section)[0].strip().splitlines()[1]
    assert serve_line.startswith("acp-lite serve --listen 127.0.0.1:8000 -- ")
    with socket.socket() as probe:  # a free port in place of 8000
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [sys.executable, "-m", "acp_lite", *serve_line.split()[1:]]
    command[command.index("127.0.0.1:8000")] = f"127.0.0.1:{port}"
    command[command.index("python")] = sys.executable  # the reader's python: the one with acp_lite
    folder = snippets["remote_client.py"].parent
    server = subprocess.Popen(command, cwd=folder, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert "serving" in server.stdout.readline(), server.stderr.read()
        client = snippets["remote_client.py"].read_text(encoding="utf-8")
        for scheme in ("http", "ws"):
            script = folder / f"remote_client_{scheme}.py"
            url = f"{scheme}://127.0.0.1:{port}/acp"
            script.write_text(client.replace("http://127.0.0.1:8000/acp", url, 1), encoding="utf-8")
            done = _run({script.name: script}, script.name)
            assert done.returncode == 0, done.stderr
            assert done.stdout.splitlines() == ["You said: hello", "end_turn"], (scheme, done.stdout)
    finally:
        server.send_signal(signal.SIGINT)
        server.wait(20)
        server.stdout.close()
        server.stderr.close()


def test_the_v2_snippet_runs_a_v2_turn_as_the_readme_says(snippets):
    done = _run(snippets, "v2_echo.py")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "UserMessage",
        "SessionUpdateStateUpdate",
        "AgentMessageChunk",
        "SessionUpdateStateUpdate",
        "2 end_turn",
    ]


@pytest.mark.slow
def test_the_minimal_client_runs_against_the_minimal_agent(snippets):
    done = _run(snippets, "minimal_client.py")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["[agent_message_chunk] You said: hello", "stop reason: end_turn"]


# An agent sending what claude-agent-acp 0.23.1 sends at the end of a turn: a usage_update whose
# "used" is null, which the v1 schema rejects (an integer is required there).
SCHEMA_REJECTED_UPDATE_AGENT = """
from acp_lite import Agent, schema, serve_stdio, updates


class UsageReporter(Agent):
    def new_session(self, params):
        return schema.NewSessionResponse(session_id="s1")

    def prompt(self, params, turn):
        update = {"sessionUpdate": "usage_update", "used": None, "size": 200000}
        self.client.connection.notify("session/update", {"sessionId": "s1", "update": update})
        turn.send(updates.text_chunk("after the usage"))
        return "end_turn"


serve_stdio(UsageReporter())
"""


@pytest.mark.slow
def test_the_minimal_client_shows_an_update_the_schema_rejects_and_goes_on(snippets, tmp_path):
    agent = tmp_path / "usage_reporter.py"
    agent.write_text(SCHEMA_REJECTED_UPDATE_AGENT, encoding="utf-8")
    done = _run(snippets, "minimal_client.py", sys.executable, str(agent))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "[undecodable] Expected `int`, got `null` - at `$.update.used`",
        "[agent_message_chunk] after the usage",
        "stop reason: end_turn",
    ]


@pytest.mark.slow
def test_the_minimal_client_prints_what_the_readme_shows_against_the_mock_coding_agent(snippets):
    done = _run(snippets, "minimal_client.py", sys.executable, str(REPO / "examples" / "agent.py"))
    assert done.returncode == 0, done.stderr
    assert done.stdout == _code_blocks("text", _section("## Getting started"))[0]


@pytest.mark.slow
def test_the_host_delivery_snippet_runs_a_turn_without_blocking_the_host_thread(snippets):
    host = snippets["snippet_2.py"]
    assert "HostDelivery()" in host.read_text(encoding="utf-8")
    done = _run(snippets, "snippet_2.py")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["[agent_message_chunk] You said: hello", "stop reason: end_turn"]


def test_the_logging_snippet_turns_on_the_acp_lite_loggers(snippets):
    probe = snippets["snippet_5.py"].read_text(encoding="utf-8") + (
        "\nimport acp_lite.codec, acp_lite.schema\n"
        'acp_lite.codec.decode(b\'{"type":"future_kind"}\', acp_lite.schema.ContentBlock)\n'
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=snippets["snippet_5.py"].parent, capture_output=True, text=True, timeout=40
    )
    assert done.returncode == 0, done.stderr
    assert " acp_lite.codec INFO unknown-variant at $: " in done.stderr


def test_the_logging_table_names_every_logger_of_the_runtime():
    used = set()
    for module in (REPO / "acp_lite").glob("*.py"):
        used.update(re.findall(r'getLogger\("(acp_lite\.[\w.]+)"\)', module.read_text(encoding="utf-8")))
    listed = set(re.findall(r"^\| `(acp_lite\.[\w.]+)` \|", _section("### Logging"), re.M))
    assert listed == used


def test_the_package_readme_reads_right_on_a_package_index():
    # Its code is the README's, it links only absolutely, and it shows no development command.
    for block in _code_blocks("python", PACKAGE_README):
        assert block in _code_blocks("python")
    assert "pip install acp-lite" in PACKAGE_README
    links = re.findall(r"\]\(([^)]*)\)", PACKAGE_README)
    assert links and all(link.startswith("https://") for link in links)
    for dev_only in (".venv", "pytest", ".ci/", "-e '"):
        assert dev_only not in PACKAGE_README
    pyproject = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    assert 'readme = "README.package.md"' in pyproject


def test_the_application_requirements_table_is_current():
    from spec.readme_section import DOC as readme_path
    from spec.readme_section import with_table

    text = readme_path.read_text()
    assert with_table(text) == text, "run: python -m spec.readme_section"


def test_the_conformance_guide_quotes_the_coverage_summary_line():
    coverage = (REPO / "spec" / "COVERAGE.md").read_text()
    summary = re.search(r"^\*\*(.+)\*\*$", coverage, re.M).group(1)
    assert f"> **{summary}**" in DOCS["conformance.md"]
