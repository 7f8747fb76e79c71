"""A GGUF file's metadata and tensor views, read in one pass.

The layout (llama.cpp's GGUF specification, versions 2 and 3): the magic
`GGUF`, a uint32 version, uint64 counts of tensors and of metadata
entries; each entry a string key, a uint32 value type and its value
(strings as a uint64 length and UTF-8 bytes, arrays as an element type, a
uint64 count and the elements); each tensor's info (name, uint32 number
of dims, uint64 dims fastest first, uint32 ggml type, uint64 offset);
then, aligned to `general.alignment` (32 by default), the tensor data.
Integers are little-endian, or big-endian in files written for such hosts
(told apart, as llama.cpp's readers do, by a version whose low 16 bits
read zero).

:class:`GGUFFile` offers what :mod:`leakjax.models.gguf` reads from the
`gguf` package's `GGUFReader` (`fields[key].contents()`, and `tensors`
with `name`, `tensor_type`, `shape` and `data` in the same dtypes and
shapes), but parses the metadata with `struct` over the memory-mapped
file instead of one NumPy view per value: a vocabulary of tens of
thousands of tokens and merges then takes a fraction of a second instead
of seconds. The tensor data stay memory-mapped views.
"""

from __future__ import annotations

import dataclasses
import mmap
import os
import struct
from typing import Any

import numpy as np

from leakjax.errors import LeakjaxError

_MAGIC = b'GGUF'
_VERSIONS = (2, 3)
_DEFAULT_ALIGNMENT = 32
_STRING, _ARRAY = 8, 9
# GGUF value type -> struct format (without the byte order).
_SCALARS = {
  0: 'B',
  1: 'b',
  2: 'H',
  3: 'h',
  4: 'I',
  5: 'i',
  6: 'f',
  7: '?',
  10: 'Q',
  11: 'q',
  12: 'd',
}
_UINT32 = 4


@dataclasses.dataclass(frozen=True)
class Field:
  """One metadata entry: its value (Python scalars, str, lists) and the
  GGUF value type of the entry (9 for arrays)."""

  value: Any
  type: int

  def contents(self) -> Any:
    return self.value


@dataclasses.dataclass(frozen=True)
class Tensor:
  """One tensor: `shape` holds the dims fastest first (GGUF order); `data`
  is `[reversed dims]` of the element type for float and integer tensors,
  and the raw bytes `[rows..., bytes per row]` for quantised ones."""

  name: str
  tensor_type: Any  # gguf.GGMLQuantizationType
  shape: np.ndarray
  data: np.ndarray


class GGUFFile:
  """The metadata (`fields`, in file order) and tensors of a GGUF file.

  Raises:
    LeakjaxError: not a GGUF file, an unsupported version, a truncated
      or inconsistent file.
  """

  def __init__(self, path: str | os.PathLike):
    with open(path, 'rb') as f:
      try:
        self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
      except ValueError:  # an empty file
        raise LeakjaxError(f'{path} is empty, not a GGUF file') from None
    self.fields: dict[str, Field] = {}
    self.tensors: list[Tensor] = []
    try:
      self._parse()
    except (struct.error, UnicodeDecodeError, IndexError) as e:
      raise LeakjaxError(
        f'{path} is truncated or corrupt ({type(e).__name__}: {e})',
        'download or convert the file again',
      ) from None

  # ----------------------------------------------------------- parsing
  def _parse(self) -> None:
    buf = self._map
    if buf[:4] != _MAGIC:
      raise LeakjaxError('the file does not start with the GGUF magic')
    (version,) = struct.unpack_from('<I', buf, 4)
    self._order = '<'
    if version & 0xFFFF == 0:  # written on a host of the other byte order
      self._order = '>'
      (version,) = struct.unpack_from('>I', buf, 4)
    if version not in _VERSIONS:
      raise LeakjaxError(
        f'GGUF version {version}; leakjax reads versions'
        f' {", ".join(map(str, _VERSIONS))}'
      )
    tensor_count, kv_count = struct.unpack_from(self._order + 'QQ', buf, 8)
    self._offset = 24
    for _ in range(kv_count):
      key = self._string()
      kind = self._scalar('I')
      if key in self.fields:
        raise LeakjaxError(f'the metadata key {key!r} appears twice')
      self.fields[key] = Field(self._value(kind), kind)
    infos = [self._tensor_info() for _ in range(tensor_count)]
    alignment = _DEFAULT_ALIGNMENT
    if 'general.alignment' in self.fields:
      field = self.fields['general.alignment']
      alignment = field.value
      if field.type != _UINT32 or alignment <= 0 or alignment & (alignment - 1):
        raise LeakjaxError(
          f'general.alignment must be a uint32 power of two, got {alignment!r}'
        )
    start = -(-self._offset // alignment) * alignment
    names = set()
    for name, dims, raw, offset in infos:
      if name in names:
        raise LeakjaxError(f'the tensor {name!r} appears twice')
      names.add(name)
      self.tensors.append(self._tensor(name, dims, raw, start + offset))

  def _scalar(self, fmt: str) -> Any:
    (value,) = struct.unpack_from(self._order + fmt, self._map, self._offset)
    self._offset += struct.calcsize(fmt)
    return value

  def _string(self) -> str:
    n = self._scalar('Q')
    end = self._offset + n
    if end > len(self._map):
      raise IndexError(f'a string of {n} bytes runs past the end')
    value = str(self._map[self._offset : end], 'utf-8')
    self._offset = end
    return value

  def _value(self, kind: int) -> Any:
    if kind == _STRING:
      return self._string()
    if kind == _ARRAY:
      item = self._scalar('I')
      count = self._scalar('Q')
      if item in _SCALARS:  # one NumPy read of the whole array
        dtype = np.dtype(self._order + _SCALARS[item])
        end = self._offset + count * dtype.itemsize
        if end > len(self._map):
          raise IndexError(f'an array of {count} values runs past the end')
        values = np.frombuffer(self._map, dtype, count, self._offset)
        self._offset = end
        return values.tolist()
      return [self._value(item) for _ in range(count)]
    if kind not in _SCALARS:
      raise LeakjaxError(f'unknown GGUF value type {kind}')
    return self._scalar(_SCALARS[kind])

  def _tensor_info(self) -> tuple[str, np.ndarray, int, int]:
    name = self._string()
    n_dims = self._scalar('I')
    dims = np.array([self._scalar('Q') for _ in range(n_dims)], np.uint64)
    raw = self._scalar('I')
    offset = self._scalar('Q')
    return name, dims, raw, offset

  def _tensor(self, name: str, dims: np.ndarray, raw: int, at: int) -> Tensor:
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType  # pylint: disable=g-import-not-at-top
    from gguf.quants import quant_shape_to_byte_shape  # pylint: disable=g-import-not-at-top

    try:
      kind = GGMLQuantizationType(raw)
    except ValueError:
      raise LeakjaxError(
        f'tensor {name!r} has unknown ggml type {raw}'
      ) from None
    count = int(np.prod(dims))
    shape = tuple(int(d) for d in reversed(dims.tolist()))
    element = _ELEMENTS.get(kind.name)
    if element is None:  # quantised: its raw bytes, one row of blocks a row
      block, size = GGML_QUANT_SIZES[kind]
      dtype, count = np.dtype(np.uint8), count * size // block
      shape = quant_shape_to_byte_shape(shape, kind)
    else:
      dtype = np.dtype(self._order + element)
    if at + count * dtype.itemsize > len(self._map):
      raise IndexError(f'the data of tensor {name!r} run past the end')
    data = np.frombuffer(self._map, dtype, count, at).reshape(shape)
    return Tensor(name=name, tensor_type=kind, shape=dims, data=data)


# Unquantised ggml types -> NumPy element type (GGUFReader's choice).
_ELEMENTS = {
  'F16': 'f2',
  'F32': 'f4',
  'F64': 'f8',
  'I8': 'i1',
  'I16': 'i2',
  'I32': 'i4',
  'I64': 'i8',
}


__all__ = ['Field', 'GGUFFile', 'Tensor']
