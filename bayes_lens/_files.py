"""Small file utilities shared by the report writer and the wind-tunnel checkpoints.

* :func:`sha256_file` - the hash recorded for every file of a report or checkpoint;
  :func:`sha256_tensor` / :func:`sha256_json` - the hashes of one tensor (dtype, shape, bytes) and of
  a JSON document (canonical form), which self-checking files (merged collections, axes) carry;
* :func:`write_bytes` / :func:`write_text` - atomic file writes (temporary file in the same folder,
  ``fsync``, ``os.replace``, ``fsync`` of the folder): a reader sees the old or the new content,
  never a torn file, even if the process is killed. The temporary file is named
  ``.<name>.<host>-<pid>-<random>.tmp``; one left by a killed writer on this host is deleted by the
  next write of the same file. A write that the file system refuses (disk full, read-only, no
  permission) raises :class:`~bayes_lens.errors.WriteError` naming the file and the fix;
* :func:`make_dir` - ``mkdir -p`` with the same errors (a file in the way, a read-only parent);
* :func:`fsync_dir` - make a rename durable;
* :class:`FolderLock` - an exclusive ``fcntl.flock`` on a lock file, waited for with a timeout, so
  that two processes never commit into the same output folder at once (the loser waits, or raises
  :class:`~bayes_lens.errors.LockTimeoutError` saying who holds the lock).

Example
-------
>>> import tempfile, pathlib
>>> d = pathlib.Path(tempfile.mkdtemp())
>>> write_text(d / "a.txt", "hello")
>>> with FolderLock(d / ".lock", timeout=5):
...     (d / "a.txt").read_text()
'hello'
"""

from __future__ import annotations

import errno
import glob
import hashlib
import json
import os
import re
import socket
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, Optional, Union

from .errors import BayesLensError, LockTimeoutError, WriteError

__all__ = ["sha256_file", "sha256_tensor", "sha256_json", "write_atomic", "write_bytes", "write_text", "fsync_dir",
           "file_mode", "make_dir", "write_error", "pid_alive", "FolderLock", "DEFAULT_LOCK_TIMEOUT", "lock_timeout"]

#: Seconds a writer waits for another writer's lock before giving up (``BAYES_LENS_LOCK_TIMEOUT``).
DEFAULT_LOCK_TIMEOUT = 120.0


def sha256_file(path: Path) -> str:
    """Hex SHA-256 of a file, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def sha256_tensor(t) -> str:
    """Hex SHA-256 of a torch tensor's dtype, shape and bytes (row-major; any dtype, bfloat16 included)."""
    import torch

    t = t.detach().cpu().contiguous()
    h = hashlib.sha256(f"{str(t.dtype).replace('torch.', '')}{list(t.shape)}".encode())
    if t.numel():
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def sha256_json(obj: Any) -> str:
    """Hex SHA-256 of a JSON-able object in canonical form (sorted keys, no spaces; NaN allowed).

    The same object read back from any JSON text of it (``json.loads``) hashes the same, so a file
    can store the hash of its own metadata next to it.
    """
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=True, ensure_ascii=True)
    return hashlib.sha256(text.encode("ascii")).hexdigest()


_FIXES = {
    errno.ENOSPC: "the disk is full: free space, or write to another disk",
    errno.EDQUOT: "the disk quota is exhausted: free space, or write to another disk",
    errno.EROFS: "the file system is read-only: write to a writable folder",
    errno.EACCES: "permission denied: write to a folder you can write to",
    errno.EPERM: "permission denied: write to a folder you can write to",
    errno.EEXIST: "a file is in the way where a folder is needed: remove it or choose another path",
    errno.ENOTDIR: "a file is in the way where a folder is needed: remove it or choose another path",
    errno.EISDIR: "a folder is in the way where a file is needed: remove it or choose another path",
    errno.ENOENT: "its folder does not exist (deleted meanwhile?): create it or choose another path",
}


def write_error(err: BaseException, path: Union[str, Path], what: str = "write", *, file: bool = True) -> WriteError:
    """The :class:`~bayes_lens.errors.WriteError` for an ``OSError`` (or safetensors' error, which
    carries the OS error code in its text) raised while writing ``path``."""
    code = getattr(err, "errno", None)
    if code is None:
        m = re.search(r"code: (\d+)", str(err))
        code = int(m.group(1)) if m else None
    fix = _FIXES.get(code) if code is not None else None
    reason = (os.strerror(code) if code else str(err)) or type(err).__name__
    return WriteError(f"cannot {what} {str(path)!r}: {reason}" + (f"; {fix}" if fix else "") +
                      (". Nothing partial was left in its place." if file else "."))


def make_dir(path: Union[str, Path], what: str = "folder") -> Path:
    """``mkdir -p path``; a file in the way or an unwritable parent is a WriteError saying so."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise WriteError(f"cannot use {str(path)!r} as the {what}: it is a file, not a folder; pass a folder path "
                         "(it is created if missing) or remove the file.")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise write_error(err, path, f"create the {what}", file=False) from None
    return path


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this host (EPERM: it exists but is not ours)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError as err:
        return err.errno == errno.EPERM
    return True


_HOST = hashlib.sha256(socket.gethostname().encode()).hexdigest()[:8]


def _tmp_prefix(path: Path) -> str:
    return f".{path.name}.{_HOST}-"


def _clean_stale_tmp(path: Path) -> None:
    """Delete temporary files of ``path`` left by killed writers on this host (a live writer's stay)."""
    prefix = _tmp_prefix(path)
    for tmp in path.parent.glob(glob.escape(prefix) + "*.tmp"):
        pid = tmp.name[len(prefix):].split("-", 1)[0]
        if pid.isdigit() and int(pid) != os.getpid() and not pid_alive(int(pid)):
            try:
                os.unlink(tmp)
            except OSError:
                pass


def file_mode() -> int:
    """0o666 minus the process umask: what ``open()`` would give (mkstemp alone gives 0o600)."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def fsync_dir(path: Union[str, Path]) -> None:
    """``fsync`` a folder so that renames inside it survive a power cut (no-op where unsupported)."""
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


def write_atomic(path: Union[str, Path], write) -> None:
    """Call ``write(tmp_path)`` on a temporary file next to ``path``, fsync it, then ``os.replace`` it in
    (and fsync the folder): a reader sees the old file or the complete new one, never a part."""
    path = Path(path)
    if path.is_dir():
        raise WriteError(f"cannot write {str(path)!r}: it is a folder; remove it or choose another file name.")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f"{_tmp_prefix(path)}{os.getpid()}-", suffix=".tmp", dir=str(path.parent))
    except OSError as err:
        raise write_error(err, path) from None
    os.close(fd)
    try:
        write(tmp)
        # after write(): a writer that replaces the file (safetensors' save_file) leaves mkstemp's 0o600 again,
        # and a shard folder another user merges must be readable as the umask says
        os.chmod(tmp, file_mode())
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException as err:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if not isinstance(err, BayesLensError) and (isinstance(err, OSError)
                                                    or type(err).__name__ == "SafetensorError"):
            raise write_error(err, path) from err
        raise
    fsync_dir(path.parent)
    _clean_stale_tmp(path)


def write_bytes(path: Union[str, Path], data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (:func:`write_atomic`)."""
    write_atomic(path, lambda tmp: Path(tmp).write_bytes(data))


def write_text(path: Union[str, Path], text: str) -> None:
    """:func:`write_bytes` for UTF-8 text."""
    write_bytes(path, text.encode("utf-8"))


def lock_timeout(timeout: Optional[float] = None) -> float:
    """``timeout`` if given, else ``$BAYES_LENS_LOCK_TIMEOUT``, else :data:`DEFAULT_LOCK_TIMEOUT` seconds."""
    if timeout is not None:
        return float(timeout)
    env = os.environ.get("BAYES_LENS_LOCK_TIMEOUT")
    if env:
        try:
            return float(env)
        except ValueError:
            pass
    return DEFAULT_LOCK_TIMEOUT


class FolderLock:
    """Exclusive lock on ``lock_file`` (``fcntl.flock``), held for a ``with`` block.

    Waits up to ``timeout`` seconds (default :func:`lock_timeout`) for another holder, polling;
    then raises :class:`~bayes_lens.errors.LockTimeoutError` naming the holder's pid. The lock is
    released by the kernel when the holder exits, even when it is killed, so a crashed writer never
    leaves the folder locked. The lock file itself is never deleted (deleting it would let two
    processes lock two different files of the same name). Where ``fcntl`` is missing (Windows) the
    lock is a no-op.
    """

    def __init__(self, lock_file: Union[str, Path], *, timeout: Optional[float] = None, what: str = "folder"):
        self.lock_file = Path(lock_file)
        self.timeout = lock_timeout(timeout)
        self.what = what
        self._fd: Optional[int] = None

    def __enter__(self) -> "FolderLock":
        try:
            import fcntl
        except ImportError:  # pragma: no cover - Windows
            return self
        try:
            fd = os.open(str(self.lock_file), os.O_RDWR | os.O_CREAT, file_mode())
        except OSError as err:
            raise write_error(err, self.lock_file, f"create the lock file of {self.what}", file=False) from None
        deadline = time.monotonic() + self.timeout
        delay = 0.01
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except (BlockingIOError, PermissionError):
                if time.monotonic() >= deadline:
                    holder = self._holder(fd)
                    os.close(fd)
                    raise LockTimeoutError(
                        f"another process{holder} is writing into {self.what} {str(self.lock_file.parent)!r} "
                        f"and held its lock for more than {self.timeout:g} s. Wait for it to finish and run "
                        "again, write to another folder (--out DIR / out=...), or raise the wait with "
                        "BAYES_LENS_LOCK_TIMEOUT=<seconds>."
                    ) from None
                time.sleep(delay)
                delay = min(delay * 2, 0.2)
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except OSError:  # pragma: no cover - the pid is only informative
            pass
        self._fd = fd
        return self

    @staticmethod
    def _holder(fd: int) -> str:
        try:
            pid = os.pread(fd, 32, 0).decode().strip()
        except (OSError, UnicodeDecodeError):  # pragma: no cover
            return ""
        return f" (pid {pid})" if pid.isdigit() else ""

    def __exit__(self, *exc) -> None:
        if self._fd is not None:
            import fcntl

            try:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
            finally:
                os.close(self._fd)
                self._fd = None


_TENSORS_SHA = "tensors_sha256"
_META_SHA = "metadata_sha256"


def save_checked_safetensors(path: Union[str, Path], tensors: Dict[str, Any], metadata: Dict[str, str]) -> Path:
    """Write ``tensors`` to one ``.safetensors`` file atomically, its metadata holding a SHA-256 of every
    tensor (dtype, shape, bytes) and one of the metadata itself; :func:`read_checked_safetensors` verifies both."""
    from safetensors.torch import save_file

    path = Path(path)
    tensors = {k: v.detach().cpu().contiguous() for k, v in tensors.items()}
    meta = {str(k): str(v) for k, v in metadata.items()}
    meta[_TENSORS_SHA] = json.dumps({name: sha256_tensor(t) for name, t in tensors.items()}, sort_keys=True)
    meta.pop(_META_SHA, None)
    meta[_META_SHA] = sha256_json(meta)
    write_atomic(path, lambda tmp: save_file(tensors, tmp, metadata=meta))
    return path


def read_checked_safetensors(path: Union[str, Path], *, keep=None, error=None, fix: str = "write it again."):
    """``(tensors, metadata)`` of a ``.safetensors`` file; ``keep(name) -> bool`` selects the tensors read.

    The checksums a :func:`save_checked_safetensors` file carries are verified for every tensor read and
    for the metadata; a file without them (a shard's tensor file, checked against its manifest instead)
    is read as it is. Any damage raises ``error`` (an exception class; default
    :class:`~bayes_lens.errors.CheckpointError`) naming the file and ending with ``fix``.
    """
    from safetensors import safe_open

    from .errors import CheckpointError

    error = error or CheckpointError
    path = Path(path)
    if not path.is_file():
        raise error(f"no such file: {str(path)!r}.")
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            names = list(f.keys())
            tensors = {name: f.get_tensor(name) for name in names if keep is None or keep(name)}
    except Exception as err:  # noqa: BLE001 - a truncated or foreign file
        raise error(f"cannot read {str(path)!r} as safetensors ({err}); {fix}") from err
    damaged = f"the file was changed or damaged after it was written; {fix}"
    if _META_SHA in meta or _TENSORS_SHA in meta:
        body = {k: v for k, v in meta.items() if k != _META_SHA}
        if meta.get(_META_SHA) != sha256_json(body):
            raise error(f"{str(path)!r}: its metadata (settings hash, model fingerprint, tensor checksums) does not "
                        f"match its SHA-256: {damaged}")
        try:
            sha = json.loads(meta[_TENSORS_SHA])
        except (KeyError, ValueError):
            sha = None
        if not isinstance(sha, dict) or set(sha) != set(names):
            raise error(f"{str(path)!r}: its tensor checksums do not list exactly the stored tensors: {damaged}")
        for name, t in tensors.items():
            if sha256_tensor(t) != sha[name]:
                raise error(f"{str(path)!r}: the tensor {name!r} does not match its SHA-256: {damaged}")
    return tensors, meta
