"""examples/gedit driven in a real gedit (Debian's) under Xvfb, as a user would: keys typed and
buttons clicked with xdotool, the panel read back by a probe plugin inside gedit (see
bench/gedit_host.py), the agent a real subprocess (examples/agent.py, tests/edit_agent.py).

gedit's Python (Debian's /usr/bin/python3, which libpeas loads) needs msgspec; the plugin gets
acp_lite only as its vendored single file, built fresh. ``.ci/run`` installs gedit, Xvfb, xdotool
and that msgspec when they are missing: with CI=true this test never skips.

The screenshot of the panel mid-stream lands in ``test-artifacts/`` (not committed).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from processes import children, gone

from bench.gedit_host import WATCH_PROBE, Gedit, gedit_usable

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples"
ARTIFACTS = REPO / "test-artifacts"
EDIT_AGENT = Path(__file__).resolve().parent / "edit_agent.py"


@pytest.fixture(scope="module")
def gedit_ready():
    missing = gedit_usable()
    if missing and os.environ.get("CI") == "true":
        pytest.fail(f"CI must run the gedit plugin test: {missing} (.ci/run installs them)")
    if missing:
        pytest.skip(missing)


@pytest.fixture
def project(tmp_path):
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "pyproject.toml").write_text('[project]\nname = "demo"\n')
    (folder / "notes.txt").write_text("old notes\n")
    (folder / "draft.txt").write_text("saved draft\n")
    return folder


def _agent_of(gedit: Gedit) -> int:
    agents = children(gedit.gedit.pid)
    assert len(agents) == 1, f"gedit's children: {agents}"
    return agents[0]


@pytest.mark.timeout(180)
@pytest.mark.req(
    "ACP-V1-PROMPT-PERMISSION-MAY",
    "ACP-V1-PROMPT-CLIENT-CANCEL-MAY",
    "ACP-V1-PROMPT-AGENT-CANCELLED-STOP-REASON",
    "ACP-V1-PROMPT-UPDATES-BEFORE-RESPONSE",
)
@pytest.mark.slow
def test_the_gedit_plugin_streams_asks_permission_cancels_and_quits_cleanly(gedit_ready, tmp_path, project):
    # A plain interpreter with acp_lite installed, behind a banner on stdout (which acp_lite's
    # reader warns about, to its own logger: gedit's stderr must not see it).
    banner = 'echo "Welcome to the mock agent"; exec "$0" "$@"'
    agent = ["/bin/sh", "-c", banner, sys.executable, str(EXAMPLES / "agent.py")]
    gedit = Gedit(tmp_path, agent, WATCH_PROBE, [project / "pyproject.toml"])
    try:
        gedit.wait_for("the panel", lambda s: "Ctrl+Alt+A" in s["chat"])
        gedit.key("ctrl+alt+a")  # shows the panel, the cursor in its prompt entry
        gedit.wait_for("the prompt entry focused", lambda s: s["entry_focused"])
        gedit.type("Check this project for configuration issues")
        gedit.key("Return")
        # The chat shows streamed lines in batches, on the main loop's next turns, and a question at
        # once: the tool call's line may follow its question by a turn.
        asked = gedit.wait_for(
            "the permission question and the tool call's line",
            lambda s: s["question"] and s["chat"].endswith("[tool] Reading configuration file: pending"),
        )
        assert asked["question"] == "Allow Reading configuration file?"
        assert [label for label, _ in asked["buttons"]] == ["Allow once", "Reject once"]
        assert "Analyzing request: Check this project for configuration issues" in asked["chat"]  # streamed
        assert asked["chat"].endswith("[tool] Reading configuration file: pending")
        ARTIFACTS.mkdir(exist_ok=True)
        gedit.screenshot(ARTIFACTS / "gedit-mid-stream.png", asked["window"])
        gedit.wait_for("the buttons on screen", lambda s: s["buttons"] and s["buttons"][0][1])
        allow_once = lambda s: s["buttons"][0][1]  # noqa: E731
        gedit.click_until("the answer", allow_once, lambda s: s["question"] is None)
        gedit.wait_for("the end of the turn", lambda s: "[stop] end_turn" in s["chat"])

        gedit.type("wait: slow full-repo analysis")
        gedit.key("Return")
        gedit.wait_for("the slow turn", lambda s: "Long analysis in progress" in s["chat"])
        gedit.key("Escape")  # the cancel key
        gedit.wait_for("the cancelled turn", lambda s: "[stop] cancelled" in s["chat"])

        gedit.type("wait: once more")
        gedit.key("Return")
        gedit.wait_for("the second slow turn", lambda s: s["chat"].count("Long analysis") == 2)
        cancelled_twice = lambda s: s["chat"].count("[stop] cancelled") == 2  # noqa: E731
        shown = gedit.click_until("the second cancelled turn", lambda s: s["cancel"], cancelled_twice)  # the button
        agent_pid = _agent_of(gedit)
        status = gedit.quit()  # Ctrl+Q
    finally:
        gedit.close()
    assert shown["chat"].splitlines() == [
        "Ctrl+Alt+A: ask the agent; Escape: cancel the turn",
        "> Check this project for configuration issues",
        f"[ready] Mock Agent in {project}",
        "Analyzing request: Check this project for configuration issues",
        "[tool] Reading configuration file: completed",  # one line per tool call, updated in place
        "Done (permission: allow_once).",  # the agent got the answer clicked
        "[stop] end_turn",
        "> wait: slow full-repo analysis",
        "Long analysis in progress\u2026",
        "[stop] cancelled",
        "> wait: once more",
        "Long analysis in progress\u2026",
        "[stop] cancelled",
    ]
    assert not shown["acp_lite_importable"]  # gedit's Python had only the vendored file
    assert status == 0
    assert gone(agent_pid), "the agent outlived gedit"
    assert gedit.stderr() == ""  # nothing reached gedit's stderr


@pytest.mark.timeout(180)
@pytest.mark.req("ACP-V1-PLAN-CLIENT-REPLACE")
@pytest.mark.slow
def test_the_gedit_plugin_shows_the_plan_serves_unsaved_edits_reloads_written_documents_and_stops_with_its_window(
    gedit_ready, tmp_path, project
):
    files = [project / "draft.txt", project / "notes.txt"]  # the first one is the active document, focused
    gedit = Gedit(tmp_path, [sys.executable, str(EDIT_AGENT)], WATCH_PROBE, files)
    try:
        gedit.wait_for("the panel", lambda s: "Ctrl+Alt+A" in s["chat"])
        gedit.type("unsaved ")  # into draft.txt, not saved
        gedit.wait_for("the edit", lambda s: s["documents"].get("draft.txt") == "unsaved saved draft")
        gedit.key("ctrl+alt+a")
        gedit.wait_for("the prompt entry focused", lambda s: s["entry_focused"])
        gedit.type("fresh notes")
        gedit.key("Return")
        shown = gedit.wait_for("the reply and the reload", lambda s: "end_turn" in s["chat"] and "loaded" in s["chat"])
        # The open document shows what the agent wrote (gedit keeps the file's last newline apart).
        assert shown["documents"]["notes.txt"] == "fresh notes"
        agent_pid = _agent_of(gedit)
        gedit.key("ctrl+s")  # draft.txt saved at last: the window closes without asking
        gedit.wait_for("draft.txt saved", lambda s: (project / "draft.txt").read_text() == "unsaved saved draft\n")
        window = shown["window"]
        gedit.click([window[0] + window[2] - 42, window[1] + 15, 20, 20])  # the title bar's close button
        gedit.gedit.wait(30)
    finally:
        gedit.close()
    notes = project / "notes.txt"
    lines = shown["chat"].splitlines()
    lines.remove(f"[write] {notes}: reloaded")  # when gedit's reload ends: before or after the reply
    assert lines == [
        "Ctrl+Alt+A: ask the agent; Escape: cancel the turn",
        "> fresh notes",
        f"[ready] Edit Agent in {project}",
        "[plan] Rewrite notes.txt (completed)",  # the plan, replaced in place by the second one
        "[plan] Check the result (completed)",
        # The agent read the unsaved draft, then the file it wrote.
        "draft.txt reads 'unsaved saved draft\\n'. "
        "notes.txt now reads 'fresh notes'; outside the folder: refused (-32002).",
        "[stop] end_turn",
    ]
    assert notes.read_text() == "fresh notes\n"
    assert not (project.parent / "outside.txt").exists()
    assert gone(agent_pid), "the agent outlived its window"
    assert gedit.stderr() == ""


@pytest.mark.timeout(300)
@pytest.mark.slow
def test_workload_h_in_gedit_runs_and_writes_results(gedit_ready, tmp_path):
    """bench/gedit_host.py in its smallest form, for correctness only (no speed is judged here)."""
    done = subprocess.run(
        [
            *(sys.executable, "bench/gedit_host.py", "--updates", "3000", "--idle-seconds", "1", "--runs", "1"),
            *("--out", str(tmp_path)),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (figures,) = json.loads((tmp_path / "host-gedit.json").read_text())
    assert figures["stop"] == "end_turn" and figures["callbacks delivered"] >= 3000
    assert figures["gedit stderr"] == ""
    for name in ("updates/s into the pump", "max pump ms", "p99 pump ms", "max view flush ms"):
        assert figures[name] > 0, name
    assert (tmp_path / "host-gedit.md").read_text().startswith("# Workload H in gedit")
