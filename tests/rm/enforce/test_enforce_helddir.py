"""A directory looked up once, without following symbolic links, and used through its descriptor
(rm/enforce/helddir.py, issue 47 item 4).  Real directories under the test's own tmp_path."""

from __future__ import annotations

import os

import pytest

from cod.rm.enforce.helddir import HeldDir, PathRefused, components


@pytest.mark.parametrize("path, parts", [
    ("/", []),
    ("/a/b", ["a", "b"]),
    ("//a/./b/", ["a", "b"]),
])
def test_components_of_an_absolute_path(path, parts):
    assert components(path) == parts


@pytest.mark.parametrize("path, needle", [
    ("a/b", "is not an absolute path"),
    ("", "is not an absolute path"),
    ("/a/../b", "'..' is not accepted"),
    ("/a/\0b", "NUL character"),
])
def test_components_refuse(path, needle):
    with pytest.raises(PathRefused, match=needle):
        components(path)


def test_a_symbolic_link_anywhere_on_the_path_is_refused_and_named(tmp_path):
    real = tmp_path / "real"
    (real / "sub").mkdir(parents=True)
    (tmp_path / "link").symlink_to(real)
    (real / "sublink").symlink_to(real / "sub")
    with pytest.raises(PathRefused, match=f"{tmp_path}/link is a symbolic link \\(to {real}\\)"):
        HeldDir.open(str(tmp_path / "link" / "sub"))
    with pytest.raises(PathRefused, match="sublink is a symbolic link"):
        HeldDir.open(str(real / "sublink"))
    (real / "file").write_text("x")
    with pytest.raises(PathRefused, match="file is not a directory"):
        HeldDir.open(str(real / "file"))
    with pytest.raises(PathRefused, match="missing: No such file or directory"):
        HeldDir.open(str(real / "missing"))


def test_what_is_held_is_the_directory_opened_whatever_its_path_names_later(tmp_path):
    first = tmp_path / "d"
    first.mkdir()
    (first / "f").write_text("first")
    held = HeldDir.open(str(first))
    try:
        assert held.path == str(first) and held.owner_uid() == os.getuid()
        assert held.identity == (os.stat(first).st_dev, os.stat(first).st_ino)
        first.rename(tmp_path / "moved")
        second = tmp_path / "d"
        second.mkdir()
        (second / "f").write_text("second")
        assert held.read("f") == b"first"
        assert held.has_file("f") and not held.has_file("nothing")
        (tmp_path / "moved" / "lnk").symlink_to(second / "f")
        assert not held.has_file("lnk")
        with pytest.raises(OSError):  # a file of it that is a link is not followed
            held.read("lnk")
    finally:
        held.close()
    assert held.closed
    with pytest.raises(OSError, match="no longer held"):
        held.read("f")
    held.close()  # idempotent
