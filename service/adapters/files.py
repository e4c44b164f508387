"""The file access policy on the local disk: a job's files lie beneath a data root, and no
symbolic link is ever followed on the way to them.

Workers share the output directories the controller writes into, and they report the paths
of the models it copies; the controller runs as root. So every local path is checked by
``paths.DataRoots`` (under a data root, not a system directory) and then reached by a walk
that opens one component at a time under the previous directory's descriptor with
``O_NOFOLLOW``: a symlink anywhere beneath the root (a planted ``model.pkl``, a ``deploy``
directory swapped for a link elsewhere) is refused, never followed.

The roots are resolved once, when ``LocalFiles`` is made (at start-up): a root configured as
a link (a volume mount) is followed then, and from then on reached by the same walk from "/"
to its resolved path, so a root swapped for a link later (to ``/etc``, say) is refused, not
followed. A root whose resolved path lies in a directory that someone other than the
controller's user (or root) can change (world- or group-writable without the sticky bit, or
owned by another user) is refused at start (``ConfigError``): whoever can rename entries
there can swap the root.

Only regular files are read, and only the controller's own: the kind is checked before
opening (``fstatat`` without following), the open uses ``O_NONBLOCK`` so that a FIFO swapped
in meanwhile cannot block it, and the kind is checked again on the open descriptor, with the
owner and the link count: FIFOs, devices, sockets and directories, a file owned by another
user, and a file with more than one hard link (another job's 0600 file linked into a
worker's directory) are refused at once, as ``NotAllowed`` (permanent). Directories for a
job's files are created the same way, one ``mkdir`` under the parent's descriptor at a time,
and the caller keeps the final directory's descriptor, so what it writes lands where the
walk checked.

Missing components raise ``FileNotFoundError`` and other OS errors pass through unchanged:
the callers translate them (missing source, transient or permanent failure).
"""

from __future__ import annotations

import contextlib
import errno
import os
import posixpath
import stat
from collections.abc import Iterator
from contextlib import contextmanager

from service.core.paths import DataRoots, segments
from service.errors import ConfigError, Refused

_OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_OPEN_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


def kind_of(mode: int) -> str:
    """What a file of this ``st_mode`` is, in words."""
    for test, kind in (
        (stat.S_ISREG, "a regular file"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISLNK, "a symbolic link"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return kind
    return "not a regular file"


class NotAllowed(Refused):
    """The file access policy forbids the path: outside the roots, through a link, not a
    regular file, or not the controller's own."""


def _not_wanted(path: str, mode: int, wanted: str) -> NotAllowed:
    kind = kind_of(mode)
    if stat.S_ISLNK(mode):
        return NotAllowed(f"{path} is a symbolic link: links beneath a data root are not followed")
    return NotAllowed(f"{path} is {kind}, not {wanted}")


def resolve_root(root: str) -> str:
    """The resolved path of a data root (its links followed, once), checked: no directory it
    lies in may be changed by anyone but the controller's user or root, else ``ConfigError``.
    A root that does not exist yet resolves as far as it exists."""
    real = os.path.realpath(root)
    parts = segments(real) or ()
    trusted = {0, os.geteuid()}
    for depth in range(len(parts)):
        parent = "/" + "/".join(parts[:depth])
        try:
            st = os.lstat(parent)
        except FileNotFoundError:
            break
        shared = bool(st.st_mode & (stat.S_IWGRP | stat.S_IWOTH))
        writable = shared and not st.st_mode & stat.S_ISVTX
        if st.st_uid not in trusted or writable:
            who = f"owned by uid {st.st_uid}" if st.st_uid not in trusted else (
                f"writable by others (mode {stat.S_IMODE(st.st_mode):04o}, no sticky bit)"
            )  # fmt: skip
            raise ConfigError(
                f"data root {root} (resolved: {real}) lies in {parent}, {who}: whoever can "
                "rename entries there can swap the root for a link; choose a root whose "
                "parent directories only the controller's user or root can change"
            )
    return real


class LocalFiles:
    """Opens a job's local files for reading and its directories for writing, by the policy."""

    def __init__(self, roots: DataRoots | None = None) -> None:
        """Resolve and check the roots (``resolve_root``): raises ``ConfigError``."""
        self._roots = roots or DataRoots()
        self._real = {root: resolve_root(root) for root in self._roots.roots}

    def open_regular(self, path: str) -> int:
        """A read-only descriptor of the regular file ``path`` (blocking reads).

        Raises ``NotAllowed`` (policy, symlink, not a regular file, not the controller's own),
        ``FileNotFoundError``, or another ``OSError``.
        """
        root, names = self._locate(path)
        if not names:
            raise NotAllowed(f"{path} is a directory, not a regular file")
        parent = self._walk(root, names[:-1], create=False)
        try:
            return _open_regular(parent, names[-1], path)
        finally:
            os.close(parent)

    @contextmanager
    def directory(self, path: str, *, create: bool) -> Iterator[int]:
        """A descriptor of the directory ``path``, creating missing components if ``create``.

        Write beneath it with ``dir_fd=`` calls: they land in the directory the walk checked
        even if a component is swapped for a symlink afterwards.
        """
        root, names = self._locate(path)
        fd = self._walk(root, names, create=create)
        try:
            yield fd
        finally:
            os.close(fd)

    def _locate(self, path: str) -> tuple[str, tuple[str, ...]]:
        """The root to start from and the components below it; ``NotAllowed`` by the
        policy."""
        problem = self._roots.disk_problem(path)
        root = self._roots.root_of(path)
        parts, root_parts = segments(path), segments(root or "")
        if problem is not None or root is None or parts is None or root_parts is None:
            raise NotAllowed(problem or f"{path} is not under a data root")
        return root, parts[len(root_parts) :]

    def _walk(self, root: str, names: tuple[str, ...], *, create: bool) -> int:
        fd = self._open_root(root, create=create)
        try:
            for depth, name in enumerate(names):
                try:
                    inner = _open_dir(fd, name, create=create)
                except OSError as e:
                    if e.errno not in (errno.ENOTDIR, errno.ELOOP):
                        raise
                    where = posixpath.join(root, *names[: depth + 1])
                    mode = os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode
                    raise _not_wanted(where, mode, "a directory") from e
                os.close(fd)
                fd = inner
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _open_root(self, root: str, *, create: bool) -> int:
        """A descriptor of the root, reached from "/" along its resolved path without
        following a link (one swapped in since start-up is refused), the missing part of
        that path made first if ``create`` (an output root that does not exist yet)."""
        real = self._real[root]
        fd = os.open("/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            for name in segments(real) or ():
                try:
                    inner = _open_dir(fd, name, create=create)
                except OSError as e:
                    if e.errno not in (errno.ENOTDIR, errno.ELOOP):
                        raise
                    raise NotAllowed(
                        f"data root {root} ({real} at start-up) is no longer a directory "
                        "there: a root swapped for a link is not followed"
                    ) from e
                os.close(fd)
                fd = inner
        except BaseException:
            os.close(fd)
            raise
        return fd


def _open_dir(parent: int, name: str, *, create: bool) -> int:
    """A descriptor of the directory ``name`` in ``parent`` (never through a symlink),
    made first if missing and ``create``. Opened first: every round writes into directories
    that mostly exist already, and a mkdir that fails with EEXIST costs as much as one that
    succeeds."""
    try:
        return os.open(name, _OPEN_DIR, dir_fd=parent)
    except FileNotFoundError:
        if not create:
            raise
    with contextlib.suppress(FileExistsError):  # another writer made it meanwhile
        os.mkdir(name, dir_fd=parent)
    return os.open(name, _OPEN_DIR, dir_fd=parent)


def _open_regular(parent: int, name: str, path: str) -> int:
    mode = os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode
    if not stat.S_ISREG(mode):
        raise _not_wanted(path, mode, "a regular file")
    try:
        fd = os.open(name, _OPEN_FILE, dir_fd=parent)
    except OSError as e:
        if e.errno == errno.ELOOP:  # swapped for a link since the stat above
            raise _not_wanted(path, stat.S_IFLNK, "a regular file") from e
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):  # swapped for something else since the stat above
            raise _not_wanted(path, st.st_mode, "a regular file")
        if st.st_nlink > 1:
            raise NotAllowed(
                f"{path} has {st.st_nlink} hard links: a file linked in from elsewhere "
                "(another job's, say) is not read"
            )
        if st.st_uid != os.geteuid():
            raise NotAllowed(
                f"{path} belongs to uid {st.st_uid}, not to the controller's ({os.geteuid()})"
            )
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd
