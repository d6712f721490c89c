"""The top-level API: every name in capsnet.__all__ resolves; `import capsnet` is light and
never pulls in the applications' packages (flask, matplotlib)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import capsnet

REPO = Path(__file__).resolve().parents[1]
APPLICATION_PACKAGES = ("flask", "matplotlib")


def imported_after(code: str) -> set[str]:
    """Top-level packages imported in a fresh interpreter after running ``code``."""
    report = "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))"
    script = f"import sys, json\n{code}\n{report}"
    out = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True,
                         text=True, check=True,
                         env={"PYTHONPATH": str(REPO), "PATH": "", "OMP_NUM_THREADS": "1"})
    return set(json.loads(out.stdout.splitlines()[-1]))


def test_import_capsnet_imports_nothing_heavy():
    assert not {"torch", *APPLICATION_PACKAGES} & imported_after("import capsnet")


def test_every_public_name_resolves_without_the_applications():
    loaded = imported_after("import capsnet\nfor name in capsnet.__all__: getattr(capsnet, name)")
    assert "torch" in loaded and not set(APPLICATION_PACKAGES) & loaded


@pytest.mark.parametrize("name", capsnet.__all__)
def test_public_name_is_listed_and_is_what_its_module_defines(name):
    value = getattr(capsnet, name)
    assert name in dir(capsnet)
    if name != "__version__":
        assert value.__name__ == name


def test_the_issue_names_are_all_there():
    for name in ("CapsNet", "CNNBaseline", "EfficientCapsNet", "EMCapsNet", "CapsNetConfig",
                 "EfficientCapsNetConfig", "EMCapsNetConfig", "squash", "PrimaryCaps",
                 "DigitCaps", "DynamicRouter", "EMRouter", "Decoder", "margin_loss",
                 "reconstruction_loss", "spread_loss", "load_model", "create_model",
                 "list_models", "predict", "to_model_input", "ImageDataset", "fit"):
        assert name in capsnet.__all__


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="module 'capsnet' has no attribute 'nope'"):
        capsnet.nope  # noqa: B018
