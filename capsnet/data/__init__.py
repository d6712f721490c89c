"""Data: IDX files, CIFAR-10, SVHN and image folders; dataset sources (lookup and
download) and tensor datasets."""

from capsnet.data.datasets import (
    DATASET_NAMES,
    ImageDataset,
    load_cifar10,
    load_dataset,
    load_split,
    load_svhn,
)
from capsnet.data.folder import FolderDatasetError, format_skipped_warning, load_folder_dataset
from capsnet.data.idx import DatasetFileError, IDXError, read_idx
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
    "DATASET_NAMES",
    "DataNotFoundError",
    "DatasetFileError",
    "DatasetSpec",
    "FolderDatasetError",
    "IDXError",
    "ImageDataset",
    "default_cache_dir",
    "download_dataset",
    "file_md5",
    "format_skipped_warning",
    "load_cifar10",
    "load_dataset",
    "load_folder_dataset",
    "load_split",
    "load_svhn",
    "locate_dataset",
    "read_idx",
]
