#!/usr/bin/env python3
"""Writes a model directory's model.safetensors as the pytorch_model.bin torch.save writes, with the
Python standard library only (no torch): a zip holding `pytorch_model/data.pkl` (the state dict, an
OrderedDict with its `_metadata`, pickled by Python's own Pickler at protocol 2, each tensor a
`torch._utils._rebuild_tensor_v2` call on a storage named by persistent id) and one stored entry per
storage under `pytorch_model/data/`.

It checks memfit's `--init` reader against a pickle that Python, not memfit, wrote:

    python3 scripts/torch_bin_from_safetensors.py RUN/best OUT_DIR
    memfit predict --model RUN/best --input rows.jsonl --out a.jsonl
    memfit predict --model OUT_DIR --input rows.jsonl --out b.jsonl && cmp a.jsonl b.jsonl

OUT_DIR gets every file of the model directory except model.safetensors, and pytorch_model.bin.
"""

import collections
import json
import pickle
import shutil
import struct
import sys
import types
import zipfile
from pathlib import Path

# torch's names, registered so that the Pickler writes them as globals (it checks they resolve).
torch = types.ModuleType("torch")
torch_utils = types.ModuleType("torch._utils")
sys.modules.update({"torch": torch, "torch._utils": torch_utils})


def _rebuild_tensor_v2(*args):
    raise NotImplementedError("only pickled here, never loaded")


_rebuild_tensor_v2.__module__ = "torch._utils"
torch_utils._rebuild_tensor_v2 = _rebuild_tensor_v2

STORAGES = {}
for dtype, name in {"F32": "FloatStorage", "F16": "HalfStorage", "BF16": "BFloat16Storage"}.items():
    STORAGES[dtype] = type(name, (), {"__module__": "torch"})
    setattr(torch, name, STORAGES[dtype])


class Storage:
    def __init__(self, cls, key, numel):
        self.cls, self.key, self.numel = cls, key, numel


class Tensor:
    def __init__(self, storage, shape):
        self.storage, self.shape = storage, shape

    def __reduce_ex__(self, protocol):
        strides = [1] * len(self.shape)
        for i in range(len(self.shape) - 2, -1, -1):
            strides[i] = strides[i + 1] * self.shape[i + 1]
        args = (self.storage, 0, tuple(self.shape), tuple(strides), False, collections.OrderedDict())
        return (_rebuild_tensor_v2, args)


class TorchPickler(pickle.Pickler):
    def persistent_id(self, obj):
        if isinstance(obj, Storage):
            return ("storage", obj.cls, obj.key, "cpu", obj.numel)
        return None


def read_safetensors(path):
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    header.pop("__metadata__", None)
    body = data[8 + n :]
    for name, info in sorted(header.items()):
        start, end = info["data_offsets"]
        yield name, info["dtype"], info["shape"], body[start:end]


def main(src, out):
    src, out = Path(src), Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.is_file() and f.name != "model.safetensors":
            shutil.copy(f, out / f.name)
    state = collections.OrderedDict()
    state._metadata = collections.OrderedDict({"": {"version": 1}})
    blobs = []
    for key, (name, dtype, shape, raw) in enumerate(read_safetensors(src / "model.safetensors")):
        width = 4 if dtype == "F32" else 2
        storage = Storage(STORAGES[dtype], str(key), len(raw) // width)
        state[name] = Tensor(storage, shape)
        blobs.append(raw)
    with zipfile.ZipFile(out / "pytorch_model.bin", "w", zipfile.ZIP_STORED) as z:
        with z.open("pytorch_model/data.pkl", "w") as f:
            TorchPickler(f, protocol=2).dump(state)
        z.writestr("pytorch_model/byteorder", "little")
        for key, raw in enumerate(blobs):
            z.writestr(f"pytorch_model/data/{key}", raw)
        z.writestr("pytorch_model/version", "3\n")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
