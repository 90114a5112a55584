"""The only harness code that reads, copies, writes or deletes anything under a run's workspace.

Everything under ``workspace/`` is controlled by agent-written code, which keeps running while the harness works
(the paper's MCTS develops several nodes at once). So the harness never resolves a workspace path by name: every
operation opens the workspace root once, then walks one component at a time relative to the directory already open
(``openat`` with ``O_NOFOLLOW | O_DIRECTORY``), and works on what it opened:

* **writing** (``instructions.md``, node scripts): a fresh file is created under a random name with
  ``O_CREAT | O_EXCL | O_NOFOLLOW`` and renamed over the target; a planted link is replaced, never written through;
* **folders** the harness needs (``working/``, ``submission/``, a worker's folder): a link or file planted at that
  name is removed (the link itself) and a real folder made, owned by the sandbox's user;
* **deleting**: iterative (no recursion a deep tree could exhaust), links are unlinked and never followed, every
  folder is opened relative to its parent without following links; what cannot be deleted (deeper than
  :data:`MAX_DEPTH`) is renamed aside and reported;
* **collecting a submission** (:meth:`Workspace.collect_submission`): only regular files named by
  ``submission.csv`` (and the CSV itself) are copied; a linked submission folder, a linked path component, FIFOs,
  devices and sockets are refused; sizes (``st_size`` and ``st_blocks``) are checked against the grader's limits on
  the descriptor that is then copied (the check and the copy are one operation); only the data extents are copied,
  so a sparse file is never densified; copies are plain ``0644`` files owned by the harness (no setuid, setgid,
  sticky bit or ownership the agent chose); the total bytes, the number of files and the nesting depth are bounded,
  and every refusal is a reason in the result, never an exception that ends the run;
* **measuring** (:meth:`Workspace.usage`): bytes allocated and entries, for the workspace disk limit;
* **sweeping** (:meth:`Workspace.sweep`, after every command): set-user-id and set-group-id bits are cleared
  through a descriptor of the entry itself (``O_PATH | O_NOFOLLOW``, checked with ``fstat``), and a workspace
  handed to a new identity is chowned entry by entry without following links.
"""

from __future__ import annotations

import contextlib
import csv
import errno
import io
import os
import stat
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from rexmle_grade.errors import RexmleError
from rexmle_grade.io import MAX_CSV_BYTES, MAX_FILE_BYTES
from rexmle_grade.schema import SUBMISSION_CSV

_O_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: opening a FIFO must not wait for a writer (it is refused after fstat anyway)
_O_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
_O_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
FILE_MODE = 0o644
DIR_MODE = 0o755
MAX_DEPTH = 64  # folders below the workspace root the harness will walk into (deeper trees are a recorded reason)
MAX_PATH_CHARS = 1024
DISCARDED_PREFIX = ".rexmle-discarded-"
_RETRIES = 4  # a name swapped between two system calls is retried this often, then refused
_COPY_CHUNK = 8 * 1024 * 1024
_LISTED_REFUSALS = 20
SWEEP_MAX_ENTRIES = 2_000_000  # entries one set-id sweep visits at most (the disk limit's --max-files stops more)
_SET_ID = stat.S_ISUID | stat.S_ISGID


class WorkspaceRefused(RexmleError):
    """The harness will not follow or copy a path of the workspace (a link, a special file, a limit)."""


@dataclass(frozen=True)
class CopyLimits:
    """Bounds of one submission copy; defaults follow the graders' own limits."""

    max_file_bytes: int = MAX_FILE_BYTES
    max_total_bytes: int = 64 * 1024**3
    max_files: int = 100_000
    max_depth: int = 16  # folders inside the submission folder
    max_csv_bytes: int = MAX_CSV_BYTES


@dataclass(frozen=True)
class Collected:
    """A submission copied out of the workspace: the copy (None when there was nothing to copy) and what was
    refused, with the reasons."""

    folder: Path | None
    files: int = 0
    bytes: int = 0
    refused: tuple[str, ...] = ()
    n_refused: int = 0


@dataclass(frozen=True)
class Usage:
    """What the workspace holds: bytes allocated on disk, entries, the deepest folder; ``complete`` is False when
    the scan stopped early at a bound."""

    bytes: int
    entries: int
    depth: int
    complete: bool = True


@dataclass(frozen=True)
class Swept:
    """What one sweep did: entries visited, set-id bits cleared, entries given to the new owner."""

    entries: int
    depth: int
    cleared: int
    reowned: int
    complete: bool = True


def relative_parts(rel: str | PurePosixPath, *, what: str = "path") -> list[str]:
    """The components of a relative path, refused when it is absolute, empty, climbs (``..``), or is too long."""
    text = str(rel)
    if "\x00" in text:
        raise WorkspaceRefused(f"{what} {text!r} contains a NUL character")
    if len(text) > MAX_PATH_CHARS:
        raise WorkspaceRefused(f"{what} is {len(text)} characters long; the limit is {MAX_PATH_CHARS}")
    path = PurePosixPath(text)
    if path.is_absolute():
        raise WorkspaceRefused(f"{what} {text!r} is absolute; a path relative to its folder is expected")
    parts = [p for p in path.parts if p != "."]
    if not parts:
        raise WorkspaceRefused(f"{what} {text!r} names no file")
    if ".." in parts:
        raise WorkspaceRefused(f"{what} {text!r} climbs out of its folder with '..'")
    return parts


def _kind(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISREG(mode):
        return "a regular file"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "a special file"


def _lstat_at(dir_fd: int, name: str) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


@contextlib.contextmanager
def _closing(fd: int) -> Iterator[int]:
    try:
        yield fd
    finally:
        os.close(fd)


class Workspace:
    """One run's workspace as the harness may touch it. ``owner`` (uid, gid) is the sandbox's user, given the
    folders the harness makes for the agent; None keeps the harness's own."""

    def __init__(self, root: Path, owner: tuple[int, int] | None = None) -> None:
        self.root = Path(root)
        self.owner = owner

    # ---- opening ----------------------------------------------------------------------------------------------
    def _open_root(self) -> int:
        try:
            return os.open(self.root, _O_DIR)
        except OSError as exc:
            raise WorkspaceRefused(f"the workspace {self.root} cannot be opened as a folder: {exc.strerror}",
                                   hint="the harness creates it; pass an existing run folder") from None

    def _make_dir_at(self, parent: int, name: str) -> None:
        os.mkdir(name, DIR_MODE, dir_fd=parent)
        if self.owner is not None:
            # chown the name just made, without following: if it was swapped for a link meanwhile, the link's
            # ownership changes, never its target's
            os.chown(name, *self.owner, dir_fd=parent, follow_symlinks=False)

    def _open_child_dir(self, parent: int, name: str, *, create: bool, replace: bool) -> int:
        """Open ``name`` under ``parent`` as a folder without following links; make it (``create``) or replace a
        link or file planted there (``replace``)."""
        for _ in range(_RETRIES):
            try:
                return os.open(name, _O_DIR, dir_fd=parent)
            except FileNotFoundError:
                if not create:
                    raise WorkspaceRefused(f"{name!r} does not exist") from None
                with contextlib.suppress(FileExistsError):  # made by someone else meanwhile: open it next round
                    self._make_dir_at(parent, name)
            except (NotADirectoryError, OSError) as exc:
                if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise
                info = _lstat_at(parent, name)
                what = "something" if info is None else _kind(info.st_mode)
                if not replace:
                    raise WorkspaceRefused(f"{name!r} is {what}, not a folder; the harness does not follow links "
                                           "or enter special files") from None
                if info is not None and not stat.S_ISDIR(info.st_mode):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(name, dir_fd=parent)  # the link itself, never its target
        raise WorkspaceRefused(f"{name!r} kept changing while the harness opened it")

    def _open_dir(self, parts: Sequence[str], *, create: bool = False, replace: bool = False) -> int:
        """A descriptor of the folder ``parts`` below the root (the root itself for no parts)."""
        if len(parts) > MAX_DEPTH:
            raise WorkspaceRefused(f"{'/'.join(parts)!r} is nested deeper than {MAX_DEPTH} folders")
        fd = self._open_root()
        try:
            for name in parts:
                child = self._open_child_dir(fd, name, create=create, replace=replace)
                os.close(fd)
                fd = child
        except BaseException:
            os.close(fd)
            raise
        return fd

    # ---- folders ------------------------------------------------------------------------------------------
    def own_root(self) -> bool:
        """Give the workspace root to the sandbox's user (so agent code may create files at its top level), closed
        to every other user (0700); True when it belonged to someone else until now."""
        if self.owner is None:
            return False
        with _closing(self._open_root()) as fd:
            info = os.fstat(fd)
            if stat.S_IMODE(info.st_mode) != 0o700:
                os.fchmod(fd, 0o700)
            if (info.st_uid, info.st_gid) != self.owner:
                os.fchown(fd, *self.owner)
                return True
        return False

    def ensure_dir(self, rel: str, *, own: bool = True) -> None:
        """``rel`` is a real folder afterwards (made if missing; a link or file planted at its name, or at a
        parent's, is replaced); with ``own``, owned by the sandbox's user (chowned through the descriptor opened
        without following links)."""
        with _closing(self._open_dir(relative_parts(rel), create=True, replace=True)) as fd:
            if own and self.owner is not None:
                info = os.fstat(fd)
                if (info.st_uid, info.st_gid) != self.owner:
                    os.fchown(fd, *self.owner)

    def reset_dir(self, rel: str) -> list[str]:
        """``rel`` is an empty real folder afterwards, whatever was there (deleted without following links).
        Returns notes about what could not be deleted (renamed aside instead)."""
        *parents, name = relative_parts(rel)
        with _closing(self._open_dir(parents, create=True, replace=True)) as parent:
            notes = self._remove_at(parent, name, depth=len(parents) + 1)
            for _ in range(_RETRIES):
                try:
                    self._make_dir_at(parent, name)
                    break
                except FileExistsError:  # re-created by a running process meanwhile
                    notes += self._remove_at(parent, name, depth=len(parents) + 1)
            else:
                raise WorkspaceRefused(f"{rel!r} kept being re-created while the harness emptied it")
        return notes

    def remove(self, rel: str) -> list[str]:
        """Delete ``rel`` (file, link or folder tree) without following links; notes as for :meth:`reset_dir`."""
        *parents, name = relative_parts(rel)
        try:
            parent = self._open_dir(parents)
        except WorkspaceRefused:
            return []  # a parent is missing or not a folder: nothing of ours to delete there
        with _closing(parent):
            return self._remove_at(parent, name, depth=len(parents) + 1)

    def _remove_at(self, parent: int, name: str, *, depth: int) -> list[str]:
        info = _lstat_at(parent, name)
        if info is None:
            return []
        if not stat.S_ISDIR(info.st_mode):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name, dir_fd=parent)
            return []
        try:
            _remove_tree(parent, name, budget=MAX_DEPTH - depth)
            return []
        except (WorkspaceRefused, OSError) as exc:
            reason = exc.message if isinstance(exc, WorkspaceRefused) else exc.strerror
            aside = f"{DISCARDED_PREFIX}{uuid.uuid4().hex[:12]}"
            try:
                os.rename(name, aside, src_dir_fd=parent, dst_dir_fd=parent)  # renames the entry, follows nothing
            except FileNotFoundError:
                return []
            return [f"{name!r} could not be deleted ({reason}); it was renamed {aside!r}"]

    # ---- files --------------------------------------------------------------------------------------------
    def write_text(self, rel: str, text: str) -> None:
        # model-written text may hold lone surrogates, which UTF-8 cannot encode: kept as \u escape text
        self.write_bytes(rel, text.encode("utf-8", "backslashreplace"))

    def write_bytes(self, rel: str, data: bytes) -> None:
        """Create ``rel`` afresh with ``data`` (atomic: a new file renamed over whatever had that name)."""
        *parents, name = relative_parts(rel)
        with _closing(self._open_dir(parents, create=True, replace=True)) as parent:
            temp = f".rexmle-{uuid.uuid4().hex}.tmp"
            with _closing(os.open(temp, _O_NEW, FILE_MODE, dir_fd=parent)) as fd:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
            for _ in range(_RETRIES):
                try:
                    os.rename(temp, name, src_dir_fd=parent, dst_dir_fd=parent)
                    return
                except (IsADirectoryError, OSError) as exc:
                    if exc.errno not in (errno.EISDIR, errno.ENOTEMPTY, errno.EEXIST):
                        raise
                    self._remove_at(parent, name, depth=len(parents) + 1)  # a folder planted at the name
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temp, dir_fd=parent)
            raise WorkspaceRefused(f"{rel!r} kept being re-created as a folder while the harness wrote it")

    def kind_of(self, rel: str) -> str | None:
        """What ``rel`` is, without following links (``a folder``, ``a symbolic link``...); None when missing or
        when a parent is not a real folder."""
        *parents, name = relative_parts(rel)
        try:
            parent = self._open_dir(parents)
        except WorkspaceRefused:
            return None
        with _closing(parent):
            info = _lstat_at(parent, name)
        return None if info is None else _kind(info.st_mode)

    def is_empty_dir(self, rel: str) -> bool:
        """True when ``rel`` is missing, not a real folder, or a folder with nothing in it."""
        try:
            fd = self._open_dir(relative_parts(rel))
        except WorkspaceRefused:
            return True
        with _closing(fd), os.scandir(fd) as entries:
            return next(iter(entries), None) is None

    def stat(self, rel: str) -> os.stat_result | None:
        """``rel``'s own status (a link is reported as a link, never followed); None when it or a parent folder is
        missing or not a real folder."""
        *parents, name = relative_parts(rel)
        try:
            parent = self._open_dir(parents)
        except WorkspaceRefused:
            return None
        with _closing(parent):
            return _lstat_at(parent, name)

    def read_bytes(self, rel: str, *, max_bytes: int) -> bytes | None:
        """The content of the regular file ``rel`` (checked on the descriptor that is read); None when it is
        missing, not a regular file (a link, a FIFO...) or larger than ``max_bytes``."""
        *parents, name = relative_parts(rel)
        try:
            parent = self._open_dir(parents)
        except WorkspaceRefused:
            return None
        with _closing(parent):
            try:
                fd = os.open(name, _O_READ, dir_fd=parent)
            except OSError:
                return None
        with _closing(fd):
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or info.st_size > max_bytes:
                return None
            return _read_exactly(fd, info.st_size)

    @contextlib.contextmanager
    def reading(self, rel: str) -> Iterator[RegularFile | None]:
        """The regular file ``rel`` opened once (without following links) for reads at offsets; None when it is
        missing or not a regular file. A reader of a file the agent rewrites compares :meth:`RegularFile.status`
        before and after to know whether what it read is one version."""
        *parents, name = relative_parts(rel)
        try:
            parent = self._open_dir(parents)
        except WorkspaceRefused:
            yield None
            return
        with _closing(parent):
            try:
                fd = os.open(name, _O_READ, dir_fd=parent)
            except OSError:
                fd = -1
        if fd < 0:
            yield None
            return
        with _closing(fd):
            yield RegularFile(fd) if stat.S_ISREG(os.fstat(fd).st_mode) else None

    def copy_out(self, rel: str, dest: Path, *, limits: CopyLimits | None = None) -> Collected:
        """Copy the regular files under ``rel`` (a file or a folder tree) into the harness folder ``dest``, without
        following links, iteratively; links, special files and what is over the limits are refused with reasons."""
        limits = limits or CopyLimits()
        copy = _Copy(-1, dest, limits)
        info = self.stat(rel)
        if info is None:
            copy.refuse(f"{rel!r} does not exist, or a folder on its way is not a real folder")
            return copy.result(None)
        parts = relative_parts(rel)
        dest.mkdir(parents=True, exist_ok=True)
        if not stat.S_ISDIR(info.st_mode):
            with _closing(self._open_dir(parts[:-1])) as parent:
                copy.copy_file(parent, parts[-1], dest / parts[-1], label=rel)
            return copy.result(dest)
        # one frame per folder level: [descriptor, path below rel, subfolders still to visit (None: not listed)]
        frames: list[list[Any]] = [[self._open_dir(parts), "", None]]
        try:
            while frames:
                frame = frames[-1]
                fd, where = frame[0], frame[1]
                if frame[2] is None:
                    files, folders = _list(fd)
                    (dest / where).mkdir(parents=True, exist_ok=True)
                    for name in files:
                        copy.copy_file(fd, name, dest / where / name, label=f"{where}{name}")
                    frame[2] = folders
                if not frame[2]:
                    os.close(frames.pop()[0])
                    continue
                child = frame[2].pop()
                if len(frames) > limits.max_depth:
                    copy.refuse(f"{where}{child}/ is nested deeper than {limits.max_depth} folders")
                    continue
                try:
                    frames.append([os.open(child, _O_DIR, dir_fd=fd), f"{where}{child}/", None])
                except OSError:
                    copy.refuse(f"{where}{child} is gone, or is no longer a folder")
        finally:
            for frame in frames:
                os.close(frame[0])
        return copy.result(dest)

    # ---- a submission ------------------------------------------------------------------------------------
    def collect_submission(self, rel: str, dest: Path, *, file_columns: Iterable[str],
                           limits: CopyLimits | None = None) -> Collected:
        """Copy the submission folder ``rel`` to the new harness folder ``dest``: ``submission.csv`` and the
        regular files its ``file_columns`` name. Refusals are reasons in the result; ``folder`` is None when not
        even the CSV could be collected."""
        limits = limits or CopyLimits()
        try:
            sub = self._open_dir(relative_parts(rel, what="submission folder"))
        except WorkspaceRefused as exc:
            return Collected(folder=None, refused=(f"the submission folder {rel!r}: {exc.message}",), n_refused=1)
        with _closing(sub):
            return _Copy(sub, dest, limits).run(list(file_columns))

    # ---- measuring --------------------------------------------------------------------------------------
    def _walk(self, visit: Callable[[int, bool], list[str]], *, stop: Callable[[], bool]) -> tuple[int, bool]:
        """Depth-first over the folders below the root without following links, one descriptor per folder level:
        ``visit(fd, top)`` handles a folder's entries and returns the names of its sub-folders; the walk stops
        early (returning False) once ``stop()`` says so or below :data:`MAX_DEPTH` folders. Returns the
        deepest level reached and whether the walk was complete."""
        root = self._open_root()
        frames: list[tuple[int, list[str]]] = [(root, [])]
        deepest = 0
        try:
            frames[0] = (root, visit(root, True))
            while frames:
                if stop() or len(frames) > MAX_DEPTH:
                    return max(deepest, len(frames)), False
                fd, pending = frames[-1]
                if not pending:
                    os.close(frames.pop()[0])
                    continue
                try:
                    child = os.open(pending.pop(), _O_DIR, dir_fd=fd)
                except OSError:  # gone, swapped for a link, or closed to the harness: nothing below it to visit
                    continue
                try:
                    frames.append((child, visit(child, False)))
                except BaseException:
                    os.close(child)
                    raise
                deepest = max(deepest, len(frames) - 1)
        finally:
            for fd, _ in frames:
                os.close(fd)
        return deepest, True

    def usage(self, *, max_entries: int | None = None, skip: Sequence[str] = ()) -> Usage:
        """Bytes allocated (``st_blocks``) and entries under the root, never following links; stops early (with
        ``complete`` False) past ``max_entries`` or below :data:`MAX_DEPTH` folders. ``skip``: top-level names
        not counted (the read-only data view's mount point). One descriptor per folder level is open at a time."""
        total = entries = 0

        def scan(fd: int, top: bool) -> list[str]:
            nonlocal total, entries
            folders: list[str] = []
            with os.scandir(fd) as listing:
                for entry in listing:
                    if top and entry.name in skip:
                        continue
                    try:
                        info = entry.stat(follow_symlinks=False)
                    except FileNotFoundError:
                        continue
                    entries += 1
                    total += info.st_blocks * 512
                    if stat.S_ISDIR(info.st_mode):
                        folders.append(entry.name)
            return folders

        deepest, complete = self._walk(scan, stop=lambda: max_entries is not None and entries > max_entries)
        return Usage(total, entries, deepest, complete=complete)

    def sweep(self, *, reown: bool = False, skip: Sequence[str] = (),
              max_entries: int = SWEEP_MAX_ENTRIES) -> Swept:
        """Clear the set-user-id and set-group-id bits of every file and folder below the root; with ``reown``,
        also give every entry to ``owner`` (chowned by name without following links: a name swapped for a link
        meanwhile changes the link's owner, never its target's). Bounded like :meth:`usage`; a folder that cannot
        be listed is passed over. ``skip``: top-level names left alone (the data view)."""
        owner = self.owner if reown else None
        entries = cleared = reowned = 0

        def visit(fd: int, top: bool) -> list[str]:
            nonlocal entries, cleared, reowned
            folders: list[str] = []
            if top:  # the root itself
                info = os.fstat(fd)
                if info.st_mode & _SET_ID:
                    os.fchmod(fd, stat.S_IMODE(info.st_mode) & ~_SET_ID)
                    cleared += 1
            try:
                listing = os.scandir(fd)
            except OSError:
                return folders
            with listing:
                for entry in listing:
                    if top and entry.name in skip:
                        continue
                    info = _lstat_at(fd, entry.name)
                    if info is None:
                        continue
                    entries += 1
                    if owner is not None and (info.st_uid, info.st_gid) != owner:
                        with contextlib.suppress(FileNotFoundError):
                            os.chown(entry.name, *owner, dir_fd=fd, follow_symlinks=False)
                            reowned += 1
                        info = _lstat_at(fd, entry.name) or info  # chown may have cleared set-id bits itself
                    if info.st_mode & _SET_ID and (stat.S_ISREG(info.st_mode) or stat.S_ISDIR(info.st_mode)):
                        cleared += _clear_set_id(fd, entry.name)
                    if stat.S_ISDIR(info.st_mode):
                        folders.append(entry.name)
            return folders

        deepest, complete = self._walk(visit, stop=lambda: entries > max_entries)
        return Swept(entries, deepest, cleared, reowned, complete=complete)


def _clear_set_id(parent: int, name: str) -> int:
    """Clear the set-id bits of ``name`` through a descriptor of the entry itself (a link is opened as the link,
    and left alone); 1 when bits were cleared."""
    try:
        fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
    except OSError:
        return 0
    try:
        info = os.fstat(fd)
        if not (info.st_mode & _SET_ID and (stat.S_ISREG(info.st_mode) or stat.S_ISDIR(info.st_mode))):
            return 0
        # chmod of an O_PATH descriptor goes through its /proc link, which names the opened inode, not a path
        os.chmod(f"/proc/self/fd/{fd}", stat.S_IMODE(info.st_mode) & ~_SET_ID)
        return 1
    except OSError:
        return 0
    finally:
        os.close(fd)


def _remove_tree(parent: int, name: str, *, budget: int) -> None:
    """Delete the folder ``name`` under ``parent`` and everything in it, iteratively and without following links;
    refuses (before deleting past it) a tree deeper than ``budget`` folders."""
    frames: list[tuple[int, str, list[str]]] = []  # (descriptor, its name, subfolders still to visit)

    def enter(at: int, child: str) -> None:
        if len(frames) >= max(1, budget):
            raise WorkspaceRefused(f"the tree is nested deeper than {MAX_DEPTH} folders")
        fd = os.open(child, _O_DIR, dir_fd=at)
        frames.append((fd, child, _clear_files(fd)))

    try:
        enter(parent, name)
        while frames:
            fd, own, pending = frames[-1]
            if pending:
                child = pending.pop()
                try:
                    enter(fd, child)
                except (FileNotFoundError, NotADirectoryError):
                    continue
                except OSError as exc:
                    if exc.errno != errno.ELOOP:  # swapped for a link meanwhile: unlinked by the rescan below
                        raise
                continue
            again = _clear_files(fd)  # what a running process added meanwhile
            if again:
                frames[-1] = (fd, own, again)
                continue
            frames.pop()
            os.close(fd)
            at = frames[-1][0] if frames else parent
            try:
                os.rmdir(own, dir_fd=at)
            except FileNotFoundError:
                pass
            except OSError as exc:
                if exc.errno != errno.ENOTEMPTY:
                    raise
                raise WorkspaceRefused(f"{own!r} kept being refilled while the harness deleted it") from None
    finally:
        for fd, _, _ in frames:
            os.close(fd)


def _clear_files(fd: int) -> list[str]:
    """Unlink every non-folder entry of the open folder ``fd`` (links themselves); return its subfolders."""
    folders: list[str] = []
    with os.scandir(fd) as listing:
        for entry in listing:
            if entry.is_dir(follow_symlinks=False):
                folders.append(entry.name)
            else:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.name, dir_fd=fd)
    return folders


@dataclass
class _Copy:
    """One submission copy (see :meth:`Workspace.collect_submission`)."""

    source: int
    dest: Path
    limits: CopyLimits
    files: int = 0
    bytes: int = 0
    refused: list[str] = field(default_factory=list)
    n_refused: int = 0

    def refuse(self, reason: str) -> None:
        self.n_refused += 1
        if len(self.refused) < _LISTED_REFUSALS:
            self.refused.append(reason)

    def result(self, folder: Path | None) -> Collected:
        return Collected(folder=folder, files=self.files, bytes=self.bytes, refused=tuple(self.refused),
                         n_refused=self.n_refused)

    def run(self, file_columns: list[str]) -> Collected:
        table = self._read_csv()
        if table is None:
            return self.result(None)
        self.dest.mkdir(parents=True)
        self._write(SUBMISSION_CSV, table)
        seen: set[tuple[str, ...]] = {(SUBMISSION_CSV,)}  # by path, not by spelling ("a.nii" and "./a.nii")
        for relpath in _named_files(table, file_columns):
            try:
                key = tuple(relative_parts(relpath, what="file"))
            except WorkspaceRefused as exc:
                self.refuse(exc.message)
                continue
            if key in seen:
                continue
            seen.add(key)
            if self.files >= self.limits.max_files:
                self.refuse(f"{relpath!r}: more than {self.limits.max_files} files are named; the rest are not "
                            "copied")
                continue
            self._copy_one(relpath)
        return self.result(self.dest)

    def _read_csv(self) -> bytes | None:
        try:
            fd = os.open(SUBMISSION_CSV, _O_READ, dir_fd=self.source)
        except FileNotFoundError:
            self.refuse(f"{SUBMISSION_CSV} is missing from the submission folder")
            return None
        except OSError as exc:
            self.refuse(f"{SUBMISSION_CSV}: {_open_problem(exc, self.source, SUBMISSION_CSV)}")
            return None
        with _closing(fd):
            info = os.fstat(fd)
            problem = self._file_problem(info, self.limits.max_csv_bytes)
            if problem:
                self.refuse(f"{SUBMISSION_CSV}: {problem}")
                return None
            return _read_exactly(fd, info.st_size)

    def _file_problem(self, info: os.stat_result, max_bytes: int) -> str | None:
        if not stat.S_ISREG(info.st_mode):
            return f"is {_kind(info.st_mode)}; only regular files are collected"
        allocated = info.st_blocks * 512
        if info.st_size > max_bytes or allocated > max_bytes + 1024 * 1024:
            return (f"is {info.st_size} bytes ({allocated} allocated); the limit per file is {max_bytes}")
        if self.bytes + info.st_size > self.limits.max_total_bytes:
            return (f"would bring the submission to {self.bytes + info.st_size} bytes; the limit is "
                    f"{self.limits.max_total_bytes}")
        return None

    def _copy_one(self, relpath: str) -> None:
        try:
            parts = relative_parts(relpath, what="file")
        except WorkspaceRefused as exc:
            self.refuse(exc.message)
            return
        if len(parts) - 1 > self.limits.max_depth:
            self.refuse(f"{relpath!r} is nested deeper than {self.limits.max_depth} folders")
            return
        opened: list[int] = []
        try:
            at = self.source
            for name in parts[:-1]:
                try:
                    at = os.open(name, _O_DIR, dir_fd=at)
                except OSError as exc:
                    self.refuse(f"{relpath!r}: the folder {name!r} {_open_problem(exc, at, name)}")
                    return
                opened.append(at)
            self.copy_file(at, parts[-1], self.dest.joinpath(*parts), label=relpath)
        finally:
            for fd_ in opened:
                os.close(fd_)

    def copy_file(self, at: int, name: str, target: Path, *, label: str) -> None:
        """Copy the regular file ``name`` of the open folder ``at`` to ``target`` (checks on the descriptor that
        is then copied; only its data extents; a plain 0644 file)."""
        if self.files >= self.limits.max_files:
            self.refuse(f"{label!r}: more than {self.limits.max_files} files; the rest are not copied")
            return
        try:
            fd = os.open(name, _O_READ, dir_fd=at)
        except OSError as exc:
            self.refuse(f"{label!r} {_open_problem(exc, at, name)}")
            return
        with _closing(fd):
            info = os.fstat(fd)
            problem = self._file_problem(info, self.limits.max_file_bytes)
            if problem:
                self.refuse(f"{label!r} {problem}")
                return
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                out = os.open(target, _O_NEW, FILE_MODE)
            except FileExistsError:  # the same file reached again: copied once
                return
            with _closing(out):
                copy_extents(fd, out, info.st_size)
            self.files += 1
            self.bytes += info.st_size

    def _write(self, name: str, data: bytes) -> None:
        with _closing(os.open(self.dest / name, _O_NEW, FILE_MODE)) as out:
            view = memoryview(data)
            while view:
                view = view[os.write(out, view):]


def _open_problem(exc: OSError, at: int, name: str) -> str:
    if isinstance(exc, FileNotFoundError):
        return "does not exist"
    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
        info = _lstat_at(at, name)
        what = "not a folder" if info is None else _kind(info.st_mode)
        return f"is {what}; the harness does not follow links"
    return f"cannot be opened ({exc.strerror})"


def _list(fd: int) -> tuple[list[str], list[str]]:
    """(entries that are not folders, real folders) of the open folder ``fd``, sorted; links are not followed."""
    files, folders = [], []
    with os.scandir(fd) as listing:
        for entry in listing:
            (folders if entry.is_dir(follow_symlinks=False) else files).append(entry.name)
    return sorted(files), sorted(folders, reverse=True)


def _named_files(table: bytes, file_columns: Sequence[str]) -> list[str]:
    """The paths the file columns of ``submission.csv`` name (nothing when the CSV cannot be read: validation then
    says why)."""
    if not file_columns:
        return []
    try:
        rows = csv.reader(io.StringIO(table.decode("utf-8-sig")))
        header = [h.strip() for h in next(rows, [])]
        columns = [header.index(c) for c in file_columns if c in header]
        return [row[i].strip() for row in rows for i in columns if i < len(row) and row[i].strip()]
    except (UnicodeDecodeError, csv.Error):
        return []


class RegularFile:
    """A regular file of the workspace opened by :meth:`Workspace.reading` (valid inside its ``with`` block)."""

    def __init__(self, fd: int) -> None:
        self._fd = fd

    def status(self) -> os.stat_result:
        return os.fstat(self._fd)

    def read(self, offset: int, count: int) -> bytes:
        """Up to ``count`` bytes from ``offset`` (fewer at the end of the file)."""
        parts, done = [], 0
        while done < count:
            chunk = os.pread(self._fd, min(count - done, _COPY_CHUNK), offset + done)
            if not chunk:
                break
            parts.append(chunk)
            done += len(chunk)
        return b"".join(parts)


def _read_exactly(fd: int, size: int) -> bytes:
    chunks = []
    left = size
    while left > 0:
        chunk = os.read(fd, min(left, _COPY_CHUNK))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def copy_extents(src: int, dst: int, size: int) -> None:
    """Copy the first ``size`` bytes of ``src`` to ``dst``, only the extents holding data (holes stay holes), in
    the kernel where it can (``copy_file_range``)."""
    offset = 0
    while offset < size:
        try:
            start = os.lseek(src, offset, os.SEEK_DATA)
        except OSError as exc:
            if exc.errno == errno.ENXIO:  # nothing but a hole up to the end
                break
            start = offset  # no hole support here: all data
        if start >= size:
            break
        try:
            end = min(os.lseek(src, start, os.SEEK_HOLE), size)
        except OSError:
            end = size
        _copy_range(src, dst, start, end - start)
        offset = end
    os.ftruncate(dst, size)


def _copy_range(src: int, dst: int, offset: int, count: int) -> None:
    done = 0
    while done < count:
        try:
            n = os.copy_file_range(src, dst, min(count - done, 1 << 30), offset + done, offset + done)
        except OSError as exc:
            if exc.errno not in (errno.EXDEV, errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.EPERM):
                raise
            n = _copy_plain(src, dst, offset + done, count - done)
        if n == 0:  # the file shrank meanwhile
            return
        done += n


def _copy_plain(src: int, dst: int, offset: int, count: int) -> int:
    done = 0
    while done < count:
        chunk = os.pread(src, min(_COPY_CHUNK, count - done), offset + done)
        if not chunk:
            break
        written = 0
        while written < len(chunk):
            written += os.pwrite(dst, chunk[written:], offset + done + written)
        done += len(chunk)
    return done
