"""What this machine can hold: the memory a process may still take and the threads it may start,
so a setting whose size is known before anything is allocated (a table, a decompressed file, a
thread count) is refused with one line naming it and what it would need, instead of an
out-of-memory kill or a thread-creation error halfway through a run."""

from __future__ import annotations

import atexit
import ctypes
import functools
import gc
import logging
import os
import resource
import shutil
from pathlib import Path
from typing import Callable

from cadence.errors import ConfigError

log = logging.getLogger(__name__)
MEMORY_CGROUP = Path("/sys/fs/cgroup/memory")
# threads a run may start, whatever the system allows: far past any useful count on one machine
MAX_THREADS = 4096


def available_memory() -> int:
    """Bytes this process may still take: the system's available memory (``MemAvailable``), or less
    where a memory cgroup (v1) caps this process's group."""
    available = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                available = int(line.split()[1]) * 1024
    except OSError:
        pass
    if available is None:
        available = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
    capped = _cgroup_room()
    return min(available, capped) if capped is not None else available


def page_cache_room() -> int:
    """Bytes the page cache of this process's files may hold at most (a table on disk is read from
    memory only if it fits here): its memory cgroup's (v1) limit less the anonymous memory charged to
    the group (heaps: this process's and its group's), else what the system has available
    (``MemAvailable``, which counts the page cache as available)."""
    limit = _cgroup_limit()
    if limit is None:
        return available_memory()
    try:
        stat = dict(line.split() for line in (_memory_group() / "memory.stat").read_text().splitlines())  # type: ignore[operator]
        anonymous = int(stat.get("total_rss", stat.get("rss", 0)))
    except (OSError, ValueError):
        anonymous = 0
    return max(0, limit - anonymous)


def _cgroup_limit() -> int | None:
    group = _memory_group()
    if group is None:
        return None
    try:
        limit = int((group / "memory.limit_in_bytes").read_text())
    except (OSError, ValueError):
        return None
    return limit if limit < 1 << 60 else None


def _memory_group() -> Path | None:
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            parts = line.split(":", 2)
            if len(parts) == 3 and "memory" in parts[1].split(","):
                return MEMORY_CGROUP / parts[2].lstrip("/")
    except OSError:
        pass
    return None


def _cgroup_room() -> int | None:
    limit = _cgroup_limit()
    if limit is None:
        return None
    try:
        usage = int((_memory_group() / "memory.usage_in_bytes").read_text())  # type: ignore[operator]
    except (OSError, ValueError):
        return None
    return max(0, limit - usage)


M_ARENA_MAX = -8  # glibc's mallopt parameter: the most malloc arenas the process's threads share


@functools.lru_cache(maxsize=1)
def _glibc() -> ctypes.CDLL | None:
    """The C library's allocator controls (``mallopt``, ``malloc_trim``), or None where it is not glibc."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return None
    return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None


def limit_allocator_arenas(count: int) -> bool:
    """Let this process's threads share at most ``count`` glibc malloc arenas from now on (0: leave
    glibc's default, 8 per core). Each arena keeps what was freed in it for reuse and gives back only
    its top, so threads that allocate and free blocks of varying size (a pipeline's loaders and
    writers: a batch's rows) each hold a high-water mark that only grows; fewer arenas, one heap that
    reuses its holes. False where the C library is not glibc (nothing changed)."""
    libc = _glibc()
    return count > 0 and libc is not None and bool(libc.mallopt(M_ARENA_MAX, count))


def release_memory() -> None:
    """Give what was freed back to the system (before the next strategy trial, or the run, starts):
    the allocator keeps freed blocks of many threads' arenas otherwise, and a run under a memory cap
    would count them (glibc's ``malloc_trim``; elsewhere a collection only)."""
    gc.collect()
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)


# what a process started and must stop before it ends (a Ray instance ``ray.init`` started: its
# agents outlive a process that exits without stopping it), with the process that started it (a
# forked child inherits the list, never what is on it); run by ``atexit``, or by ``end_process``
_AT_END: list[tuple[int, Callable[[], None]]] = []
# files such a thing left that only a scratch process's end removes (a Ray instance's session
# directory: after a run, its logs; after a trial of ``strategy: auto``, nobody's)
_LEFT: list[tuple[int, Path, str]] = []


def stop_at_exit(stop: Callable[[], None]) -> None:
    """Run ``stop`` when this process ends: at its exit, or at ``end_process`` (once)."""
    if (os.getpid(), stop) not in _AT_END:
        _AT_END.append((os.getpid(), stop))


def left_at_exit(directory: Path, pattern: str) -> None:
    """What ``pattern`` matches in ``directory`` (what a thing ``stop_at_exit`` stops leaves) goes
    at ``end_process(scratch=True)``."""
    _LEFT.append((os.getpid(), directory, pattern))


def end_process(scratch: bool = False) -> None:
    """Run what this process registered with ``stop_at_exit``, newest first, each once: where a
    process ends without ``atexit`` (a forked child leaves by ``os._exit``: a trial of
    ``strategy: auto``). What its parent registered stays the parent's. ``scratch``: the process's
    work is thrown away (a trial): what ``left_at_exit`` named goes too."""
    mine = [stop for pid, stop in _AT_END if pid == os.getpid()]
    _AT_END[:] = [(pid, stop) for pid, stop in _AT_END if pid != os.getpid()]
    for stop in reversed(mine):
        try:
            stop()
        except Exception as err:  # (a process on its way out: one line, never in the way of the rest)
            log.warning("stopping %s at exit: %s", getattr(stop, "__qualname__", stop), err)
    left = [(directory, pattern) for pid, directory, pattern in _LEFT if pid == os.getpid()]
    _LEFT[:] = [entry for entry in _LEFT if entry[0] != os.getpid()]
    for directory, pattern in left if scratch else []:
        for path in directory.glob(pattern):
            shutil.rmtree(path, ignore_errors=True)


atexit.register(end_process)  # (this process's own registrations only, each once)


def processes_marked(name: str, value: str) -> list[int]:
    """The processes (this user's, readable in /proc) whose environment has ``name=value``: what a
    process that set it started, whoever their parent is now (an orphan included); none without /proc."""
    mark, found = f"{name}={value}".encode(), []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if mark in (proc / "environ").read_bytes().split(b"\0"):
                found.append(int(proc.name))
        except (OSError, ValueError):
            continue
    return found


def gib(size: int | float) -> str:
    return f"{size / 2**30:,.1f} GiB" if size >= 2**30 else f"{size / 2**20:,.0f} MiB"


def check_memory(what: str, needed: int) -> None:
    """A ``ConfigError`` naming ``what`` when ``needed`` bytes are more than this process may take."""
    room = available_memory()
    if needed > room:
        raise ConfigError(f"{what} needs {gib(needed)}; this machine has {gib(room)} available")


def thread_limit() -> int:
    """Threads a run may start: ``MAX_THREADS``, or fewer where the system's limits are lower (the
    kernel's ``threads-max``, this user's process limit)."""
    limits = [MAX_THREADS]
    try:
        limits.append(int(Path("/proc/sys/kernel/threads-max").read_text()) // 2)
    except (OSError, ValueError):
        pass
    soft, _ = resource.getrlimit(resource.RLIMIT_NPROC)
    if soft != resource.RLIM_INFINITY:
        limits.append(max(1, soft // 2))
    return max(1, min(limits))


def check_threads(key: str, count: int) -> None:
    """A ``ConfigError`` naming ``key`` when ``count`` threads are past ``thread_limit()``."""
    limit = thread_limit()
    if count > limit:
        raise ConfigError(f"{key}: {count:,} threads; a run may start at most {limit:,} here")
