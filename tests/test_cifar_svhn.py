"""CIFAR-10 binary batches and SVHN .mat files: reading, validation, lookup, loopback download."""

import hashlib
import io
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch

import capsnet.data.datasets as datasets
from capsnet.data import (
    ChecksumError,
    DataNotFoundError,
    DatasetFileError,
    load_cifar10,
    load_dataset,
    load_split,
    load_svhn,
)
from capsnet.data.sources import RemoteFile

scipy_io = pytest.importorskip("scipy.io")

pytestmark = pytest.mark.usefixtures("loopback_only")  # own cache, no data dir, no proxy

RECORDS_PER_BATCH = 3
SVHN_SIZES = {"train": 5, "test": 4}
NUM_CLASSES = 10
EVIL = b"evil"


def md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


# ---- CIFAR-10 -------------------------------------------------------------------------

def cifar_records(n: int, seed: int) -> tuple[np.ndarray, np.ndarray, bytes]:
    """n random records: images (n, 3, 32, 32), labels (n,), and their bytes on disk."""
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, (n, 3, 32, 32), dtype=np.uint8)
    labels = rng.integers(0, NUM_CLASSES, n, dtype=np.uint8)
    raw = np.concatenate([labels[:, None], images.reshape(n, -1)], axis=1)  # (n, 3073)
    return images, labels, raw.tobytes()


def write_cifar(directory: Path) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The six batch files in ``directory``; returns split -> (images, labels) written."""
    directory.mkdir(parents=True, exist_ok=True)
    written = {}
    for split, names in datasets.CIFAR_SPLIT_FILES.items():
        parts = []
        for name in names:
            images, labels, raw = cifar_records(RECORDS_PER_BATCH, datasets.CIFAR_FILES.index(name))
            (directory / name).write_bytes(raw)
            parts.append((images, labels))
        written[split] = (np.concatenate([images for images, _ in parts]),
                          np.concatenate([labels for _, labels in parts]))
    return written


def test_cifar_reads_channel_major_records(tmp_path):
    written = write_cifar(tmp_path / "d" / datasets.CIFAR_BATCH_DIR)
    for split in ("train", "test"):
        dataset = load_cifar10(split, data_dir=tmp_path / "d", download=False)
        images, labels = written[split]
        assert dataset.images.shape == (len(labels), 3, 32, 32) and dataset.channels == 3
        assert torch.equal(dataset.images, torch.from_numpy(images))
        assert dataset.labels.tolist() == labels.tolist() and dataset.labels.dtype == torch.int64
        assert dataset.classes[0] == "airplane" and dataset.classes[-1] == "truck"
    assert len(load_cifar10("train", tmp_path / "d", download=False)) == 5 * RECORDS_PER_BATCH
    test_batch = tmp_path / "d" / datasets.CIFAR_BATCH_DIR / "test_batch.bin"
    red = np.frombuffer(test_batch.read_bytes()[1:1025], np.uint8)
    assert torch.equal(load_cifar10("test", tmp_path / "d", False).images[0, 0].flatten(),
                       torch.from_numpy(red.copy()))


def test_cifar_lookup_order_and_registry(tmp_path, monkeypatch):
    write_cifar(tmp_path / "arg" / "cifar10")
    write_cifar(tmp_path / "env")
    assert datasets.locate_cifar10(tmp_path / "arg", download=False) == tmp_path / "arg" / "cifar10"
    monkeypatch.setenv("CAPSNET_DATA_DIR", str(tmp_path / "env"))
    assert datasets.locate_cifar10(download=False) == tmp_path / "env"
    train, test = load_dataset("cifar10", data_dir=tmp_path / "arg", download=False)
    assert len(train) == 5 * RECORDS_PER_BATCH and len(test) == RECORDS_PER_BATCH


def test_cifar_not_found_message(tmp_path):
    with pytest.raises(DataNotFoundError) as err:
        load_cifar10("test", data_dir=tmp_path / "nowhere", download=False)
    message = str(err.value)
    assert "\n" not in message and "test_batch.bin" in message and "download disabled" in message
    assert str(tmp_path / "nowhere") in message and str(tmp_path / "cache" / "cifar10") in message


@pytest.mark.parametrize("damage, reason", [
    (lambda raw: raw[:-10], "not a positive multiple of the 3073-byte"),
    (lambda raw: b"", "not a positive multiple"),
    (lambda raw: bytes([NUM_CLASSES]) + raw[1:], "record 0 has label 10"),
])
def test_cifar_bad_batch_named(tmp_path, damage, reason):
    write_cifar(tmp_path / "d")
    bad = tmp_path / "d" / "data_batch_3.bin"
    bad.write_bytes(damage(bad.read_bytes()))
    with pytest.raises(DatasetFileError) as err:
        load_cifar10("train", tmp_path / "d", download=False)
    assert str(err.value).startswith(str(bad)) and reason in str(err.value)
    assert "\n" not in str(err.value)


def build_archive(path: Path, source: Path, extra=()) -> None:
    """A tar.gz like the official one, cifar-10-batches-bin/<six files>, plus the ``extra``
    TarInfo members; an extra member with a batch file's name takes its place."""
    replaced = {info.name for info in extra}
    with tarfile.open(path, "w:gz") as tar:
        for name in datasets.CIFAR_FILES:
            arcname = f"{datasets.CIFAR_BATCH_DIR}/{name}"
            if arcname not in replaced:
                tar.add(source / name, arcname=arcname)
        for info in extra:
            tar.addfile(info, io.BytesIO(EVIL) if info.isfile() else None)


def evil_member(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    """A member named ``name``: a small regular file, or a link to ``link``."""
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, link
    info.size = len(EVIL) if kind == tarfile.REGTYPE else 0
    return info


def test_cifar_download_verifies_extracts_and_cleans_up(tmp_path, http_root, monkeypatch):
    www, base = http_root
    written = write_cifar(tmp_path / "src")
    archive = www / "cifar-10-binary.tar.gz"
    build_archive(archive, tmp_path / "src")
    urls = (f"{base}/absent.tar.gz", f"{base}/{archive.name}")  # the first one fails: 404
    remote = RemoteFile("cifar-10-binary.tar.gz", urls, md5(archive))
    monkeypatch.setattr(datasets, "CIFAR_ARCHIVE", remote)
    train = load_cifar10("train")  # nothing local: downloaded into the cache
    cache = tmp_path / "cache" / "cifar10"
    assert torch.equal(train.images, torch.from_numpy(written["train"][0]))
    assert sorted(p.name for p in cache.iterdir()) == [datasets.CIFAR_BATCH_DIR]  # archive removed
    batches = cache / datasets.CIFAR_BATCH_DIR
    assert sorted(p.name for p in batches.iterdir()) == sorted(datasets.CIFAR_FILES)


@pytest.mark.parametrize("member, reason", [
    (evil_member("../evil.bin"), "unsafe archive member '../evil.bin'"),
    (evil_member("/tmp/capsnet-evil.bin"), "unsafe archive member"),
    (evil_member(f"{datasets.CIFAR_BATCH_DIR}/../../evil.bin"), "unsafe archive member"),
    (evil_member(f"{datasets.CIFAR_BATCH_DIR}/data_batch_1.bin", tarfile.SYMTYPE, "/etc/passwd"),
     "not a regular file"),
])
def test_cifar_download_refuses_unsafe_archives(tmp_path, http_root, member, reason):
    www, base = http_root
    write_cifar(tmp_path / "src")
    archive = www / "evil.tar.gz"
    build_archive(archive, tmp_path / "src", extra=[member])
    remote = RemoteFile("cifar-10-binary.tar.gz", (f"{base}/evil.tar.gz",), md5(archive))
    dest = tmp_path / "deep" / "dest"
    with pytest.raises(DataNotFoundError, match=reason):
        datasets.download_cifar10(dest, archive=remote)
    assert not (tmp_path / "deep" / "evil.bin").exists() and not (tmp_path / "evil.bin").exists()
    assert list(dest.iterdir()) == []


def test_cifar_download_checksum_mismatch(tmp_path, http_root):
    www, base = http_root
    write_cifar(tmp_path / "src")
    build_archive(www / "a.tar.gz", tmp_path / "src")
    remote = RemoteFile("cifar-10-binary.tar.gz", (f"{base}/a.tar.gz",), "0" * 32)
    with pytest.raises(DataNotFoundError, match="checksum mismatch: md5 of the file"):
        datasets.download_cifar10(tmp_path / "dest", archive=remote)


# ---- SVHN -----------------------------------------------------------------------------

def svhn_arrays(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """X (32, 32, 3, n) uint8 and y (n, 1) with labels 1..10, 10 included."""
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 256, (32, 32, 3, n), dtype=np.uint8)
    y = rng.integers(1, 11, (n, 1)).astype(np.uint8)
    y[0, 0] = datasets.SVHN_ZERO_LABEL
    return x, y


def write_svhn(directory: Path) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    directory.mkdir(parents=True, exist_ok=True)
    written = {}
    for seed, (split, n) in enumerate(SVHN_SIZES.items()):
        x, y = svhn_arrays(n, seed)
        scipy_io.savemat(directory / datasets.SVHN_FILES[split].name, {"X": x, "y": y})
        written[split] = (x, y)
    return written


def test_svhn_reads_and_maps_ten_to_zero(tmp_path):
    written = write_svhn(tmp_path / "d" / "svhn")
    for split, n in SVHN_SIZES.items():
        dataset = load_svhn(split, data_dir=tmp_path / "d", download=False)
        x, y = written[split]
        assert dataset.images.shape == (n, 3, 32, 32) and dataset.images.dtype == torch.uint8
        assert torch.equal(dataset.images[1, 2], torch.from_numpy(x[:, :, 2, 1]))
        expected = np.where(y[:, 0] == 10, 0, y[:, 0])
        assert dataset.labels.tolist() == expected.tolist() and dataset.labels[0] == 0
        assert dataset.classes == tuple("0123456789")
    train, test = load_dataset("svhn", data_dir=tmp_path / "d", download=False)
    assert len(train) == SVHN_SIZES["train"] and len(test) == SVHN_SIZES["test"]
    assert len(load_split("svhn", "test", tmp_path / "d", download=False)) == SVHN_SIZES["test"]
    with pytest.raises(ChecksumError, match="md5 of the file"):
        load_svhn("test", data_dir=tmp_path / "d", download=False, verify=True)


@pytest.mark.parametrize("contents, reason", [
    ({"X": np.zeros((32, 32, 1, 2), np.uint8), "y": np.ones((2, 1))}, "expected X of shape"),
    ({"X": np.zeros((32, 32, 3, 2), np.float64), "y": np.ones((2, 1))}, "uint8"),
    ({"X": np.zeros((32, 32, 3, 2), np.uint8), "y": np.ones((3, 1))}, "expected y of shape"),
    ({"X": np.zeros((32, 32, 3, 2), np.uint8), "y": np.array([[0], [1]])}, "labels span 0..1"),
    ({"X": np.zeros((32, 32, 3, 2), np.uint8), "y": np.array([[11], [1]])}, "labels span 1..11"),
    ({"X": np.zeros((32, 32, 3, 2), np.uint8)}, "expected variables X and y"),
    (None, "cannot read MATLAB file"),
])
def test_svhn_bad_file_named(tmp_path, contents, reason):
    write_svhn(tmp_path / "d")
    bad = tmp_path / "d" / datasets.SVHN_FILES["test"].name
    if contents is None:
        bad.write_bytes(b"this is not a MATLAB file at all" * 10)
    else:
        scipy_io.savemat(bad, contents)
    with pytest.raises(DatasetFileError) as err:
        load_svhn("test", data_dir=tmp_path / "d", download=False)
    message = str(err.value)
    assert message.startswith(str(bad)) and reason in message and "\n" not in message


def test_svhn_without_scipy_says_how_to_install(tmp_path, monkeypatch):
    write_svhn(tmp_path / "d")
    monkeypatch.setitem(sys.modules, "scipy.io", None)
    with pytest.raises(ImportError, match="pip install scipy"):
        load_svhn("test", data_dir=tmp_path / "d", download=False)


def test_svhn_download_verified_and_not_found(tmp_path, http_root, monkeypatch):
    www, base = http_root
    written = write_svhn(www)
    files = {split: RemoteFile(remote.name, (f"{base}/{remote.name}",), md5(www / remote.name))
             for split, remote in datasets.SVHN_FILES.items()}
    with pytest.raises(DataNotFoundError, match="download disabled"):
        load_svhn("train", download=False)
    monkeypatch.setattr(datasets, "SVHN_FILES", files)
    test = load_svhn("test")
    assert torch.equal(test.images[0, 0], torch.from_numpy(written["test"][0][:, :, 0, 0]))
    cache = tmp_path / "cache" / "svhn"
    assert sorted(p.name for p in cache.iterdir()) == sorted(r.name for r in files.values())
    wrong = {split: RemoteFile(r.name, r.urls, "0" * 32) for split, r in files.items()}
    with pytest.raises(DataNotFoundError, match="checksum mismatch"):
        datasets.download_svhn(tmp_path / "other", files=wrong)
    assert list((tmp_path / "other").iterdir()) == []
