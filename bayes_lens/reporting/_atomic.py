"""Crash-safe, all-or-nothing writing of a report folder: versioned folders and one atomic switch.

Layout of an output folder ``out`` (what a user opens is unchanged: ``out/report.html``,
``out/report.json``, ``out/tables/*.csv``)::

    out/report.html -> .bayes_lens/current/report.html     (relative symbolic links, made once)
    out/report.json -> .bayes_lens/current/report.json
    out/tables      -> .bayes_lens/current/tables
    out/.bayes_lens/current -> versions/<id>               (THE pointer)
    out/.bayes_lens/versions/<id>/{report.html, report.json, tables/}
    out/.bayes_lens/lock                                   (flock: one writer at a time)
    out/.bayes_lens/staging-<pid>-<rand>/                  (a report being written)

Every file is written into a private staging folder (same file system, each file ``fsync``-ed).
:meth:`Staging.commit` then, holding the folder's lock (:class:`~bayes_lens._files.FolderLock`),
renames the staging folder to ``versions/<id>``, makes the top-level links that do not exist yet,
and switches ``current`` to the new version with a single ``os.replace`` of a symbolic link - the
only step that changes what a reader sees, and it is atomic (``rename(2)``). A process killed at
any point therefore leaves either the complete old or the complete new report, never a mix. Old
versions, stale staging folders of dead processes and temporary links are deleted afterwards, and
again (under the lock) by the next run (:func:`recover`).

Two cases cannot switch with one rename and are rolled *forward* by a journal instead:

* a folder written before this layout (plain files ``report.json``, ``tables/``): after the switch
  each plain entry is replaced by its link (``report.json`` last); a kill in between is finished by
  the next run, which sees that ``current`` points to a complete version;
* a file system without symbolic links (``layout="copy"``, chosen automatically): the new version's
  id is written to ``.bayes_lens/pending`` (atomically - the commit point), then its entries are
  moved into ``out`` (``report.json`` last); the next run finishes an interrupted move.

Method: the classic "build aside, switch a pointer" (Git's ``HEAD``, Nix profiles,
``ln -sfn`` + ``rename`` deploys); ``rename(2)`` of a symlink over a symlink is atomic on POSIX.

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
from typing import Iterable, List, Optional, Union

from .._files import FolderLock, fsync_dir, write_bytes, write_text
from ..errors import InvalidInputError

__all__ = ["write_text", "write_bytes", "Staging", "check_writable", "recover", "report_entries",
           "STATE_DIR", "STAGING_PREFIX", "symlinks_supported"]

STATE_DIR = ".bayes_lens"
STAGING_PREFIX = "staging-"
_VERSIONS = "versions"
_CURRENT = "current"
_PENDING = "pending"
_LOCK = "lock"
_TMP_PREFIX = ".bayes_lens-tmp-"
_TRASH_PREFIX = "trash-"
_PROBE_PREFIX = ".bayes_lens-probe-"
# left behind by killed processes directly in ``out``: write probes, and staging/backup folders of
# the previous layout
_DEBRIS_PREFIXES = (_PROBE_PREFIX, ".bayes_lens-staging-", ".bayes_lens-backup-")


def check_writable(out: Union[str, Path]) -> Path:
    """Create ``out`` if needed and prove a file can be written there; raise InvalidInputError if not."""
    out = Path(out).expanduser()
    if out.exists() and not out.is_dir():
        raise InvalidInputError(f"output folder {str(out)!r} exists and is not a folder; pass another --out.")
    try:
        out.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=f"{_PROBE_PREFIX}{os.getpid()}-", dir=str(out))
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


def _owner_dead(name: str, prefix: str) -> bool:
    try:
        pid = int(name[len(prefix):].split("-")[0])
    except ValueError:
        return False
    return pid != os.getpid() and not _pid_alive(pid)


def _remove(path: Path) -> None:
    """Delete a file, a symbolic link or a folder tree; a missing path is fine."""
    if path.is_symlink() or not path.is_dir():
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
    else:
        shutil.rmtree(path, ignore_errors=True)


def symlinks_supported(folder: Union[str, Path]) -> bool:
    """Whether symbolic links can be made in ``folder`` (not on FAT, or Windows without the privilege)."""
    probe = Path(folder) / f"{_TMP_PREFIX}probe-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        os.symlink("x", probe)
    except (OSError, NotImplementedError, AttributeError):
        return False
    os.unlink(probe)
    return True


def _link(target: str, where: Path, tmp_dir: Path) -> None:
    """Make ``where`` a symbolic link to ``target`` atomically (a new link renamed over the old)."""
    tmp = tmp_dir / f"{_TMP_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:8]}"
    os.symlink(target, tmp)
    try:
        os.replace(tmp, where)
    except BaseException:
        _remove(tmp)
        raise


def _ordered(names: Iterable[str]) -> List[str]:
    """Names in commit order: ``report.json`` (the marker of a complete report) last."""
    names = sorted(set(names))
    return [n for n in names if n != "report.json"] + (["report.json"] if "report.json" in names else [])


def _link_target(name: str) -> str:
    return f"{STATE_DIR}/{_CURRENT}/{name}"


def _current_version(state: Path) -> Optional[Path]:
    """The version folder ``current`` points to, or None (no pointer, dangling, or not a link)."""
    cur = state / _CURRENT
    if not cur.is_symlink():
        return None
    target = os.readlink(cur)
    version = state / target
    if os.path.dirname(target) != _VERSIONS or not version.is_dir() or version.is_symlink():
        return None
    return version


def _trash(state: Path) -> Path:
    t = state / f"{_TRASH_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:8]}"
    t.mkdir()
    return t


def _roll_forward_links(out: Path, state: Path, version: Path) -> None:
    """Point every top-level entry of the current version at it; drop links to entries it lacks."""
    trash = None
    for name in _ordered(p.name for p in version.iterdir()):
        where = out / name
        if where.is_symlink() and os.readlink(where) == _link_target(name):
            continue
        if where.is_dir() and not where.is_symlink():  # a plain folder of the old layout
            trash = trash or _trash(state)
            os.replace(where, trash / name)
        _link(_link_target(name), where, out)
    for child in out.iterdir():
        if child.is_symlink() and os.readlink(child).startswith(f"{STATE_DIR}/{_CURRENT}/") \
                and not (version / child.name).exists():
            _remove(child)
    fsync_dir(out)


def _roll_forward_copy(out: Path, state: Path) -> None:
    """Finish a pending commit of the ``copy`` layout: move the version's entries into ``out``."""
    pending = state / _PENDING
    if not pending.exists():
        return
    version = state / _VERSIONS / pending.read_text(encoding="utf-8").strip()
    if version.is_dir():
        _remove(state / _CURRENT)  # a folder that had the links layout: its pointer gives way
        trash = None
        for name in _ordered(p.name for p in version.iterdir()):
            where = out / name
            if (where.is_dir() and not where.is_symlink()) or (where.is_symlink() and (version / name).is_dir()):
                trash = trash or _trash(state)
                os.replace(where, trash / name)
            os.replace(version / name, where)
        fsync_dir(out)
    os.unlink(pending)
    fsync_dir(state)


def _recover_locked(out: Path, state: Path) -> None:
    versions = state / _VERSIONS
    if (state / _PENDING).exists():
        _roll_forward_copy(out, state)
    current = _current_version(state)
    if current is not None:
        _roll_forward_links(out, state, current)
    else:
        if os.path.lexists(state / _CURRENT):  # dangling, or a copied folder (``cp -rL``): not a pointer
            _remove(state / _CURRENT)
        for child in out.iterdir():  # links made by a first commit killed before its switch
            if child.is_symlink() and os.readlink(child).startswith(f"{STATE_DIR}/{_CURRENT}/"):
                _remove(child)
    if versions.is_dir():
        for v in versions.iterdir():
            if current is None or v.name != current.name:
                _remove(v)
    for child in state.iterdir():
        if child.name.startswith((_TRASH_PREFIX, _TMP_PREFIX, ".")):  # "." : write_text's temp files
            _remove(child)
        elif child.name.startswith(STAGING_PREFIX) and _owner_dead(child.name, STAGING_PREFIX):
            _remove(child)
    for child in out.iterdir():
        if child.name.startswith(_TMP_PREFIX):
            _remove(child)
        for prefix in _DEBRIS_PREFIXES:
            if child.name.startswith(prefix) and _owner_dead(child.name, prefix):
                if prefix.endswith("backup-") and child.is_dir():  # old layout killed mid-swap
                    for item in child.iterdir():  # put back what is missing
                        if not os.path.lexists(out / item.name):
                            os.replace(item, out / item.name)
                _remove(child)


def recover(out: Union[str, Path], *, lock_timeout: Optional[float] = None) -> None:
    """Finish or undo whatever a killed writer left in ``out`` (holding the folder's lock).

    Rolls an interrupted commit forward (the new version is complete once it is named), deletes old
    versions, staging folders of dead processes and temporary links. Runs at the start of every
    :class:`Staging`; safe to call any time.
    """
    out = Path(out)
    state = out / STATE_DIR
    if not out.is_dir():
        return
    state.mkdir(exist_ok=True)
    with FolderLock(state / _LOCK, timeout=lock_timeout, what="report folder"):
        _recover_locked(out, state)


def report_entries(out: Union[str, Path]) -> Optional[Path]:
    """The folder holding the current report's files (``out/.bayes_lens/versions/<id>``), or None.

    Reading through this folder gives one consistent report even while another process commits.
    """
    return _current_version(Path(out) / STATE_DIR)


class Staging:
    """A private staging folder inside ``out``; ``commit(names)`` switches the report in, all or none.

    Use as a context manager: on exit (normal or not) an uncommitted staging folder is removed, so an
    interrupted run leaves ``out`` exactly as it was.

    Parameters
    ----------
    out:
        The output folder (created if needed).
    lock_timeout:
        Seconds to wait for another writer's lock (default ``$BAYES_LENS_LOCK_TIMEOUT`` or 120).
    layout:
        ``"auto"`` (symbolic links where the file system has them, else ``"copy"``), ``"links"`` or
        ``"copy"``.
    """

    def __init__(self, out: Union[str, Path], *, lock_timeout: Optional[float] = None, layout: str = "auto"):
        if layout not in ("auto", "links", "copy"):
            raise InvalidInputError(f"layout must be 'auto', 'links' or 'copy', got {layout!r}.")
        self.out = check_writable(out)
        self.state = self.out / STATE_DIR
        self.lock_timeout = lock_timeout
        self.layout = layout
        self.path: Path = Path()
        self._committed = False

    def _lock(self) -> FolderLock:
        return FolderLock(self.state / _LOCK, timeout=self.lock_timeout, what="report folder")

    def __enter__(self) -> "Staging":
        self.state.mkdir(exist_ok=True)
        with self._lock():
            _recover_locked(self.out, self.state)
        self.path = self.state / f"{STAGING_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.path.mkdir()
        self._committed = False
        return self

    def __exit__(self, *exc) -> None:
        if not self._committed:
            shutil.rmtree(self.path, ignore_errors=True)

    def commit(self, names: Iterable[str]) -> None:
        """Switch the staged entries ``names`` (files or folders) in as the folder's report.

        Entries of the staging folder not in ``names`` are dropped; top-level entries of an older
        report that the new one lacks disappear with it.
        """
        names = _ordered(names)
        for name in names:
            if not (self.path / name).exists():
                raise FileNotFoundError(f"staged entry {name!r} is missing")
            if "/" in name or name.startswith("."):
                raise InvalidInputError(f"report entry {name!r} must be a plain, visible top-level name.")
        for child in self.path.iterdir():
            if child.name not in names:
                _remove(child)
        fsync_dir(self.path)
        layout = self.layout
        if layout == "auto":
            layout = "links" if symlinks_supported(self.state) else "copy"
        versions = self.state / _VERSIONS
        with self._lock():
            versions.mkdir(exist_ok=True)
            version = versions / self.path.name[len(STAGING_PREFIX):]
            os.rename(self.path, version)
            self._committed = True  # from here on the version belongs to the folder, not to us
            fsync_dir(versions)
            if layout == "copy":
                write_text(self.state / _PENDING, version.name)  # the commit point
            else:
                for name in names:  # links that do not exist yet (a first report, or a new entry)
                    if not os.path.lexists(self.out / name):
                        _link(_link_target(name), self.out / name, self.out)
                fsync_dir(self.out)
                _link(f"{_VERSIONS}/{version.name}", self.state / _CURRENT, self.state)  # THE switch
                fsync_dir(self.state)
            _recover_locked(self.out, self.state)
