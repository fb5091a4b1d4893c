"""The report of ``acp-lite check``: per check and per requirement, as text and as JSON. Any thread."""

from typing import Any, Dict, Iterator, List, NamedTuple, Optional

from .check_probe import AUTH_SKIP, FAIL, MUST_LEVELS, NOTE, PASS, REQUIREMENT_LEVELS, SKIP, Finding

_TRANSCRIPT_LIMIT = 400  # characters of one transcript line in the text report
# Which status a requirement takes when its findings differ: the highest.
_PRECEDENCE = {SKIP: 0, PASS: 1, NOTE: 2, FAIL: 3}


class CheckResult(NamedTuple):
    """What one check found, with the transcript of its agent process(es) and stderr tail."""

    name: str
    summary: str
    findings: List[Finding]
    transcript: List[str]
    stderr: str
    seconds: float


class CheckReport(NamedTuple):
    """A whole run: each check's result, the wire findings over all of them, and per
    requirement the overall status (FAIL if any finding failed, else NOTE for advice not followed,
    else PASS if any passed)."""

    agent_command: List[str]
    agent_info: Optional[Dict[str, Any]]
    checks: List[CheckResult]
    wire: List[Finding]
    auth_methods: List[str]  # the ids of the authMethods the agent advertised

    def blocked_by_auth(self) -> List[str]:
        """The checks an ``auth_required`` answer stopped (no ``--auth-method`` was given)."""
        return [check.name for check in self.checks if any(finding.detail == AUTH_SKIP for finding in check.findings)]

    def requirement_status(self) -> Dict[str, str]:
        status: Dict[str, str] = {}
        for finding in self.findings():
            known = status.get(finding.requirement)
            if known is None or _PRECEDENCE[finding.status] > _PRECEDENCE[known]:
                status[finding.requirement] = finding.status
        return status

    def findings(self) -> Iterator[Finding]:
        for check in self.checks:
            yield from check.findings
        yield from self.wire

    def must_failures(self) -> List[str]:
        return [
            requirement
            for requirement, status in sorted(self.requirement_status().items())
            if status == FAIL and REQUIREMENT_LEVELS[requirement] in MUST_LEVELS
        ]

    @property
    def exit_status(self) -> int:
        return 1 if self.must_failures() else 0


def _format_finding(finding: Finding) -> str:
    return f"  {finding.status} {finding.requirement} ({finding.level}): {finding.detail}"


def format_check_result(result: CheckResult) -> str:
    """A check's result as text: a header, its findings, and on failure its transcript; a check
    skipped as a whole takes one line. Any thread."""
    reasons = {finding.detail for finding in result.findings if finding.status == SKIP}
    if len(reasons) == 1 and all(finding.status == SKIP for finding in result.findings):
        return f"{result.name}: SKIP ({reasons.pop()})"
    lines = [f"{result.name}: {result.summary} ({result.seconds:.2f} s)"]
    lines.extend(_format_finding(finding) for finding in result.findings)
    if any(finding.status == FAIL for finding in result.findings):
        lines.append("  transcript (-> to the agent, <- from it):")
        lines.extend(
            "    " + (line if len(line) <= _TRANSCRIPT_LIMIT else line[:_TRANSCRIPT_LIMIT] + "...")
            for line in result.transcript
        )
        if result.stderr.strip():
            lines.append("  agent stderr (last lines):")
            lines.extend("    " + line for line in result.stderr.strip().splitlines()[-10:])
    return "\n".join(lines)


def format_summary(report: CheckReport) -> str:
    """The wire findings and the totals per requirement. Any thread."""
    lines = ["wire: every line the agent wrote, in every check"]
    lines.extend(_format_finding(finding) for finding in report.wire)
    statuses = list(report.requirement_status().values())
    failures = report.must_failures()
    blocked = report.blocked_by_auth()
    if blocked:
        methods = ", ".join(report.auth_methods) or "none advertised"
        lines.append("")
        lines.append(
            f"{AUTH_SKIP} stopped {len(blocked)} check(s) ({', '.join(blocked)}): "
            f"pass --auth-method ID to run them (the agent advertises: {methods})"
        )
    lines.append("")
    lines.append(
        f"{len(statuses)} requirements: {statuses.count(PASS)} passed, {statuses.count(FAIL)} failed, "
        f"{statuses.count(SKIP)} skipped"
        + (f", {statuses.count(NOTE)} note(s) of advice" if NOTE in statuses else "")
        + "; "
        + (f"MUST-level failures: {', '.join(failures)}" if failures else "no MUST-level failure")
    )
    return "\n".join(lines)


def report_json(report: CheckReport) -> Dict[str, Any]:
    """The report as JSON-ready data; failed checks carry their wire transcript. Any thread."""
    return {
        "agent": report.agent_command,
        "agentInfo": report.agent_info,
        "exitStatus": report.exit_status,
        "blockedByAuthentication": report.blocked_by_auth(),
        "requirements": {
            requirement: {"level": REQUIREMENT_LEVELS[requirement], "status": status}
            for requirement, status in sorted(report.requirement_status().items())
        },
        "checks": [
            {
                "name": result.name,
                "summary": result.summary,
                "seconds": round(result.seconds, 3),
                "findings": [finding._asdict() for finding in result.findings],
                **(
                    {"transcript": result.transcript, "stderr": result.stderr}
                    if any(finding.status == FAIL for finding in result.findings)
                    else {}
                ),
            }
            for result in report.checks
        ],
        "wire": [finding._asdict() for finding in report.wire],
    }
