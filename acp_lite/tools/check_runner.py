"""Running the checks of ``acp-lite check``: selection (``-k``), one check after the other with fresh
agent processes, and the wire findings over all of them. Calling thread only."""

import fnmatch
import os
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

from .check_probe import (
    AUTH_SKIP,
    FAIL,
    NOTE,
    PASS,
    SHAPE_REQUIREMENTS,
    SKIP,
    WIRE_REQUIREMENTS,
    CheckFailed,
    CheckOptions,
    CheckSkipped,
    Finding,
    finding_for,
)
from .check_report import CheckReport, CheckResult
from .checks import BASELINE_CHECKS, Check, CheckRun
from .checks_capabilities import CAPABILITY_CHECKS
from .checks_v2 import CHECKS_V2
from .wirecheck import advertised

# Every v1 check, in the order they run.
CHECKS = BASELINE_CHECKS + CAPABILITY_CHECKS
# The checks that find what the checks with ``needs`` look at.
_DISCOVERING_CHECKS = ("initialize", "new-session")


def _checks(protocol: int) -> Sequence[Check]:
    return CHECKS_V2 if protocol == 2 else CHECKS


def selected_checks(pattern: Optional[str], protocol: int = 1) -> List[str]:
    """The names of the checks ``-k PATTERN`` selects: those whose name or a requirement id
    matches (a case-insensitive substring, or a shell-style pattern), plus the discovering checks
    when a selected check needs what they find. ``protocol`` 2: among the v2 checks."""
    checks = _checks(protocol)
    if not pattern:
        return [check.name for check in checks]
    wanted = pattern.lower()

    def matches(text: str) -> bool:
        text = text.lower()
        return wanted in text or fnmatch.fnmatchcase(text, wanted)

    chosen = [check for check in checks if matches(check.name) or any(map(matches, check.requirements))]
    needed = _DISCOVERING_CHECKS if any(check.needs for check in chosen) else ()
    return [check.name for check in checks if check in chosen or check.name in needed]


def run_checks(options: CheckOptions, on_result: Optional[Callable[[CheckResult], None]] = None) -> CheckReport:
    """Run the selected checks one after the other, each with fresh agent processes; calls
    ``on_result`` after each. Raises ``AgentStartError`` when the agent cannot be started at all.
    Calling thread only."""
    discovered: Dict[str, Any] = {}
    wire_seen: Dict[str, int] = {}
    results: List[CheckResult] = []
    names = selected_checks(options.pattern, options.protocol)
    with tempfile.TemporaryDirectory(prefix="acp-lite-check-") as workdir:
        for check in _checks(options.protocol):
            if check.name not in names:
                continue
            if results and results[0].name == "initialize" and "initialize" not in discovered:
                # An agent that cannot complete initialize fails every check the same way.
                result = _skipped_check(check, "the agent did not complete initialize (see the initialize check)")
            else:
                result = _run_check(check, options, os.path.realpath(workdir), discovered, wire_seen, results)
            results.append(result)
            if on_result is not None:
                on_result(result)
    initialized = discovered.get("initialize", {})
    info = initialized.get("agentInfo" if options.protocol == 1 else "info")
    auth_methods = [
        str(method.get("id")) for method in initialized.get("authMethods") or () if isinstance(method, dict)
    ]
    return CheckReport(
        list(options.agent_command),
        info if isinstance(info, dict) else None,
        results,
        _wire_findings(results, wire_seen),
        auth_methods,
    )


def _run_check(
    check: Check,
    options: CheckOptions,
    workdir: str,
    discovered: Dict[str, Any],
    wire_seen: Dict[str, int],
    earlier: List[CheckResult],
) -> CheckResult:
    if check.needs and check.needs[0] == "session" and "session" not in discovered:
        return _skipped_check(check, _why_no_session(earlier))
    if check.needs and not advertised(discovered, *check.needs):
        where = "session/new returned no" if check.needs[0] == "session" else "the agent does not advertise"
        return _skipped_check(check, f"{where} {'.'.join(check.needs[1:])}")
    started = time.monotonic()
    run = CheckRun(options, workdir, discovered)
    stopped_by = "not reached: the check stopped at an earlier failure"
    try:
        check.run(run)
    except CheckSkipped as exc:
        stopped_by = str(exc)
    except CheckFailed as exc:
        run.findings.append(finding_for(exc.requirement, FAIL, str(exc)))
    finally:
        for agent in run.agents:
            agent.stop()
            for requirement, count in agent.wire_seen.items():
                wire_seen[requirement] = wire_seen.get(requirement, 0) + count
    judged = {finding.requirement for finding in run.findings}
    run.findings.extend(
        finding_for(requirement, SKIP, stopped_by) for requirement in check.requirements if requirement not in judged
    )
    stderr = "\n".join(agent.process.stderr_tail() for agent in run.agents)
    return CheckResult(check.name, check.summary, run.findings, run.transcript, stderr, time.monotonic() - started)


def _why_no_session(earlier: List[CheckResult]) -> str:
    """Why no session/new result is known to the checks that look at one."""
    new_session = next((result for result in earlier if result.name == "new-session"), None)
    if new_session is not None and any(finding.detail == AUTH_SKIP for finding in new_session.findings):
        return AUTH_SKIP  # counted among the checks authentication blocked
    return "no session/new succeeded (see the new-session check)"


def _skipped_check(check: Check, why: str) -> CheckResult:
    findings = [finding_for(requirement, SKIP, why) for requirement in check.requirements]
    return CheckResult(check.name, check.summary, findings, [], "", 0.0)


def _wire_findings(results: List[CheckResult], wire_seen: Dict[str, int]) -> List[Finding]:
    """One finding per wire requirement over all checks (failures and notes are reported by their
    check)."""
    failed_in: Dict[str, List[str]] = {}
    for result in results:
        for finding in result.findings:
            if finding.status in (FAIL, NOTE) and (
                finding.requirement in WIRE_REQUIREMENTS or finding.requirement in SHAPE_REQUIREMENTS.values()
            ):
                failed_in.setdefault(finding.requirement, []).append(result.name)
    shapes = [
        requirement
        for requirement in SHAPE_REQUIREMENTS.values()
        if requirement in wire_seen or requirement in failed_in
    ]
    findings = []
    for requirement in (*WIRE_REQUIREMENTS, *dict.fromkeys(shapes)):
        if requirement in failed_in:
            checks = ", ".join(dict.fromkeys(failed_in[requirement]))
            finding = finding_for(requirement, FAIL, "")
            findings.append(finding._replace(detail=f"{'noted' if finding.status == NOTE else 'failed'} in: {checks}"))
        elif requirement in wire_seen:
            findings.append(finding_for(requirement, PASS, f"{wire_seen[requirement]} message(s) judged"))
        elif requirement == "ACP-V1-CONFIG-NO-BOOLEAN-WITHOUT-CAPABILITY":
            findings.append(finding_for(requirement, SKIP, "the agent sent no configOptions"))
        else:
            findings.append(finding_for(requirement, SKIP, "none of the agent's messages exercised it"))
    return findings
