"""Crash-safe report folders: atomic file writes, one atomic switch per commit, one writer per folder.

The fault-injection tests fork a child that writes a report and SIGKILLs itself just before its k-th
file-system change (rename, replace, symlink, unlink, mkdir, rmdir), for every k until the child
gets through; after each kill the folder must show the complete old or the complete new report
(never a mix), and the next run's clean-up must leave exactly one version and no debris.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bayes_lens.errors import InvalidInputError, LockTimeoutError
from bayes_lens._files import FolderLock
from bayes_lens.reporting import _atomic
from bayes_lens.reporting._atomic import (STAGING_PREFIX, STATE_DIR, Staging, check_writable, recover,
                                       report_entries, write_bytes, write_text)

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="fault injection forks a child process")

NAMES = ["tables", "report.html", "report.json"]
OLD_TABLES = ("a.csv", "stale.csv")
NEW_TABLES = ("a.csv", "b.csv")
MUTATORS = ("replace", "rename", "symlink", "unlink", "rmdir", "mkdir")


def visible(out: Path) -> dict:
    """{relative path: bytes} of what a user sees: every non-hidden entry, links followed."""
    snap = {}
    for entry in sorted(Path(out).iterdir()):
        if entry.name.startswith("."):
            continue
        if entry.is_dir():
            for f in sorted(entry.iterdir()):
                snap[f"{entry.name}/{f.name}"] = f.read_bytes()
        elif entry.exists():
            snap[entry.name] = entry.read_bytes()
    return snap


def expected(tag: str, tables) -> dict:
    snap = {f"tables/{t}": f"{tag} {t}\n".encode() for t in tables}
    snap["report.html"] = f"<html>{tag}</html>".encode()
    snap["report.json"] = f'{{"tag": "{tag}"}}'.encode()
    return snap


def _make_report(st_, tag: str, tables=("a.csv",)):
    (st_.path / "tables").mkdir()
    for t in tables:
        write_text(st_.path / "tables" / t, f"{tag} {t}\n")
    write_text(st_.path / "report.html", f"<html>{tag}</html>")
    write_text(st_.path / "report.json", f'{{"tag": "{tag}"}}')


def write_report(out, tag, tables, layout="auto"):
    with Staging(out, layout=layout) as s:
        _make_report(s, tag, tables)
        s.commit(NAMES)


def write_legacy(out: Path, tag: str, tables) -> None:
    """A report in the layout of earlier versions: plain files, no state folder."""
    (out / "tables").mkdir(parents=True)
    for rel, data in expected(tag, tables).items():
        (out / rel).write_bytes(data)


def assert_clean(out: Path, n_versions: int = 1) -> None:
    """No staging, trash or temporary entries left; exactly ``n_versions`` stored versions."""
    state = out / STATE_DIR
    assert not [p for p in out.iterdir() if p.name.startswith(".bayes_lens-")], list(out.iterdir())
    if not state.exists():
        assert n_versions == 0
        return
    names = sorted(p.name for p in state.iterdir())
    assert [n for n in names if n not in ("lock", "current", "versions")] == [], names
    versions = state / "versions"
    assert (len(list(versions.iterdir())) if versions.exists() else 0) == n_versions


def run_child(out: Path, tag: str, tables, *, kill_at: int = 0, slow: float = 0.0, layout="auto") -> int:
    """Fork a writer; it SIGKILLs itself before its ``kill_at``-th file-system change. Returns its status."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        try:
            count = [0]

            def wrap(fn):
                def inner(*a, **k):
                    count[0] += 1
                    if count[0] == kill_at:
                        os.kill(os.getpid(), signal.SIGKILL)
                    if slow:
                        time.sleep(slow)
                    return fn(*a, **k)
                return inner

            for name in MUTATORS:
                setattr(os, name, wrap(getattr(os, name)))
            write_report(out, tag, tables, layout=layout)
            os._exit(0)
        except BaseException:
            traceback.print_exc()
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    return status


# ---------------------------------------------------------------- plain behaviour


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

    monkeypatch.setattr(os, "replace", boom)
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


@pytest.mark.parametrize("layout", ["links", "copy"])
def test_commit_replaces_whole_report(tmp_path, layout):
    write_report(tmp_path, "old", OLD_TABLES, layout)
    assert visible(tmp_path) == expected("old", OLD_TABLES)
    write_report(tmp_path, "new", NEW_TABLES, layout)
    assert visible(tmp_path) == expected("new", NEW_TABLES)  # the stale table is gone
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".")) == sorted(NAMES)
    assert_clean(tmp_path, 1 if layout == "links" else 0)


def test_links_layout_is_relative_and_opens_like_plain_files(tmp_path):
    write_report(tmp_path / "out", "old", OLD_TABLES)
    out = tmp_path / "out"
    for name in NAMES:
        assert (out / name).is_symlink() and os.readlink(out / name) == f"{STATE_DIR}/current/{name}"
    # a browser is handed out/report.html: it resolves inside the folder and reads the right bytes
    assert (out / "report.html").resolve().is_relative_to(out.resolve())
    assert (out / "report.html").resolve().as_uri().startswith("file://")
    assert report_entries(out) == (out / "report.html").resolve().parent
    # the folder still works after being moved or copied (cp -r keeps the relative links)
    moved = tmp_path / "moved"
    shutil.move(str(out), str(moved))
    assert visible(moved) == expected("old", OLD_TABLES)
    subprocess.run(["cp", "-r", str(moved), str(tmp_path / "copy")], check=True)
    assert visible(tmp_path / "copy") == expected("old", OLD_TABLES)
    shutil.copytree(moved, tmp_path / "deref")  # links followed: plain files, still a valid report
    assert visible(tmp_path / "deref") == expected("old", OLD_TABLES)
    write_report(tmp_path / "deref", "new", NEW_TABLES)  # and it can be written again
    assert visible(tmp_path / "deref") == expected("new", NEW_TABLES)
    assert_clean(tmp_path / "deref")


def test_legacy_plain_report_is_migrated(tmp_path):
    write_legacy(tmp_path, "old", OLD_TABLES)
    write_report(tmp_path, "new", NEW_TABLES)
    assert visible(tmp_path) == expected("new", NEW_TABLES)
    assert all((tmp_path / n).is_symlink() for n in NAMES)
    assert_clean(tmp_path)


def test_dropped_entry_disappears(tmp_path):
    with Staging(tmp_path) as s:
        _make_report(s, "old", OLD_TABLES)
        write_text(s.path / "extra.txt", "x")
        s.commit(NAMES + ["extra.txt"])
    assert (tmp_path / "extra.txt").read_text() == "x"
    write_report(tmp_path, "new", NEW_TABLES)
    assert not os.path.lexists(tmp_path / "extra.txt")
    assert visible(tmp_path) == expected("new", NEW_TABLES)


def test_interrupt_before_commit_leaves_old_report(tmp_path):
    with pytest.raises(KeyboardInterrupt):
        with Staging(tmp_path) as s:
            _make_report(s, "new")
            raise KeyboardInterrupt
    assert visible(tmp_path) == {}
    write_report(tmp_path, "old", OLD_TABLES)
    with pytest.raises(KeyboardInterrupt):
        with Staging(tmp_path) as s:
            _make_report(s, "new")
            raise KeyboardInterrupt
    assert visible(tmp_path) == expected("old", OLD_TABLES)
    assert_clean(tmp_path)


def test_error_inside_commit_keeps_old_report(tmp_path, monkeypatch):
    write_report(tmp_path, "old", OLD_TABLES)
    real = os.replace

    def flaky(src, dst):  # the switch of the pointer fails
        if str(dst).endswith("current"):
            raise OSError(28, "No space left on device")
        return real(src, dst)

    monkeypatch.setattr(os, "replace", flaky)
    with pytest.raises(OSError, match="No space"):
        write_report(tmp_path, "new", NEW_TABLES)
    monkeypatch.undo()
    assert visible(tmp_path) == expected("old", OLD_TABLES)
    recover(tmp_path)
    assert_clean(tmp_path)


def test_stale_staging_of_dead_process_is_cleaned(tmp_path):
    write_report(tmp_path, "old", OLD_TABLES)
    state = tmp_path / STATE_DIR
    dead = state / f"{STAGING_PREFIX}999999999-abcd"
    dead.mkdir()
    (dead / "junk").write_text("x")
    alive = state / f"{STAGING_PREFIX}{os.getppid()}-abcd"  # a live process: must be kept
    alive.mkdir()
    legacy = tmp_path / ".bayes_lens-staging-999999999-abcd"  # left by the previous layout
    legacy.mkdir()
    write_report(tmp_path, "new", NEW_TABLES)
    assert not dead.exists() and alive.exists() and not legacy.exists()


def test_check_writable(tmp_path):
    assert check_writable(tmp_path / "a" / "b").is_dir()
    (tmp_path / "file").write_text("x")
    with pytest.raises(InvalidInputError, match="not a folder"):
        check_writable(tmp_path / "file")
    with pytest.raises(InvalidInputError, match="not writable"):
        check_writable(tmp_path / "file" / "sub")


def test_bad_layout_and_names(tmp_path):
    with pytest.raises(InvalidInputError, match="layout must be"):
        Staging(tmp_path, layout="zip")
    with pytest.raises(InvalidInputError, match="plain, visible top-level name"):
        with Staging(tmp_path) as s:
            write_text(s.path / ".hidden", "x")
            s.commit([".hidden"])


# ---------------------------------------------------------------- fault injection


def _kill_sweep(tmp_path, prepare, *, layout, consistent_right_after: bool):
    """Kill the writer before each of its file-system changes in turn; check the folder every time."""
    old, new = prepare["old"], expected("new", NEW_TABLES)
    k, killed = 0, 0
    while True:
        k += 1
        out = tmp_path / f"k{k}"
        out.mkdir()
        prepare["make"](out)
        status = run_child(out, "new", NEW_TABLES, kill_at=k, layout=layout)
        if os.WIFEXITED(status):
            assert os.WEXITSTATUS(status) == 0
            assert visible(out) == new
            break
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
        killed += 1
        seen = visible(out)
        if consistent_right_after:
            assert seen in (old, new), (k, seen)
        recover(out)  # what the next run does first
        after = visible(out)
        assert after in (old, new), (k, after)
        if consistent_right_after:
            assert after == seen, k  # clean-up never flips what a reader saw
        assert_clean(out, n_versions=int((out / "report.json").is_symlink()))
        write_report(out, "third", ("c.csv",), layout=layout)  # and the folder works again
        assert visible(out) == expected("third", ("c.csv",))
        assert k < 300
    return killed


SCENARIOS = {
    "first": {"old": {}, "make": lambda out: None},
    "replace": {"old": expected("old", OLD_TABLES), "make": lambda out: write_report(out, "old", OLD_TABLES)},
}


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_kill_at_every_step_links(tmp_path, scenario):
    killed = _kill_sweep(tmp_path, SCENARIOS[scenario], layout="links", consistent_right_after=True)
    assert killed >= 12  # staging writes, the rename into versions, the links, the switch, clean-up


def test_kill_at_every_step_legacy_migration(tmp_path):
    prep = {"old": expected("old", OLD_TABLES), "make": lambda out: write_legacy(out, "old", OLD_TABLES)}
    assert _kill_sweep(tmp_path, prep, layout="links", consistent_right_after=False) >= 12


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_kill_at_every_step_copy_layout(tmp_path, scenario):
    prep = dict(SCENARIOS[scenario])
    if scenario == "replace":
        prep["make"] = lambda out: write_report(out, "old", OLD_TABLES, layout="copy")
    assert _kill_sweep(tmp_path, prep, layout="copy", consistent_right_after=False) >= 10


# ---------------------------------------------------------------- one writer at a time


def test_two_concurrent_writers_never_mix(tmp_path):
    a, b = expected("A", OLD_TABLES), expected("B", ("b.csv",))
    for rnd in range(3):
        out = tmp_path / f"r{rnd}"
        pids = []
        for tag, tables in (("A", OLD_TABLES), ("B", ("b.csv",))):
            pid = os.fork()
            if pid == 0:  # pragma: no cover - child
                try:
                    real = os.replace

                    def slow_replace(*x, **k):
                        time.sleep(0.01)
                        return real(*x, **k)

                    os.replace = slow_replace
                    write_report(out, tag, tables)
                    os._exit(0)
                except BaseException:
                    traceback.print_exc()
                    os._exit(1)
            pids.append(pid)
        statuses = [os.waitpid(p, 0)[1] for p in pids]
        assert all(os.WIFEXITED(s) and os.WEXITSTATUS(s) == 0 for s in statuses), statuses
        assert visible(out) in (a, b)
        assert_clean(out)


def test_loser_waits_for_the_lock(tmp_path):
    write_report(tmp_path, "old", OLD_TABLES)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child holds the lock for 1 s
        with FolderLock(tmp_path / STATE_DIR / "lock"):
            os.write(w, b"x")
            time.sleep(1.0)
        os._exit(0)
    os.read(r, 1)
    t0 = time.monotonic()
    write_report(tmp_path, "new", NEW_TABLES)
    waited = time.monotonic() - t0
    os.waitpid(pid, 0)
    assert waited > 0.5
    assert visible(tmp_path) == expected("new", NEW_TABLES)


def test_lock_timeout_is_a_clear_error(tmp_path, monkeypatch):
    write_report(tmp_path, "old", OLD_TABLES)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child holds the lock for 3 s
        with FolderLock(tmp_path / STATE_DIR / "lock"):
            os.write(w, b"x")
            time.sleep(3.0)
        os._exit(0)
    os.read(r, 1)
    try:
        with pytest.raises(LockTimeoutError, match=rf"pid {pid}\).*held its lock for more than 0.3 s") as info:
            with Staging(tmp_path, lock_timeout=0.3):
                pass
        assert "BAYES_LENS_LOCK_TIMEOUT" in str(info.value)
        monkeypatch.setenv("BAYES_LENS_LOCK_TIMEOUT", "0.2")
        with pytest.raises(LockTimeoutError, match="more than 0.2 s"):
            write_report(tmp_path, "new", NEW_TABLES)
    finally:
        os.waitpid(pid, 0)
    assert visible(tmp_path) == expected("old", OLD_TABLES)
    write_report(tmp_path, "new", NEW_TABLES)  # the lock is free again
    assert visible(tmp_path) == expected("new", NEW_TABLES)


def test_killed_lock_holder_releases_the_lock(tmp_path):
    write_report(tmp_path, "old", OLD_TABLES)
    proc = subprocess.Popen([sys.executable, "-c",
                             "import fcntl, os, sys, time\n"
                             f"fd = os.open({str(tmp_path / STATE_DIR / 'lock')!r}, os.O_RDWR)\n"
                             "fcntl.flock(fd, fcntl.LOCK_EX); print('locked', flush=True); time.sleep(60)"],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "locked"
        with pytest.raises(LockTimeoutError):
            with Staging(tmp_path, lock_timeout=0.2):
                pass
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        write_report(tmp_path, "new", NEW_TABLES)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert visible(tmp_path) == expected("new", NEW_TABLES)


def test_browser_opens_report_html_through_the_link(tmp_path):
    """A browser handed the unresolved path out/report.html (the link) shows the current report."""
    import tempfile as _tempfile

    from browser import OFFLINE_FLAGS, find_chromium

    browser = find_chromium()
    if browser is None:
        pytest.skip("chromium is not installed (apt-get install -y chromium)")
    out = tmp_path / "out"
    write_report(out, "old", OLD_TABLES)
    write_report(out, "new", NEW_TABLES)
    url = "file://" + str((out / "report.html").absolute())  # not resolved: the browser follows the link
    with _tempfile.TemporaryDirectory() as profile:
        proc = subprocess.run([browser, *OFFLINE_FLAGS, f"--user-data-dir={profile}", "--dump-dom", url],
                              capture_output=True, text=True, timeout=120)
    assert "new" in proc.stdout and "old" not in proc.stdout, proc.stdout[-500:] + proc.stderr[-500:]
