"""The workspace's building blocks without a connection: the root-set policy, the output buffer
and the terminal manager. ``test_workspace.py`` drives the same rules over the wire."""

import io
import os
import sys
import time
import unicodedata
from concurrent.futures import Future
from contextlib import contextmanager
from unittest.mock import patch

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from acp_lite import beneath, files, terminals
from acp_lite.errors import InvalidParams, ResourceNotFound
from acp_lite.files import RootSet
from acp_lite.terminals import TerminalManager, _OutputBuffer

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def tree(tmp_path):
    """``root`` (the session's cwd) beside ``outside``, with links between them."""
    root = tmp_path / "root"
    outside = tmp_path / "outside"
    (root / "sub").mkdir(parents=True)
    outside.mkdir()
    (root / "a.txt").write_text("in")
    (outside / "secret.txt").write_text("out")
    (root / "link_out").symlink_to(outside)
    (root / "link_in").symlink_to("sub")
    (root / "dangling_out").symlink_to(outside / "not-yet")
    (root / "file_out").symlink_to(outside / "secret.txt")
    return root, outside


# -- RootSet ------------------------------------------------------------------------------------
def _opened(roots, path):
    """The (device, inode) of what ``roots.open`` opens for ``path``."""
    fd, _, _ = roots.open(path, os.O_RDONLY)
    try:
        info = os.fstat(fd)
    finally:
        os.close(fd)
    return info.st_dev, info.st_ino


def _identity(path):
    info = os.stat(path)
    return info.st_dev, info.st_ino


@contextmanager
def root_set(*args):
    roots = RootSet(*args)
    try:
        yield roots
    finally:
        roots.close()


@pytest.fixture(params=["openat2", "walk"])
def resolver(request):
    """Each test runs with the kernel's resolution and with the component walk."""
    if request.param == "openat2" and beneath._syscall is None:
        pytest.skip("this system has no openat2")
    with patch.object(beneath, "_syscall", beneath._syscall if request.param == "openat2" else None):
        yield request.param


@pytest.mark.req("ACP-V1-OVERVIEW-ABSOLUTE-PATHS")
@pytest.mark.parametrize("path", ["a.txt", "./a.txt", "../root/a.txt", "", "~/a.txt", "C:\\root\\a.txt"])
def test_relative_paths_are_invalid_params(tree, path):
    root, _ = tree
    with root_set(str(root)) as roots, pytest.raises(InvalidParams, match="absolute"):
        roots.open(path, os.O_RDONLY)


def test_a_nul_character_is_invalid_params(tree):
    root, _ = tree
    with root_set(str(root)) as roots, pytest.raises(InvalidParams, match="NUL"):
        roots.open(f"{root}/a.txt\x00.png", os.O_RDONLY)


@pytest.mark.req("ACP-V1-SETUP-CWD-IN-ROOT-SET")
@pytest.mark.parametrize(
    "spelling, target",
    [
        ("{root}/a.txt", "a.txt"),
        ("{root}/sub/../a.txt", "a.txt"),
        ("{root}//sub/./", "sub"),
        ("{root}/link_in/x.txt", "sub/x.txt"),  # a relative symlink that stays inside is followed
        ("{root}", ""),
    ],
)
def test_paths_inside_open_what_they_name(tree, resolver, spelling, target):
    root, _ = tree
    (root / "sub" / "x.txt").write_text("x")
    with root_set(str(root)) as roots:
        assert _opened(roots, spelling.format(root=root)) == _identity(root / target)


@pytest.mark.req("ACP-V1-SETUP-ROOT-SET-BOUNDARY")
@pytest.mark.parametrize(
    "spelling",
    [
        "{root}/../outside/secret.txt",  # dot-dot
        "{root}/sub/../../outside/secret.txt",
        "{root}/link_out/secret.txt",  # a symlink leading out
        "{root}/file_out",  # the last component is the symlink
        "{root}/link_in/../../outside/secret.txt",  # '..' after a symlink is taken from its target
        "{root}/dangling_out",  # a dangling symlink whose target would be created outside
        "{root}/link_out/new-file.txt",
        "{root}/abs_in/x.txt",  # an absolute symlink, even one pointing inside
        "{root}/..",
        "/etc/passwd",
        "/",
    ],
)
def test_paths_leading_outside_are_resource_not_found(tree, resolver, spelling):
    root, _ = tree
    (root / "abs_in").symlink_to(root / "sub")
    with root_set(str(root)) as roots, pytest.raises(ResourceNotFound, match="outside the session's root set"):
        roots.open(spelling.format(root=root), os.O_RDONLY)


@pytest.mark.req("ACP-V1-SETUP-ROOT-SET-BOUNDARY")
def test_a_sibling_sharing_the_roots_name_as_a_prefix_is_outside(tree):
    root, _ = tree
    sibling = root.parent / (root.name + "2")
    sibling.mkdir()
    (sibling / "x.txt").write_text("x")
    with root_set(str(root)) as roots, pytest.raises(ResourceNotFound):
        roots.open(f"{sibling}/x.txt", os.O_RDONLY)


@pytest.mark.req("ACP-V1-SETUP-ROOT-SET-BOUNDARY")
@pytest.mark.parametrize(
    "root_name, other_name",
    [
        ("root", "ROOT"),
        (unicodedata.normalize("NFC", "racine-é"), unicodedata.normalize("NFD", "racine-é")),
        ("root", "root\u200b"),
    ],
    ids=["case", "unicode-normalization", "zero-width-space"],
)
def test_a_directory_spelled_almost_like_a_root_is_outside_when_it_is_another_directory(
    tmp_path, root_name, other_name
):
    root = tmp_path / root_name
    other = tmp_path / other_name
    root.mkdir()
    try:
        other.mkdir()
    except FileExistsError:
        pytest.skip("this file system treats both spellings as one directory")
    (other / "x.txt").write_text("x")
    with root_set(str(root)) as roots, pytest.raises(ResourceNotFound):
        roots.open(f"{other}/x.txt", os.O_RDONLY)


def test_roots_are_compared_by_identity_so_any_spelling_of_a_root_is_inside(tree, tmp_path):
    root, _ = tree
    alias = tmp_path / "alias"
    alias.symlink_to(root)
    # The root reported through a symlink (which the editor allows); the path spelled with the
    # real directory, and back.
    with root_set(str(alias), (), True) as roots:
        assert _opened(roots, f"{root}/a.txt") == _identity(root / "a.txt")
    with root_set(str(alias)) as roots:  # by default a symlinked root is no root (issue 33)
        with pytest.raises(ResourceNotFound):
            roots.open(f"{root}/a.txt", os.O_RDONLY)
    with root_set(str(root)) as roots:
        assert _opened(roots, f"{alias}/a.txt") == _identity(root / "a.txt")


@pytest.mark.skipif(not os.path.isdir("/proc/self/root"), reason="needs Linux /proc")
@pytest.mark.req("ACP-V1-SETUP-ROOT-SET-BOUNDARY")
def test_proc_magic_links_inside_a_root_are_outside(tree, resolver):
    root, _ = tree
    (root / "rootfs").symlink_to("/proc/self/root")
    with root_set(str(root)) as roots:
        with pytest.raises(ResourceNotFound):
            roots.open(f"{root}/rootfs/etc/passwd", os.O_RDONLY)
        # A magic link *before* the root only spells the root: the root is found by identity.
        assert _opened(roots, f"/proc/self/root{root}/a.txt") == _identity(root / "a.txt")


@pytest.mark.req("ACP-V1-SETUP-ROOT-SET-BOUNDARY")
def test_additional_directories_join_the_root_set(tree, tmp_path):
    root, outside = tree
    extra = tmp_path / "extra"
    extra.mkdir()
    (extra / "notes.md").write_text("")
    with root_set(str(root), [str(extra)]) as roots:
        assert _opened(roots, f"{extra}/notes.md") == _identity(extra / "notes.md")
        with pytest.raises(ResourceNotFound):
            roots.open(f"{outside}/secret.txt", os.O_RDONLY)


@pytest.mark.req("ACP-V1-SETUP-ROOT-SET-BOUNDARY")
def test_a_root_that_did_not_exist_when_the_session_started_contains_nothing_even_once_created(tmp_path):
    with root_set(str(tmp_path / "later")) as roots:
        (tmp_path / "later").mkdir()
        (tmp_path / "later" / "x.txt").write_text("")
        with pytest.raises(ResourceNotFound):
            roots.open(f"{tmp_path}/later/x.txt", os.O_RDONLY)


# Paths built from these components, each judged against an oracle that knows nothing of inodes:
# the real path (as the kernel would resolve it) is inside iff it is under the root's real path.
_COMPONENTS = st.sampled_from(["..", ".", "sub", "a.txt", "link_in", "link_out", "dangling_out", "missing", ""])


@settings(max_examples=200, deadline=None)
@given(components=st.lists(_COMPONENTS, max_size=7), walk=st.booleans())
@example(components=["a.txt", "."], walk=True)  # a file followed by "/." is not a directory
@pytest.mark.req("ACP-V1-SETUP-ROOT-SET-BOUNDARY")
def test_open_agrees_with_a_spelling_oracle_on_generated_paths(tmp_path_factory, components, walk):
    base = tmp_path_factory.getbasetemp() / "oracle"
    root = base / "root"
    if not root.exists():
        (root / "sub").mkdir(parents=True)
        (base / "outside").mkdir()
        (root / "a.txt").write_text("in")
        (root / "link_out").symlink_to(base / "outside")
        (root / "link_in").symlink_to("sub")
        (root / "dangling_out").symlink_to(base / "outside" / "not-yet")
    path = "/".join([str(root), *components])
    real_root = os.path.realpath(root)
    inside = os.path.commonpath([os.path.realpath(path), real_root]) == real_root
    with patch.object(beneath, "_syscall", None if walk else beneath._syscall), root_set(str(root)) as roots:
        if inside and os.path.exists(path):
            assert _opened(roots, path) == _identity(path)
        else:  # outside, or inside but missing: either way nothing the agent may see
            with pytest.raises(ResourceNotFound):
                roots.open(path, os.O_RDONLY)


# -- line selection --------------------------------------------------------------------------------
@settings(max_examples=300, deadline=None)
@given(
    data=st.lists(st.sampled_from([b"x", b"yz", b"\n", b"\r\n", "é".encode()]), max_size=30).map(b"".join),
    first=st.integers(min_value=1, max_value=12),
    count=st.none() | st.integers(min_value=0, max_value=12),
    chunk=st.integers(min_value=1, max_value=9),
)
def test_line_selection_matches_a_split_on_newlines_whatever_the_read_size(data, first, count, chunk):
    lines = data.split(b"\n")
    lines = [line + b"\n" for line in lines[:-1]] + ([lines[-1]] if lines[-1] else [])
    expected = b"".join(lines[first - 1 :] if count is None else lines[first - 1 : first - 1 + count])
    with patch.object(files, "_IO_CHUNK", chunk):
        assert files._select_lines(io.BytesIO(data), first, count, max_bytes=1000) == expected
        if expected:
            assert files._select_lines(io.BytesIO(data), first, count, max_bytes=len(expected) - 1) is None


# -- the output buffer --------------------------------------------------------------------------
@settings(max_examples=300, deadline=None)
@given(
    text=st.text(st.characters(blacklist_categories=("Cs",)), max_size=60),
    cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=6),
    limit=st.integers(min_value=0, max_value=40),
)
@pytest.mark.req("ACP-V1-TERM-CLIENT-TRUNCATE-AT-CHARACTER-BOUNDARY")
@example(text="0\x80\U00010000", cuts=[6], limit=1)  # emptied inside a character whose end comes later
def test_the_buffer_keeps_the_longest_suffix_within_the_limit_that_starts_on_a_character(text, cuts, limit):
    data = text.encode("utf-8")
    buffer = _OutputBuffer(limit)
    # The same bytes, arriving in chunks cut anywhere (even inside a character).
    start = 0
    for cut in [*sorted(c for c in cuts if c < len(data)), len(data)]:
        buffer.append(data[start:cut])
        start = cut
    kept = buffer.text(final=True)
    assert buffer.truncated == (len(data) > limit)
    assert text.endswith(kept)
    kept_bytes = kept.encode("utf-8")
    assert len(kept_bytes) <= limit or not buffer.truncated
    # Shorter than the limit only by the bytes of the character that straddled the cut.
    longest = max(
        (len(text[i:].encode("utf-8")) for i in range(len(text) + 1) if len(text[i:].encode("utf-8")) <= limit),
        default=0,
    )
    assert len(kept_bytes) == min(len(data), longest)


def test_a_character_still_being_written_is_held_back_until_it_is_complete():
    buffer = _OutputBuffer(100)
    euro = "€".encode()
    buffer.append(b"price: " + euro[:2])
    assert buffer.text(final=False) == "price: "
    buffer.append(euro[2:])
    assert buffer.text(final=False) == "price: €"


def test_bytes_that_are_not_utf8_become_replacement_characters():
    buffer = _OutputBuffer(100)
    buffer.append(b"ok \xff\xfe done")
    assert buffer.text(final=True) == "ok \ufffd\ufffd done"


# -- the terminal manager -----------------------------------------------------------------------
def _python(code):
    return [sys.executable, "-c", code]


@pytest.fixture
def cwd(tmp_path):
    """A directory handle to start terminals in."""
    fd = os.open(tmp_path, os.O_RDONLY)
    yield fd
    os.close(fd)


def test_the_manager_caps_output_when_the_agent_asks_for_more_or_sets_no_limit(cwd):
    manager = TerminalManager(max_output_bytes=5)
    try:
        for asked in (None, 1000):
            terminal_id = manager.create("s", _python("print('0123456789', end='')"), dict(os.environ), cwd, asked)
            waited = manager.wait_for_exit("s", terminal_id)
            if isinstance(waited, Future):  # still running when asked
                waited = waited.result(10)
            assert waited.exit_code == 0
            output = manager.output("s", terminal_id)
            assert (output.output, output.truncated) == ("56789", True)
    finally:
        manager.close()


def test_close_kills_and_reaps_every_terminal_and_returns_their_final_output(cwd):
    manager = TerminalManager()
    first = manager.create(
        "s1", _python("import time; print('up', flush=True); time.sleep(60)"), dict(os.environ), cwd, None
    )
    second = manager.create("s2", _python("import time; time.sleep(60)"), dict(os.environ), cwd, None)
    while manager.output("s1", first).output != "up\n":
        time.sleep(0.01)
    released = {terminal_id: (session_id, final) for session_id, terminal_id, final in manager.close()}
    assert set(released) == {first, second}
    session_id, final = released[first]
    assert session_id == "s1" and final.output == "up\n"
    assert final.exit_status is not None and final.exit_status.signal == "SIGKILL"
    with pytest.raises(ResourceNotFound):
        manager.output("s1", first)
    assert manager.close() == []


def test_a_command_that_outlives_the_kill_wait_is_reaped_when_it_finally_exits(cwd, monkeypatch):
    # As if SIGKILL took longer than close() waits (a starved or stuck process): close() returns
    # at once, and the exit thread reaps the command later; no_leaks checks nothing is left.
    monkeypatch.setattr(terminals, "_KILL_WAIT_SECONDS", 0)
    manager = TerminalManager()
    manager.create("s", _python("import time; time.sleep(60)"), dict(os.environ), cwd, None)
    [(_, _, final)] = manager.close()
    assert final.output == ""


def test_an_editor_embedding_python_still_supervises_its_terminals_with_a_python(cwd, monkeypatch, tmp_path):
    # Embedded in an editor, sys.executable names the editor: running it with -c would start one.
    command = _python("print('ran')")
    monkeypatch.setattr(sys, "executable", str(tmp_path / "editor"))
    manager = TerminalManager()
    try:
        terminal_id = manager.create("s", command, dict(os.environ), cwd, None)
        waited = manager.wait_for_exit("s", terminal_id)
        assert (waited.result(20) if isinstance(waited, Future) else waited).exit_code == 0
        assert manager.output("s", terminal_id).output == "ran\n"
    finally:
        manager.close()
