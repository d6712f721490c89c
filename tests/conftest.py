"""Shared fixtures: real MNIST files when present, tiny fake IDX datasets, a small trained model."""
from __future__ import annotations

import functools
import http.server
import os
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.helpers_idx import write_idx

REPO = Path(__file__).resolve().parents[1]
MNIST_DIR = Path(os.environ.get("CAPSNET_TEST_MNIST_DIR",
                                REPO.parent / "shared" / "data" / "mnist"))
MNIST_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte",
               "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")

# The one place the tests set torch's thread count, here at import, before any test module
# is collected: one intra-op thread per test process (several processes share the cores,
# and two threads per process on a busy 2-core machine run several times slower).
TEST_THREADS = 1
torch.set_num_threads(TEST_THREADS)


def mnist_available() -> bool:
    return all((MNIST_DIR / f).exists() or (MNIST_DIR / f"{f}.gz").exists() for f in MNIST_FILES)


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    """Never touch the user's cache or download anything from a test."""
    monkeypatch.setenv("CAPSNET_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))
    monkeypatch.delenv("CAPSNET_DATA_DIR", raising=False)


@pytest.fixture(scope="session")
def mnist_dir() -> Path:
    if not mnist_available():
        pytest.skip(f"MNIST not found in {MNIST_DIR} (set CAPSNET_TEST_MNIST_DIR)")
    return MNIST_DIR


def make_fake_digits(n: int, seed: int = 0, size: int = 28) -> tuple[np.ndarray, np.ndarray]:
    """n learnable 'digits': class k is a bright bar at a class-specific position, with noise.
    Returns images (n, size, size) uint8 and labels (n,) uint8."""
    rng = np.random.default_rng(seed)
    labels = (np.arange(n) % 10).astype(np.uint8)
    rng.shuffle(labels)
    images = rng.integers(0, 40, size=(n, size, size), dtype=np.uint8)
    for i, k in enumerate(labels):
        row = 4 + 2 * int(k)
        images[i, row:row + 2, 4:size - 4] = 255
    return images, labels


@pytest.fixture(scope="session")
def tiny_mnist_dir(tmp_path_factory) -> Path:
    """A fake MNIST-format dataset: 600 training and 200 test 28x28 images, as .gz IDX."""
    root = tmp_path_factory.mktemp("tiny_mnist")
    train_x, train_y = make_fake_digits(600, seed=1)
    test_x, test_y = make_fake_digits(200, seed=2)
    for name, array in [("train-images-idx3-ubyte", train_x), ("train-labels-idx1-ubyte", train_y),
                        ("t10k-images-idx3-ubyte", test_x), ("t10k-labels-idx1-ubyte", test_y)]:
        write_idx(root / f"{name}.gz", array)
    return root


@pytest.fixture(scope="session")
def small_checkpoint(tmp_path_factory, tiny_mnist_dir) -> Path:
    """A checkpoint of the 'small' CapsNet trained briefly on the fake dataset (a few seconds)."""
    from capsnet.training import TrainSettings, fit

    out = tmp_path_factory.mktemp("small_run")
    fit(TrainSettings(preset="small", data_dir=str(tiny_mnist_dir), download=False, epochs=2,
                      val_size=100, out_dir=str(out), progress=False), log=lambda _: None)
    return out / "best.pt"


LOOPBACK = "127.0.0.1"
SERVER_POLL_S = 0.01  # how fast the test server notices shutdown


@pytest.fixture
def loopback_only(tmp_path, monkeypatch):
    """Own cache and no data dir; never route loopback through a proxy."""
    monkeypatch.delenv("CAPSNET_DATA_DIR", raising=False)
    monkeypatch.setenv("CAPSNET_CACHE_DIR", str(tmp_path / "cache"))
    for var in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("no_proxy", "*")


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture
def http_root(tmp_path):
    """A directory served over HTTP on the loopback address; yields (root dir, base URL)."""
    root = tmp_path / "www"
    root.mkdir()
    handler = functools.partial(QuietHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer((LOOPBACK, 0), handler)
    thread = threading.Thread(target=server.serve_forever, args=(SERVER_POLL_S,), daemon=True)
    thread.start()
    yield root, f"http://{LOOPBACK}:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
    thread.join()


# The attack tests' tiny trained models and images (tests.attack_models), per test module.


@pytest.fixture(scope="module")
def capsnet():
    from tests.attack_models import trained
    return trained("capsnet")


@pytest.fixture(scope="module")
def cnn():
    from tests.attack_models import trained
    return trained("cnn")


@pytest.fixture(scope="module")
def data():
    """ATTACK_IMAGES fake digits (B, 1, 28, 28) in [0, 1] and their labels (B,)."""
    from tests.attack_models import ATTACK_IMAGES, fake_digits
    return fake_digits(ATTACK_IMAGES, seed=2)


def last_error_line(capsys) -> str:
    """The one error line a failed command ends its stderr with (a speed-plan note or a
    warning may precede it), with no traceback."""
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err
    last = err.splitlines()[-1]
    assert last.startswith("capsnet: error: ")
    return last
