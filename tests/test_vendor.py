"""The single-file build (``acp_lite.tools.vendor``).

The rules of the build are pinned on small throwaway packages, so each test shows the one rule it
is about; the real package is then built once and imported under another name, inside a package,
in a process where ``acp_lite`` itself cannot be imported (test_vendor_runs.py runs the protocol
scenarios there).
"""

import importlib.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from acp_lite import __version__
from acp_lite.tools import vendor

REPO = Path(__file__).resolve().parent.parent


def make_package(root: Path, files: dict, name: str = "toy") -> Path:
    package = root / name
    package.mkdir()
    (package / "__init__.py").write_text('"""A toy package."""\n__version__ = "9.9"\n')
    for filename, source in files.items():
        (package / filename).parent.mkdir(exist_ok=True)
        (package / filename).write_text(textwrap.dedent(source))
    return package


@pytest.fixture
def toy(tmp_path, monkeypatch):
    """Point the builder at a throwaway package made of the given files; returns the rendered text."""

    def render(files: dict) -> str:
        package = make_package(tmp_path, files)
        monkeypatch.setattr(vendor, "PACKAGE_DIR", package)
        monkeypatch.setattr(vendor, "PACKAGE_NAME", package.name)
        return vendor.render()

    return render


def import_text(text: str, path: Path, name: str):
    """Import ``text`` as module ``name`` (registered in sys.modules while the test runs, as msgspec
    resolves postponed annotations through it)."""
    path.write_text(text)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


TOY = {
    # zeta sorts last but is needed first.
    "zeta.py": '''\
        """Zeta: the base values."""
        import os
        import os.path
        from typing import List

        BASE = 40


        def _zeta_helper() -> int:
            return 2
        ''',
    # alpha: postponed annotations with forward references (msgspec must still resolve them), an
    # import under TYPE_CHECKING that would be a cycle if it counted, and an __all__.
    "alpha.py": """\
        from __future__ import annotations

        from typing import TYPE_CHECKING, List

        import msgspec

        from .zeta import BASE, _zeta_helper

        if TYPE_CHECKING:
            from .beta import Later


        class Item(msgspec.Struct):
            children: List[Child]


        class Child(msgspec.Struct):
            n: int


        ANSWER = BASE + _zeta_helper()

        __all__ = ["Item", "Child", "ANSWER"]
        """,
    # beta: a lazy import inside a function, and names it does not export.
    "beta.py": '''\
        """Beta: what uses alpha."""
        from .alpha import ANSWER


        class Later:
            def answer(self):
                from .zeta import BASE  # lazy
                return ANSWER, BASE
        ''',
}


@pytest.mark.timeout(30)
def test_concatenates_in_import_order_and_the_result_works(toy, tmp_path):
    text = toy(TOY)
    order = [line.split()[2] for line in text.splitlines() if line.startswith("# ---") and "/" in line]
    assert order.index("toy/zeta.py") < order.index("toy/alpha.py") < order.index("toy/beta.py")
    assert text.count("from __future__ import annotations") == 1
    assert "import os.path" in text.splitlines()  # a dotted import keeps its submodule
    assert "from .zeta" not in text and "from .beta" not in text

    single = import_text(text, tmp_path / "single.py", "toy_single_file")
    try:
        assert single.__version__ == "9.9"
        assert single.ANSWER == 42 and single.alpha.ANSWER == 42
        assert single.Later().answer() == (42, 40)
        # Module objects: __all__ when there is one, else the public names the module defines.
        assert sorted(n for n in vars(single.alpha) if not n.startswith("__")) == ["ANSWER", "Child", "Item"]
        assert sorted(n for n in vars(single.zeta) if not n.startswith("__")) == ["BASE"]
        assert single.zeta.__doc__ == "Zeta: the base values."
        assert single.beta.__name__ == "toy_single_file.beta"
        # Postponed annotations still resolve: forward reference, and the file's own globals.
        item = single.msgspec.json.decode(b'{"children": [{"n": 1}]}', type=single.alpha.Item)
        assert item == single.Item(children=[single.Child(n=1)])
    finally:
        del sys.modules["toy_single_file"]


REFUSED = {
    "two modules, one name": (
        {"a.py": "X = 1\n", "b.py": "X = 2\n"},
        "'X' is bound by toy/b.py and by toy/a.py",
    ),
    "a module's name and an import": (
        {"a.py": "import json\n", "b.py": "def json():\n    pass\n"},
        "'json' is bound by toy/b.py and by an import of json",
    ),
    "a name and a module object": (
        {"a.py": "b = 1\n", "b.py": "Y = 2\n"},
        "'b' is bound by toy/a.py and by the module object for toy/b.py",
    ),
    "one name imported from two places": (
        {"a.py": "from json import loads\n", "b.py": "from pickle import loads\n"},
        "'loads' is imported as both",
    ),
    "a global assigned only in a function": (
        {"a.py": "def f():\n    global X\n    X = 1\n", "b.py": "X = 2\n"},
        "'X' is bound by toy/b.py and by toy/a.py",
    ),
    "from . import module": (
        {"a.py": "X = 1\n", "b.py": "from . import a\n"},
        "toy/b.py:1: only `from .mod import Name` can be vendored",
    ),
    "absolute import of the package": (
        {"a.py": "X = 1\n", "b.py": "import toy.a\n"},
        "toy/b.py:1: `import toy...` cannot be vendored",
    ),
    "absolute from-import of the package": (
        {"a.py": "X = 1\n", "b.py": "def f():\n    from toy.a import X\n"},
        "toy/b.py:2: only `from .mod import Name` can be vendored",
    ),
    "renamed import": (
        {"a.py": "X = 1\n", "b.py": "from .a import X as Y\n"},
        "toy/b.py:1: `from .a import X as Y` cannot be vendored",
    ),
    "star import": (
        {"a.py": "X = 1\n", "b.py": "from .a import *\n"},
        "toy/b.py:1: `from .a import *` cannot be vendored",
    ),
    "import cycle": (
        {"a.py": "from .b import Y\nX = 1\n", "b.py": "from .a import X\nY = 1\n"},
        "import cycle between modules",
    ),
    "import sharing a line": (
        {"a.py": "X = 1\n", "b.py": "from .a import X; Y = X\n"},
        "toy/b.py:1: put this statement on lines of its own",
    ),
    "import in a class body": (
        {"a.py": "X = 1\n", "b.py": "class C:\n    from .a import X\n"},
        "an import in the body of class C cannot be vendored",
    ),
    "__all__ that is not a literal": (
        {"a.py": "X = 1\n__all__ = [n for n in ('X',)]\n"},
        "toy/a.py:2: __all__ must be a literal list of names",
    ),
    "__file__": (
        {"a.py": "import os\nHERE = os.path.dirname(__file__)\n"},
        "toy/a.py:2: uses __file__",
    ),
    "__all__ naming nothing": (
        {"a.py": "X = 1\n__all__ = ['X', 'Y']\n"},
        "toy/a.py: __all__ lists names it does not bind: ['Y']",
    ),
}


@pytest.mark.timeout(10)
def test_subpackages_and_the_entry_point_are_left_out_by_construction(toy):
    text = toy(
        {
            "core.py": "X = 1\n",
            "__main__.py": "from .tools.cli import main\n",
            "tools/__init__.py": "",
            "tools/cli.py": "from ..core import X\n",
        }
    )
    assert "toy/core.py" in text
    assert "toy/tools" not in text and "toy/__main__" not in text


@pytest.mark.timeout(10)
@pytest.mark.parametrize("files, message", list(REFUSED.values()), ids=list(REFUSED))
def test_refuses_what_it_cannot_rewrite_faithfully(toy, files, message):
    with pytest.raises(vendor.VendorError) as refused:
        toy(files)
    assert message in str(refused.value)


@pytest.mark.timeout(10)
def test_command_line_reports_a_refusal_and_writes_nothing(tmp_path, monkeypatch, capsys):
    package = make_package(tmp_path, {"a.py": "X = 1\n", "b.py": "X = 2\n"})
    monkeypatch.setattr(vendor, "PACKAGE_DIR", package)
    monkeypatch.setattr(vendor, "PACKAGE_NAME", package.name)
    out = tmp_path / "_acp.py"
    assert vendor.main([str(out)]) == 1
    assert "'X' is bound by toy/b.py and by toy/a.py" in capsys.readouterr().err
    assert os.listdir(tmp_path) == ["toy"]


@pytest.mark.timeout(30)
def test_output_does_not_depend_on_hash_randomization(tmp_path):
    package = make_package(tmp_path, TOY)
    script = (
        "import sys; from pathlib import Path; from acp_lite.tools import vendor\n"
        "vendor.PACKAGE_DIR = Path(sys.argv[1]); vendor.PACKAGE_NAME = 'toy'\n"
        "sys.stdout.write(vendor.render())\n"
    )
    outputs = {
        subprocess.run(
            [sys.executable, "-c", script, str(package)],
            env={**os.environ, "PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            check=True,
            timeout=20,
        ).stdout
        for seed in ("1", "2", "3")
    }
    assert len(outputs) == 1


@pytest.mark.timeout(10)
def test_header_names_the_installed_package_version_outside_git(toy):
    first_lines = toy({"a.py": "X = 1\n"}).splitlines()[:3]
    assert first_lines[0].startswith("# GENERATED by `acp-lite vendor` (`python -m toy.tools.vendor`)")
    assert first_lines[0].endswith("from the installed toy 9.9.")  # no "commit unknown"


# ----- the real package ----------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_command_builds_the_real_package_with_version_and_head_commit(tmp_path):
    out = tmp_path / "my_plugin" / "_acp.py"
    out.parent.mkdir()
    done = subprocess.run(
        [sys.executable, "-m", "acp_lite.tools.vendor", str(out)], capture_output=True, text=True, timeout=50
    )
    assert done.returncode == 0 and done.stdout == f"vendor: wrote {out}\n", done.stderr
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    first = out.read_text().splitlines()[0]
    origin = f"acp_lite {__version__}, commit {head}" if head else f"the installed acp_lite {__version__}"
    assert f"from {origin}" in first
