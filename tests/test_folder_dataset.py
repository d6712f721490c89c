"""Image-folder datasets: layout, split, channels, sizes, bad input, the decode cache."""

import os
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image, features

import capsnet.data.folder as folder_module
from capsnet.data import (
    FolderDatasetError,
    ImageDataset,
    format_skipped_warning,
    load_dataset,
    load_folder_dataset,
    load_split,
)
from capsnet.data.folder import decode_image_file

SIZE = (6, 5)  # (H, W) of the generated images
PER_CLASS = 4
EXIF_ORIENTATION = 0x0112
ROTATED_90 = 6  # EXIF: the stored image must be turned 90 degrees clockwise


def grey_value(label: int, index: int) -> int:
    """A grey level unique to (class, image), so that an image identifies its file."""
    return 10 * label + index + 1


def listed_position(train, index: int) -> int:
    """Where the training pool holds the image at ``index`` of the folder's listing."""
    return int(torch.nonzero(folder_module.training_order(len(train)) == index))


def write_image(path: Path, array: np.ndarray, **save_kwargs) -> Path:
    """Save a uint8 (H, W) or (H, W, C) array as an image file; the format from the suffix."""
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(array).save(path, **save_kwargs)
    return path


def make_split(root: Path, split: str, classes, per_class: int = PER_CLASS,
               size: tuple[int, int] = SIZE, colour: bool = False) -> list[Path]:
    """root/split/<class>/<i>.png with grey (or colour) images of value grey_value."""
    paths = []
    for label, name in enumerate(classes):
        for i in range(per_class):
            array = np.full(size, grey_value(label, i), dtype=np.uint8)  # (H, W)
            if colour:
                array = np.stack([array, array // 2, 255 - array], axis=-1)  # (H, W, 3)
            paths.append(write_image(root / split / name / f"{i:02d}.png", array))
    return paths


def load(root: Path, **options):
    options.setdefault("progress", False)
    options.setdefault("cache_dir", root.parent / "cache")
    return load_folder_dataset(root, **options)


def assert_one_line_naming(err: pytest.ExceptionInfo, *names) -> str:
    message = str(err.value)
    assert "\n" not in message
    for name in names:
        assert str(name) in message
    return message


# ---- layouts --------------------------------------------------------------------------

def test_train_and_test_folders_classes_sorted(tmp_path):
    root = tmp_path / "data"
    make_split(root, "train", ["b", "a", "c"])
    make_split(root, "test", ["c", "a"], per_class=2)
    (root / "train" / "a" / "notes.txt").write_text("not an image")
    write_image(root / "train" / "a" / ".hidden.png", np.zeros(SIZE, np.uint8))
    write_image(root / "train" / ".thumbs" / "x.png", np.zeros(SIZE, np.uint8))
    train, test = load(root)
    assert train.classes == test.classes == ("a", "b", "c")
    assert isinstance(train, ImageDataset) and train.name == "folder"
    assert train.images.shape == (3 * PER_CLASS, 1, *SIZE) and train.images.dtype == torch.uint8
    assert train.channels == 1 and train.image_size == SIZE
    listed = torch.empty_like(train.labels)  # the labels in the folder's listing order
    listed[folder_module.training_order(len(train))] = train.labels
    assert listed.tolist() == [0] * PER_CLASS + [1] * PER_CLASS + [2] * PER_CLASS
    assert test.labels.tolist() == [0, 0, 2, 2]
    # make_split wrote class "b" (label 1 now) with value grey_value(0, i): sorted order wins
    assert train.images[listed_position(train, PER_CLASS), 0, 0, 0] == grey_value(0, 0)
    assert "test_split" not in train.info and train.info["skipped"] == {}
    assert train.info["root"] == str(root.resolve()) and train.info["image_size"] == list(SIZE)


@pytest.mark.parametrize("num_classes", [2, 5])
def test_split_carved_from_train_is_stratified_seeded_and_recorded(tmp_path, num_classes):
    root = tmp_path / "data"
    per_class = 10
    classes = [f"class{k}" for k in range(num_classes)]
    make_split(root, "train", classes, per_class=per_class)
    train, test = load(root, test_fraction=0.2, seed=3)
    assert len(test) == 2 * num_classes and len(train) == 8 * num_classes
    assert torch.bincount(test.labels).tolist() == [2] * num_classes
    split = test.info["test_split"]
    assert split["seed"] == 3 and split["fraction"] == 0.2 and len(split["files"]) == len(test)
    for image, label, file in zip(test.images, test.labels, split["files"], strict=True):
        class_name, stem = Path(file).parts[1], Path(file).stem
        assert file.startswith("train/") and class_name == classes[label]
        assert image[0, 0, 0] == grey_value(int(label), int(stem))
    train_values = {int(image[0, 0, 0]) for image in train.images}
    assert train_values.isdisjoint(int(image[0, 0, 0]) for image in test.images)
    assert load(root, test_fraction=0.2, seed=3)[1].info["test_split"]["files"] == split["files"]
    assert load(root, test_fraction=0.2, seed=4)[1].info["test_split"]["files"] != split["files"]


# ---- channels -------------------------------------------------------------------------

def test_colour_detection_and_forcing(tmp_path):
    colour = tmp_path / "colour"
    make_split(colour, "train", ["x", "y"], colour=True)
    make_split(colour, "test", ["x", "y"], per_class=1, colour=True)
    train, _ = load(colour)
    assert train.channels == 3 and train.images.shape[1:] == (3, *SIZE)
    first = np.asarray(Image.open(colour / "train" / "x" / "00.png"))  # (H, W, 3)
    at = listed_position(train, 0)  # where the folder's first image is held
    assert np.array_equal(train.images[at].permute(1, 2, 0).numpy(), first)
    grey_forced, _ = load(colour, channels=1)
    luma = np.asarray(Image.open(colour / "train" / "x" / "00.png").convert("L"))
    assert grey_forced.channels == 1 and np.array_equal(grey_forced.images[at, 0].numpy(), luma)

    grey = tmp_path / "grey"
    make_split(grey, "train", ["x", "y"])
    rgb_grey = np.repeat(np.full(SIZE, 77, np.uint8)[..., None], 3, axis=-1)  # R == G == B
    write_image(grey / "train" / "x" / "rgb_but_grey.png", rgb_grey)
    train, _ = load(grey)
    assert train.channels == 1
    rgb_forced, _ = load(grey, channels=3)
    assert rgb_forced.images.shape[1] == 3
    assert torch.equal(rgb_forced.images[:, 0], rgb_forced.images[:, 2])


def test_grey_and_colour_mixed_become_rgb(tmp_path):
    root = tmp_path / "data"
    make_split(root, "train", ["x"])
    make_split(root, "train", ["y"], colour=True)
    train, test = load(root)
    assert train.channels == test.channels == 3
    greys = train.images[train.labels == 0]  # (K, 3, H, W) from grey files
    assert torch.equal(greys[:, 0], greys[:, 1]) and torch.equal(greys[:, 1], greys[:, 2])


def test_transparency_16_bit_and_exif(tmp_path):
    rgba = np.zeros((*SIZE, 4), np.uint8)
    rgba[..., :3] = 255  # white, but fully transparent ...
    rgba[0, 0] = (200, 100, 50, 255)  # ... except one opaque pixel
    path = write_image(tmp_path / "alpha.png", rgba)
    decoded = decode_image_file(path)  # (3, H, W)
    assert decoded[:, 0, 0].tolist() == [200, 100, 50] and decoded[:, 1:, 1:].max() == 0
    grey_alpha = np.stack([np.full(SIZE, 90, np.uint8), np.full(SIZE, 255, np.uint8)], axis=-1)
    assert decode_image_file(write_image(tmp_path / "la.png", grey_alpha)).shape[0] == 1
    wide = np.full(SIZE, 65535, np.uint16)
    assert decode_image_file(write_image(tmp_path / "wide.png", wide)).max() == 255
    exif = Image.Exif()
    exif[EXIF_ORIENTATION] = ROTATED_90
    tall = write_image(tmp_path / "rotated.jpg", np.zeros(SIZE, np.uint8), exif=exif)
    assert decode_image_file(tall).shape == (1, SIZE[1], SIZE[0])


def test_extensions_any_case_and_formats(tmp_path):
    root = tmp_path / "data"
    formats = [".PNG", ".jpg", ".JPEG", ".bmp", ".gif", ".tif", ".TIFF"]
    if features.check("webp"):
        formats.append(".webp")
    for label in ("a", "b"):
        for i, suffix in enumerate(formats):
            write_image(root / "train" / label / f"{i}{suffix}", np.full(SIZE, 128, np.uint8))
    train, test = load(root)
    assert len(train) + len(test) == 2 * len(formats) and train.image_size == SIZE


# ---- sizes ----------------------------------------------------------------------------

def test_odd_sizes_kept_or_resized(tmp_path):
    root = tmp_path / "data"
    make_split(root, "train", ["a", "b"], size=(13, 17))
    train, _ = load(root)
    assert train.image_size == (13, 17)
    resized, _ = load(root, image_size=8)
    assert resized.image_size == (8, 8) and resized.images.shape[1:] == (1, 8, 8)
    # a constant image stays constant under antialiased resizing
    assert (resized.images[0] == resized.images[0, 0, 0, 0]).all()


def test_mixed_sizes_without_image_size_name_two_files(tmp_path):
    root = tmp_path / "data"
    make_split(root, "train", ["a", "b"])
    odd = write_image(root / "train" / "b" / "zz.png", np.zeros((9, 9), np.uint8))
    with pytest.raises(FolderDatasetError) as err:
        load(root)
    assert_one_line_naming(err, root / "train" / "a" / "00.png", odd, "--image-size N", "9x9")
    train, _ = load(root, image_size=4)
    assert train.image_size == (4, 4)


# ---- bad input ------------------------------------------------------------------------

def test_missing_root_or_train(tmp_path):
    with pytest.raises(FolderDatasetError) as err:
        load(tmp_path / "absent")
    assert_one_line_naming(err, tmp_path / "absent", "not found")
    (tmp_path / "data" / "test" / "a").mkdir(parents=True)
    with pytest.raises(FolderDatasetError) as err:
        load(tmp_path / "data")
    assert_one_line_naming(err, tmp_path / "data" / "train", "no train folder")


def test_no_classes_no_images_empty_class_single_class(tmp_path):
    root = tmp_path / "data"
    (root / "train").mkdir(parents=True)
    with pytest.raises(FolderDatasetError) as err:
        load(root)
    assert_one_line_naming(err, root / "train", "no class folders")
    for name in ("a", "b"):
        (root / "train" / name).mkdir()
        (root / "train" / name / "readme.txt").write_text("text")
    with pytest.raises(FolderDatasetError) as err:
        load(root)
    assert_one_line_naming(err, root / "train", "no image files")
    make_split(root, "train", ["a"])
    with pytest.raises(FolderDatasetError) as err:
        load(root, skip_bad=True)
    assert_one_line_naming(err, root / "train" / "b", "empty class folder")
    (root / "train" / "b" / "readme.txt").unlink()
    (root / "train" / "b").rmdir()
    with pytest.raises(FolderDatasetError) as err:
        load(root, skip_bad=True)
    assert_one_line_naming(err, root / "train", "only one class")


def test_test_class_not_in_train(tmp_path):
    root = tmp_path / "data"
    make_split(root, "train", ["a", "b"])
    make_split(root, "test", ["a", "zebra"], per_class=1)
    with pytest.raises(FolderDatasetError) as err:
        load(root)
    assert_one_line_naming(err, root / "test" / "zebra", "'zebra'")


@pytest.mark.parametrize("content, reason", [
    (b"definitely not an image", "identify"),
    (None, "truncated"),  # None: a PNG cut in half
])
def test_corrupt_file_is_named_with_pillow_reason(tmp_path, content, reason):
    root = tmp_path / "data"
    make_split(root, "train", ["a", "b"], size=(32, 32))
    bad = root / "train" / "b" / "01.png"
    if content is None:
        image = np.random.default_rng(0).integers(0, 256, (32, 32), dtype=np.uint8)
        write_image(bad, image)
        content = bad.read_bytes()[: bad.stat().st_size // 2]
    bad.write_bytes(content)
    with pytest.raises(FolderDatasetError) as err:
        load(root)
    assert_one_line_naming(err, bad, reason)


def test_decompression_bomb_refused_as_bad_file(tmp_path, monkeypatch):
    root = tmp_path / "data"
    make_split(root, "train", ["a", "b"])
    warned = write_image(root / "train" / "a" / "big.png", np.zeros((12, 12), np.uint8))
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 100)  # 144 pixels: Pillow only warns
    with pytest.raises(FolderDatasetError) as err:
        load(root)
    assert_one_line_naming(err, warned, "decompression bomb")
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 50)  # more than twice: Pillow's error
    with pytest.raises(FolderDatasetError) as err:
        load(root)
    assert_one_line_naming(err, "decompression bomb")


def test_skip_bad_records_skipped_files(tmp_path):
    root = tmp_path / "data"
    make_split(root, "train", ["a", "b"])
    make_split(root, "test", ["a", "b"], per_class=1)
    (root / "train" / "a" / "broken.png").write_bytes(b"junk")
    (root / "test" / "b" / "broken.jpg").write_bytes(b"")
    train, test = load(root, skip_bad=True)
    assert len(train) == 2 * PER_CLASS and len(test) == 2
    skipped = train.info["skipped"]
    assert list(skipped) == ["train/a/broken.png", "test/b/broken.jpg"] and test.info == train.info
    warning = format_skipped_warning(train.info)
    assert "\n" not in warning and "skipped 2 unreadable image files" in warning
    assert "train/a/broken.png" in warning and str(root.resolve()) in warning
    assert format_skipped_warning(train.info, limit=1).endswith("and 1 more")
    assert format_skipped_warning({"skipped": {}}) is None


def test_skip_bad_class_left_without_images_is_an_error(tmp_path):
    root = tmp_path / "data"
    make_split(root, "train", ["a"])
    (root / "train" / "b").mkdir()
    (root / "train" / "b" / "bad.png").write_bytes(b"junk")
    with pytest.raises(FolderDatasetError) as err:
        load(root, skip_bad=True)
    assert_one_line_naming(err, root / "train" / "b", "1 skipped")


def test_bad_options():
    for options in ({"image_size": 0}, {"channels": 2}, {"test_fraction": 1.0}):
        with pytest.raises(ValueError):
            load_folder_dataset("unused", **options)


# ---- cache ----------------------------------------------------------------------------

def test_cache_hit_touch_and_corrupt(tmp_path, monkeypatch):
    root, cache = tmp_path / "data", tmp_path / "cache"
    paths = make_split(root, "train", ["a", "b"])
    calls = []

    def counting(*args, **kwargs):
        calls.append(args[0])
        return decode_image_file(*args, **kwargs)

    monkeypatch.setattr(folder_module, "decode_image_file", counting)
    first_train, first_test = load(root)
    assert len(calls) == len(paths)
    (cached_file,) = cache.glob("*.npz")

    def refuse(*args, **kwargs):
        raise AssertionError("decoded although cached")

    monkeypatch.setattr(folder_module, "decode_image_file", refuse)
    train, test = load(root)
    assert torch.equal(train.images, first_train.images) and train.info == first_train.info
    assert torch.equal(test.labels, first_test.labels) and train.classes == first_train.classes

    monkeypatch.setattr(folder_module, "decode_image_file", counting)
    stat = paths[0].stat()
    os.utime(paths[0], ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    calls.clear()
    load(root)
    assert len(calls) == len(paths)
    (new_file,) = cache.glob("*.npz")  # the stale file was replaced
    assert new_file != cached_file

    new_file.write_bytes(b"not a zip file")
    calls.clear()
    train, _ = load(root)
    assert len(calls) == len(paths) and torch.equal(train.images, first_train.images)
    assert np.load(new_file)["train_images"].shape == tuple(train.images.shape)

    make_split(root, "train", ["c"], per_class=1)  # a new file (and class) invalidates it too
    calls.clear()
    assert load(root)[0].num_classes == 3 and len(calls) == len(paths) + 1


def test_cache_options_are_part_of_the_key(tmp_path):
    root = tmp_path / "data"
    make_split(root, "train", ["a", "b"])
    assert load(root)[0].image_size == SIZE
    assert load(root, image_size=3)[0].image_size == (3, 3)
    assert load(root, channels=3)[0].channels == 3
    assert len(list((tmp_path / "cache").glob("*.npz"))) == 3


def test_default_cache_dir_is_used(tmp_path, monkeypatch):
    monkeypatch.setenv("CAPSNET_CACHE_DIR", str(tmp_path / "capsnet_cache"))
    root = tmp_path / "data"
    make_split(root, "train", ["a", "b"])
    load_folder_dataset(root, progress=False)
    assert len(list((tmp_path / "capsnet_cache" / "folders").glob("*.npz"))) == 1


# ---- registry and ImageDataset --------------------------------------------------------

def test_load_dataset_by_name(tmp_path):
    root = tmp_path / "data"
    make_split(root, "train", ["a", "b"])
    make_split(root, "test", ["a", "b"], per_class=1)
    train, test = load_dataset("folder", data_dir=root, image_size=4, progress=False)
    assert train.image_size == (4, 4) and len(test) == 2
    assert torch.equal(load_split("folder", "test", root, image_size=4).images, test.images)
    with pytest.raises(ValueError, match="data_dir"):
        load_dataset("folder")
    with pytest.raises(ValueError, match="image_size"):
        load_dataset("mnist", data_dir=root, image_size=4)
    with pytest.raises(ValueError, match="cifar10.*svhn.*folder"):
        load_split("imagenet", "test", root)


def test_image_dataset_channels_and_info():
    labels = torch.zeros(2, dtype=torch.long)
    grey = ImageDataset(torch.zeros(2, 5, 7, dtype=torch.uint8), labels, ("a",), "g")
    assert grey.channels == 1 and grey.image_size == (5, 7) and grey.info == {}
    colour = ImageDataset(torch.zeros(2, 3, 5, 7, dtype=torch.uint8), labels, ("a",), "c",
                          {"source": "test"})
    assert colour.channels == 3 and colour.image_size == (5, 7)
    assert colour.subset([1]).info == {"source": "test"} and colour.to("cpu").channels == 3
    with pytest.raises(ValueError, match="C in"):
        ImageDataset(torch.zeros(2, 2, 5, 7, dtype=torch.uint8), labels, ("a",), "bad")


def test_progress_bar_while_decoding_many_files(tmp_path, monkeypatch, capsys):
    root = tmp_path / "data"
    make_split(root, "train", ["a", "b"])
    monkeypatch.setattr(folder_module, "PROGRESS_MIN_FILES", 1)
    load(root, progress=False)
    assert "decoding" not in capsys.readouterr().err
    load(root, progress=True, image_size=4)  # stderr not a terminal (a log): no bar
    assert "decoding" not in capsys.readouterr().err
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    load(root, progress=True, image_size=3)  # on a terminal; other options: not cached yet
    assert "decoding data" in capsys.readouterr().err


def test_tiny_split_keeps_a_training_image(tmp_path):
    root = tmp_path / "data"
    make_split(root, "train", ["a", "b"], per_class=1)
    train, test = load(root, test_fraction=0.9)
    assert len(train) == 1 and len(test) == 1


def test_the_training_pool_is_shuffled_so_that_a_subset_mixes_classes(tmp_path):
    """Folders list images class by class; the training pool comes back in a seeded mixed
    order (the same every time), so --subset N does not take the first classes only."""
    root = tmp_path / "data"
    for k, name in enumerate(["a", "b", "c", "d"]):
        for i in range(10):
            write_image(root / "train" / name / f"{i}.png", np.full((8, 8), 40 * k, np.uint8))
    train, _ = load_folder_dataset(root, test_fraction=0.25, cache_dir=tmp_path / "cache",
                                   progress=False)
    first = train.labels[:8].tolist()
    assert len(set(first)) >= 3  # not one or two classes
    again, _ = load_folder_dataset(root, test_fraction=0.25, cache_dir=tmp_path / "other",
                                   progress=False)
    assert torch.equal(again.labels, train.labels) and torch.equal(again.images, train.images)
