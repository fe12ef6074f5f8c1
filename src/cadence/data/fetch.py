"""Fetch datasets that ship inside packages on the Python package index.

The benchmark graphs UMLS, Kinships and Nations ship inside the ``pykeen==1.11.1`` wheel; we fetch
that wheel with ``pip download --no-deps`` (pykeen itself is never installed), check its sha256, and
extract only the dataset files into the cache ``$CADENCE_HOME/datasets/<name>/`` (default
``~/.cache/cadence``). Extraction goes to a temporary directory renamed into place, so an
interrupted fetch leaves nothing half-written.
"""

from __future__ import annotations

import fcntl
import hashlib
import io
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from cadence.errors import DataError, FetchError


@dataclass(frozen=True)
class WheelSource:
    """Files ``members`` (wheel path -> file name) of one pinned wheel."""

    package: str
    version: str
    sha256: str
    members: dict[str, str]
    # a wheel with compiled code exists per Python and platform: name the one pinned, so every
    # interpreter and machine fetches the same file (we only read data files out of it)
    build: tuple[str, str] | None = None  # (python version "3.11", platform tag)

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


PYKEEN_WHEEL = ("pykeen", "1.11.1", "b6cc0ab012fc6ba4f37b58fb7081a409a5c1f04cbbb0e0e9c2256e911757d4ba")


def pykeen_graph(name: str) -> WheelSource:
    package, version, sha256 = PYKEEN_WHEEL
    members = {f"pykeen/datasets/{name}/{split}.txt": f"{split}.txt" for split in ("train", "valid", "test")}
    return WheelSource(package, version, sha256, members)


def cadence_home() -> Path:
    """The cache of fetched data (``$CADENCE_HOME``, default ``~/.cache/cadence``); an error naming
    it when it exists but is not a directory."""
    home = Path(os.environ.get("CADENCE_HOME", Path.home() / ".cache" / "cadence"))
    if home.exists() and not home.is_dir():
        where = "CADENCE_HOME" if "CADENCE_HOME" in os.environ else "the data cache"
        raise DataError(f"{where} is not a directory", home)
    return home


def dataset_dir(name: str) -> Path:
    return cadence_home() / "datasets" / name


def is_fetched(name: str, source: WheelSource) -> bool:
    directory = dataset_dir(name)
    return all((directory / target).is_file() for target in source.members.values())


def fetch(name: str, source: WheelSource) -> Path:
    """Make ``dataset_dir(name)`` hold the source's files; return that directory."""

    def extract(staging: Path) -> None:
        wheel = _download_wheel(source)
        with zipfile.ZipFile(wheel) as archive:
            for member, filename in source.members.items():
                try:
                    data = archive.read(member)
                except KeyError:
                    raise FetchError(f"{wheel.name} has no file {member}") from None
                (staging / filename).write_bytes(data)

    return publish(name, extract, lambda: is_fetched(name, source))


def publish(name: str, write: Callable[[Path], None], fetched: Callable[[], bool]) -> Path:
    """Fill ``dataset_dir(name)`` all at once, unless ``fetched()`` says it is: ``write`` fills a
    temporary directory beside it, which is then renamed into place, so an interrupted fetch leaves
    nothing half-written. Processes that fetch one dataset at the same time (two runs started on a
    fresh machine) take turns on the dataset's lock file (``$CADENCE_HOME/locks/NAME.lock``, one per
    dataset: a corpus's ``write`` may fetch another dataset): the first writes it, the others find
    it there and write nothing (none deletes a copy another is reading)."""
    target = dataset_dir(name)
    if fetched():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    locks = cadence_home() / "locks"
    locks.mkdir(exist_ok=True)
    lock = os.open(locks / f"{name}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when it is closed
        if fetched():  # another process published it while this one waited
            return target
        staging = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=target.parent))
        try:
            write(staging)
            if target.exists():  # an incomplete copy (a file of it deleted by hand)
                shutil.rmtree(target)
            staging.rename(target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    finally:
        os.close(lock)
    return target


def _download_wheel(source: WheelSource) -> Path:
    downloads = cadence_home() / "downloads"
    downloads.mkdir(parents=True, exist_ok=True)
    pattern = f"{source.package}-{source.version}-*.whl"
    for existing in downloads.glob(pattern):
        if _sha256(existing) == source.sha256:
            return existing
        existing.unlink()
    with tempfile.TemporaryDirectory(dir=downloads) as scratch:
        wheel = _download_via_pip(source, scratch)
        digest = _sha256(wheel)
        if digest != source.sha256:
            raise FetchError(f"{wheel.name}: sha256 {digest} does not match the pinned {source.sha256}")
        final = downloads / wheel.name
        wheel.replace(final)
    return final


def _download_via_pip(source: WheelSource, scratch: str) -> Path:
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--disable-pip-version-check", "-q", "-d", scratch, source.requirement]
    if source.build is not None:
        python, platform = source.build
        command += ["--python-version", python, "--implementation", "cp", "--platform", platform]
    done = subprocess.run(command, capture_output=True, text=True)
    wheels = list(Path(scratch).glob(f"{source.package}-{source.version}-*.whl"))
    if done.returncode != 0 or not wheels:
        detail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise FetchError(f"could not download {source.requirement} from the package index: " + " | ".join(detail))
    return wheels[0]


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


# --- Debian packages (apt-get download, unpacked in Python, never installed) -----------------------

@dataclass(frozen=True)
class DebianPackage:
    name: str
    version: str
    sha256: str
    member: str = ""  # the one file wanted from data.tar.* (``debian_member``), if any
    arch: str = "all"  # a package of compiled code is per architecture (``amd64``)
    source: str = ""  # the source package it is built from, where a mirror keeps it ("": its own name)

    @property
    def filename(self) -> str:
        """The file's name in the archive: the version without its epoch (``1:3.0-37`` -> ``3.0-37``)."""
        return f"{self.name}_{self.version.partition(':')[2] or self.version}_{self.arch}.deb"

    @property
    def pool(self) -> str:
        """Where a Debian mirror keeps it: ``pool/main/<l>/<source>/``, ``<l>`` the source's first
        letter (its first four for a ``lib*`` source)."""
        source = self.source or self.name
        return f"pool/main/{source[:4] if source.startswith('lib') else source[0]}/{source}/"


def debian_member(package: DebianPackage) -> bytes:
    """The bytes of ``package.member``, from the checked ``.deb`` (downloaded if not cached)."""
    return debian_members(package, [package.member])[package.member]


def debian_members(package: DebianPackage, wanted: list[str]) -> dict[str, bytes]:
    """{path: bytes} of the files ``wanted`` (paths in the package, no leading ``./``), read from
    the checked ``.deb`` (an ``ar`` archive whose ``data.tar.*`` holds the files) in one pass."""
    deb = _debian_package(package)
    members = dict(_ar_members(deb.read_bytes(), deb))
    data = next((body for name, body in members.items() if name.startswith("data.tar")), None)
    if data is None:
        raise FetchError(f"{deb}: no data.tar.* member in this Debian package")
    found: dict[str, bytes] = {}
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as archive:
        for info in archive:
            name = info.name.removeprefix("./")
            if name in wanted:
                found[name] = archive.extractfile(info).read()
    missing = [name for name in wanted if name not in found]
    if missing:
        raise FetchError(f"{deb}: the package has no file {missing[0]}")
    return found


def _debian_package(package: DebianPackage) -> Path:
    downloads = cadence_home() / "downloads"
    downloads.mkdir(parents=True, exist_ok=True)
    placed = sorted(downloads.glob(f"{package.name}_*.deb"))
    for existing in placed:
        if _sha256(existing) == package.sha256:
            return existing
    with tempfile.TemporaryDirectory(dir=downloads) as scratch:
        requirement = f"{package.name}={package.version}"
        try:
            done = subprocess.run(["apt-get", "download", "-q", requirement], cwd=scratch,
                                  capture_output=True, text=True)
            failure = None if done.returncode == 0 else (done.stderr or done.stdout).strip().splitlines()[-1:]
        except OSError as err:
            failure = [f"apt-get is not available ({err.strerror})"]
        debs = list(Path(scratch).glob(f"{package.name}_*.deb"))
        if failure is not None or not debs:
            mismatched = f"; {', '.join(p.name for p in placed)} there do(es) not match it" if placed else ""
            raise FetchError(
                f"could not download the Debian package {requirement} with `apt-get download` "
                f"({' '.join(failure or ['no .deb written'])}). Download {package.filename} from any Debian "
                f"mirror ({package.pool}) and place it at {downloads / package.filename}; "
                f"it must have sha256 {package.sha256}{mismatched}")
        digest = _sha256(debs[0])
        if digest != package.sha256:
            raise FetchError(f"{debs[0].name}: sha256 {digest} does not match the pinned {package.sha256}")
        final = downloads / package.filename
        debs[0].replace(final)
    return final


def _ar_members(data: bytes, path: Path) -> Iterator[tuple[str, bytes]]:
    """(name, body) of each member of an ``ar`` archive (a ``.deb``): a magic line, then per member
    a 60-byte header (name 0:16, decimal size 48:58) and the body, padded to an even offset."""
    if not data.startswith(b"!<arch>\n"):
        raise FetchError(f"{path}: not a Debian package (no ar archive header)")
    offset = 8
    while offset + 60 <= len(data):
        header = data[offset:offset + 60]
        name, size = header[:16].decode("ascii").strip().rstrip("/"), int(header[48:58])
        yield name, data[offset + 60:offset + 60 + size]
        offset += 60 + size + (size & 1)
