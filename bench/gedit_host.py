"""gedit under Xvfb with examples/gedit installed, for tests/test_gedit_plugin.py and workload H in gedit.

    python bench/gedit_host.py [--updates N] [--idle-seconds S] [--out DIR]   writes OUT/host-gedit.json, .md

``Gedit`` starts a private X server (Xvfb), then Debian's gedit in it with a private home, the
plugin (its vendored ``_acp.py`` built fresh) and a probe plugin enabled; it types and clicks with
xdotool as a user would, and takes screenshots with GDK. The probe is a second gedit plugin that
looks at the chat panel from inside gedit (a user's eyes): the test's probe writes what the panel shows
to a JSON file every 100 ms; the benchmark's times each pump of the plugin and writes its figures
once the turn is over, polling nothing meanwhile.

Workload H in gedit: the replay agent streams workload A's mix as one turn into the plugin; the
figures are the updates per second delivered into the pump (to ``session_update``), how long
each pump held gedit's main loop (max, p99, p50), of which ``HostDelivery.pump`` and of which the
chat view's flush (the view's own work, measured apart), and gedit's CPU over ``--idle-seconds``
with the plugin connected to a quiet agent against gedit with the plugin off.
"""

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

REPO = Path(__file__).resolve().parent.parent
PLUGIN = REPO / "examples" / "gedit"
SYSTEM_PYTHON = "/usr/bin/python3"  # the Python gedit's libpeas loads (Debian's)
WAIT = 30.0  # generous: the machine may be loaded

_PROBE_PLUGIN = """[Plugin]
Loader=python3
Module=acp_gedit_probe
IAge=3
Name=acp_gedit probe
Description=Test instrument for acp_gedit.
"""

# The test's probe: what the chat panel shows, and where its widgets are on the screen.
WATCH_PROBE = r"""
import importlib.util, json, os
from gi.repository import GLib, GObject, Gedit

def _box(widget):
    if not widget.get_mapped():
        return None
    x, y = widget.translate_coordinates(widget.get_toplevel(), 0, 0)
    _, ox, oy = widget.get_toplevel().get_window().get_origin()
    a = widget.get_allocation()
    return [ox + x, oy + y, a.width, a.height]

class Probe(GObject.Object, Gedit.WindowActivatable):
    __gtype_name__ = "AcpGeditProbe"
    window = GObject.Property(type=Gedit.Window)

    def do_activate(self):
        self._timer = GLib.timeout_add(100, self._write)

    def do_deactivate(self):
        GLib.source_remove(self._timer)

    def do_update_state(self):
        pass

    def _write(self):
        panel = self.window.get_side_panel().get_child_by_name("AcpGeditPanel")
        if panel is None:
            return True
        snapshot = {
            "pid": os.getpid(),
            "acp_lite_importable": importlib.util.find_spec("acp_lite") is not None,
            "chat": panel.chat.contents(),
            "question": panel.permission.label.get_text() if panel.permission.get_visible() else None,
            "buttons": [[b.get_child().get_label(), _box(b)] for b in panel.permission.buttons.get_children()],
            "entry": _box(panel.entry),
            "entry_focused": panel.entry.has_focus(),
            "cancel": _box(panel.cancel_button),
            "window": _box(self.window),
            "documents": {d.get_file().get_location().get_basename(): d.get_text(*d.get_bounds(), False)
                          for d in self.window.get_documents() if d.get_file().get_location()},
        }
        path = os.environ["ACP_GEDIT_PROBE"]
        with open(path + ".part", "w") as f:
            json.dump(snapshot, f)
        os.replace(path + ".part", path)
        return True
"""

# The benchmark's probe: times every pump of the plugin (the whole hold of the main loop, and the
# HostDelivery.pump inside it) during the turn, and writes the figures once the turn is over.
PUMP_PROBE = r"""
import json, os, time
from gi.repository import GObject, Gedit
from acp_gedit import session

_pump, _delivery_pump, _send = session.ChatSession.pump, session._acp.HostDelivery.pump, session.ChatSession._send
_record = {"pumps": [], "delivery": [], "written": False}

def _timed_delivery_pump(self, *args, **kwargs):
    started = time.perf_counter()
    ran = _delivery_pump(self, *args, **kwargs)
    _record["delivery"].append((started, time.perf_counter() - started, ran))
    return ran

def _timed_pump(self):
    started = time.perf_counter()
    again = _pump(self)
    _record["pumps"].append((started, time.perf_counter() - started))
    if self._turn is not None and self._turn.done() and not _record["written"]:
        _record["written"] = True
        with open(os.environ["ACP_GEDIT_PROBE"], "w") as f:
            json.dump({"pumps": _record["pumps"], "delivery": _record["delivery"], "pid": os.getpid(),
                       "stop": self._turn.result().stop_reason}, f)
    return again

def _send_and_record(self, text):
    _record["pumps"].clear()
    _record["delivery"].clear()
    _send(self, text)

session.ChatSession.pump = _timed_pump
session._acp.HostDelivery.pump = _timed_delivery_pump
session.ChatSession._send = _send_and_record

class Probe(GObject.Object, Gedit.WindowActivatable):
    __gtype_name__ = "AcpGeditPumpProbe"
    window = GObject.Property(type=Gedit.Window)
    def do_activate(self):
        with open(os.environ["ACP_GEDIT_PROBE"], "w") as f:
            json.dump({"ready": True}, f)
    def do_deactivate(self): pass
    def do_update_state(self): pass
"""


class Gedit:
    """gedit in a private Xvfb, home and plugin folder; ``files`` opened at start."""

    def __init__(self, work: Path, agent: Sequence[str], probe: str, files: Sequence[Path], plugin_on: bool = True):
        self.work = work
        home = work / "home"
        plugins = home / ".local" / "share" / "gedit" / "plugins"
        shutil.copytree(PLUGIN, plugins, ignore=shutil.ignore_patterns("_acp.py", "__pycache__", "*.png"))
        from acp_lite.tools import vendor

        vendor.build(plugins / "acp_gedit" / "_acp.py")
        (plugins / "acp_gedit_probe.plugin").write_text(_PROBE_PLUGIN)
        (plugins / "acp_gedit_probe.py").write_text(probe)
        settings = home / ".config" / "glib-2.0" / "settings"
        settings.mkdir(parents=True)
        active = ["acp_gedit", "acp_gedit_probe"] if plugin_on else []
        (settings / "keyfile").write_text(f"[org/gnome/gedit/plugins]\nactive-plugins={active!r}\n")
        (home / ".config" / "gedit").mkdir()
        (home / ".config" / "gedit" / "acp-chat.json").write_text(json.dumps({"agent": list(agent)}))
        self.probe_file = work / "probe.json"
        self.stderr_file = work / "gedit.stderr"
        self._xvfb = self._start_xvfb()
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(home),
            "XDG_CONFIG_HOME": str(home / ".config"),
            "XDG_DATA_HOME": str(home / ".local" / "share"),
            "XDG_CACHE_HOME": str(home / ".cache"),
            "XDG_RUNTIME_DIR": str(work),
            "GSETTINGS_BACKEND": "keyfile",  # the plugin list above, with no dconf service
            "NO_AT_BRIDGE": "1",  # no accessibility bus here
            "DISPLAY": self.display,
            "ACP_GEDIT_PROBE": str(self.probe_file),
            "LANG": "C.UTF-8",
        }
        self.env = env
        with open(work / "gedit.stdout", "wb") as out, open(self.stderr_file, "wb") as err:
            self.gedit = subprocess.Popen(
                ["gedit", "--standalone", *map(str, files)], env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err
            )

    def _start_xvfb(self) -> subprocess.Popen:
        read, write = os.pipe()
        xvfb = subprocess.Popen(
            ["Xvfb", "-displayfd", str(write), "-screen", "0", "1280x800x24", "-nolisten", "tcp"],
            pass_fds=(write,),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        os.close(write)
        with os.fdopen(read) as f:
            number = f.readline().strip()
        if not number:
            xvfb.kill()
            xvfb.wait()
            raise RuntimeError("Xvfb did not start")
        self.display = f":{number}"
        return xvfb

    # -- a user's hands ---------------------------------------------------------------------------
    def _xdotool(self, *args: str) -> None:
        subprocess.run(["xdotool", *args], env=self.env, check=True, timeout=20, capture_output=True)

    def key(self, *keys: str) -> None:
        self._xdotool("key", *keys)

    def type(self, text: str) -> None:
        self._xdotool("type", "--delay", "15", text)

    def click_until(self, what: str, box: Any, done: Any, tries: int = 3) -> Dict[str, Any]:
        """Click the widget ``box(snapshot)`` until ``done(snapshot)``, as a user clicks again a
        button that did not react (a click can be lost while a loaded machine lays the panel out)."""
        for _ in range(tries - 1):
            self.click(box(self.snapshot()))
            try:
                return self.wait_for(what, done, wait=WAIT / 3)
            except AssertionError:
                pass
        self.click(box(self.snapshot()))
        return self.wait_for(what, done)

    def click(self, box: Sequence[int]) -> None:
        x, y, width, height = box
        self._xdotool("mousemove", str(x + width // 2), str(y + height // 2), "sleep", "0.3", "click", "1")

    def screenshot(self, path: Path, box: Optional[Sequence[int]] = None) -> None:
        """The screen, or the ``box`` (x, y, width, height) of it, as a PNG (GDK, in gedit's Python)."""
        script = (
            "import sys, gi; gi.require_version('Gdk', '3.0'); from gi.repository import Gdk; "
            "w = Gdk.get_default_root_window(); "
            "x, y, width, height = [int(a) for a in sys.argv[2:]] or (0, 0, w.get_width(), w.get_height()); "
            "Gdk.pixbuf_get_from_window(w, x, y, width, height).savev(sys.argv[1], 'png', [], [])"
        )
        subprocess.run(
            [SYSTEM_PYTHON, "-c", script, str(path), *map(str, box or ())], env=self.env, check=True, timeout=30
        )

    # -- a user's eyes ----------------------------------------------------------------------------
    def snapshot(self) -> Dict[str, Any]:
        try:
            return json.loads(self.probe_file.read_text())
        except (OSError, ValueError):
            return {}

    def wait_for(self, what: str, test: Any, wait: float = WAIT) -> Dict[str, Any]:
        deadline = time.monotonic() + wait
        while True:
            snapshot = self.snapshot()
            if snapshot and test(snapshot):
                return snapshot
            if self.gedit.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(
                    f"{what} never showed; gedit {'exited' if self.gedit.poll() is not None else 'runs'}; "
                    f"the panel: {snapshot.get('chat')!r}; stderr: {self.stderr()!r}"
                )
            time.sleep(0.05)

    def stderr(self) -> str:
        return self.stderr_file.read_text(errors="replace")

    def quit(self, timeout: float = WAIT) -> Optional[int]:
        """Ctrl+Q, as a user quits; gedit's exit status (None if it had to be killed)."""
        self.key("ctrl+q")
        try:
            return self.gedit.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def close(self) -> None:
        for process in (self.gedit, self._xvfb):
            if process.poll() is None:
                process.kill()
            process.wait()


def gedit_usable() -> str:
    """Why gedit cannot run the plugin here, or '' when it can."""
    for tool in ("gedit", "Xvfb", "xdotool"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    if not os.path.exists(SYSTEM_PYTHON):
        return f"{SYSTEM_PYTHON} is missing"
    probe = subprocess.run([SYSTEM_PYTHON, "-c", "import msgspec, gi"], capture_output=True, timeout=30)
    return "" if probe.returncode == 0 else f"{SYSTEM_PYTHON} (gedit's Python) lacks msgspec or gi"


# -- workload H in gedit --------------------------------------------------------------------------
UPDATES = 400_000
IDLE_SECONDS = 10.0


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def _idle_cpu(gedit: "Gedit", seconds: float) -> float:
    # After a turn GTK lays out the text it got in the background (the pumps kept it waiting) for a
    # few seconds: that is the turn's cost, not the idle plugin's. Wait for a quiet second first.
    deadline = time.monotonic() + 20.0
    while time.monotonic() < deadline:
        before = _cpu_seconds(gedit.gedit.pid)
        time.sleep(1.0)
        if _cpu_seconds(gedit.gedit.pid) - before <= 0.05:
            break
    before = _cpu_seconds(gedit.gedit.pid)
    time.sleep(seconds)
    return (_cpu_seconds(gedit.gedit.pid) - before) / seconds * 100


def _percentile(values: List[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


def measure(updates: int, idle_seconds: float, work: Path) -> Dict[str, Any]:
    sys.path.insert(0, str(REPO / "bench"))
    from run import replay_agent
    from streams import stream_file

    stream = stream_file(REPO / "bench" / "results" / "tmp", "mix", updates)
    project = work / "project"
    project.mkdir()
    (project / "notes.txt").write_text("notes\n")
    (work / "on").mkdir()
    gedit = Gedit(work / "on", replay_agent(stream), PUMP_PROBE, [project / "notes.txt"])
    try:
        gedit.wait_for("gedit", lambda snapshot: snapshot.get("ready"))
        time.sleep(3.0)  # (the window is made before it is shown: give it time to take keys)
        gedit.key("ctrl+alt+a")
        time.sleep(1.0)
        gedit.type("go")
        gedit.key("Return")
        deadline = time.monotonic() + max(4 * WAIT, updates / 200)  # (a loaded machine is slow)
        while "pumps" not in gedit.snapshot():
            if gedit.gedit.poll() is not None or time.monotonic() > deadline:
                gedit.screenshot(work / "failed.png")
                raise RuntimeError(f"the turn did not end (see {work / 'failed.png'}); stderr: {gedit.stderr()!r}")
            time.sleep(0.2)
        record = gedit.snapshot()
        idle_on = _idle_cpu(gedit, idle_seconds)
        stderr = gedit.stderr()
    finally:
        gedit.close()
    (work / "off").mkdir()
    alone = Gedit(work / "off", ["true"], "", [project / "notes.txt"], plugin_on=False)
    try:
        time.sleep(2.0)
        idle_off = _idle_cpu(alone, idle_seconds)
    finally:
        alone.close()
    delivery = [(start, took, ran) for start, took, ran in record["delivery"] if ran]
    first, last = delivery[0], delivery[-1]
    delivered = sum(ran for _, _, ran in delivery)
    pumps_ms = [took * 1e3 for _, took in record["pumps"]]
    # Between two pumps of the turn the main loop does the rest: input, and drawing what the pumps wrote.
    gaps_ms = [(b[0] - a[0] - a[1]) * 1e3 for a, b in zip(record["pumps"], record["pumps"][1:])]
    delivery_ms = [took * 1e3 for _, took, _ in record["delivery"]]
    view_ms = [whole - part for whole, part in zip(pumps_ms, delivery_ms)]
    return {
        "updates": updates,
        "stop": record["stop"],
        "callbacks delivered": delivered,
        "updates/s into the pump": delivered / (last[0] + last[1] - first[0]),
        "pumps": len(pumps_ms),
        "max pump ms": max(pumps_ms),
        "p99 pump ms": _percentile(pumps_ms, 0.99),
        "p50 pump ms": _percentile(pumps_ms, 0.50),
        "max HostDelivery.pump ms": max(delivery_ms),
        "p99 HostDelivery.pump ms": _percentile(delivery_ms, 0.99),
        "max view flush ms": max(view_ms),
        "p99 view flush ms": _percentile(view_ms, 0.99),
        "p50 main loop between pumps ms": _percentile(gaps_ms, 0.50) if gaps_ms else 0.0,
        "max main loop between pumps ms": max(gaps_ms, default=0.0),
        "idle CPU % (plugin connected, agent quiet)": idle_on,
        "idle CPU % (gedit, plugin off)": idle_off,
        "gedit stderr": stderr,
        "load average": os.getloadavg(),
    }


def main(args: Sequence[str]) -> int:
    import argparse
    import statistics
    import tempfile

    parser = argparse.ArgumentParser(prog="python bench/gedit_host.py")
    parser.add_argument("--updates", type=int, default=UPDATES)
    parser.add_argument("--idle-seconds", type=float, default=IDLE_SECONDS)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    options = parser.parse_args(args)
    missing = gedit_usable()
    if missing:
        print(f"gedit_host: {missing}", file=sys.stderr)
        return 2
    runs = []
    for _ in range(options.runs):
        with tempfile.TemporaryDirectory() as tmp:
            runs.append(measure(options.updates, options.idle_seconds, Path(tmp)))
    options.out.mkdir(parents=True, exist_ok=True)
    (options.out / "host-gedit.json").write_text(json.dumps(runs, indent=1) + "\n")
    lines = [
        "# Workload H in gedit: examples/gedit under Xvfb",
        "",
        f"One turn of {options.updates:,} updates (workload A's mix) from the replay agent into the plugin, "
        "woken by GLib.idle_add; each pump runs `HostDelivery.pump` within the plugin's budget, then (at most "
        "every 50 ms during a stream) the chat view's flush with what is left of it. Median (min–max) over "
        f"{options.runs} runs, load average {runs[0]['load average'][0]:.2f} after the first and "
        f"{runs[-1]['load average'][0]:.2f} after the last. Targets as for Vim: max pump <= 12 ms, p99 <= 9 ms, "
        ">= 150,000 updates/s into the pump, idle <= 3 %.",
        "",
        "| metric | median | min | max |",
        "| --- | ---: | ---: | ---: |",
    ]
    for name, value in runs[0].items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            values = [run[name] for run in runs]
            lines.append(f"| {name} | {statistics.median(values):,.2f} | {min(values):,.2f} | {max(values):,.2f} |")
    (options.out / "host-gedit.md").write_text("\n".join(lines) + "\n")
    print((options.out / "host-gedit.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
