"""Own images -> MNIST-like 28x28: polarity, crop, 20x20 fit, centre of mass, bad inputs;
and for other models the whole image at their channels and size."""
from __future__ import annotations

import re

import numpy as np
import pytest
from image_files import encoded, png_header
from PIL import Image, ImageDraw

from capsnet.data.folder import decode_image_file
from capsnet.models import CapsNetConfig
from capsnet.preprocess import (
    FIT_SIZE,
    MAX_PIXELS,
    MNIST_SIZE,
    ImageTooLargeError,
    PreprocessError,
    prepare_for_model,
    prepare_image,
    prepare_plain,
)

CENTRE = MNIST_SIZE / 2  # where MNIST's digits have their centre of mass


def drawn_digit(size=(300, 400), ink=20, paper=235, offset=(0, 0), mode="L") -> Image.Image:
    """A '7'-like shape drawn with thick strokes: dark ink on light paper."""
    image = Image.new(mode, size, paper if mode == "L" else (paper,) * 3)
    draw = ImageDraw.Draw(image)
    dx, dy = offset
    fill = ink if mode == "L" else (ink,) * 3
    draw.line([(80 + dx, 100 + dy), (200 + dx, 100 + dy), (120 + dx, 300 + dy)], fill=fill,
              width=18)
    return image


def centre_of_mass(image: np.ndarray) -> tuple[float, float]:
    w = image.astype(np.float64)
    rows, cols = np.arange(w.shape[0]), np.arange(w.shape[1])
    return (w.sum(1) * rows).sum() / w.sum(), (w.sum(0) * cols).sum() / w.sum()


def ink_box(image: np.ndarray) -> tuple[int, int]:
    rows, cols = np.nonzero(image)
    return rows.max() - rows.min() + 1, cols.max() - cols.min() + 1


def test_dark_on_light_becomes_white_on_black_fit_and_centred():
    out = prepare_image(drawn_digit())
    assert out.shape == (MNIST_SIZE, MNIST_SIZE) and out.dtype == np.uint8
    assert out.max() == 255
    assert out[0, 0] == out[0, -1] == out[-1, 0] == out[-1, -1] == 0  # black background
    assert (out == 0).mean() > 0.6
    height, width = ink_box(out)
    assert max(height, width) in (FIT_SIZE - 1, FIT_SIZE)
    com_y, com_x = centre_of_mass(out)
    assert abs(com_y - CENTRE) <= 1 and abs(com_x - CENTRE) <= 1


def test_light_on_dark_is_not_inverted_and_matches_dark_on_light():
    dark_on_light = prepare_image(drawn_digit(ink=20, paper=235))
    light_on_dark = prepare_image(drawn_digit(ink=235, paper=20))
    assert np.abs(dark_on_light.astype(int) - light_on_dark).max() <= 1


def test_aspect_ratio_is_kept():
    image = Image.new("L", (400, 400), 255)
    ImageDraw.Draw(image).rectangle([180, 50, 219, 349], fill=0)  # 40 wide, 300 tall
    out = prepare_image(image)
    height, width = ink_box(out)
    assert height in (FIT_SIZE - 1, FIT_SIZE)
    assert width <= 5  # 40/300 of 20 pixels, plus anti-aliasing


def test_position_and_canvas_size_do_not_matter():
    centred = prepare_image(drawn_digit(size=(300, 400)))
    corner = prepare_image(drawn_digit(size=(900, 700), offset=(600, 350)))
    assert np.abs(centred.astype(int) - corner).mean() < 3


def test_an_mnist_like_digit_survives_a_round_trip():
    """Upscale an already-prepared digit 10x as dark-on-light: preparing it again gives it back."""
    first = prepare_image(drawn_digit())
    big = Image.fromarray(255 - first).resize((280, 280), Image.Resampling.NEAREST)
    again = prepare_image(big)
    assert np.corrcoef(first.ravel(), again.ravel())[0, 1] > 0.9


def test_photo_like_background_is_removed():
    """Uneven grey paper with noise and a JPEG round trip: the background comes out black."""
    rng = np.random.default_rng(0)
    photo = np.asarray(drawn_digit(ink=60, paper=0), dtype=np.float64)  # ink mask, 60 on 0
    gradient = np.linspace(170, 215, photo.shape[1])[None, :]  # (1, W) uneven lighting
    paper = gradient + rng.normal(0, 4, photo.shape)
    pixels = np.where(photo > 0, 60 + rng.normal(0, 4, photo.shape), paper)
    jpeg = encoded(Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).convert("RGB"),
                   "JPEG", quality=80)
    out = prepare_image(jpeg)
    clean = prepare_image(drawn_digit())
    assert (out == 0).mean() > 0.6  # most of the field is background, as in MNIST
    assert np.corrcoef(out.ravel(), clean.ravel())[0, 1] > 0.9


@pytest.mark.parametrize("strokes", [(0, 0, 0, 255), (255, 255, 255, 255)])
def test_transparent_canvas_with_dark_or_light_strokes(strokes):
    image = Image.new("RGBA", (200, 200), (0, 0, 0, 0))
    ImageDraw.Draw(image).line([(100, 30), (100, 170)], fill=strokes, width=14)
    out = prepare_image(encoded(image))
    height, width = ink_box(out)
    assert height in (FIT_SIZE - 1, FIT_SIZE) and width < height


def test_sixteen_bit_png():
    grey = np.asarray(drawn_digit(ink=235, paper=20), dtype=np.uint16) * 257  # (H, W) 16-bit
    out = prepare_image(encoded(Image.fromarray(grey)))
    assert np.abs(out.astype(int) - prepare_image(drawn_digit(ink=235, paper=20))).max() <= 1


def test_paths_bytes_images_and_arrays_agree(tmp_path):
    image = drawn_digit()
    path = tmp_path / "seven.png"
    image.save(path)
    expected = prepare_image(image)
    for source in (path, str(path), path.read_bytes(), np.asarray(image)):
        np.testing.assert_array_equal(prepare_image(source), expected)


@pytest.mark.parametrize("image", [Image.new("L", (100, 100), 255), Image.new("L", (100, 100), 0),
                                   Image.new("RGB", (100, 100), (128, 128, 128))],
                         ids=["white", "black", "grey"])
def test_blank_images_have_no_ink(image):
    with pytest.raises(PreprocessError, match="no ink"):
        prepare_image(encoded(image))


def test_faint_noise_is_not_ink():
    rng = np.random.default_rng(1)
    noise = (200 + rng.integers(-10, 10, (120, 120))).astype(np.uint8)
    with pytest.raises(PreprocessError, match="no ink"):
        prepare_image(noise)


def test_not_an_image(tmp_path):
    text = tmp_path / "notes.png"
    text.write_text("these are not pixels\n")
    with pytest.raises(PreprocessError, match="not an image"):
        prepare_image(text)
    with pytest.raises(PreprocessError, match="not an image"):
        prepare_image(b"GIF? no, plain bytes")


def test_empty_and_missing_files(tmp_path):
    empty = tmp_path / "empty.png"
    empty.write_bytes(b"")
    with pytest.raises(PreprocessError, match="empty"):
        prepare_image(empty)
    with pytest.raises(PreprocessError, match="empty"):
        prepare_image(b"")
    with pytest.raises(PreprocessError, match="no such file"):
        prepare_image(tmp_path / "missing.png")


@pytest.mark.parametrize("fmt", ["PNG", "JPEG"])
def test_truncated_files(fmt):
    data = encoded(drawn_digit().convert("RGB"), fmt)
    with pytest.raises(PreprocessError, match="truncated|corrupt|unreadable"):
        prepare_image(data[:len(data) // 2])


def test_huge_images_are_refused_before_decoding():
    side = int(MAX_PIXELS**0.5) + 1  # just over the limit
    with pytest.raises(ImageTooLargeError, match="too large"):
        prepare_image(png_header(side, side))  # holds no pixel data: it was never decoded
    with pytest.raises(ImageTooLargeError):
        prepare_image(png_header(100_000, 100_000))  # beyond Pillow's own bomb limit too


def test_errors_are_value_errors_for_the_cli():
    assert issubclass(PreprocessError, ValueError) and issubclass(ImageTooLargeError,
                                                                  PreprocessError)


@pytest.mark.slow
def test_real_mnist_digits_come_back_as_mnist_made_them(mnist_dir):
    """MNIST test digits printed large, dark on a light page, and prepared again match the
    originals pixel for pixel (up to resampling): the same fit and centring as MNIST's."""
    from capsnet.data import load_split

    digits = load_split("mnist", "test", mnist_dir, download=False).images[:100].numpy()
    scale, margin = 8, 40
    correlations = []
    for digit in digits:
        big = Image.fromarray(digit).resize((28 * scale,) * 2, Image.Resampling.BILINEAR)
        big = np.asarray(big, dtype=np.float64)
        page = np.full((28 * scale + 2 * margin,) * 2, 230.0)
        page[margin:-margin, margin:-margin] -= 0.8 * big  # dark ink on light paper
        again = prepare_image(page.astype(np.uint8))
        correlations.append(np.corrcoef(again.ravel(), digit.ravel())[0, 1])
    # A few MNIST digits sit a pixel or more off their own centre of mass; most match closely.
    assert np.mean(correlations) > 0.92 and np.percentile(correlations, 10) > 0.8


# ---- prepare_for_model: the way follows the model -------------------------------------------

EXIF_ORIENTATION = 0x0112
ROTATED_90 = 6  # EXIF: the stored image must be turned 90 degrees clockwise


def colour_picture(size=(50, 40)) -> Image.Image:
    """A red square and a blue bar on dark green: not a digit, and not square."""
    image = Image.new("RGB", size, (0, 60, 0))
    draw = ImageDraw.Draw(image)
    draw.rectangle([5, 5, 20, 20], fill=(230, 20, 20))
    draw.rectangle([25, 30, 45, 35], fill=(20, 20, 230))
    return image


def test_digit_models_get_mnist_digits_on_their_canvas():
    digit = drawn_digit()
    mnist = CapsNetConfig()
    np.testing.assert_array_equal(prepare_for_model(digit, mnist), prepare_image(digit)[None])
    canvas = prepare_for_model(digit, CapsNetConfig(image_size=40))  # (1, 40, 40): affNIST
    assert canvas.shape == (1, 40, 40) and canvas[0, :6].sum() == 0
    np.testing.assert_array_equal(canvas[0, 6:34, 6:34], prepare_image(digit))
    small = prepare_for_model(digit, CapsNetConfig(image_size=20))  # trained on resized MNIST
    assert small.shape == (1, 20, 20)


def test_other_models_get_the_whole_image_resized_like_a_training_file(tmp_path):
    picture = colour_picture()
    path = tmp_path / "picture.png"
    picture.save(path)
    colour = prepare_for_model(path, CapsNetConfig(in_channels=3, image_size=32,
                                                   dataset="folder"))
    np.testing.assert_array_equal(colour, decode_image_file(path, (32, 32), 3))
    assert colour[0].max() > 200 and colour[2].max() > 200  # red and blue stay apart
    fashion = prepare_for_model(path, CapsNetConfig(dataset="fashion-mnist"))  # grey, 28
    np.testing.assert_array_equal(fashion, decode_image_file(path, (28, 28), 1))
    cropped = prepare_for_model(path, CapsNetConfig(in_channels=3, image_size=24,
                                                    uncropped_size=32, dataset="cifar10"))
    np.testing.assert_array_equal(cropped, colour[:, 4:28, 4:28])
    array = np.asarray(picture)  # (H, W, 3)
    same = prepare_for_model(array, CapsNetConfig(in_channels=3, image_size=32, dataset="svhn"))
    np.testing.assert_array_equal(same, colour)


def test_plain_preparation_is_upright_and_flattens_transparency_onto_black():
    picture = colour_picture()
    rgba = picture.convert("RGBA")
    rgba.putalpha(0)  # fully transparent: black, as the folder reader reads it
    assert prepare_plain(encoded(rgba), 16, 3).max() == 0
    exif = Image.Exif()
    exif[EXIF_ORIENTATION] = ROTATED_90
    turned = prepare_plain(encoded(picture.transpose(Image.Transpose.ROTATE_90), exif=exif),
                           40, 3)
    np.testing.assert_array_equal(turned, prepare_plain(picture, 40, 3))


@pytest.mark.parametrize("source, words", [
    (b"plain text", "not an image"),
    (np.zeros((2, 3, 4, 5)), "expected an image array (H, W) or (H, W, 3)"),
    (np.zeros((0, 3)), "no pixels"),
])
def test_plain_preparation_errors_are_one_line(source, words):
    with pytest.raises(PreprocessError, match=re.escape(words)):
        prepare_for_model(source, CapsNetConfig(in_channels=3, image_size=32, dataset="folder"))
