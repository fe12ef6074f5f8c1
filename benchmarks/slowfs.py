#!/usr/bin/env python
"""Storage whose reads really take time (issue 26, part 8): a FUSE filesystem that passes every
operation through to a backing directory and serves each read request after ``--latency-ms``
(requests overlap, as on a device with a queue) plus its size over ``--mib-per-s`` (one shared
transfer budget: requests queue for it). A read of a hole (a never-written range of a sparse file:
a store's fresh table) is answered at once, as a filesystem does without the device; a read that
continues the same handle's previous one (a sequential scan: a checkpoint's copy of the table)
streams, paying the bandwidth but no latency of its own, as a disk's sequential reads do. Writes pass
through at once (the kernel writes dirty pages
back behind the writer; a device's write latency is not what the out-of-core pipeline hides).

It is the slow device, not code under test: the latency lives in this separate process, which the
kernel asks for each page that a process under test faults in (``max_readahead=0``, no
``direct_io``: memory-mapped files work, through the page cache, charged to the faulting process's
memory cgroup). The measured service time per request is written to ``--stats`` at unmount.

Parts, fetched once into ``$CADENCE_HOME/tools`` and checked against pinned sha256s: libfuse 2.9.9
from Debian's ``libfuse2`` package (``apt-get download``, unpacked, never installed) and fusepy
3.0.1's ``fuse.py`` (``pip download --no-deps``: the sdist, never installed). Needs root and
``/dev/fuse``.

    sudo .venv/bin/python benchmarks/slowfs.py BACKING MOUNTPOINT --latency-ms 1 [--mib-per-s 200]

serves until unmounted (``umount MOUNTPOINT``) or signalled; ``SlowMount`` does both from Python.
"""

from __future__ import annotations

import argparse
import errno
import hashlib
import json
import os
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from pathlib import Path

from cadence.data.fetch import DebianPackage, cadence_home, debian_members

LIBFUSE = DebianPackage("libfuse2", "2.9.9-6+b1", "df32b8f65d819f854e096896890d6ad632b6e520977bb120bb3143b4c66e2fcd",
                        arch="amd64")
LIBFUSE_MEMBER = "lib/x86_64-linux-gnu/libfuse.so.2.9.9"
FUSEPY = ("fusepy", "3.0.1", "72ff783ec2f43de3ab394e3f7457605bf04c8cf288a2f4068b4cde141d4ee6bd")


def usable() -> str | None:
    """Why a slow mount cannot be made here, or None."""
    if os.geteuid() != 0:
        return "needs root (mounting a FUSE filesystem)"
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse"
    return None


def tools() -> Path:
    """The directory holding ``libfuse.so.2`` and ``fuse.py`` (fetched and checked on first use)."""
    where = cadence_home() / "tools" / "slowfs"
    library, module = where / "libfuse.so.2", where / "fuse.py"
    if library.is_file() and module.is_file():
        return where
    where.mkdir(parents=True, exist_ok=True)
    if not library.is_file():
        body = debian_members(LIBFUSE, [LIBFUSE_MEMBER])[LIBFUSE_MEMBER]
        _publish(library, body)
    if not module.is_file():
        _publish(module, _fusepy_module())
    return where


def _publish(path: Path, body: bytes) -> None:
    staged = path.with_name(path.name + ".part")
    staged.write_bytes(body)
    staged.replace(path)


def _fusepy_module() -> bytes:
    name, version, sha256 = FUSEPY
    with tempfile.TemporaryDirectory() as scratch:
        done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary=:all:",
                               "--disable-pip-version-check", "-q", "-d", scratch, f"{name}=={version}"],
                              capture_output=True, text=True)
        found = list(Path(scratch).glob(f"{name}-{version}.tar.gz"))
        if done.returncode != 0 or not found:
            raise SystemExit(f"slowfs: could not download {name}=={version}: {(done.stderr or done.stdout)[-500:]}")
        digest = hashlib.sha256(found[0].read_bytes()).hexdigest()
        if digest != sha256:
            raise SystemExit(f"slowfs: {found[0].name}: sha256 {digest} does not match the pinned {sha256}")
        with tarfile.open(found[0]) as archive:
            return archive.extractfile(f"{name}-{version}/fuse.py").read()


# ---- the server (its own process) ---------------------------------------------------------------------
def serve(backing: str, mount: str, latency_s: float, mib_per_s: float, stats_path: str | None) -> None:
    where = tools()
    os.environ["FUSE_LIBRARY_PATH"] = str(where / "libfuse.so.2")
    sys.path.insert(0, str(where))
    from fuse import FUSE, FuseOSError, Operations  # noqa: E402  (fetched above; no installed package)

    root = os.path.realpath(backing)
    budget = threading.Lock()
    transfer = {"free_at": 0.0}  # when the shared transfer budget is next free
    served = {"reads": 0, "bytes": 0, "random_service_seconds": 0.0, "writes": 0, "written_bytes": 0, "hole_reads": 0,
              "streamed_reads": 0}
    counting = threading.Lock()
    ends: dict[int, int] = {}  # per file handle: where its last read ended

    def full(path: str) -> str:
        return os.path.join(root, path.lstrip("/"))

    class Slow(Operations):
        def __call__(self, op, path, *args):
            try:
                return super().__call__(op, full(path), *args)
            except OSError as err:
                raise FuseOSError(err.errno or errno.EIO) from None

        def getattr(self, path, fh=None):
            st = os.lstat(path)
            return {key: getattr(st, key) for key in ("st_atime", "st_ctime", "st_gid", "st_mode", "st_mtime",
                                                       "st_nlink", "st_size", "st_uid", "st_blocks")}

        def readdir(self, path, fh):
            return [".", "..", *os.listdir(path)]

        def statfs(self, path):
            st = os.statvfs(path)
            return {key: getattr(st, key) for key in ("f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail",
                                                       "f_ffree", "f_files", "f_flag", "f_frsize", "f_namemax")}

        def access(self, path, mode):
            if not os.access(path, mode):
                raise FuseOSError(errno.EACCES)

        def chmod(self, path, mode):
            os.chmod(path, mode)

        def chown(self, path, uid, gid):
            os.chown(path, uid, gid)

        def utimens(self, path, times=None):
            os.utime(path, times)

        def mkdir(self, path, mode):
            os.mkdir(path, mode)

        def rmdir(self, path):
            os.rmdir(path)

        def unlink(self, path):
            os.unlink(path)

        def rename(self, old, new):
            os.rename(old, full(new))

        def open(self, path, flags):
            return os.open(path, flags)

        def create(self, path, mode, fi=None):
            return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)

        def read(self, path, size, offset, fh):
            began = time.perf_counter()
            data = os.pread(fh, size, offset)
            if _hole(fh, offset, size):  # never written: a filesystem answers zeros without the device
                with counting:
                    served["hole_reads"] += 1
                return data
            with counting:  # a read continuing the handle's last one streams: no access of its own
                streaming, ends[fh] = ends.get(fh) == offset, offset + len(data)
            if mib_per_s > 0:
                with budget:  # the transfer queues for the device's bandwidth
                    start = max(began, transfer["free_at"])
                    transfer["free_at"] = start + len(data) / (mib_per_s * 2 ** 20)
                    done_at = transfer["free_at"]
            else:
                done_at = began
            if not streaming:
                done_at = max(done_at, began + latency_s)  # the request's latency overlaps other requests'
            pause = done_at - time.perf_counter()
            if pause > 0:
                time.sleep(pause)
            with counting:
                served["reads"] += 1
                served["bytes"] += len(data)
                served["streamed_reads"] += streaming
                if not streaming:
                    served["random_service_seconds"] += time.perf_counter() - began
            return data

        def write(self, path, data, offset, fh):
            with counting:
                served["writes"] += 1
                served["written_bytes"] += len(data)
            return os.pwrite(fh, data, offset)

        def truncate(self, path, length, fh=None):
            if fh is not None:
                os.ftruncate(fh, length)
            else:
                os.truncate(path, length)

        def flush(self, path, fh):
            return 0

        def fsync(self, path, datasync, fh):
            (os.fdatasync if datasync else os.fsync)(fh)

        def release(self, path, fh):
            os.close(fh)

        def destroy(self, path):
            if stats_path:
                randoms = served["reads"] - served["streamed_reads"]
                Path(stats_path).write_text(json.dumps({
                    **served, "mean_random_read_ms": 1000 * served["random_service_seconds"] / randoms if randoms else None,
                    "latency_ms": latency_s * 1000, "mib_per_s": mib_per_s}))

    FUSE(Slow(), mount, foreground=True, nothreads=False, allow_other=True, max_readahead=0, big_writes=True)


def _hole(fd: int, offset: int, size: int) -> bool:
    """Whether ``[offset, offset + size)`` of the backing file is a hole (no data written there)."""
    try:
        return os.lseek(fd, offset, os.SEEK_DATA) >= offset + size
    except OSError as err:  # ENXIO: no data at or after offset
        return err.errno == errno.ENXIO


# ---- the client side: a mount for the duration of a with-block ----------------------------------------
class SlowMount:
    """``with SlowMount(backing, mount, latency_ms, mib_per_s) as m:`` files under ``mount`` are
    ``backing``'s, read with the latency; ``m.stats()`` after the block: what the server served."""

    def __init__(self, backing: Path, mount: Path, latency_ms: float, mib_per_s: float = 0.0):
        self.backing, self.mount = Path(backing), Path(mount)
        self.latency_ms, self.mib_per_s = latency_ms, mib_per_s
        self.stats_file = Path(tempfile.mkstemp(prefix="slowfs-", suffix=".json")[1])
        self.process: subprocess.Popen | None = None

    def __enter__(self) -> "SlowMount":
        tools()  # fetched here, so a failure is this process's, with its message
        self.backing.mkdir(parents=True, exist_ok=True)
        self.mount.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(
            [sys.executable, __file__, str(self.backing), str(self.mount), "--latency-ms", str(self.latency_ms),
             "--mib-per-s", str(self.mib_per_s), "--stats", str(self.stats_file)],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
        deadline = time.monotonic() + 20
        while not self.mounted():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self._stop()
                raise SystemExit(f"slowfs: the mount at {self.mount} did not come up: "
                                 f"{self.process.stderr.read().decode()[-800:]}")
            time.sleep(0.05)
        return self

    def mounted(self) -> bool:
        target = os.path.realpath(self.mount)
        return any(line.split()[1] == target for line in Path("/proc/mounts").read_text().splitlines())

    def __exit__(self, *exc) -> None:
        self._stop()

    def _stop(self) -> None:
        if self.mounted():
            subprocess.run(["umount", str(self.mount)], capture_output=True)
        if self.process is not None:
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.send_signal(signal.SIGKILL)
                self.process.wait()
                subprocess.run(["umount", "-l", str(self.mount)], capture_output=True)

    def stats(self) -> dict:
        try:
            return json.loads(self.stats_file.read_text() or "{}")
        finally:
            self.stats_file.unlink(missing_ok=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("backing")
    parser.add_argument("mount")
    parser.add_argument("--latency-ms", type=float, default=1.0, help="per read request (default 1)")
    parser.add_argument("--mib-per-s", type=float, default=0.0, help="shared read bandwidth (0: unlimited)")
    parser.add_argument("--stats", help="where to write what was served, at unmount")
    args = parser.parse_args()
    why = usable()
    if why is not None:
        raise SystemExit(f"slowfs: {why}")
    serve(args.backing, args.mount, args.latency_ms / 1000, args.mib_per_s, args.stats)


if __name__ == "__main__":
    main()
