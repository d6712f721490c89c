"""Where dataset files come from: known datasets, local lookup, verified download.

An IDX dataset (MNIST, Fashion-MNIST) is four IDX files, each raw or .gz; their checksums
are of the decompressed content. Every dataset is found by :func:`locate_files` and
fetched by :func:`download_file`."""

from __future__ import annotations

import hashlib
import os
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from http.client import HTTPException
from pathlib import Path
from typing import Any

from capsnet.atomic import atomic_path
from capsnet.data.idx import GZIP_ERRORS, GZIP_MAGIC, GZIP_SUFFIX, IDXError, open_maybe_gzip

FILE_KEYS = ("train_images", "train_labels", "test_images", "test_labels")
# The four IDX files' names (without .gz), in FILE_KEYS order, alike for every IDX dataset.
IDX_FILE_NAMES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                  "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")
DIGITS = tuple(str(digit) for digit in range(10))  # the classes of digit datasets
DATA_DIR_ENV = "CAPSNET_DATA_DIR"
CACHE_DIR_ENV = "CAPSNET_CACHE_DIR"
XDG_CACHE_ENV = "XDG_CACHE_HOME"
CACHE_SUBDIR = "capsnet"
CHUNK_BYTES = 1 << 20
DOWNLOAD_TIMEOUT_S = 30
MAX_DOWNLOAD_BYTES = 1 << 30  # the largest file, SVHN's train_32x32.mat, is about 182 MB


@dataclass(frozen=True)
class RemoteFile:
    """A file to download: name on disk, URLs tried in order, MD5 as stored (None: unchecked)."""

    name: str
    urls: tuple[str, ...]
    md5: str | None


@dataclass(frozen=True)
class DatasetSpec:
    """Four IDX files: ``files`` maps FILE_KEYS to (name without .gz, decompressed MD5 or
    None); each is fetched from ``<mirror>/<name>.gz``, mirrors in order."""

    name: str
    files: Mapping[str, tuple[str, str | None]]
    mirrors: tuple[str, ...]
    system_dirs: tuple[str, ...]
    classes: tuple[str, ...]

    def file_names(self) -> list[str]:
        """The four file names (without .gz), in FILE_KEYS order."""
        return [self.files[key][0] for key in FILE_KEYS]


def idx_files(*md5s: str) -> dict[str, tuple[str, str]]:
    """FILE_KEYS -> (IDX file name, MD5 of its decompressed content), MD5s in that order."""
    return dict(zip(FILE_KEYS, zip(IDX_FILE_NAMES, md5s, strict=True), strict=True))


DATASETS: dict[str, DatasetSpec] = {
    "mnist": DatasetSpec(
        name="mnist",
        files=idx_files("6bbc9ace898e44ae57da46a324031adb", "a25bea736e30d166cdddb491f175f624",
                        "2646ac647ad5339dbf082846283269ea", "27ae3e4e09519cfbb04c329615203637"),
        mirrors=(
            "https://ossci-datasets.s3.amazonaws.com/mnist",
            "https://storage.googleapis.com/cvdf-datasets/mnist",
        ),
        system_dirs=(),
        classes=DIGITS,
    ),
    "fashion-mnist": DatasetSpec(
        name="fashion-mnist",
        files=idx_files("f4a8712d7a061bf5bd6d2ca38dc4d50a", "9018921c3c673c538a1fc5bad174d6f9",
                        "8181f5470baa50b63fa0f6fddb340f0a", "15d484375f8d13e6eb1aabb0c3f46965"),
        mirrors=("http://fashion-mnist.s3-website.eu-central-1.amazonaws.com",),
        system_dirs=("/usr/share/datasets/fashion-mnist",),  # Debian: dataset-fashion-mnist
        classes=("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                 "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"),
    ),
}


class DataNotFoundError(RuntimeError):
    """The dataset files are in none of the places looked at and could not be downloaded."""


class ChecksumError(ValueError):
    """A file's content does not have the expected MD5."""


def get_spec(name_or_spec: str | DatasetSpec) -> DatasetSpec:
    """The DatasetSpec for a known name (case-insensitive), or the spec itself."""
    if isinstance(name_or_spec, DatasetSpec):
        return name_or_spec
    spec = DATASETS.get(name_or_spec.lower())
    if spec is None:
        raise ValueError(f"unknown dataset {name_or_spec!r}; known: {', '.join(sorted(DATASETS))}")
    return spec


def default_cache_dir() -> Path:
    """``$CAPSNET_CACHE_DIR``, else ``$XDG_CACHE_HOME/capsnet``, else ``~/.cache/capsnet``."""
    if os.environ.get(CACHE_DIR_ENV):
        return Path(os.environ[CACHE_DIR_ENV]).expanduser()
    if os.environ.get(XDG_CACHE_ENV):
        return Path(os.environ[XDG_CACHE_ENV]).expanduser() / CACHE_SUBDIR
    return Path.home() / ".cache" / CACHE_SUBDIR


def file_md5(path: str | os.PathLike, decompress: bool = True) -> str:
    """Hex MD5 of :func:`file_digest`."""
    return file_digest(path, "md5", decompress)


def file_digest(path: str | os.PathLike, algorithm: str, decompress: bool = True) -> str:
    """Hex ``hashlib`` digest of the content, read in chunks (decompressed if gzip, unless
    ``decompress=False``); IDXError when the file is missing or its gzip stream corrupt."""
    digest = hashlib.new(algorithm)
    with open_maybe_gzip(path, decompress) as f:
        try:
            for chunk in iter(lambda: f.read(CHUNK_BYTES), b""):
                digest.update(chunk)
        except GZIP_ERRORS as err:
            raise IDXError(path, f"corrupt gzip data: {err}") from err
    return digest.hexdigest()


def verify_file(path: str | os.PathLike, expected_md5: str | None,
                decompress: bool = True) -> None:
    """Raise ChecksumError unless the MD5 (see file_md5) is ``expected_md5`` (None: no check)."""
    if expected_md5 is None:
        return
    actual = file_md5(path, decompress=decompress)
    if actual != expected_md5:
        content = "the decompressed content" if decompress else "the file"
        raise ChecksumError(f"{os.fspath(path)}: checksum mismatch: md5 of {content} "
                            f"is {actual}, expected {expected_md5}")


def find_files(directory: Path, spec: DatasetSpec) -> dict[str, Path] | None:
    """The four files in ``directory`` (raw preferred over .gz), or None unless all are there
    and the test labels are not another known dataset's (MNIST and Fashion-MNIST share file
    names; files of unknown content are accepted)."""
    found = {}
    for key, (file_name, _) in spec.files.items():
        raw, packed = directory / file_name, directory / (file_name + GZIP_SUFFIX)
        path = raw if raw.is_file() else packed if packed.is_file() else None
        if path is None:
            return None
        found[key] = path
    try:
        md5 = file_md5(found["test_labels"])
    except IDXError:
        return found  # a damaged file: reading it reports the error with its name
    others = [other for other in DATASETS.values() if other.name != spec.name]
    return None if any(other.files["test_labels"][1] == md5 for other in others) else found


def not_found_message(name: str, needed: str, searched: list[Path], download_note: str) -> str:
    """One line: which files, where they were looked for, where to put them, the download."""
    return (f"dataset {name!r} not found: need {needed} in one directory; "
            f"looked in: {', '.join(map(str, searched))}; "
            f"put them in a directory given by --data-dir DIR or the environment variable "
            f"{DATA_DIR_ENV}, or in the cache dir {default_cache_dir() / name}; {download_note}")


def locate_files(name: str, find: Callable[[Path], Any], fetch: Callable[[Path], Any],
                 needed: str, data_dir: str | os.PathLike | None = None, download: bool = True,
                 system_dirs: Sequence[str] = ()) -> Any:
    """The first non-None ``find(directory)`` over data_dir and $CAPSNET_DATA_DIR (each also
    with ``/<name>``), the cache and ``system_dirs``, else (with ``download``) ``fetch(cache
    dir / name)``; DataNotFoundError naming ``needed`` when both fail."""
    searched = []
    for base in (data_dir, os.environ.get(DATA_DIR_ENV) or None):
        if base is not None:
            searched += [Path(base).expanduser(), Path(base).expanduser() / name]
    searched += [default_cache_dir() / name, *map(Path, system_dirs)]
    for directory in searched:
        found = find(directory)
        if found is not None:
            return found
    if not download:
        raise DataNotFoundError(not_found_message(name, needed, searched, "download disabled"))
    try:
        return fetch(default_cache_dir() / name)
    except (DataNotFoundError, OSError) as err:
        note = f"download attempted and failed: {err}"
        raise DataNotFoundError(not_found_message(name, needed, searched, note)) from err


def locate_dataset(name: str | DatasetSpec, data_dir: str | os.PathLike | None = None,
                   download: bool = True) -> dict[str, Path]:
    """Paths of the four files by FILE_KEYS, from one directory; downloads when missing."""
    spec = get_spec(name)
    return locate_files(spec.name, lambda directory: find_files(directory, spec),
                        lambda dest: download_dataset(spec, dest),
                        needed=f"the four files {', '.join(spec.file_names())} (each raw or .gz)",
                        data_dir=data_dir, download=download, system_dirs=spec.system_dirs)


def _fetch(url: str, dest: Path) -> None:
    """Stream ``url`` into the file ``dest``, at most MAX_DOWNLOAD_BYTES."""
    with (urllib.request.urlopen(url, timeout=DOWNLOAD_TIMEOUT_S) as response,
          open(dest, "wb") as out):
        total = response.headers.get("Content-Length")
        total = int(total) if total and total.isdigit() else None
        received = 0
        for chunk in iter(lambda: response.read(CHUNK_BYTES), b""):
            received += len(chunk)
            if received > MAX_DOWNLOAD_BYTES:
                raise ValueError(f"more than {MAX_DOWNLOAD_BYTES} bytes")
            out.write(chunk)
        if total is not None and received != total:
            raise ValueError(f"incomplete download: {received} of {total} bytes")


def download_file(remote: RemoteFile, dest_dir: str | os.PathLike,
                  check: Callable[[Path], None] | None = None) -> Path:
    """``<dest_dir>/<remote.name>``, kept when it passes the MD5 and ``check``, else fetched from
    the first URL whose content passes them; DataNotFoundError listing each URL's error."""
    target = Path(dest_dir) / remote.name

    def verified(path: Path) -> None:
        verify_file(path, remote.md5, decompress=False)
        if check is not None:
            check(path)

    if target.is_file() and (remote.md5 is not None or check is not None):
        try:
            verified(target)
            return target
        except (ValueError, OSError):
            pass
    errors = []
    for url in remote.urls:  # each into a temporary file, renamed into place once verified
        try:
            with atomic_path(target) as tmp:
                _fetch(url, tmp)
                verified(tmp)
            return target
        except (OSError, HTTPException, ValueError) as err:  # URLError, timeouts, checks
            errors.append(f"{url}: {err}")
    tried = "; ".join(errors) or "no mirrors"
    raise DataNotFoundError(f"could not download {target.name}: {tried}")


def _check_gzip(path: Path, expected_md5: str | None) -> None:
    """Raise ValueError unless ``path`` is a complete gzip stream with the expected content."""
    with open(path, "rb") as f:
        if f.read(len(GZIP_MAGIC)) != GZIP_MAGIC:
            raise ValueError("not a gzip file")
    file_md5(path)  # decompresses it all: a truncated or corrupt stream raises IDXError
    verify_file(path, expected_md5)


def download_dataset(name_or_spec: str | DatasetSpec, dest_dir: str | os.PathLike
                     ) -> dict[str, Path]:
    """The four files as ``<dest_dir>/<file>.gz``, each from the first mirror that verifies."""
    spec = get_spec(name_or_spec)
    Path(dest_dir).mkdir(parents=True, exist_ok=True)
    paths = {}
    for key, (file_name, md5) in spec.files.items():
        urls = tuple(f"{base.rstrip('/')}/{file_name}{GZIP_SUFFIX}" for base in spec.mirrors)
        paths[key] = download_file(RemoteFile(file_name + GZIP_SUFFIX, urls, None), dest_dir,
                                   lambda path, md5=md5: _check_gzip(path, md5))
    return paths
