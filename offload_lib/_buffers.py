"""Turn user buffers into (address, size, dtype) without copying.

Accepted: anything with ``__array_interface__`` (numpy), torch CPU tensors (``data_ptr``),
and any object exporting the buffer protocol (bytearray, memoryview, array.array, ...).
"""
from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from offload_lib._native import ffi
from offload_lib.errors import InvalidArgument


class Buffer(NamedTuple):
    addr: int
    nbytes: int
    itemsize: int
    dtype: str  # numpy's dtype.str ("<f4"), or a name numpy lacks ("bfloat16")
    obj: Any  # keeps the memory alive while an op uses it

    @property
    def count(self) -> int:
        return self.nbytes // self.itemsize if self.itemsize else 0

    @property
    def dtype_name(self) -> str:
        try:
            return np.dtype(self.dtype).name
        except TypeError:
            return self.dtype

    def overlaps(self, other: Buffer) -> bool:
        return (
            self.nbytes > 0
            and other.nbytes > 0
            and self.addr < other.addr + other.nbytes
            and other.addr < self.addr + self.nbytes
        )


# torch dtypes by the numpy dtype.str they match; bfloat16 has no numpy twin.
_TORCH_DTYPES = {
    "float32": "<f4", "float64": "<f8", "float16": "<f2", "int8": "|i1", "uint8": "|u1",
    "int16": "<i2", "int32": "<i4", "int64": "<i8", "bool": "|b1", "complex64": "<c8",
    "complex128": "<c16",
}


def _address(obj: Any) -> int:
    # from_buffer is the cheapest way to an address (~0.3 us against ~1 us for .ctypes).
    return int(ffi.cast("uintptr_t", ffi.from_buffer(obj)))


def _from_ndarray(a: np.ndarray, writable: bool, name: str) -> Buffer:
    if not a.flags.c_contiguous:
        raise InvalidArgument(f"{name} is not C-contiguous: pass np.ascontiguousarray({name})")
    if writable and not a.flags.writeable:
        raise InvalidArgument(f"{name} is read-only: the collective writes into it")
    return Buffer(_address(a) if a.nbytes else 0, a.nbytes, a.itemsize, a.dtype.str, a)


def _from_torch(t: Any, writable: bool, name: str) -> Buffer:
    if t.device.type != "cpu":
        raise InvalidArgument(
            f"{name} is a torch tensor on {t.device}: only CPU tensors are supported by this build"
        )
    if not t.is_contiguous():
        raise InvalidArgument(f"{name} is not contiguous: pass {name}.contiguous()")
    if writable and t.requires_grad and t.is_leaf:
        raise InvalidArgument(f"{name} requires grad: pass a tensor created under torch.no_grad()")
    itemsize = t.element_size()
    name = str(t.dtype).removeprefix("torch.")
    return Buffer(t.data_ptr(), t.numel() * itemsize, itemsize, _TORCH_DTYPES.get(name, name), t)


def _from_buffer_protocol(obj: Any, writable: bool, name: str) -> Buffer:
    try:
        view = memoryview(obj)
    except TypeError:
        raise InvalidArgument(
            f"{name} ({type(obj).__name__}) does not expose memory: pass a numpy array, "
            "a torch CPU tensor or an object with the buffer protocol"
        ) from None
    if not view.c_contiguous:
        raise InvalidArgument(f"{name} is not C-contiguous")
    if writable and view.readonly:
        raise InvalidArgument(f"{name} is read-only: the collective writes into it")
    try:
        dtype = np.dtype(view.format).str
    except TypeError:
        dtype = f"raw{view.itemsize}"
    addr = _address(view) if view.nbytes else 0
    return Buffer(addr, view.nbytes, view.itemsize, dtype, view)


def as_buffer(obj: Any, *, writable: bool, name: str) -> Buffer:
    """Describe ``obj``'s memory; raise InvalidArgument saying what to pass instead."""
    if isinstance(obj, np.ndarray):
        return _from_ndarray(obj, writable, name)
    if hasattr(obj, "__cuda_array_interface__"):
        raise InvalidArgument(f"{name} is a GPU array: GPU buffers are not supported by this build")
    if hasattr(obj, "__array_interface__") and not hasattr(obj, "data_ptr"):
        return _from_ndarray(np.asarray(obj), writable, name)
    if hasattr(obj, "data_ptr") and hasattr(obj, "is_contiguous"):
        return _from_torch(obj, writable, name)
    return _from_buffer_protocol(obj, writable, name)
