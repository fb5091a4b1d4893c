"""An agent that replays what a real agent said to ``acp-lite check``, from ``acp-lite tap`` logs.

    replay_agent.py [--lingers-after-eof] LOG_DIR

``LOG_DIR`` holds one tap log per agent process of a recorded ``check`` run (see
``tests/data/README.md``). The probe is deterministic: it sends the same messages in the same
order, except for its scratch directory, whose path is normalised on both sides. So each line the
probe sends is matched against the next client message of every recording that still fits, and
the agent lines that followed it in the first such recording are written back (as the log holds
them: the same JSON values, re-serialised); recordings whose agent said something else there no
longer fit. A line that no recording continues
with is reported on stderr and ends the process with status 3, so that a probe that changed what
it sends fails loudly instead of being answered by guesswork.

When stdin closes the process exits, unless ``--lingers-after-eof`` (the recorded agent was seen
to keep running after its stdin closed) keeps it alive until it is killed.

Standard library only; one thread.
"""

import argparse
import json
import re
import sys
import time
from pathlib import Path

# The probe's scratch directory (tempfile.mkdtemp(prefix="acp-lite-check-")), wherever it is.
_WORKDIR = re.compile(r'(?:/[^"/\\\s]+)*/acp-lite-check-[A-Za-z0-9_]+')
_PLACEHOLDER = "<WORKDIR>"


def normalised(line: str) -> str:
    return _WORKDIR.sub(_PLACEHOLDER, line)


def recording(path: Path):
    """[(the client message, normalised, [the agent lines that followed it])], and the agent
    lines written before the first client message."""
    steps, before = [], []
    for entry in map(json.loads, path.read_text(encoding="utf-8").splitlines()):
        line = json.dumps(entry["msg"], separators=(",", ":"), ensure_ascii=False) if "msg" in entry else entry["raw"]
        if entry["dir"] == "client->agent":
            steps.append((canonical(normalised(line)), []))
        else:
            (steps[-1][1] if steps else before).append(normalised(line))
    return steps, before


def canonical(line: str) -> str:
    """One form per JSON value, whatever its spacing: the probe writes ``json.dumps`` style."""
    try:
        return json.dumps(json.loads(line), sort_keys=True, ensure_ascii=False)
    except ValueError:
        return line


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lingers-after-eof", action="store_true")
    parser.add_argument("log_dir", type=Path)
    args = parser.parse_args()
    candidates = [recording(path) for path in sorted(args.log_dir.glob("*.jsonl"))]
    workdir = None
    out = sys.stdout

    def emit(lines):
        for line in lines:
            out.write((line.replace(_PLACEHOLDER, workdir) if workdir else line) + "\n")
        out.flush()

    openings = {tuple(before) for _, before in candidates}
    if len(openings) == 1:
        emit(next(iter(openings)))
    position = 0
    for line in sys.stdin:
        found = _WORKDIR.search(line)
        if found and workdir is None:
            workdir = found.group(0)
        key = canonical(normalised(line.rstrip("\n")))
        fitting = [
            (steps, before) for steps, before in candidates if position < len(steps) and steps[position][0] == key
        ]
        if not fitting:
            print(f"replay: no recording continues with: {line.strip()[:300]}", file=sys.stderr, flush=True)
            return 3
        answer = fitting[0][0][position][1]
        candidates = [(steps, before) for steps, before in fitting if steps[position][1] == answer]
        emit(answer)
        position += 1
    if args.lingers_after_eof:
        while True:
            time.sleep(60)
    return 0


if __name__ == "__main__":
    sys.exit(main())
