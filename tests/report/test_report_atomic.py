"""Atomic writing of report folders: temp file + fsync + os.replace, all-or-nothing swap with rollback."""

from __future__ import annotations

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bayes_lens.errors import InvalidInputError
from bayes_lens.reporting import _atomic
from bayes_lens.reporting._atomic import STAGING_PREFIX, Staging, check_writable, write_bytes, write_text


def _snapshot(folder):
    """{relative path: bytes} of every file under ``folder``."""
    out = {}
    for root, _, files in os.walk(folder):
        for f in files:
            p = os.path.join(root, f)
            with open(p, "rb") as fh:
                out[os.path.relpath(p, folder)] = fh.read()
    return out


def _make_report(st_, tag: str, tables=("a.csv",)):
    (st_.path / "tables").mkdir()
    for t in tables:
        write_text(st_.path / "tables" / t, f"{tag} {t}\n")
    write_text(st_.path / "report.html", f"<html>{tag}</html>")
    write_text(st_.path / "report.json", f'{{"tag": "{tag}"}}')


NAMES = ["tables", "report.html", "report.json"]


@settings(max_examples=25, deadline=None)
@given(data=st.binary(max_size=4096))
def test_write_bytes_round_trip_and_leaves_no_temp(tmp_path_factory, data):
    d = tmp_path_factory.mktemp("w")
    write_bytes(d / "f.bin", b"old")
    write_bytes(d / "f.bin", data)
    assert (d / "f.bin").read_bytes() == data
    assert sorted(os.listdir(d)) == ["f.bin"]


def test_write_bytes_failure_keeps_old_file(tmp_path, monkeypatch):
    write_text(tmp_path / "r.json", "old")

    def boom(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(_atomic.os, "replace", boom)
    with pytest.raises(KeyboardInterrupt):
        write_text(tmp_path / "r.json", "new")
    monkeypatch.undo()
    assert (tmp_path / "r.json").read_text() == "old"
    assert os.listdir(tmp_path) == ["r.json"]  # the temp file was removed


def test_written_files_get_normal_permissions(tmp_path):
    write_text(tmp_path / "x.txt", "x")
    mask = os.umask(0)
    os.umask(mask)
    assert (tmp_path / "x.txt").stat().st_mode & 0o777 == 0o666 & ~mask


def test_commit_replaces_whole_report(tmp_path):
    with Staging(tmp_path) as s:
        _make_report(s, "old", tables=("a.csv", "stale.csv"))
        s.commit(NAMES)
    with Staging(tmp_path) as s:
        _make_report(s, "new", tables=("a.csv",))
        s.commit(NAMES)
    snap = _snapshot(tmp_path)
    assert snap == {"tables/a.csv": b"new a.csv\n", "report.html": b"<html>new</html>",
                    "report.json": b'{"tag": "new"}'}  # the stale table is gone, no staging/backup left


@pytest.mark.parametrize("fail_at", [1, 2, 3, 4])  # 4 renames: old tables out, 3 new entries in
def test_interrupted_swap_restores_previous_report(tmp_path, monkeypatch, fail_at):
    with Staging(tmp_path) as s:
        _make_report(s, "old")
        s.commit(NAMES)
    before = _snapshot(tmp_path)
    calls = {"n": 0}
    real = os.replace

    def flaky(src, dst):
        calls["n"] += 1
        if calls["n"] == fail_at:
            raise KeyboardInterrupt
        return real(src, dst)

    with pytest.raises(KeyboardInterrupt):
        with Staging(tmp_path) as s:
            _make_report(s, "new")
            monkeypatch.setattr(_atomic.os, "replace", flaky)
            s.commit(NAMES)
    monkeypatch.undo()
    assert calls["n"] >= fail_at
    assert _snapshot(tmp_path) == before


def test_interrupt_before_commit_leaves_nothing(tmp_path):
    with pytest.raises(KeyboardInterrupt):
        with Staging(tmp_path) as s:
            _make_report(s, "new")
            raise KeyboardInterrupt
    assert os.listdir(tmp_path) == []


def test_stale_staging_of_dead_process_is_cleaned(tmp_path):
    dead = tmp_path / f"{STAGING_PREFIX}999999999-abcd"
    dead.mkdir()
    (dead / "junk").write_text("x")
    alive = tmp_path / f"{STAGING_PREFIX}{os.getppid()}-abcd"  # a live process: must be kept
    alive.mkdir()
    with Staging(tmp_path) as s:
        _make_report(s, "new")
        s.commit(NAMES)
    assert not dead.exists() and alive.exists()


def test_check_writable(tmp_path):
    assert check_writable(tmp_path / "a" / "b").is_dir()
    (tmp_path / "file").write_text("x")
    with pytest.raises(InvalidInputError, match="not a folder"):
        check_writable(tmp_path / "file")
    with pytest.raises(InvalidInputError, match="not writable"):
        check_writable(tmp_path / "file" / "sub")
