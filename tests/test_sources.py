"""Dataset lookup, verified download from a loopback HTTP server, and split loading."""

import gzip
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from capsnet.data import (
    DATASETS,
    ChecksumError,
    DataNotFoundError,
    DatasetSpec,
    IDXError,
    default_cache_dir,
    download_dataset,
    file_md5,
    load_dataset,
    load_split,
    locate_dataset,
)
from capsnet.data.sources import FILE_KEYS
from tests.conftest import LOOPBACK
from tests.helpers_idx import write_idx

pytestmark = pytest.mark.usefixtures("loopback_only")  # own cache, no data dir, no proxy

NUM_CLASSES = 10
IMAGE_SIZE = 4
PIXEL_LEVELS = 256
SPLIT_SIZES = {"train": 6, "test": 3}
SHARED_MNIST = Path(__file__).resolve().parents[2] / "shared" / "data" / "mnist"
MNIST_DIR = Path(os.environ.get("CAPSNET_TEST_MNIST_DIR", SHARED_MNIST))
FASHION_DIR = Path(DATASETS["fashion-mnist"].system_dirs[0])
MNIST_FILES = DATASETS["mnist"].file_names()


def write_fake_dataset(directory: Path, gz: bool = True, seed: int = 0) -> dict[str, str]:
    """Tiny IDX files with MNIST's file names; returns file name -> md5 of the content."""
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    md5s = {}
    for split, n in SPLIT_SIZES.items():
        prefix = "train" if split == "train" else "t10k"
        images = rng.integers(0, PIXEL_LEVELS, (n, IMAGE_SIZE, IMAGE_SIZE), dtype=np.uint8)
        arrays = {f"{prefix}-images-idx3-ubyte": images,
                  f"{prefix}-labels-idx1-ubyte": rng.integers(0, NUM_CLASSES, n, dtype=np.uint8)}
        for file_name, array in arrays.items():
            path = directory / (file_name + (".gz" if gz else ""))
            write_idx(path, array)
            md5s[file_name] = file_md5(path)
    return md5s


def fake_spec(md5s: dict[str, str], mirrors: tuple[str, ...] = ()) -> DatasetSpec:
    """A spec like MNIST's, for the fake files, with the given mirrors."""
    mnist = DATASETS["mnist"]
    files = {key: (name, md5s[name]) for key, (name, _) in mnist.files.items()}
    return DatasetSpec(name="tiny", files=files, mirrors=mirrors, system_dirs=(),
                       classes=mnist.classes)


# ---- default_cache_dir ----------------------------------------------------------------

def test_default_cache_dir(monkeypatch, tmp_path):
    assert default_cache_dir() == tmp_path / "cache"
    monkeypatch.delenv("CAPSNET_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == tmp_path / "xdg" / "capsnet"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_cache_dir() == tmp_path / "home" / ".cache" / "capsnet"


# ---- locate_dataset -------------------------------------------------------------------

def test_locate_order_data_dir_then_env_then_cache(tmp_path, monkeypatch):
    for place in ("arg", "env", "cache/mnist"):
        write_fake_dataset(tmp_path / place)
    monkeypatch.setenv("CAPSNET_DATA_DIR", str(tmp_path / "env"))
    found = locate_dataset("mnist", data_dir=tmp_path / "arg", download=False)
    assert found["train_images"].parent == tmp_path / "arg"
    assert locate_dataset("mnist", download=False)["train_images"].parent == tmp_path / "env"
    monkeypatch.delenv("CAPSNET_DATA_DIR")
    found = locate_dataset("mnist", download=False)
    assert found["test_labels"].parent == tmp_path / "cache" / "mnist"


def test_locate_accepts_dir_with_dataset_name(tmp_path, monkeypatch):
    write_fake_dataset(tmp_path / "arg" / "mnist")
    write_fake_dataset(tmp_path / "env" / "mnist")
    found = locate_dataset("mnist", data_dir=tmp_path / "arg", download=False)
    assert set(found) == set(FILE_KEYS)
    assert found["train_labels"].parent == tmp_path / "arg" / "mnist"
    monkeypatch.setenv("CAPSNET_DATA_DIR", str(tmp_path / "env"))
    found = locate_dataset("mnist", download=False)
    assert found["train_labels"].parent == tmp_path / "env" / "mnist"


def test_locate_accepts_raw_and_gz_prefers_raw(tmp_path):
    write_fake_dataset(tmp_path / "d", gz=True)
    raw_name = MNIST_FILES[0]
    gz_bytes = (tmp_path / "d" / f"{raw_name}.gz").read_bytes()
    (tmp_path / "d" / raw_name).write_bytes(gzip.decompress(gz_bytes))
    (tmp_path / "d" / f"{MNIST_FILES[1]}.gz").unlink()
    write_fake_dataset(tmp_path / "raw_only", gz=False)
    shutil.copy(tmp_path / "raw_only" / MNIST_FILES[1], tmp_path / "d")
    found = locate_dataset("mnist", data_dir=tmp_path / "d", download=False)
    assert found["train_images"].name == raw_name
    assert found["train_labels"].name == MNIST_FILES[1]
    assert found["test_images"].name == f"{MNIST_FILES[2]}.gz"


def test_incomplete_directory_does_not_count(tmp_path):
    write_fake_dataset(tmp_path / "d")
    (tmp_path / "d" / f"{MNIST_FILES[3]}.gz").unlink()
    with pytest.raises(DataNotFoundError):
        locate_dataset("mnist", data_dir=tmp_path / "d", download=False)


def test_not_found_message_names_files_places_and_download(tmp_path):
    with pytest.raises(DataNotFoundError) as info:
        locate_dataset("mnist", data_dir=tmp_path / "nowhere", download=False)
    message = str(info.value)
    assert "\n" not in message
    for name in MNIST_FILES:
        assert name in message
    for hint in (str(tmp_path / "nowhere"), "--data-dir", "CAPSNET_DATA_DIR",
                 str(tmp_path / "cache" / "mnist"), "download disabled"):
        assert hint in message


def test_unknown_dataset_lists_known_names():
    with pytest.raises(ValueError, match="fashion-mnist.*mnist"):
        locate_dataset("cifar", download=False)


def test_locate_downloads_into_cache_and_reports_failure(tmp_path, http_root, monkeypatch):
    root, base = http_root
    md5s = write_fake_dataset(root / "good")
    spec = fake_spec(md5s, mirrors=(f"{base}/good",))
    found = locate_dataset(spec)
    assert found["train_images"] == tmp_path / "cache" / "tiny" / f"{MNIST_FILES[0]}.gz"
    broken = fake_spec(md5s, mirrors=(f"{base}/absent",))
    monkeypatch.setenv("CAPSNET_CACHE_DIR", str(tmp_path / "other_cache"))
    with pytest.raises(DataNotFoundError, match="download attempted and failed.*404"):
        locate_dataset(broken)


# ---- download_dataset -----------------------------------------------------------------

def test_download_success_is_verified_and_leaves_no_temp_files(tmp_path, http_root):
    root, base = http_root
    md5s = write_fake_dataset(root / "good")
    dest = tmp_path / "dest"
    paths = download_dataset(fake_spec(md5s, mirrors=(f"{base}/good",)), dest)
    assert sorted(p.name for p in dest.iterdir()) == sorted(f"{name}.gz" for name in MNIST_FILES)
    for _key, path in paths.items():
        assert path.parent == dest and file_md5(path) == md5s[path.name[:-len(".gz")]]


def test_download_falls_over_to_next_mirror_on_bad_checksum(tmp_path, http_root):
    root, base = http_root
    md5s = write_fake_dataset(root / "good", seed=0)
    write_fake_dataset(root / "bad", seed=1)
    spec = fake_spec(md5s, mirrors=(f"{base}/bad", f"{base}/good"))
    paths = download_dataset(spec, tmp_path / "dest")
    assert all(file_md5(path) == md5s[path.name[:-len(".gz")]] for path in paths.values())
    assert len(list((tmp_path / "dest").iterdir())) == len(FILE_KEYS)


def test_download_all_mirrors_failing(tmp_path, http_root):
    root, base = http_root
    md5s = write_fake_dataset(root / "good", seed=0)
    write_fake_dataset(root / "bad", seed=1)
    (root / "notgzip").mkdir()
    for name in MNIST_FILES:
        (root / "notgzip" / f"{name}.gz").write_text("<html>not found</html>")
    spec = fake_spec(md5s, mirrors=(f"{base}/bad", f"{base}/absent", f"{base}/notgzip"))
    with pytest.raises(DataNotFoundError) as info:
        download_dataset(spec, tmp_path / "dest")
    message = str(info.value)
    assert MNIST_FILES[0] in message and "checksum mismatch" in message
    assert "404" in message and "not a gzip file" in message
    assert list((tmp_path / "dest").iterdir()) == []


def test_download_keeps_verified_existing_files(tmp_path, http_root):
    root, base = http_root
    md5s = write_fake_dataset(root / "good")
    dest = tmp_path / "dest"
    write_fake_dataset(dest)  # same seed: same content as the server's
    spec = fake_spec(md5s, mirrors=(f"{base}/absent",))
    assert set(download_dataset(spec, dest)) == set(FILE_KEYS)


def test_download_unreachable_host(tmp_path, http_root):
    root, base = http_root
    md5s = write_fake_dataset(root / "good")
    spec = fake_spec(md5s, mirrors=(f"http://{LOOPBACK}:1",))  # port 1: connection refused
    with pytest.raises(DataNotFoundError, match=MNIST_FILES[0]):
        download_dataset(spec, tmp_path / "dest")


# ---- load_split -----------------------------------------------------------------------

def test_load_split_fake_data(tmp_path):
    write_fake_dataset(tmp_path / "d")
    train, test = load_dataset("mnist", data_dir=tmp_path / "d", download=False)
    assert train.images.shape == (SPLIT_SIZES["train"], IMAGE_SIZE, IMAGE_SIZE)
    assert train.images.dtype == torch.uint8 and train.labels.dtype == torch.int64
    assert len(test) == SPLIT_SIZES["test"] and test.classes == DATASETS["mnist"].classes
    part = train.subset([0, 2])
    assert len(part) == 2 and torch.equal(part.images[1], train.images[2])
    moved = part.to("cpu")
    assert moved is not part and torch.equal(moved.labels, part.labels)


def test_load_split_rejects_bad_labels(tmp_path):
    write_fake_dataset(tmp_path / "d")
    labels_path = tmp_path / "d" / f"{MNIST_FILES[1]}.gz"
    write_idx(labels_path, np.full(SPLIT_SIZES["train"], NUM_CLASSES, dtype=np.uint8))
    with pytest.raises(IDXError, match=f"{MNIST_FILES[1]}.gz: labels span"):
        load_split("mnist", "train", data_dir=tmp_path / "d", download=False)
    write_idx(labels_path, np.zeros(SPLIT_SIZES["train"] + 1, dtype=np.uint8))
    with pytest.raises(IDXError, match="7 labels but 6 images"):
        load_split("mnist", "train", data_dir=tmp_path / "d", download=False)


def test_load_split_verify_detects_wrong_content(tmp_path):
    write_fake_dataset(tmp_path / "d")
    with pytest.raises(ChecksumError, match="checksum mismatch"):
        load_split("mnist", "test", data_dir=tmp_path / "d", download=False, verify=True)
    with pytest.raises(ValueError, match="split"):
        load_split("mnist", "validation", data_dir=tmp_path / "d", download=False)


# ---- the real data, when present ------------------------------------------------------

@pytest.mark.slow
@pytest.mark.skipif(not MNIST_DIR.is_dir(), reason=f"no MNIST copy at {MNIST_DIR}")
def test_real_mnist():
    train = load_split("mnist", "train", data_dir=MNIST_DIR, download=False, verify=True)
    test = load_split("mnist", "test", data_dir=MNIST_DIR, download=False, verify=True)
    assert train.images.shape == (60000, 28, 28) and test.images.shape == (10000, 28, 28)
    assert train.labels.unique().tolist() == list(range(NUM_CLASSES))
    assert test.labels.unique().tolist() == list(range(NUM_CLASSES))


@pytest.mark.skipif(not FASHION_DIR.is_dir(), reason="dataset-fashion-mnist is not installed")
def test_fashion_mnist_from_system_dir():
    paths = locate_dataset("fashion-mnist", download=False)
    assert paths["test_images"].parent == FASHION_DIR
    test = load_split("fashion-mnist", "test", download=False, verify=True)
    assert test.images.shape == (10000, 28, 28) and test.num_classes == NUM_CLASSES
    assert file_md5(paths["train_labels"]) == DATASETS["fashion-mnist"].files["train_labels"][1]



def test_a_directory_of_mnist_is_not_taken_for_fashion_mnist(mnist_dir):
    # MNIST and Fashion-MNIST share their file names: a $CAPSNET_DATA_DIR holding MNIST was
    # read as Fashion-MNIST (digits under clothing names); their test labels tell them apart
    from capsnet.data.sources import DATASETS, find_files

    assert find_files(mnist_dir, DATASETS["mnist"]) is not None
    assert find_files(mnist_dir, DATASETS["fashion-mnist"]) is None
