"""Fetch datasets that ship inside packages on the Python package index.

The benchmark graphs UMLS, Kinships and Nations ship inside the ``pykeen==1.11.1`` wheel; we fetch
that wheel with ``pip download --no-deps`` (pykeen itself is never installed), check its sha256, and
extract only the dataset files into the cache ``$CADENCE_HOME/datasets/<name>/`` (default
``~/.cache/cadence``). Extraction goes to a temporary directory renamed into place, so an
interrupted fetch leaves nothing half-written.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

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
    target = dataset_dir(name)
    if is_fetched(name, source):
        return target
    wheel = _download_wheel(source)

    def extract(staging: Path) -> None:
        with zipfile.ZipFile(wheel) as archive:
            for member, filename in source.members.items():
                try:
                    data = archive.read(member)
                except KeyError:
                    raise FetchError(f"{wheel.name} has no file {member}") from None
                (staging / filename).write_bytes(data)

    return publish(name, extract)


def publish(name: str, write: Callable[[Path], None]) -> Path:
    """Fill ``dataset_dir(name)`` all at once: ``write`` fills a temporary directory beside it, which
    is then renamed into place, so an interrupted fetch leaves nothing half-written."""
    target = dataset_dir(name)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=target.parent))
    try:
        write(staging)
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
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
