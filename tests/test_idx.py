"""IDX reading: round trips of files the test helper writes, and every kind of damaged file."""

import gzip
import pickle
import struct
import time

import numpy as np
import pytest

from capsnet.data.idx import IDXError, read_idx
from tests.helpers_idx import write_idx

UINT8_CODE = 0x08


def idx_bytes(type_code: int, dims: tuple[int, ...], payload: bytes = b"") -> bytes:
    """A hand-built IDX file: magic, big-endian uint32 dims, payload."""
    return bytes([0, 0, type_code, len(dims)]) + struct.pack(f">{len(dims)}I", *dims) + payload


@pytest.mark.parametrize("suffix", ["", ".gz"])
@pytest.mark.parametrize("shape", [(5, 4, 3), (7,)])
def test_round_trip_uint8(tmp_path, suffix, shape):
    array = np.arange(np.prod(shape), dtype=np.uint8).reshape(shape)
    path = tmp_path / f"a{suffix}"
    write_idx(path, array)
    result = read_idx(path)
    assert result.dtype == np.uint8 and result.shape == shape
    np.testing.assert_array_equal(result, array)


@pytest.mark.parametrize("dtype", [np.int8, np.int16, np.int32, np.float32, np.float64])
@pytest.mark.parametrize("suffix", ["", ".gz"])
def test_round_trip_multibyte_native_endian(tmp_path, dtype, suffix):
    array = (np.arange(24).reshape(2, 3, 4) - 12).astype(dtype) * 3
    path = tmp_path / f"a{suffix}"
    write_idx(path, array)
    result = read_idx(path)
    assert result.dtype == np.dtype(dtype) and result.dtype.isnative
    np.testing.assert_array_equal(result, array)


def test_gzip_detected_by_magic_not_suffix(tmp_path):
    array = np.arange(6, dtype=np.uint8)
    packed, raw_named_gz = tmp_path / "packed.gz", tmp_path / "raw.gz"
    write_idx(packed, array)
    renamed = tmp_path / "packed_without_suffix"
    packed.rename(renamed)
    raw_named_gz.write_bytes(idx_bytes(UINT8_CODE, (6,), array.tobytes()))
    np.testing.assert_array_equal(read_idx(renamed), array)
    np.testing.assert_array_equal(read_idx(raw_named_gz), array)


def test_big_endian_on_disk(tmp_path):
    path = tmp_path / "a"
    write_idx(path, np.array([1, 2], dtype=np.int16))
    assert path.read_bytes() == idx_bytes(0x0B, (2,), b"\x00\x01\x00\x02")


def write_bytes(tmp_path, content: bytes, name="bad-idx1-ubyte"):
    path = tmp_path / name
    path.write_bytes(content)
    return path


@pytest.mark.parametrize("content, reason", [
    (b"", "empty file"),
    (b"\x00\x00", "truncated IDX header"),
    (b"\x01\x02\x08\x01" + b"\x00" * 8, "not an IDX file"),
    (idx_bytes(0x0A, (2,), b"\x00\x00"), "unknown IDX type code 0x0A"),
    (bytes([0, 0, UINT8_CODE, 0]), "0 dimensions"),
    (bytes([0, 0, UINT8_CODE, 9]) + b"\x00\x00\x00\x01" * 9, "9 dimensions"),
    (idx_bytes(UINT8_CODE, (2, 3))[:-2], "truncated IDX header"),
    (idx_bytes(UINT8_CODE, (2, 0)), "zero dimension"),
    (idx_bytes(UINT8_CODE, (2, 3), b"\x01" * 5), "header claims 6 bytes of data, found 5"),
    (idx_bytes(UINT8_CODE, (2, 3), b"\x01" * 7), "trailing bytes"),
])
@pytest.mark.parametrize("compress", [False, True])
def test_malformed_files_raise_idx_error_naming_the_file(tmp_path, content, reason, compress):
    path = write_bytes(tmp_path, gzip.compress(content) if compress else content)
    with pytest.raises(IDXError, match=reason) as info:
        read_idx(path)
    assert str(info.value).startswith(str(path) + ": ")


def test_absurd_header_refused_before_allocating(tmp_path):
    path = write_bytes(tmp_path, idx_bytes(UINT8_CODE, (100000, 100000, 100000)))
    start = time.perf_counter()
    with pytest.raises(IDXError,
                       match=r"header claims 1000000000000000 bytes, more than the limit") as info:
        read_idx(path)
    assert time.perf_counter() - start < 1.0
    assert path.name in str(info.value)


@pytest.mark.parametrize("type_code, dims", [
    (0x0E, (0xFFFFFFFF,) * 8),
    (UINT8_CODE, (1 << 16,) * 4),  # 2**64 bytes: wraps to 0 in 64-bit arithmetic
])
def test_default_limit_refuses_huge_claims(tmp_path, type_code, dims):
    path = write_bytes(tmp_path, idx_bytes(type_code, dims))
    with pytest.raises(IDXError, match="more than the limit"):
        read_idx(path)


def test_missing_file(tmp_path):
    path = tmp_path / "absent.gz"
    with pytest.raises(IDXError, match="file not found") as info:
        read_idx(path)
    assert str(path) in str(info.value)


def valid_gzip(tmp_path) -> bytes:
    path = tmp_path / "valid.gz"
    rng = np.random.default_rng(0)
    write_idx(path, rng.integers(0, 256, size=(50, 28, 28), dtype=np.uint8))
    return path.read_bytes()


def test_corrupt_gzip(tmp_path):
    content = bytearray(valid_gzip(tmp_path))
    middle = len(content) // 2
    content[middle:middle + 8] = bytes(b ^ 0xFF for b in content[middle:middle + 8])
    path = write_bytes(tmp_path, bytes(content), "corrupt.gz")
    with pytest.raises(IDXError, match="corrupt gzip") as info:
        read_idx(path)
    assert "corrupt.gz" in str(info.value)


def test_truncated_gzip(tmp_path):
    content = valid_gzip(tmp_path)
    path = write_bytes(tmp_path, content[: len(content) * 2 // 3], "truncated.gz")
    with pytest.raises(IDXError, match="truncated.gz"):
        read_idx(path)


def test_bad_gzip_crc(tmp_path):
    content = bytearray(valid_gzip(tmp_path))
    crc_offset = len(content) - 8  # gzip trailer: CRC32, then ISIZE
    content[crc_offset] ^= 0xFF
    path = write_bytes(tmp_path, bytes(content), "badcrc.gz")
    with pytest.raises(IDXError, match="badcrc.gz: corrupt gzip"):
        read_idx(path)


def test_gzip_magic_followed_by_garbage(tmp_path):
    path = write_bytes(tmp_path, b"\x1f\x8b" + b"garbage" * 10, "garbage.gz")
    with pytest.raises(IDXError, match="garbage.gz"):
        read_idx(path)


def test_idx_error_is_value_error_and_pickles():
    error = IDXError("data/foo.gz", "truncated IDX file")
    assert isinstance(error, ValueError)
    assert str(pickle.loads(pickle.dumps(error))) == "data/foo.gz: truncated IDX file"
