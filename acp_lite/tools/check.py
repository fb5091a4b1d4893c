"""``acp-lite check``: a black-box conformance probe for any ACP agent that speaks stdio.

The probe plays the client. Each check starts a fresh agent process (so that one crash cannot hide
the rest), drives it with raw JSON lines, and judges what comes back. A check ends in findings, one
per requirement id of ``spec/manifest`` that it observed: PASS, FAIL (with the wire transcript that
shows it) or SKIP (with why: a capability the agent does not advertise, authentication it needs, a
turn too short to cancel).

Two kinds of judgement:

- Each check exercises one feature (version negotiation, a prompt turn, cancel, load, ...) and
  judges that feature's requirements.
- Every line the agent writes, in every check, also goes through ``WireChecker`` (the same judge as
  ``acp-lite validate``): UTF-8 JSON-RPC only, responses with exactly one of result and error and an
  id we sent, every message decoding strictly into the v1 types (a lenient decoding counts against
  the agent), no fs/terminal/elicitation call the probe did not advertise. These "wire" findings
  are reported once, over all checks.

The probe advertises no client capability at all, so an agent must not call fs, terminal or
elicitation methods, offer boolean config options or terminal authentication methods. It answers
a permission request with a reject option (with ``cancelled`` once it has cancelled the turn) and
any other agent request with -32601. It never authenticates or logs out unless given
``--auth-method``, since that can change the user's real account state.

Exit status: 0 when no MUST-level requirement failed, 1 otherwise, 2 for a usage error, 127 when the
agent cannot be started. A requirement's level is its manifest keyword. The ``probe:`` findings are
the probe's advice (level ADVICE), where v1 has no rule; one not followed is a NOTE, never a FAIL:
the agent exits when its stdin closes (one that outlives its client leaks a process in every editor
that does not stop it, but the transports page does not require it), and it answers within
``--timeout``. An answer is awaited ``NO_RESPONSE_FACTOR`` times that long before "no response"
fails a MUST: on a loaded machine the machine, not the agent, may be slow. An agent may refuse a
request with a well-formed error (``session/set_mode``, say): the check of that answer's shape is
then skipped, saying so.

With ``--protocol 2`` the checks are those of ``checks_v2``: the agent's ACP v2 (draft) surface,
judged by the draft manifest's rules; the wire findings are the same.

The parts: ``check_probe`` (one agent process driven by hand, the wire judgement, the requirement
tables), ``checks`` (the checks), ``checks_v2`` (those of ``--protocol 2``), ``check_runner``
(selection and running), ``check_report`` (the report as text and JSON); this module is the command.
"""

import argparse
import json

from ..errors import AgentStartError
from .argtypes import positive_seconds, writable_file
from .check_probe import DEFAULT_CANCEL_PROMPT, CheckOptions
from .check_report import format_check_result, format_summary, report_json
from .check_runner import run_checks, selected_checks
from .exits import CANNOT_START, cli_error


# -- the command ----------------------------------------------------------------------------------
def configure_check_command(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--timeout",
        type=positive_seconds,
        default=10.0,
        metavar="S",
        help="an answer later than this is noted as slow; none within 3 times this fails (default: 10)",
    )
    parser.add_argument(
        "--cancel-prompt",
        default=DEFAULT_CANCEL_PROMPT,
        metavar="TEXT",
        help="a prompt that keeps the agent busy long enough to cancel it",
    )
    parser.add_argument(
        "--auth-method",
        metavar="ID",
        help="authenticate with this method after initialize (and exercise authenticate/logout)",
    )
    parser.add_argument(
        "--json",
        type=writable_file,
        metavar="FILE",
        help="write the full report, with the transcript of each failure, here",
    )
    parser.add_argument(
        "--protocol",
        type=int,
        choices=(1, 2),
        default=1,
        help="2: probe the agent's ACP v2 (draft) surface instead of v1 (default: 1)",
    )
    parser.add_argument(
        "-k",
        metavar="PATTERN",
        dest="pattern",
        help="run only the checks whose name or a requirement id contains PATTERN "
        "(or matches it as a shell pattern, e.g. 'ACP-V1-SETUP-*')",
    )


def check_command(args: argparse.Namespace) -> int:
    """``acp-lite check``: run the probe, print each check's result as it ends and then the
    summary; 0 when no MUST-level requirement failed. Main thread (it prints)."""
    options = CheckOptions(
        list(args.agent_command), args.timeout, args.cancel_prompt, args.auth_method, args.pattern, args.protocol
    )
    if not selected_checks(options.pattern, options.protocol):
        cli_error(f"no check matches -k {options.pattern!r}")
        return 2
    print(f"acp-lite check: {' '.join(options.agent_command)}", flush=True)
    try:
        report = run_checks(options, lambda result: print(format_check_result(result), flush=True))
    except AgentStartError as exc:
        cli_error(str(exc))
        return CANNOT_START
    print(format_summary(report), flush=True)
    if args.json:  # checked before the run (argtypes), yet the disk may have filled up since
        try:
            with open(args.json, "w", encoding="utf-8") as out:
                json.dump(report_json(report), out, indent=1, ensure_ascii=False)
                out.write("\n")
        except OSError as exc:
            cli_error(f"cannot write {args.json}: {exc.strerror or exc}")
            return 1
    return report.exit_status
