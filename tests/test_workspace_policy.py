"""The workspace's building blocks without a connection: the root-set policy, the output buffer
and the terminal manager. ``test_workspace.py`` drives the same rules over the wire."""
import io
import os
import sys
import time
import unicodedata
from concurrent.futures import Future
from unittest.mock import patch
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from acp_lite import workspace
from acp_lite.errors import InvalidParams, ResourceNotFound
from acp_lite.workspace import RootSet, TerminalManager, _OutputBuffer

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
    (root / "link_in").symlink_to(root / "sub")
    (root / "dangling_out").symlink_to(outside / "not-yet")
    (root / "file_out").symlink_to(outside / "secret.txt")
    return root, outside


# -- RootSet ------------------------------------------------------------------------------------
@pytest.mark.req("ACP-V1-OVERVIEW-ABSOLUTE-PATHS")
@pytest.mark.parametrize("path", ["a.txt", "./a.txt", "../root/a.txt", "", "~/a.txt", "C:\\root\\a.txt"])
def test_relative_paths_are_invalid_params(tree, path):
    root, _ = tree
    with pytest.raises(InvalidParams, match="absolute"):
        RootSet(str(root)).resolve(path)


def test_a_nul_character_is_invalid_params(tree):
    root, _ = tree
    with pytest.raises(InvalidParams, match="NUL"):
        RootSet(str(root)).resolve(f"{root}/a.txt\x00.png")


@pytest.mark.req("ACP-V1-SETUP-CWD-IN-ROOT-SET")
@pytest.mark.parametrize(
    "spelling, target",
    [
        ("{root}/a.txt", "a.txt"),
        ("{root}/new-file.txt", "new-file.txt"),  # need not exist yet (writing creates it)
        ("{root}/sub/../a.txt", "a.txt"),
        ("{root}//sub/./", "sub"),
        ("{root}/link_in/x.txt", "sub/x.txt"),  # a symlink that stays inside is followed
        ("{root}", ""),
    ],
)
def test_paths_inside_resolve_to_their_real_path(tree, spelling, target):
    root, _ = tree
    resolved = RootSet(str(root)).resolve(spelling.format(root=root))
    assert resolved == Path(os.path.realpath(root / target))


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
        "{root}/..",
        "/etc/passwd",
        "/",
    ],
)
def test_paths_leading_outside_are_resource_not_found(tree, spelling):
    root, _ = tree
    with pytest.raises(ResourceNotFound, match="outside the session's root set"):
        RootSet(str(root)).resolve(spelling.format(root=root))


@pytest.mark.req("ACP-V1-SETUP-ROOT-SET-BOUNDARY")
def test_a_sibling_sharing_the_roots_name_as_a_prefix_is_outside(tree):
    root, _ = tree
    sibling = root.parent / (root.name + "2")
    sibling.mkdir()
    with pytest.raises(ResourceNotFound):
        RootSet(str(root)).resolve(f"{sibling}/x.txt")


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
def test_a_directory_spelled_almost_like_a_root_is_outside_when_it_is_another_directory(tmp_path, root_name, other_name):
    root = tmp_path / root_name
    other = tmp_path / other_name
    root.mkdir()
    try:
        other.mkdir()
    except FileExistsError:
        pytest.skip("this file system treats both spellings as one directory")
    with pytest.raises(ResourceNotFound):
        RootSet(str(root)).resolve(f"{other}/x.txt")


def test_roots_are_compared_by_identity_so_any_spelling_of_a_root_is_inside(tree, tmp_path):
    root, _ = tree
    alias = tmp_path / "alias"
    alias.symlink_to(root)
    # The root reported through a symlink; the path spelled with the real directory, and back.
    assert RootSet(str(alias)).resolve(f"{root}/a.txt") == Path(os.path.realpath(root / "a.txt"))
    assert RootSet(str(root)).resolve(f"{alias}/a.txt") == Path(os.path.realpath(root / "a.txt"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/root"), reason="needs Linux /proc")
@pytest.mark.req("ACP-V1-SETUP-ROOT-SET-BOUNDARY")
def test_proc_magic_links_are_resolved_before_the_check(tree):
    root, _ = tree
    (root / "rootfs").symlink_to("/proc/self/root")
    roots = RootSet(str(root))
    with pytest.raises(ResourceNotFound):
        roots.resolve(f"{root}/rootfs/etc/passwd")
    # The same magic link pointing back into the root is just another spelling of it.
    assert roots.resolve(f"/proc/self/root{root}/a.txt") == Path(os.path.realpath(root / "a.txt"))


@pytest.mark.req("ACP-V1-SETUP-ROOT-SET-BOUNDARY")
def test_additional_directories_join_the_root_set(tree, tmp_path):
    root, outside = tree
    extra = tmp_path / "extra"
    extra.mkdir()
    roots = RootSet(str(root), [str(extra)])
    assert roots.resolve(f"{extra}/notes.md") == Path(os.path.realpath(extra / "notes.md"))
    with pytest.raises(ResourceNotFound):
        roots.resolve(f"{outside}/secret.txt")


def test_a_root_that_does_not_exist_contains_nothing(tmp_path):
    with pytest.raises(ResourceNotFound):
        RootSet(str(tmp_path / "gone")).resolve(f"{tmp_path}/gone/x.txt")


# Paths built from these components, each judged against an oracle that knows nothing of inodes:
# the real path (as the kernel would resolve it) is inside iff it is under the root's real path.
_COMPONENTS = st.sampled_from(["..", ".", "sub", "a.txt", "link_in", "link_out", "dangling_out", "missing", ""])


@settings(max_examples=300, deadline=None)
@given(components=st.lists(_COMPONENTS, max_size=7))
@pytest.mark.req("ACP-V1-SETUP-ROOT-SET-BOUNDARY")
def test_resolve_agrees_with_a_spelling_oracle_on_generated_paths(tmp_path_factory, components):
    base = tmp_path_factory.getbasetemp() / "oracle"
    root = base / "root"
    if not root.exists():
        (root / "sub").mkdir(parents=True)
        (base / "outside").mkdir()
        (root / "a.txt").write_text("in")
        (root / "link_out").symlink_to(base / "outside")
        (root / "link_in").symlink_to(root / "sub")
        (root / "dangling_out").symlink_to(base / "outside" / "nothing")
    path = "/".join([str(root), *components])
    real_root = os.path.realpath(root)
    real = os.path.realpath(path)
    inside = os.path.commonpath([real, real_root]) == real_root
    if inside:
        assert RootSet(str(root)).resolve(path) == Path(real)
    else:
        with pytest.raises(ResourceNotFound):
            RootSet(str(root)).resolve(path)


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
    with patch.object(workspace, "_IO_CHUNK", chunk):
        assert workspace._select_lines(io.BytesIO(data), first, count, max_bytes=1000) == expected
        if expected:
            assert workspace._select_lines(io.BytesIO(data), first, count, max_bytes=len(expected) - 1) is None


# -- the output buffer --------------------------------------------------------------------------
@settings(max_examples=300, deadline=None)
@given(
    text=st.text(st.characters(blacklist_categories=("Cs",)), max_size=60),
    cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=6),
    limit=st.integers(min_value=0, max_value=40),
)
@pytest.mark.req("ACP-V1-TERM-CLIENT-TRUNCATE-AT-CHARACTER-BOUNDARY")
def test_the_buffer_keeps_the_longest_suffix_within_the_limit_that_starts_on_a_character(text, cuts, limit):
    data = text.encode("utf-8")
    buffer = _OutputBuffer(limit)
    # The same bytes, arriving in chunks cut anywhere (even inside a character).
    start = 0
    for cut in sorted(c for c in cuts if c < len(data)) + [len(data)]:
        buffer.append(data[start:cut])
        start = cut
    kept = buffer.text(final=True)
    assert buffer.truncated == (len(data) > limit)
    assert text.endswith(kept)
    kept_bytes = kept.encode("utf-8")
    assert len(kept_bytes) <= limit or not buffer.truncated
    # Shorter than the limit only by the bytes of the character that straddled the cut.
    longest = max((len(text[i:].encode("utf-8")) for i in range(len(text) + 1) if len(text[i:].encode("utf-8")) <= limit), default=0)
    assert len(kept_bytes) == min(len(data), longest)


def test_a_character_still_being_written_is_held_back_until_it_is_complete():
    buffer = _OutputBuffer(100)
    euro = "€".encode("utf-8")
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


def test_the_manager_caps_output_when_the_agent_asks_for_more_or_sets_no_limit(tmp_path):
    manager = TerminalManager(max_output_bytes=5)
    try:
        for asked in (None, 1000):
            terminal_id = manager.create("s", _python("print('0123456789', end='')"), dict(os.environ), str(tmp_path), asked)
            waited = manager.wait_for_exit("s", terminal_id)
            if isinstance(waited, Future):  # still running when asked
                waited = waited.result(10)
            assert waited.exit_code == 0
            output = manager.output("s", terminal_id)
            assert (output.output, output.truncated) == ("56789", True)
    finally:
        manager.close()


def test_close_kills_and_reaps_every_terminal_and_returns_their_final_output(tmp_path):
    manager = TerminalManager()
    first = manager.create("s1", _python("import time; print('up', flush=True); time.sleep(60)"), dict(os.environ), str(tmp_path), None)
    second = manager.create("s2", _python("import time; time.sleep(60)"), dict(os.environ), str(tmp_path), None)
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


def test_a_command_that_outlives_the_kill_wait_is_reaped_when_it_finally_exits(tmp_path, monkeypatch):
    # As if SIGKILL took longer than close() waits (a starved or stuck process): close() returns
    # at once, and the exit thread reaps the command later; no_leaks checks nothing is left.
    monkeypatch.setattr(workspace, "_KILL_WAIT_SECONDS", 0)
    manager = TerminalManager()
    manager.create("s", _python("import time; time.sleep(60)"), dict(os.environ), str(tmp_path), None)
    [(_, _, final)] = manager.close()
    assert final.output == ""
