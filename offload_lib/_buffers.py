"""Turn user buffers into (address, size, dtype) without copying.

Host memory: anything with ``__array_interface__`` (numpy), torch CPU tensors (``data_ptr``),
and any object exporting the buffer protocol (bytearray, memoryview, array.array, ...).
GPU memory: torch CUDA tensors, anything with ``__cuda_array_interface__`` (cupy, numba) and
DLPack exporters on a CUDA device; neither cupy nor torch is imported unless the object
came from it. A GPU buffer carries its device and the CUDA stream its producer uses.
"""
from __future__ import annotations

import ctypes
import math
import re
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
    device: int = -1  # CUDA device ordinal; -1: host memory
    stream: int = 0  # GPU buffers: the CUDA stream the collective is ordered on

    @property
    def on_gpu(self) -> bool:
        return self.device >= 0

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


_UINTPTR = ffi.typeof("uintptr_t")
# A small op's whole call costs a few microseconds: describing a numpy array goes the short
# way (the namedtuple's own __new__ handles defaults at ~3x the cost; dtype.str builds a
# string each time).
_new_buffer = tuple.__new__
_dtype_str: dict[np.dtype, str] = {}


def _address(obj: Any) -> int:
    # from_buffer is the cheapest way to an address (~0.3 us against ~1 us for .ctypes).
    return int(ffi.cast(_UINTPTR, ffi.from_buffer(obj)))


def _refuse_objects(dtype: np.dtype, name: str) -> None:
    """Elements that are Python object references (or hold one; numpy's variable-width
    StringDType too) are pointers into this process: sent to a peer they are garbage, and
    reading them crashes it."""
    if dtype.hasobject:
        raise InvalidArgument(
            f"{name} holds Python objects or other references (dtype {dtype}): collectives "
            f"move plain numbers or bytes; convert it first, e.g. np.asarray({name}, "
            "dtype=np.float64)")


# PEP 3118 field names (":name:") may contain any letter; the type codes are outside them.
_FIELD_NAME = re.compile(r":[^:]*:")


def _from_ndarray(a: np.ndarray, writable: bool, name: str) -> Buffer:
    dt = a.dtype
    if dt.hasobject:
        _refuse_objects(dt, name)
    flags = a.flags
    if not flags.c_contiguous:
        raise InvalidArgument(f"{name} is not C-contiguous: pass np.ascontiguousarray({name})")
    if writable and not flags.writeable:
        raise InvalidArgument(f"{name} is read-only: the collective writes into it")
    nbytes = a.nbytes
    dtype = _dtype_str.get(dt)
    if dtype is None:
        dtype = _dtype_str.setdefault(dt, dt.str)
    return _new_buffer(Buffer, (_address(a) if nbytes else 0, nbytes, dt.itemsize, dtype, a,
                                -1, 0))


def _from_torch(t: Any, writable: bool, name: str) -> Buffer:
    if t.device.type not in ("cpu", "cuda"):
        raise InvalidArgument(
            f"{name} is a torch tensor on {t.device}: pass a CPU or CUDA tensor"
        )
    if not t.is_contiguous():
        raise InvalidArgument(f"{name} is not contiguous: pass {name}.contiguous()")
    if writable and t.requires_grad and t.is_leaf:
        raise InvalidArgument(f"{name} requires grad: pass a tensor created under torch.no_grad()")
    itemsize = t.element_size()
    dtype = str(t.dtype).removeprefix("torch.")
    buf = Buffer(t.data_ptr(), t.numel() * itemsize, itemsize, _TORCH_DTYPES.get(dtype, dtype), t)
    if t.device.type == "cuda":
        import sys

        # torch is imported: the user passed one of its tensors. Order on its current stream.
        stream = int(sys.modules["torch"].cuda.current_stream(t.device).cuda_stream)
        return buf._replace(device=int(t.device.index or 0), stream=stream or _LEGACY_STREAM)
    return buf


def _from_buffer_protocol(obj: Any, writable: bool, name: str) -> Buffer:
    try:
        view = memoryview(obj)
    except TypeError:
        raise InvalidArgument(
            f"{name} ({type(obj).__name__}) does not expose memory: pass a numpy array, "
            "a torch CPU tensor or an object with the buffer protocol"
        ) from None
    if "O" in _FIELD_NAME.sub("", view.format):  # "O": a PyObject pointer (PEP 3118)
        raise InvalidArgument(
            f"{name} holds Python objects (buffer format {view.format!r}): collectives move "
            "plain numbers or bytes")
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
    gpu = gpu_buffer(obj, writable, name)
    if gpu is not None:
        return gpu
    if hasattr(obj, "__array_interface__") and not hasattr(obj, "data_ptr"):
        return _from_ndarray(np.asarray(obj), writable, name)
    if hasattr(obj, "data_ptr") and hasattr(obj, "is_contiguous"):
        return _from_torch(obj, writable, name)
    return _from_buffer_protocol(obj, writable, name)


# --------------------------------------------------------------------------------------------
# GPU memory

_LEGACY_STREAM = 1  # CU_STREAM_LEGACY, and the CUDA array interface's "default stream"
_DL_CUDA, _DL_CUDA_MANAGED = 2, 13  # DLDeviceType


def _contiguous_strides(shape: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    out, step = [], itemsize
    for dim in reversed(shape):
        out.append(step)
        step *= max(int(dim), 1)
    return tuple(reversed(out))


def _from_cai(obj: Any, writable: bool, name: str) -> Buffer:
    cai = obj.__cuda_array_interface__
    shape = tuple(int(d) for d in cai["shape"])
    dt = np.dtype(cai["typestr"])
    _refuse_objects(dt, name)
    strides = cai.get("strides")
    if strides is not None and math.prod(shape) > 1 and \
            tuple(strides) != _contiguous_strides(shape, dt.itemsize):
        raise InvalidArgument(f"{name} is not C-contiguous: pass a contiguous copy")
    ptr, readonly = cai["data"]
    if writable and readonly:
        raise InvalidArgument(f"{name} is read-only: the collective writes into it")
    nbytes = math.prod(shape) * dt.itemsize
    device = _device_ordinal(int(ptr)) if nbytes else 0
    stream = cai.get("stream")  # version 3: the producer's stream; None: nothing to order on
    return Buffer(int(ptr) if nbytes else 0, nbytes, dt.itemsize, dt.str, obj, device,
                  int(stream) if stream else _LEGACY_STREAM)


def _device_ordinal(ptr: int) -> int:
    from offload_lib import _cuda

    return _cuda.driver().device_of(ptr)[1]


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


_DL_CODES = {0: "i", 1: "u", 2: "f", 5: "c"}  # kDLInt, kDLUInt, kDLFloat, kDLComplex; 4: bfloat


def dlpack_tensor(capsule: Any) -> tuple[int, tuple[int, ...], int, str, int, int]:
    """(address, shape, itemsize, dtype, device type, device id) of a "dltensor" capsule,
    which stays owned by the capsule (its deleter runs when the capsule goes)."""
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    t = _DLTensor.from_address(get(capsule, b"dltensor"))
    shape = tuple(int(t.shape[i]) for i in range(t.ndim))
    itemsize = t.dtype.bits // 8 * t.dtype.lanes
    if t.dtype.code == 4 and t.dtype.bits == 16:
        dtype = "bfloat16"
    elif t.dtype.code in _DL_CODES and t.dtype.lanes == 1:
        dtype = np.dtype(f"{_DL_CODES[t.dtype.code]}{itemsize}").str
    else:
        dtype = f"raw{itemsize}"
    if t.strides and math.prod(shape) > 1:
        strides = tuple(int(t.strides[i]) * itemsize for i in range(t.ndim))
        if strides != _contiguous_strides(shape, itemsize):
            raise InvalidArgument("a DLPack tensor must be C-contiguous: pass a contiguous copy")
    return ((t.data or 0) + t.byte_offset, shape, itemsize, dtype, t.device.device_type,
            t.device.device_id)


def _from_dlpack(obj: Any, name: str) -> Buffer:
    # Ask the producer to order its work before the legacy default stream, which the
    # collective then uses as the user's stream.
    capsule = obj.__dlpack__(stream=_LEGACY_STREAM)
    addr, shape, itemsize, dtype, _kind, device = dlpack_tensor(capsule)
    nbytes = math.prod(shape) * itemsize
    return Buffer(addr if nbytes else 0, nbytes, itemsize, dtype, (obj, capsule), device,
                  _LEGACY_STREAM)


def gpu_buffer(obj: Any, writable: bool, name: str) -> Buffer | None:
    """``obj`` as a GPU Buffer, or None if it is not GPU memory."""
    if getattr(obj, "is_cuda", False) and hasattr(obj, "data_ptr"):
        return _from_torch(obj, writable, name)
    try:
        has_cai = hasattr(obj, "__cuda_array_interface__")
    except Exception:  # some exporters raise other errors for host memory
        has_cai = False
    if has_cai:
        return _from_cai(obj, writable, name)
    dev = getattr(obj, "__dlpack_device__", None)
    if dev is not None and not hasattr(obj, "__array_interface__"):
        kind, _ = dev()
        if int(kind) in (_DL_CUDA, _DL_CUDA_MANAGED):
            return _from_dlpack(obj, name)
    return None
