"""The file access policy on the local disk: a job's files lie beneath a data root, and no
symbolic link is ever followed on the way to them.

Workers share the output directories the controller writes into, and they report the paths
of the models it copies; the controller runs as root. So every local path is checked by
``paths.DataRoots`` (under a data root, not a system directory, no ".." component) and then
reached without following a symlink anywhere on the way: a symlink beneath the root (a
planted ``model.pkl``, a ``deploy`` directory swapped for a link elsewhere) is refused,
never followed. Where the kernel has ``openat2`` (Linux 5.6), a directory is opened by its
whole path in one call with ``RESOLVE_NO_SYMLINKS``; where it has not (or a seccomp filter
forbids it, said once in the log) the path is walked one component at a time, each opened
under the previous directory's descriptor with ``O_NOFOLLOW``. A call that fails is walked
again the slow way, which names what is wrong (a link, not a directory), and a directory
that is missing and is to be created is made under its parent's descriptor.

The roots are resolved once, when ``LocalFiles`` is made (at start-up): a root configured as
a link (a volume mount) is followed then, and from then on reached along its resolved path
from "/" without following a link, so a root swapped for a link later (to ``/etc``, say) is
refused, not followed. (Each call resolves that path again rather than keeping a descriptor
of the root: a kept one would go on writing into a root moved aside, and miss a volume
mounted there after start-up.) A root whose resolved path lies in a directory that someone
other than the controller's user (or root) can change (world- or group-writable without the
sticky bit, or owned by another user) is refused at start (``ConfigError``): whoever can
rename entries there can swap the root.

Only regular files are read, and only the controller's own: the kind is checked before
opening (``fstatat`` without following), the open uses ``O_NONBLOCK`` so that a FIFO swapped
in meanwhile cannot block it, and the kind is checked again on the open descriptor, with the
owner and the link count: FIFOs, devices, sockets and directories, a file owned by another
user, and a file with more than one hard link (another job's 0600 file linked into a
worker's directory) are refused at once, as ``NotAllowed`` (permanent). Directories for a
job's files are created one ``mkdir`` under the parent's descriptor at a time, and the
caller keeps the final directory's descriptor, so what it writes lands where the policy
checked.

Missing components raise ``FileNotFoundError`` and other OS errors pass through unchanged:
the callers translate them (missing source, transient or permanent failure).
"""


import ctypes
import errno
import functools
import logging
import os
import platform
import posixpath
import stat
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import NamedTuple

from service.core.paths import DataRoots, segments
from service.errors import ConfigError, Refused

_OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_OPEN_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
log = logging.getLogger(__name__)


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


class Directory(NamedTuple):
    """A directory opened by ``LocalFiles.directory``."""

    fd: int
    #: whether this call made it: then it holds nothing but what others put there since
    made: bool


class LocalFiles:
    """Opens a job's local files for reading and its directories for writing, by the policy."""

    def __init__(self, roots: DataRoots | None = None, *, in_one_call: bool = True) -> None:
        """Resolve and check the roots (``resolve_root``): raises ``ConfigError``.

        ``in_one_call``: open a path in one ``openat2`` call where the kernel can; False
        walks it one component at a time (what happens anyway where it cannot).
        """
        self._roots = roots or DataRoots()
        self._real = {root: resolve_root(root) for root in self._roots.roots}
        self._openat2 = kernel_openat2() if in_one_call else None

    def open_regular(self, path: str) -> int:
        """A read-only descriptor of the regular file ``path`` (blocking reads).

        Raises ``NotAllowed`` (policy, symlink, not a regular file, not the controller's own),
        ``FileNotFoundError``, or another ``OSError``.
        """
        root, names = self._locate(path)
        if not names:
            raise NotAllowed(f"{path} is a directory, not a regular file")
        parent, _ = self._open_beneath(root, names[:-1], create=False)
        try:
            return _open_regular(parent, names[-1], path)
        finally:
            os.close(parent)

    @contextmanager
    def directory(self, path: str, *, create: bool) -> Iterator[Directory]:
        """The directory ``path`` opened, creating missing components if ``create``.

        Write beneath its descriptor with ``dir_fd=`` calls: they land in the directory the
        policy checked even if a component is swapped for a symlink afterwards.
        """
        root, names = self._locate(path)
        opened = Directory(*self._open_beneath(root, names, create=create))
        try:
            yield opened
        finally:
            os.close(opened.fd)

    def _locate(self, path: str) -> tuple[str, tuple[str, ...]]:
        """The root to start from and the components below it; ``NotAllowed`` by the
        policy."""
        problem = self._roots.disk_problem(path)
        found = self._roots.locate(path)
        if problem is not None or found is None:
            raise NotAllowed(problem or f"{path} is not under a data root")
        return found

    def _open_beneath(self, root: str, names: tuple[str, ...], *, create: bool) -> tuple[int, bool]:
        """A descriptor of the directory ``names`` beneath ``root``, opened in one call
        where the kernel can, and whether it was made: a missing one is (if ``create``),
        under its parent's descriptor."""
        openat2 = self._openat2
        if openat2 is None:
            return self._walk(root, names, create=create)
        try:
            return openat2(posixpath.join(self._real[root], *names), _OPEN_DIR), False
        except FileNotFoundError:
            if not create:
                raise
            if not names:  # the root itself is missing: made along its path from "/"
                return self._walk(root, names, create=True)
        except OSError:  # a link or a file on the way: the walk says which (or a race ended)
            return self._walk(root, names, create=create)
        parent, _ = self._open_beneath(root, names[:-1], create=True)
        try:
            return _open_step(parent, root, names, create=True, missing=True)
        finally:
            os.close(parent)

    def _walk(self, root: str, names: tuple[str, ...], *, create: bool) -> tuple[int, bool]:
        fd, made = self._open_root(root, create=create)
        steps = (
            functools.partial(_open_step, root=root, names=names[: depth + 1], create=create)
            for depth in range(len(names))
        )
        return _descend(fd, steps, made)

    def _open_root(self, root: str, *, create: bool) -> tuple[int, bool]:
        """A descriptor of the root, reached from "/" along its resolved path without
        following a link (one swapped in since start-up is refused), the missing part of
        that path made first if ``create`` (an output root that does not exist yet)."""
        real = self._real[root]

        def step(parent: int, name: str) -> tuple[int, bool]:
            try:
                return _open_dir(parent, name, create=create)
            except OSError as e:
                if e.errno not in (errno.ENOTDIR, errno.ELOOP):
                    raise
                raise NotAllowed(
                    f"data root {root} ({real} at start-up) is no longer a directory "
                    "there: a root swapped for a link is not followed"
                ) from e

        fd = os.open("/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        return _descend(fd, (functools.partial(step, name=name) for name in segments(real) or ()))


def _descend(
    fd: int, steps: Iterable[Callable[[int], tuple[int, bool]]], made: bool = False
) -> tuple[int, bool]:
    """Open each step's directory under the one before, from ``fd`` on: the last descriptor
    (every other one closed; all of them, ``fd`` too, if a step fails) and whether the last
    step made its directory (``made`` without a step)."""
    try:
        for step in steps:
            inner, made = step(fd)
            os.close(fd)
            fd = inner
    except BaseException:
        os.close(fd)
        raise
    return fd, made


def _open_step(
    parent: int, root: str, names: tuple[str, ...], *, create: bool, missing: bool = False
) -> tuple[int, bool]:
    """The directory ``names[-1]`` in ``parent`` (the directory ``names[:-1]`` beneath
    ``root``), made first if missing and ``create``, and whether it was made; ``NotAllowed``
    if it is no directory. ``missing``: see `_open_dir`."""
    name = names[-1]
    try:
        return _open_dir(parent, name, create=create, missing=missing)
    except OSError as e:
        if e.errno not in (errno.ENOTDIR, errno.ELOOP):
            raise
        mode = os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode
        raise _not_wanted(posixpath.join(root, *names), mode, "a directory") from e


def _open_dir(
    parent: int, name: str, *, create: bool, missing: bool = False
) -> tuple[int, bool]:
    """A descriptor of the directory ``name`` in ``parent`` (never through a symlink),
    made first if missing and ``create``, and whether this call made it. Opened first:
    every round writes into directories that mostly exist already, and a mkdir that fails
    with EEXIST costs as much as one that succeeds; but made first when ``missing`` (with
    ``create``: it was found missing a moment ago, so an open would fail)."""
    if not (missing and create):
        try:
            return os.open(name, _OPEN_DIR, dir_fd=parent), False
        except FileNotFoundError:
            if not create:
                raise
    try:
        os.mkdir(name, dir_fd=parent)
    except FileExistsError:  # another writer made it meanwhile
        made = False
    else:
        made = True
    return os.open(name, _OPEN_DIR, dir_fd=parent), made


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


#: openat2's system call number where it is known (the same on both: 5.6 numbered new calls
#: alike on every architecture but alpha).
_SYS_OPENAT2 = {"x86_64": 437, "aarch64": 437}
_AT_FDCWD = -100
_RESOLVE_NO_SYMLINKS = 0x04


class _OpenHow(ctypes.Structure):
    _fields_ = (("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64))


class Openat2:
    """``openat2(2)`` through libc's ``syscall`` (Python has no wrapper): an absolute path
    opened in one call, following no symbolic link anywhere on it (``RESOLVE_NO_SYMLINKS``:
    a link met on the way fails the call with ``ELOOP``)."""

    def __init__(self, number: int) -> None:
        syscall = ctypes.CDLL(None, use_errno=True).syscall
        syscall.restype = ctypes.c_long
        syscall.argtypes = (
            ctypes.c_long, ctypes.c_int, ctypes.c_char_p, ctypes.POINTER(_OpenHow), ctypes.c_size_t
        )  # fmt: skip
        self._syscall = syscall
        self._number = number

    def __call__(self, path: str, flags: int) -> int:
        """A descriptor of ``path`` opened with ``flags``; an ``OSError`` as ``os.open``'s."""
        how = _OpenHow(flags, 0, _RESOLVE_NO_SYMLINKS)
        fd: int = self._syscall(
            self._number, _AT_FDCWD, os.fsencode(path), ctypes.byref(how), ctypes.sizeof(how)
        )
        if fd < 0:
            code = ctypes.get_errno()
            raise OSError(code, os.strerror(code), path)
        return fd


@functools.cache
def kernel_openat2() -> Openat2 | None:
    """``openat2`` if this kernel (and the seccomp filter around us) lets it open "/"; None,
    said once in the log, where it does not."""
    number = _SYS_OPENAT2.get(platform.machine())
    why = f"no openat2 system call known on {platform.machine()}"
    if number is not None:
        openat2 = Openat2(number)
        try:
            os.close(openat2("/", _OPEN_DIR & ~os.O_NOFOLLOW))
        except OSError as e:
            why = f"openat2 fails here ({e.strerror})"
        else:
            return openat2
    log.info("%s: local paths are walked one component at a time", why)
    return None
