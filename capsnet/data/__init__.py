"""Data: IDX files, dataset sources (lookup and download) and tensor datasets."""

from capsnet.data.datasets import ImageDataset, load_dataset, load_split
from capsnet.data.idx import IDXError, read_idx, write_idx
from capsnet.data.sources import (
    DATASETS,
    ChecksumError,
    DataNotFoundError,
    DatasetSpec,
    default_cache_dir,
    download_dataset,
    file_md5,
    locate_dataset,
)

__all__ = [
    "ChecksumError",
    "DATASETS",
    "DataNotFoundError",
    "DatasetSpec",
    "IDXError",
    "ImageDataset",
    "default_cache_dir",
    "download_dataset",
    "file_md5",
    "load_dataset",
    "load_split",
    "locate_dataset",
    "read_idx",
    "write_idx",
]
