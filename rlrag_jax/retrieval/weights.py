"""Streaming reads of Hugging Face weight files as numpy, without torch.

`open_weights(folder)` returns a `WeightReader`: `names()` lists the tensors and `get(name)` reads
one tensor at a time, so a converter can place each on the device before reading the next.

Formats, in order of preference:
  model.safetensors, model.safetensors.index.json (sharded)       read with `safetensors`
  pytorch_model.bin, pytorch_model.bin.index.json (sharded)       read with a restricted unpickler

A torch `.bin` is a zip archive holding `data.pkl` (the state dict with tensors pickled as
references to storages) and one raw little-endian file per storage under `data/`. We unpickle it
with an allow-list of globals (OrderedDict, the tensor/parameter rebuild functions and the typed
storage classes), so no torch import is needed and arbitrary code in a pickle is refused. Storages
are read from the zip only when a tensor is requested. The legacy pre-1.6 (non-zip) format is
refused with a message that says how to convert it.
"""
from __future__ import annotations

import collections
import json
import os
import pathlib
import pickle
import zipfile
from typing import Callable

import ml_dtypes
import numpy as np

SAFETENSORS = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
TORCH_BIN = "pytorch_model.bin"
TORCH_BIN_INDEX = "pytorch_model.bin.index.json"

# torch storage class name -> numpy dtype of one element.
_STORAGE_DTYPES = {
    "FloatStorage": np.float32, "DoubleStorage": np.float64, "HalfStorage": np.float16,
    "BFloat16Storage": ml_dtypes.bfloat16, "LongStorage": np.int64, "IntStorage": np.int32,
    "ShortStorage": np.int16, "CharStorage": np.int8, "ByteStorage": np.uint8,
    "BoolStorage": np.bool_,
}


class WeightReader:
  """Name -> numpy tensor, read lazily from one or more shards."""

  def __init__(self, names: dict, loaders: dict, files: list):
    self._where = names        # tensor name -> shard path
    self._loaders = loaders    # shard path -> callable(name) -> np.ndarray
    self.files = files         # shard paths, for error messages

  def names(self) -> list:
    return list(self._where)

  def file_of(self, name: str) -> str:
    return self._where[name]

  def __contains__(self, name: str) -> bool:
    return name in self._where

  def get(self, name: str) -> np.ndarray:
    if name not in self._where:
      raise KeyError(f"tensor {name!r} not found in {', '.join(self.files)}")
    return self._loaders[self._where[name]](name)


def open_weights(folder: str | os.PathLike) -> WeightReader:
  """Finds the weight files of a checkpoint folder; safetensors first, then torch .bin."""
  folder = pathlib.Path(folder)
  if (folder / SAFETENSORS).is_file():
    return _reader_from_shards([folder / SAFETENSORS], _safetensors_shard)
  if (folder / SAFETENSORS_INDEX).is_file():
    return _reader_from_shards(_index_shards(folder / SAFETENSORS_INDEX), _safetensors_shard)
  if (folder / TORCH_BIN).is_file():
    return _reader_from_shards([folder / TORCH_BIN], _torch_shard)
  if (folder / TORCH_BIN_INDEX).is_file():
    return _reader_from_shards(_index_shards(folder / TORCH_BIN_INDEX), _torch_shard)
  raise FileNotFoundError(
      f"{folder}: no weights found; expected one of {SAFETENSORS}, {SAFETENSORS_INDEX}, "
      f"{TORCH_BIN}, {TORCH_BIN_INDEX}")


def _index_shards(index_path: pathlib.Path) -> list:
  try:
    weight_map = json.loads(index_path.read_text())["weight_map"]
  except (json.JSONDecodeError, KeyError) as e:
    raise ValueError(f"{index_path}: expected JSON with a 'weight_map' field ({e})") from None
  shards = sorted(set(weight_map.values()))
  missing = [s for s in shards if not (index_path.parent / s).is_file()]
  if missing:
    raise FileNotFoundError(f"{index_path}: shard file(s) listed in 'weight_map' are missing: "
                            f"{missing}")
  return [index_path.parent / s for s in shards]


def _reader_from_shards(paths: list, open_shard: Callable) -> WeightReader:
  where, loaders = {}, {}
  for p in paths:
    names, load = open_shard(p)
    loaders[str(p)] = load
    for n in names:
      where[n] = str(p)
  return WeightReader(where, loaders, [str(p) for p in paths])


# ------------------------------------------------------------------------------- safetensors
def _safetensors_shard(path: pathlib.Path):
  from safetensors import safe_open  # pylint: disable=g-import-not-at-top
  try:
    with safe_open(str(path), framework="np") as f:
      names = list(f.keys())
  except Exception as e:  # safetensors raises its own error types
    raise ValueError(f"{path}: not a readable safetensors file ({e})") from None

  def load(name):
    with safe_open(str(path), framework="np") as f:
      return f.get_tensor(name)
  return names, load


# ------------------------------------------------------------------------------- torch .bin
class _StorageRef:
  """A storage of a torch zip checkpoint: the zip entry and the element dtype."""

  def __init__(self, archive: "_TorchZip", key: str, dtype):
    self.archive, self.key, self.dtype = archive, key, dtype

  def array(self) -> np.ndarray:
    return self.archive.storage(self.key, self.dtype)


class _LazyTensor:
  """What `_rebuild_tensor_v2` returns: materialised only when the name is requested."""

  def __init__(self, storage: _StorageRef, offset: int, size: tuple, stride: tuple):
    self.storage, self.offset, self.size, self.stride = storage, offset, tuple(size), tuple(stride)

  def numpy(self) -> np.ndarray:
    flat = self.storage.array()
    if not self.size:
      return flat[self.offset].copy()
    item = flat.dtype.itemsize
    view = np.lib.stride_tricks.as_strided(
        flat[self.offset:], shape=self.size, strides=tuple(s * item for s in self.stride))
    return np.ascontiguousarray(view)


def _rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad=False,
                       backward_hooks=None, metadata=None):
  del requires_grad, backward_hooks, metadata
  return _LazyTensor(storage, storage_offset, size, stride)


def _rebuild_parameter(data, requires_grad=False, backward_hooks=None):
  del requires_grad, backward_hooks
  return data


class _StorageType:
  def __init__(self, name: str):
    self.name = name


class _TorchZip:
  """Reads storages of a torch zip checkpoint on demand."""

  def __init__(self, path: pathlib.Path):
    self.path = path
    if not zipfile.is_zipfile(path):
      raise ValueError(
          f"{path}: not a zip-format torch checkpoint (torch < 1.6 legacy pickle?). Convert it once "
          "to safetensors, e.g. `transformers` save_pretrained(..., safe_serialization=True), or "
          "re-save it with torch >= 1.6.")
    with zipfile.ZipFile(path) as z:
      pkl = [n for n in z.namelist() if n.endswith("/data.pkl") or n == "data.pkl"]
      if len(pkl) != 1:
        raise ValueError(f"{path}: expected exactly one data.pkl in the archive, found {pkl}")
      self.prefix = pkl[0][: -len("data.pkl")]
      self.pickle_bytes = z.read(pkl[0])
      byteorder = self.prefix + "byteorder"
      if byteorder in z.namelist() and z.read(byteorder).strip() != b"little":
        raise ValueError(f"{path}: big-endian torch checkpoints are not supported")

  def storage(self, key: str, dtype) -> np.ndarray:
    with zipfile.ZipFile(self.path) as z:
      raw = z.read(f"{self.prefix}data/{key}")
    return np.frombuffer(raw, dtype=dtype)


class _RestrictedUnpickler(pickle.Unpickler):
  """Allows only the globals a plain state dict needs; everything else is refused."""

  def __init__(self, archive: _TorchZip):
    import io  # pylint: disable=g-import-not-at-top
    super().__init__(io.BytesIO(archive.pickle_bytes))
    self.archive = archive

  def find_class(self, module, name):
    if (module, name) == ("collections", "OrderedDict"):
      return collections.OrderedDict
    if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
      return _rebuild_tensor_v2
    if (module, name) == ("torch._utils", "_rebuild_parameter"):
      return _rebuild_parameter
    if module == "torch" and name in _STORAGE_DTYPES:
      return _StorageType(name)
    raise pickle.UnpicklingError(
        f"{self.archive.path}: refusing to unpickle global {module}.{name}; only plain tensor "
        "state dicts are read without torch (convert the checkpoint to safetensors)")

  def persistent_load(self, pid):
    # ('storage', storage_type, key, location, numel)
    if not (isinstance(pid, tuple) and pid and pid[0] == "storage"):
      raise pickle.UnpicklingError(f"{self.archive.path}: unexpected persistent id {pid!r}")
    storage_type, key = pid[1], pid[2]
    if not isinstance(storage_type, _StorageType):
      raise pickle.UnpicklingError(f"{self.archive.path}: unsupported storage type {storage_type!r}")
    return _StorageRef(self.archive, str(key), _STORAGE_DTYPES[storage_type.name])


def _torch_shard(path: pathlib.Path):
  archive = _TorchZip(path)
  state = _RestrictedUnpickler(archive).load()
  if not isinstance(state, dict):
    raise ValueError(f"{path}: expected a state dict (name -> tensor), found {type(state).__name__}")
  tensors = {k: v for k, v in state.items() if isinstance(v, _LazyTensor)}

  def load(name):
    return tensors[name].numpy()
  return list(tensors), load

