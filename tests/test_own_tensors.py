"""Your own data in plain PyTorch form: ImageDataset is a torch Dataset, and fit() trains on
(images, labels) tensors or any Dataset as well as on named datasets and folders."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader, TensorDataset

from capsnet import ImageDataset, TrainSettings, fit
from capsnet.checkpoint import load_checkpoint
from capsnet.data.image_dataset import as_image_dataset
from capsnet.training.fit import own_datasets
from tests.conftest import make_fake_digits


def fake(n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    images, labels = make_fake_digits(n, seed)  # (n, 28, 28) uint8, (n,)
    return torch.from_numpy(images), torch.from_numpy(labels.astype(np.int64))


def test_image_dataset_items_are_model_input_and_batch_in_a_data_loader():
    images, labels = fake(10)
    dataset = ImageDataset(images, labels, tuple("0123456789"), "fake")
    image, label = dataset[3]
    assert image.shape == (1, 28, 28) and image.dtype == torch.float32
    torch.testing.assert_close(image[0], images[3].float() / 255)
    assert label == int(labels[3]) and isinstance(label, int)
    assert dataset[-1][1] == int(labels[-1])
    with pytest.raises(IndexError):
        dataset[10]
    batches = list(DataLoader(dataset, batch_size=4, num_workers=0))
    assert [tuple(x.shape) for x, _ in batches] == [(4, 1, 28, 28)] * 2 + [(2, 1, 28, 28)]
    assert torch.equal(torch.cat([y for _, y in batches]), labels)


def test_a_colour_image_dataset_gives_channels_first_items():
    images = torch.randint(0, 256, (3, 3, 8, 6), dtype=torch.uint8)  # (N, C, H, W)
    image, _ = ImageDataset(images, torch.tensor([0, 1, 0]), ("a", "b"), "rgb")[1]
    assert image.shape == (3, 8, 6)
    torch.testing.assert_close(image, images[1].float() / 255)


def test_tensors_and_datasets_become_one_image_dataset():
    images, labels = fake(12)
    from_uint8 = as_image_dataset((images, labels))
    from_float = as_image_dataset((images.float() / 255, labels))  # (N, H, W) in [0, 1]
    from_tensors = as_image_dataset(TensorDataset(images.unsqueeze(1).float() / 255, labels))
    pil_items = [(Image.fromarray(x.numpy()), int(y)) for x, y in zip(images, labels, strict=True)]
    from_pil = as_image_dataset(pil_items_dataset(pil_items))
    for made in (from_float, from_pil):
        assert torch.equal(made.images, images)
    assert torch.equal(from_tensors.images[:, 0], images)
    for made in (from_uint8, from_float, from_tensors, from_pil):
        assert torch.equal(made.labels, labels) and made.name == "own"
    for made in (from_uint8, from_float, from_tensors):
        assert made.classes == tuple(str(c) for c in range(int(labels.max()) + 1))
    assert from_pil.classes[0] == "zero"  # a Dataset's own `classes` names them


def pil_items_dataset(items):
    class Items(torch.utils.data.Dataset):
        classes = ["zero", *map(str, range(1, 10))]

        def __len__(self):
            return len(items)

        def __getitem__(self, i):
            return items[i]

    return Items()


@pytest.mark.parametrize("data, expected", [
    ("mnist.npz", "expected a pair \\(images, labels\\) or a torch Dataset"),
    ((torch.rand(4, 28, 28) * 2, torch.zeros(4)), "float images must be in \\[0, 1\\]"),
    ((torch.rand(4, 28, 28), torch.zeros(3)), "expected labels \\(N,\\) for images"),
    ((torch.rand(4, 28, 28), -torch.ones(4)), "class indices 0..K-1"),
])
def test_bad_own_data_is_one_line(data, expected):
    with pytest.raises(ValueError, match=expected):
        as_image_dataset(data)


def test_without_test_data_a_stratified_tenth_is_held_out():
    train, test = own_datasets(fake(200))
    assert (len(train), len(test)) == (180, 20)
    assert torch.bincount(test.labels, minlength=10).tolist() == [2] * 10
    again = own_datasets(fake(200))[1]  # the same test images every time
    assert torch.equal(again.images, test.images)
    assert test.info["test_split"]["seed"] == 0 and len(test.info["test_split"]["indices"]) == 20


def test_fit_names_its_first_argument_when_given_data_there():
    with pytest.raises(TypeError, match=r"first argument is a TrainSettings, got tuple; pass "
                                        r"your data as fit\(settings, data="):
        fit(fake(10))


@pytest.mark.parametrize("as_dataset", [False, True])
def test_fit_trains_on_own_tensors_or_a_dataset(tmp_path, as_dataset):
    images, labels = fake(600, seed=1)
    test = fake(200, seed=2)
    data = TensorDataset(images.unsqueeze(1).float() / 255, labels) if as_dataset else (
        images, labels)
    settings = TrainSettings(model="cnn", preset="tiny", epochs=2, batch_size=32, val_size=60,
                             out_dir=str(tmp_path), progress=False)
    results = fit(settings, data=data, test_data=test, log=lambda _: None)
    assert results["best"]["accuracy"] > 0.5  # chance is 0.1; measured 1.0
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["best"]["accuracy"] == results["best"]["accuracy"]
    checkpoint = load_checkpoint(tmp_path / "best.pt")
    assert checkpoint["train_settings"]["dataset"] == "own"  # the run names its data
    assert checkpoint["config"]["dataset"] == "own" and checkpoint["config"]["num_classes"] == 10
