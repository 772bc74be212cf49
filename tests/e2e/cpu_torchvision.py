"""A stand-in for PyTorch's CPU build of torchvision (`torchvision==0.28.0+cpu`, https://download.pytorch.org/whl/cpu),
which the real-engine lane's controller cannot reach (its pip sees PyPI only, whose torchvision is a CUDA build that
cannot load beside torch 2.13.0+cpu: "operator torchvision::nms does not exist").

What needs it: `python -m dynamo.vllm` imports dynamo/vllm/multimodal_utils/models/qwen.py, which imports
transformers' qwen2_vl image processor, which imports `torchvision.transforms.v2.functional` at module level. A text
model never calls it. This wheel makes every `torchvision.*` module importable (each name in it a placeholder that
raises if it is ever called), so the import succeeds and any real use fails loudly. It lives in tests, where a
vendor repository we cannot reach is stood in for; the product names the real requirement (engines.yaml `vllm: cpu:
wheels`), and a user's controller gets the real wheel from PyTorch's CPU index.

    write_wheel(DIR) -> DIR/torchvision-0.28.0+cpu-py3-none-any.whl   (a find-links directory for the controller)
"""
from __future__ import annotations

import base64
import hashlib
import zipfile
from pathlib import Path

VERSION = "0.28.0+cpu"
NAME = f"torchvision-{VERSION}-py3-none-any.whl"

INIT = '''"""Stand-in torchvision (tests/e2e/cpu_torchvision.py): importable, never usable."""
import importlib.abc
import importlib.machinery
import sys
import types

__version__ = "0.28.0+cpu"


class _Placeholder:
    def __init__(self, name):
        self._name = name

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Placeholder(self._name + "." + attr)

    def __call__(self, *a, **k):
        raise RuntimeError(self._name + ": the stand-in torchvision has no implementations (text models only)")

    def __mro_entries__(self, bases):
        return (object,)

    def __repr__(self):
        return "<stand-in " + self._name + ">"


class _Module(types.ModuleType):
    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Placeholder(self.__name__ + "." + attr)


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        if name.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        m = _Module(spec.name)
        m.__path__ = []
        return m

    def exec_module(self, module):
        pass


sys.meta_path.insert(0, _Finder())
'''


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def write_wheel(directory: str | Path) -> Path:
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    info = f"torchvision-{VERSION}.dist-info"
    files = {
        "torchvision/__init__.py": INIT.encode(),
        f"{info}/METADATA": (f"Metadata-Version: 2.1\nName: torchvision\nVersion: {VERSION}\n"
                             "Summary: m3deploy test stand-in for PyTorch's CPU torchvision (import only)\n"
                             "Requires-Dist: torch==2.13.0\n").encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: m3deploy-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "\n".join(_record_line(n, b) for n, b in files.items()) + f"\n{info}/RECORD,,\n"
    out = d / NAME
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        for n, b in files.items():
            zi = zipfile.ZipInfo(n, date_time=(2026, 1, 1, 0, 0, 0))
            z.writestr(zi, b)
        z.writestr(zipfile.ZipInfo(f"{info}/RECORD", date_time=(2026, 1, 1, 0, 0, 0)), record)
    return out
