"""Atomic, all-or-nothing writing of a report folder.

Every file of a report is first written into a private staging folder *inside* the output folder
(same file system, so renames are atomic), each file flushed and ``fsync``-ed. Only when all files
are complete does :func:`swap_in` move them into place with ``os.replace``: the old files are first
hard-linked (or, for the ``tables`` folder, renamed) into a backup folder, and if anything - an
error, ``KeyboardInterrupt`` - interrupts the swap, the backup is restored. An interrupted run
therefore never leaves a half-written report, and an existing report is only replaced by a complete
one. ``report.json`` is moved last, so a reader who sees a new ``report.json`` sees a new report.

Example
-------
>>> import tempfile, pathlib
>>> out = pathlib.Path(tempfile.mkdtemp())
>>> with Staging(out) as st:                               # doctest: +SKIP
...     write_text(st.path / "report.json", "{}")
...     st.commit(["report.json"])
"""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Iterable, Union

from ..errors import InvalidInputError

__all__ = ["write_text", "write_bytes", "Staging", "check_writable", "STAGING_PREFIX"]

STAGING_PREFIX = ".bayes_lens-staging-"
_BACKUP_PREFIX = ".bayes_lens-backup-"


def _file_mode() -> int:
    """0o666 minus the process umask: what ``open()`` would give (mkstemp alone gives 0o600)."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(str(path), os.O_RDONLY)
    except OSError:  # pragma: no cover - e.g. Windows
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)


def write_bytes(path: Union[str, Path], data: bytes) -> None:
    """Write ``data`` to ``path`` atomically: temp file in the same folder, fsync, ``os.replace``."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=str(path.parent))
    try:
        os.chmod(tmp, _file_mode())
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    _fsync_dir(path.parent)


def write_text(path: Union[str, Path], text: str) -> None:
    """:func:`write_bytes` for UTF-8 text."""
    write_bytes(path, text.encode("utf-8"))


def check_writable(out: Union[str, Path]) -> Path:
    """Create ``out`` if needed and prove a file can be written there; raise InvalidInputError if not."""
    out = Path(out).expanduser()
    if out.exists() and not out.is_dir():
        raise InvalidInputError(f"output folder {str(out)!r} exists and is not a folder; pass another --out.")
    try:
        out.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".bayes_lens-probe-", dir=str(out))
        os.close(fd)
        os.unlink(probe)
    except OSError as err:
        reason = os.strerror(err.errno) if err.errno else str(err)
        raise InvalidInputError(
            f"output folder {str(out)!r} is not writable ({reason}); pass a folder you can write to "
            "(--out DIR / out=...)."
        ) from None
    return out


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError as err:  # EPERM: alive but not ours
        return err.errno == errno.EPERM
    return True


def _clean_stale(out: Path) -> None:
    """Remove staging/backup folders left behind by killed runs (their process is gone)."""
    for child in out.iterdir():
        for prefix in (STAGING_PREFIX, _BACKUP_PREFIX):
            if child.is_dir() and child.name.startswith(prefix):
                try:
                    pid = int(child.name[len(prefix):].split("-")[0])
                except ValueError:
                    continue
                if pid != os.getpid() and not _pid_alive(pid):
                    if prefix == _BACKUP_PREFIX:
                        _restore_missing(child, out)
                    shutil.rmtree(child, ignore_errors=True)


def _restore_missing(backup: Path, out: Path) -> None:
    """A backup left by a run killed mid-swap: put back any file the swap had not replaced."""
    for item in backup.iterdir():
        target = out / item.name
        if not target.exists():
            os.replace(item, target)


class Staging:
    """A private staging folder inside ``out``; ``commit(names)`` swaps the files in, all or none.

    Use as a context manager: on exit (normal or not) the staging folder is removed, so an
    interrupted run leaves ``out`` exactly as it was.
    """

    def __init__(self, out: Union[str, Path]):
        self.out = check_writable(out)
        self.path: Path = Path()

    def __enter__(self) -> "Staging":
        _clean_stale(self.out)
        self.path = self.out / f"{STAGING_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.path.mkdir()
        return self

    def __exit__(self, *exc) -> None:
        shutil.rmtree(self.path, ignore_errors=True)

    def commit(self, names: Iterable[str]) -> None:
        """Move the staged entries ``names`` (files or folders) into ``out``; restore on any error."""
        names = list(names)
        if "report.json" in names:  # the marker of a complete report goes in last
            names = [n for n in names if n != "report.json"] + ["report.json"]
        for name in names:
            if not (self.path / name).exists():
                raise FileNotFoundError(f"staged entry {name!r} is missing")
        _fsync_dir(self.path)
        backup = self.out / f"{_BACKUP_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:8]}"
        backup.mkdir()
        saved, moved = [], []
        try:
            for name in names:  # keep the old entries (hard link for files: they stay in place)
                old = self.out / name
                if old.is_dir() and not old.is_symlink():
                    os.replace(old, backup / name)
                    saved.append((name, True))
                elif old.exists():
                    try:
                        os.link(old, backup / name)
                    except OSError:
                        shutil.copy2(old, backup / name)
                    saved.append((name, False))
            for name in names:
                os.replace(self.path / name, self.out / name)
                moved.append(name)
            _fsync_dir(self.out)
        except BaseException:
            for name in reversed(moved):  # take the new entries out again
                target = self.out / name
                if target.is_dir() and not target.is_symlink():
                    shutil.rmtree(target, ignore_errors=True)
                else:
                    try:
                        target.unlink()
                    except FileNotFoundError:
                        pass
            for name, _ in saved:  # and put the old ones back
                os.replace(backup / name, self.out / name)
            _fsync_dir(self.out)
            shutil.rmtree(backup, ignore_errors=True)
            raise
        shutil.rmtree(backup, ignore_errors=True)
