"""The code runs on Python 3.9, the oldest release pyproject.toml promises.

``vermin`` finds the minimum version the syntax and standard-library use need. It cannot tell a
``X | Y`` union in an annotation from ``a | b`` on integers, so a small AST check covers that one
case, which matters here: msgspec evaluates annotations, and ``int | None`` needs 3.10 even under
``from __future__ import annotations``. When a 3.9 interpreter is at hand (``tests/pythons.py``
looks in pyenv's versions and on the PATH), everything is also compiled with it, and ``.ci/run``
runs the runtime's tests with it.
"""

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest
from pythons import find_python

REPO = Path(__file__).resolve().parent.parent
CHECKED = [REPO / "acp_lite", REPO / "examples"]
PYTHON39 = find_python("3.9")


def python_files():
    return sorted(p for root in CHECKED for p in root.rglob("*.py"))


def run_vermin(*paths):
    return subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, vermin; sys.exit(vermin.main())",
            "--target=3.9-",
            "--no-tips",
            "--violations",
            "--eval-annotations",
            *map(str, paths),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.timeout(120)
@pytest.mark.slow
def test_vermin_finds_nothing_newer_than_python_3_9():
    result = run_vermin(*CHECKED)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.timeout(60)
def test_vermin_check_fails_on_code_that_needs_3_10(tmp_path):
    newer = tmp_path / "newer.py"
    newer.write_text("pairs = list(zip([1], [2], strict=True))\n")
    result = run_vermin(newer)
    assert result.returncode == 1 and "3.10" in result.stdout


def pep604_annotations(path: Path):
    """The lines with ``X | Y`` in an annotation (quoted ones included)."""
    found = []

    def check(annotation, line):
        if annotation is None:
            return
        if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
            try:
                annotation = ast.parse(annotation.value, mode="eval").body
            except SyntaxError:
                return
        if any(isinstance(n, ast.BinOp) and isinstance(n.op, ast.BitOr) for n in ast.walk(annotation)):
            found.append(line)

    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args
            for arg in args.posonlyargs + args.args + args.kwonlyargs + [args.vararg, args.kwarg]:
                if arg is not None:
                    check(arg.annotation, arg.lineno)
            check(node.returns, node.lineno)
        elif isinstance(node, ast.AnnAssign):
            check(node.annotation, node.lineno)
    return sorted(found)


@pytest.mark.timeout(60)
@pytest.mark.slow
def test_no_pep604_unions_in_annotations():
    found = [f"{path.relative_to(REPO)}:{line}" for path in python_files() for line in pep604_annotations(path)]
    assert not found, "use Optional[...] / Union[...] (Python 3.9): " + ", ".join(found)


@pytest.mark.timeout(60)
def test_pep604_check_sees_quoted_and_plain_unions(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text(
        "def f(a: 'int | None', b: int = 1 | 2) -> int:\n"
        "    x: List[int | str] = []\n"
        "def g() -> str | None:\n"
        "    flags = 1 | 2\n"
    )
    assert pep604_annotations(sample) == [1, 2, 3]


@pytest.mark.timeout(60)
def test_interpreters_are_found_in_pyenv_versions_and_must_run_as_the_version(tmp_path, monkeypatch):
    def fake(path, reports):
        path.parent.mkdir(parents=True)
        path.write_text(f"#!/bin/sh\necho {reports}\n")
        path.chmod(0o755)

    fake(tmp_path / "versions" / "3.9.2" / "bin" / "python3.9", "3.9")
    fake(tmp_path / "versions" / "3.9.10" / "bin" / "python3.9", "3.9")
    fake(tmp_path / "shims" / "python3.8", "3.7")  # a shim that runs another version
    monkeypatch.setenv("PYENV_ROOT", str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path / "shims"))
    assert find_python("3.9") == str(tmp_path / "versions" / "3.9.10" / "bin" / "python3.9")
    assert find_python("3.8") is None


@pytest.mark.timeout(120)
@pytest.mark.skipif(PYTHON39 is None, reason="no Python 3.9 in pyenv's versions or on the PATH")
def test_compiles_with_python_3_9():
    script = "import sys\nfor p in sys.argv[1:]:\n    compile(open(p, 'rb').read(), p, 'exec')\n"
    result = subprocess.run(
        [PYTHON39, "-c", script, *map(str, python_files())],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
    )
    assert result.returncode == 0, result.stderr
