"""Build the single-file edition of acp_lite, for editor plugins that ship their dependencies.

    python -m acp_lite.tools.vendor my_plugin/_acp.py

writes one module holding the whole runtime and every ACP v1 type. It imports only the standard
library and msgspec, and works under any module name, inside any package. Users of the file write
``from my_plugin import _acp`` and then ``_acp.Agent``, ``_acp.RemoteAgent``, ``_acp.schema.X``,
``_acp.updates.text_chunk(...)``: every top-level name of every module is a name of the file, and
each module is also there as a module object of the same name holding its public names (its
``__all__`` when it has one), so code written against the package reads the same.

How the file is made, and the rules it relies on (the package keeps them so this can stay dumb):

* The modules are this package's ``*.py`` files, except this builder and the command-line tools. Their order
  comes from their own ``from .mod import Name`` statements, sorted topologically; a cycle fails
  the build.
* Intra-package imports are removed (nested ones, e.g. inside a function or ``if TYPE_CHECKING:``,
  become ``pass``): in one file every name is already a global. Any other form of intra-package
  import (``from . import mod``, ``import acp_lite.x``, ``*``, ``as``) fails the build, because it
  cannot be rewritten into a name that exists.
* Top-level ``import``/``from`` statements of other packages are hoisted to the top and merged,
  ``from __future__`` features are merged into one statement. The ``annotations`` feature then
  applies to the whole file, which is harmless: every name an annotation uses is a global of it,
  where msgspec and ``typing`` look them up.
* A top-level name bound by two modules (or a module name colliding with a top-level name) fails
  the build: in one namespace the later one would silently replace the earlier. So do subpackages
  and ``__file__``, which one file cannot reproduce.

The header names the acp_lite version and, from a git checkout, the commit the file was built from. Build-time only:
this module is not part of the vendored file and runs on the developer's interpreter.
"""

import argparse
import ast
import graphlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, NamedTuple, Optional, Set, Tuple, Union

from .argtypes import writable_file

PACKAGE_DIR = Path(__file__).resolve().parent.parent
PACKAGE_NAME = PACKAGE_DIR.name
# The builder and the command-line tools: a plugin embeds the runtime, not the terminal commands.
# Names the generated footer adds; they must not collide with anything in the package.
_FOOTER_NAMES = {"types", "_vendored_module"}


class VendorError(Exception):
    """The package breaks a rule the single-file build relies on; the message says where and how."""


class _Import(NamedTuple):
    """One name bound by an import statement: ``import module [as bound]`` when ``attribute`` is
    None, else ``from module import attribute [as bound]``."""

    module: str
    attribute: Optional[str]
    bound: str

    def referent(self) -> str:
        """What the bound name stands for; two imports of one name must agree on it."""
        if self.attribute is not None:
            return f"{self.module}.{self.attribute}"
        return self.module if self.bound != self.module.split(".")[0] else self.bound

    def statement(self) -> str:
        alias = "" if self.bound == (self.attribute or self.module.split(".")[0]) else f" as {self.bound}"
        if self.attribute is None:
            return f"import {self.module}{alias}"
        return f"from {self.module} import {self.attribute}{alias}"


class _ParsedModule(NamedTuple):
    name: str
    doc: Optional[str]
    body: str  # the source less its imports (and, unless it is __init__, its __all__)
    depends_on: Set[str]  # sibling modules whose names it needs at import time
    future: Set[str]
    imports: Set[_Import]  # its top-level imports of other packages, to hoist
    defines: Set[str]  # top-level names bound by its own statements
    public: List[str]  # the names its module object exposes


def build(out_path: Union[str, "os.PathLike[str]"]) -> Path:
    """Write the single-file module to ``out_path`` (whose directory must exist) and return its
    path. Raises ``VendorError``."""
    out = Path(out_path)
    text = render()
    compile(text, str(out), "exec")  # a rewrite that broke the syntax must fail here, not in a plugin
    if not out.parent.is_dir():  # a typo in the path must not leave a tree of new directories
        raise VendorError(f"no directory {out.parent}: create it first (vendor creates none)")
    partial = out.with_name(out.name + ".partial")
    partial.write_text(text, encoding="utf-8")
    os.replace(partial, out)
    return out


def render() -> str:
    """The single-file module's source text. Raises ``VendorError``."""
    modules = {m.name: m for m in (_parse_module(path) for path in _module_paths())}
    order = _import_order(modules)
    imports = _merged_imports(modules, order)
    _check_unique_names(modules, order, imports)

    future = sorted(set().union(*(m.future for m in modules.values())))
    parts = [_header(_version())]
    if future:
        parts.append(f"from __future__ import {', '.join(future)}\n")
    parts.append(_render_imports(imports))
    for name in order:
        parts.append(f"\n# {'-' * 30} {PACKAGE_NAME}/{name}.py {'-' * 30}\n\n{modules[name].body.strip()}\n")
    parts.append(_footer(modules, order))
    return "\n".join(parts)


def source_commit() -> Optional[str]:
    """The git commit the package is at, marked when its files have uncommitted changes; None
    when the package is not a git checkout (an installed package: its version says it all)."""

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=PACKAGE_DIR, capture_output=True, text=True, check=True, timeout=30
        ).stdout.strip()

    try:
        if Path(git("rev-parse", "--show-toplevel")).resolve() != PACKAGE_DIR.parent:
            return None  # e.g. installed into a virtualenv that sits inside some other repository
        commit = git("rev-parse", "HEAD")
        dirty = git("status", "--porcelain", "--", ".")
    except (OSError, subprocess.SubprocessError):
        return None
    return f"{commit} with uncommitted changes" if dirty else commit


def _module_paths() -> List[Path]:
    """The runtime: every top-level module of the package but the ``python -m`` entry point.
    Subpackages (the tools) are never vendored."""
    return sorted(p for p in PACKAGE_DIR.glob("*.py") if p.stem != "__main__")


def _parse_module(path: Path) -> _ParsedModule:
    name = path.stem
    source = path.read_text(encoding="utf-8")
    tree = ast.parse(source, str(path))
    where = f"{PACKAGE_NAME}/{path.name}"

    removed: List[ast.stmt] = []  # statements to delete
    future: Set[str] = set()
    imports: Set[_Import] = set()
    depends_on: Set[str] = set()
    public: Optional[List[str]] = None
    defines: Set[str] = set()
    for node in tree.body:
        sibling = _sibling_import(node, where)
        if sibling is not None:
            depends_on.add(sibling)
            removed.append(node)
        elif isinstance(node, ast.ImportFrom) and node.module == "__future__":
            future.update(alias.name for alias in node.names)
            removed.append(node)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            imports.update(_imports_of(node))
            removed.append(node)
        elif name != "__init__" and isinstance(node, ast.Assign) and _assigns_all(node):
            try:
                public = list(ast.literal_eval(node.value))
            except ValueError:
                raise VendorError(f"{where}:{node.lineno}: __all__ must be a literal list of names") from None
            removed.append(node)
        else:
            defines |= _bound_names(node)
    for name_node in ast.walk(tree):
        if isinstance(name_node, ast.Name) and name_node.id == "__file__":
            raise VendorError(f"{where}:{name_node.lineno}: uses __file__, which in one file would name that file")
    # ``global x`` in a function binds a module-level name too.
    defines |= {n for node in ast.walk(tree) if isinstance(node, ast.Global) for n in node.names}

    to_pass = []  # nested sibling imports: each becomes ``pass``
    for node, runs_at_import in _nested_imports(tree, where):
        sibling = _sibling_import(node, where)
        if sibling is not None:
            to_pass.append(node)
            if runs_at_import:
                depends_on.add(sibling)

    return _ParsedModule(
        name=name,
        doc=ast.get_docstring(tree, clean=False),
        body=_edit(source.splitlines(), removed, to_pass, where),
        depends_on=depends_on - {name},
        future=future,
        imports=imports,
        defines=defines,
        public=public if public is not None else sorted(n for n in defines if not n.startswith("_")),
    )


def _sibling_import(node: ast.AST, where: str) -> Optional[str]:
    """The sibling module an import statement takes names from, None when it imports from
    elsewhere (or is no import); raises for the forms the build cannot rewrite."""
    if isinstance(node, ast.Import):
        if any(alias.name.split(".")[0] == PACKAGE_NAME for alias in node.names):
            raise VendorError(
                f"{where}:{node.lineno}: `import {PACKAGE_NAME}...` cannot be vendored; use `from .mod import Name`"
            )
        return None
    if not isinstance(node, ast.ImportFrom):
        return None
    absolute = node.level == 0 and (node.module or "").split(".")[0] == PACKAGE_NAME
    if node.level == 0 and not absolute:
        return None
    if absolute or node.level > 1 or node.module is None or "." in node.module:
        raise VendorError(f"{where}:{node.lineno}: only `from .mod import Name` can be vendored")
    for alias in node.names:
        if alias.name == "*" or alias.asname not in (None, alias.name):
            raise VendorError(
                f"{where}:{node.lineno}: `from .{node.module} import {alias.name}"
                + (f" as {alias.asname}" if alias.asname else "")
                + "` cannot be vendored; import the name itself"
            )
    return node.module


def _imports_of(node: ast.stmt) -> List[_Import]:
    if isinstance(node, ast.Import):
        return [_Import(a.name, None, a.asname or a.name.split(".")[0]) for a in node.names]
    assert isinstance(node, ast.ImportFrom) and node.module is not None
    return [_Import(node.module, a.name, a.asname or a.name) for a in node.names]


def _assigns_all(node: ast.Assign) -> bool:
    return any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets)


def _nested_imports(tree: ast.Module, where: str) -> List[Tuple[ast.stmt, bool]]:
    """Every import statement below the module's top level, with whether it runs when the module
    is imported (it does not inside a function or under ``if TYPE_CHECKING:``)."""
    found: List[Tuple[ast.stmt, bool]] = []

    def visit(node: ast.AST, runs: bool) -> None:
        for field, value in ast.iter_fields(node):
            for child in value if isinstance(value, list) else [value]:
                if not isinstance(child, ast.AST):
                    continue
                child_runs = runs and not (
                    (isinstance(node, ast.If) and field == "body" and _is_type_checking(node.test))
                    or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
                )
                if not isinstance(child, (ast.Import, ast.ImportFrom)):
                    visit(child, child_runs)
                elif node is not tree:
                    if isinstance(node, ast.ClassDef) and _sibling_import(child, where) is not None:
                        raise VendorError(
                            f"{where}:{child.lineno}: an import in the body of class {node.name} cannot be vendored"
                        )
                    found.append((child, child_runs))

    visit(tree, True)
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _bound_names(node: ast.stmt) -> Set[str]:
    """The module-level names a top-level statement binds, including inside its if/try/with/for
    blocks, which run at module level too."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return set() if getattr(node, "level", 0) else {i.bound for i in _imports_of(node)}
    targets: List[ast.AST] = []
    if isinstance(node, ast.Assign):
        targets = list(node.targets)
    elif isinstance(node, (ast.AnnAssign, ast.AugAssign, ast.For, ast.AsyncFor)):
        targets = [node.target]
    elif isinstance(node, (ast.With, ast.AsyncWith)):
        targets = [item.optional_vars for item in node.items if item.optional_vars is not None]
    names = {n.id for target in targets for n in ast.walk(target) if isinstance(n, ast.Name)}
    names |= {n.target.id for n in ast.walk(node) if isinstance(n, ast.NamedExpr) and isinstance(n.target, ast.Name)}
    for handler in getattr(node, "handlers", []):
        if handler.name:
            names.add(handler.name)
    for block in [getattr(node, f, []) for f in ("body", "orelse", "finalbody")] + [
        h.body for h in getattr(node, "handlers", [])
    ]:
        for child in block:
            names |= _bound_names(child)
    return names


def _edit(lines: List[str], removed: List[ast.stmt], to_pass: List[ast.stmt], where: str) -> str:
    """``lines`` with the ``removed`` statements deleted and the ``to_pass`` ones replaced by
    ``pass``. Each must sit alone on its lines, so that the edit touches nothing else."""
    out: List[Optional[str]] = list(lines)
    for node, replacement in [(n, None) for n in removed] + [(n, "pass") for n in to_pass]:
        first, last = node.lineno - 1, (node.end_lineno or node.lineno) - 1
        head, tail = lines[first][: node.col_offset], lines[last][node.end_col_offset :].strip()
        if head.strip() or (tail and not tail.startswith("#")):
            raise VendorError(f"{where}:{node.lineno}: put this statement on lines of its own")
        out[first : last + 1] = [None] * (last - first + 1)
        if replacement is not None:
            out[first] = head + replacement
    return "\n".join(line for line in out if line is not None)


def _import_order(modules: Dict[str, _ParsedModule]) -> List[str]:
    sorter: graphlib.TopologicalSorter[str] = graphlib.TopologicalSorter()
    for name in sorted(modules):
        missing = modules[name].depends_on - modules.keys()
        if missing:
            raise VendorError(f"{PACKAGE_NAME}/{name}.py imports from missing module(s) {sorted(missing)}")
        sorter.add(name, *sorted(modules[name].depends_on))
    try:
        return list(sorter.static_order())
    except graphlib.CycleError as exc:
        raise VendorError(f"import cycle between modules: {' -> '.join(exc.args[1])}") from None


def _merged_imports(modules: Dict[str, _ParsedModule], order: List[str]) -> Set[_Import]:
    """The hoisted imports of all modules plus the footer's; fails when two of them bind one name
    to different things."""
    merged = {_Import("types", None, "types")}
    for name in order:
        merged |= modules[name].imports
    referents: Dict[str, str] = {}
    for imp in sorted(merged, key=lambda i: (i.bound, i.statement())):
        if referents.setdefault(imp.bound, imp.referent()) != imp.referent():
            raise VendorError(f"{imp.bound!r} is imported as both {referents[imp.bound]} and {imp.referent()}")
    return merged


def _check_unique_names(modules: Dict[str, _ParsedModule], order: List[str], imports: Set[_Import]) -> None:
    """Fail when one global would be bound by two modules, by a module and an import, or by a
    module and a module object."""
    owner = {imp.bound: f"an import of {imp.referent()}" for imp in imports}
    owner.update({n: "the vendored file's footer" for n in _FOOTER_NAMES})
    owner.update({m: f"the module object for {PACKAGE_NAME}/{m}.py" for m in order if m != "__init__"})
    problems = []
    for name in order:
        for defined in sorted(modules[name].defines):
            if defined in owner:
                problems.append(f"{defined!r} is bound by {PACKAGE_NAME}/{name}.py and by {owner[defined]}")
            owner[defined] = f"{PACKAGE_NAME}/{name}.py"
        unbound = [n for n in modules[name].public if n not in owner]
        if unbound:
            problems.append(f"{PACKAGE_NAME}/{name}.py: __all__ lists names it does not bind: {unbound}")
    if problems:
        raise VendorError("top-level names must be unique across the package:\n  " + "\n  ".join(problems))


def _render_imports(imports: Set[_Import]) -> str:
    plain = sorted(imp.statement() for imp in imports if imp.attribute is None)
    names: Dict[str, List[str]] = {}
    for imp in imports:
        if imp.attribute is not None:
            names.setdefault(imp.module, []).append(imp.statement().split(" import ", 1)[1])
    return (
        "\n".join(plain + [f"from {module} import {', '.join(sorted(names[module]))}" for module in sorted(names)])
        + "\n"
    )


def _version() -> str:
    init = PACKAGE_DIR / "__init__.py"
    for node in ast.parse(init.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["__version__"]:
            return str(ast.literal_eval(node.value))
    raise VendorError(f"{PACKAGE_NAME}/__init__.py must set __version__ to a literal")


def _header(version: str) -> str:
    commit = source_commit()
    origin = f"{PACKAGE_NAME} {version}, commit {commit}" if commit else f"the installed {PACKAGE_NAME} {version}"
    return (
        f"# GENERATED by `acp-lite vendor` (`python -m {PACKAGE_NAME}.tools.vendor`) from {origin}.\n"
        f"# Do not edit: to upgrade, run the same command with the new {PACKAGE_NAME} installed.\n"
        f'"""{PACKAGE_NAME} {version} in one module, built from {origin}.\n'
        "\n"
        "Every top-level name of the package is a name of this module (``Agent``, ``RemoteAgent``,\n"
        "``serve``, ...), and each package module is a module object here holding that module's public\n"
        "names (``schema``, ``updates``, ``errors``, ...). It needs only the standard library and msgspec.\n"
        "Import it as a module, never exec() its text: msgspec looks its types' annotations up through\n"
        "``sys.modules[__name__]``.\n"
        '"""\n'
    )


def _footer(modules: Dict[str, _ParsedModule], order: List[str]) -> str:
    lines = [
        f"\n# {'-' * 30} module objects {'-' * 30}\n\n",
        "def _vendored_module(name, doc, names):",
        "    # Stands in for the package module `name`, so that `.schema.X` reads as it does with the package.",
        "    module = types.ModuleType(__name__ + '.' + name, doc)",
        "    for attribute in names:",
        "        setattr(module, attribute, globals()[attribute])",
        "    return module\n\n",
    ]
    for name in order:
        if name != "__init__":
            lines.append(f"{name} = _vendored_module({name!r}, {modules[name].doc!r}, {modules[name].public!r})")
    return "\n".join(lines) + "\n"


def configure_vendor_command(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "out", type=writable_file, help="the module file to write, e.g. my_plugin/_acp.py (its directory must exist)"
    )


def vendor_command(args: argparse.Namespace) -> int:
    """Build the file ``args.out``; ``acp-lite vendor`` and ``python -m acp_lite.tools.vendor``."""
    try:
        out = build(args.out)
    except VendorError as exc:
        print(f"vendor: {exc}", file=sys.stderr)
        return 1
    print(f"vendor: wrote {out}")
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m {PACKAGE_NAME}.tools.vendor", description=__doc__.splitlines()[0])
    configure_vendor_command(parser)
    return vendor_command(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
