"""The few CUDA driver calls GPU buffers need, through ctypes on libcuda.so.1.

Loaded only when a GPU buffer reaches a collective: the driver library ships with the GPU
driver, so neither cupy nor torch is imported for it. Names and constants are those of the
CUDA 12/13 ``cuda.h`` (``*_v2`` entry points where the header maps a name to one).

:func:`driver` returns the process's :class:`Driver`; tests install a stand-in with
:func:`use` (tests/fake_cuda.py) that implements the same methods over host memory.
"""
from __future__ import annotations

import ctypes
import threading
from contextlib import contextmanager
from typing import Any, Iterator, NamedTuple

from offload_lib.errors import OffloadError

# cuda.h
CU_POINTER_ATTRIBUTE_CONTEXT = 1
CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2
CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9
CU_MEMORYTYPE_HOST, CU_MEMORYTYPE_DEVICE, CU_MEMORYTYPE_UNIFIED = 1, 2, 4
CU_STREAM_NON_BLOCKING = 0x1
CU_EVENT_DISABLE_TIMING = 0x2
CU_STREAM_WAIT_VALUE_GEQ = 0x0  # (int32_t)(*addr - value) >= 0: wrap-safe
CU_STREAM_WRITE_VALUE_DEFAULT = 0x0
CU_MEMHOSTREGISTER_PORTABLE = 0x1
CUDA_ERROR_NOT_READY = 600
CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED = 712
CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD = 0x1
CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TARGET_CURRENT_CTX = 0
CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TO_OWNER = 100


class CudaError(OffloadError):
    """A CUDA driver call failed; the message names the call and the driver's reason."""


class Copy2D(NamedTuple):
    """``height`` rows of ``width`` bytes from ``src`` (row pitch ``src_pitch``) to ``dst``."""
    dst: int
    dst_pitch: int
    src: int
    src_pitch: int
    width: int
    height: int

    @staticmethod
    def flat(dst: int, src: int, nbytes: int) -> Copy2D:
        return Copy2D(dst, nbytes, src, nbytes, nbytes, 1)


class _Memcpy2D(ctypes.Structure):  # CUDA_MEMCPY2D_v2
    _fields_ = [
        ("srcXInBytes", ctypes.c_size_t), ("srcY", ctypes.c_size_t),
        ("srcMemoryType", ctypes.c_int), ("srcHost", ctypes.c_void_p),
        ("srcDevice", ctypes.c_uint64), ("srcArray", ctypes.c_void_p),
        ("srcPitch", ctypes.c_size_t),
        ("dstXInBytes", ctypes.c_size_t), ("dstY", ctypes.c_size_t),
        ("dstMemoryType", ctypes.c_int), ("dstHost", ctypes.c_void_p),
        ("dstDevice", ctypes.c_uint64), ("dstArray", ctypes.c_void_p),
        ("dstPitch", ctypes.c_size_t),
        ("WidthInBytes", ctypes.c_size_t), ("Height", ctypes.c_size_t),
    ]


class Driver:
    """The CUDA driver API: contexts, async copies, events, streams and stream memory ops."""

    name = "cuda"

    def __init__(self, path: str = "libcuda.so.1") -> None:
        try:
            self._lib = ctypes.CDLL(path)
        except OSError as e:
            raise CudaError(f"a GPU buffer needs the CUDA driver, but {path} did not load: {e}") \
                from None
        self._call("cuInit", ctypes.c_uint(0))

    def _call(self, fn: str, *args: Any) -> int:
        rc = int(getattr(self._lib, fn)(*args))
        if rc != 0:
            raise CudaError(f"{fn} failed: {self._error(rc)}")
        return rc

    def _error(self, rc: int) -> str:
        msg = ctypes.c_char_p()
        if self._lib.cuGetErrorString(rc, ctypes.byref(msg)) == 0 and msg.value:
            return f"{msg.value.decode()} (CUresult {rc})"
        return f"CUresult {rc}"

    # -- pointers and contexts --------------------------------------------------------------
    def device_of(self, ptr: int) -> tuple[int, int]:
        """(context, device ordinal) for device pointer ``ptr``. Memory from the VMM API or
        a stream-ordered pool (torch's expandable segments, cudaMallocAsync, cupy's async
        pool) names no context: the device's primary context, which the runtime uses, is
        taken then."""
        ctx, ordinal = ctypes.c_void_p(), ctypes.c_int()
        self._call("cuPointerGetAttribute", ctypes.byref(ordinal),
                   CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, ctypes.c_uint64(ptr))
        self._call("cuPointerGetAttribute", ctypes.byref(ctx),
                   CU_POINTER_ATTRIBUTE_CONTEXT, ctypes.c_uint64(ptr))
        if not ctx.value:
            dev = ctypes.c_int()
            self._call("cuDeviceGet", ctypes.byref(dev), ordinal)
            # retained for the life of the process, like the runtime's own
            self._call("cuDevicePrimaryCtxRetain", ctypes.byref(ctx), dev)
        return int(ctx.value or 0), int(ordinal.value)

    @contextmanager
    def scope(self, ctx: int) -> Iterator[None]:
        """Make ``ctx`` current on this thread for the calls inside."""
        self._call("cuCtxPushCurrent_v2", ctypes.c_void_p(ctx))
        try:
            yield
        finally:
            popped = ctypes.c_void_p()
            self._lib.cuCtxPopCurrent_v2(ctypes.byref(popped))

    # -- memory -----------------------------------------------------------------------------
    def host_register(self, addr: int, nbytes: int) -> None:
        """Pin host memory for DMA (the staging buffers, in the job's shared memory)."""
        rc = int(self._lib.cuMemHostRegister_v2(ctypes.c_void_p(addr), ctypes.c_size_t(nbytes),
                                                CU_MEMHOSTREGISTER_PORTABLE))
        if rc not in (0, CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED):
            raise CudaError(f"cuMemHostRegister failed: {self._error(rc)}")

    def host_unregister(self, addr: int) -> None:
        self._lib.cuMemHostUnregister(ctypes.c_void_p(addr))

    def alloc_word(self) -> int:
        """A 4-byte device word for stream memory ops, zeroed."""
        ptr = ctypes.c_uint64()
        self._call("cuMemAlloc_v2", ctypes.byref(ptr), ctypes.c_size_t(4))
        self._call("cuMemsetD32_v2", ptr, ctypes.c_uint(0), ctypes.c_size_t(1))
        return int(ptr.value)

    def free(self, ptr: int) -> None:
        self._lib.cuMemFree_v2(ctypes.c_uint64(ptr))

    def allocation(self, ptr: int) -> tuple[int, int]:
        """(base, size) of the allocation holding ``ptr``."""
        base, size = ctypes.c_uint64(), ctypes.c_size_t()
        self._call("cuMemGetAddressRange_v2", ctypes.byref(base), ctypes.byref(size),
                   ctypes.c_uint64(ptr))
        return int(base.value), int(size.value)

    def flush_rdma_writes(self) -> None:
        """Make the NIC's completed writes into this context's memory visible to its
        kernels, before the stream goes on (GPUDirect)."""
        self._call("cuFlushGPUDirectRDMAWrites", CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TARGET_CURRENT_CTX,
                   CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TO_OWNER)

    def dmabuf(self, ptr: int, nbytes: int) -> int:
        """A dma-buf file descriptor for [ptr, ptr+nbytes) (GPUDirect RDMA registration)."""
        fd = ctypes.c_int(-1)
        self._call("cuMemGetHandleForAddressRange", ctypes.byref(fd), ctypes.c_uint64(ptr),
                   ctypes.c_size_t(nbytes), CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD,
                   ctypes.c_ulonglong(0))
        return int(fd.value)

    # -- copies -----------------------------------------------------------------------------
    def copy_async(self, c: Copy2D, to_device: bool, stream: int) -> None:
        if c.height == 1:  # a plain copy: no pitch limit
            fn = "cuMemcpyHtoDAsync_v2" if to_device else "cuMemcpyDtoHAsync_v2"
            dst = ctypes.c_uint64(c.dst) if to_device else ctypes.c_void_p(c.dst)
            src = ctypes.c_void_p(c.src) if to_device else ctypes.c_uint64(c.src)
            self._call(fn, dst, src, ctypes.c_size_t(c.width), ctypes.c_void_p(stream))
            return
        p = _Memcpy2D()
        host, dev = CU_MEMORYTYPE_HOST, CU_MEMORYTYPE_DEVICE
        p.srcMemoryType, p.dstMemoryType = (host, dev) if to_device else (dev, host)
        if to_device:
            p.srcHost, p.dstDevice = c.src, c.dst
        else:
            p.srcDevice, p.dstHost = c.src, c.dst
        p.srcPitch, p.dstPitch, p.WidthInBytes, p.Height = c.src_pitch, c.dst_pitch, c.width, \
            c.height
        self._call("cuMemcpy2DAsync_v2", ctypes.byref(p), ctypes.c_void_p(stream))

    # -- streams and events -----------------------------------------------------------------
    def stream_create(self) -> int:
        s = ctypes.c_void_p()
        self._call("cuStreamCreate", ctypes.byref(s), CU_STREAM_NON_BLOCKING)
        return int(s.value or 0)

    def stream_destroy(self, stream: int) -> None:
        self._lib.cuStreamDestroy_v2(ctypes.c_void_p(stream))

    def event_record(self, stream: int) -> int:
        ev = ctypes.c_void_p()
        self._call("cuEventCreate", ctypes.byref(ev), CU_EVENT_DISABLE_TIMING)
        self._call("cuEventRecord", ev, ctypes.c_void_p(stream))
        return int(ev.value or 0)

    def event_synchronize(self, ev: int) -> None:
        self._call("cuEventSynchronize", ctypes.c_void_p(ev))

    def event_destroy(self, ev: int) -> None:
        self._lib.cuEventDestroy_v2(ctypes.c_void_p(ev))

    def stream_wait_event(self, stream: int, ev: int) -> None:
        self._call("cuStreamWaitEvent", ctypes.c_void_p(stream), ctypes.c_void_p(ev),
                   ctypes.c_uint(0))

    def stream_wait_value(self, stream: int, addr: int, value: int) -> None:
        """Hold ``stream`` until the word at ``addr`` reaches ``value`` (wrap-safe)."""
        self._call("cuStreamWaitValue32_v2", ctypes.c_void_p(stream), ctypes.c_uint64(addr),
                   ctypes.c_uint32(value & 0xFFFFFFFF), CU_STREAM_WAIT_VALUE_GEQ)

    def stream_write_value(self, stream: int, addr: int, value: int) -> None:
        self._call("cuStreamWriteValue32_v2", ctypes.c_void_p(stream), ctypes.c_uint64(addr),
                   ctypes.c_uint32(value & 0xFFFFFFFF), CU_STREAM_WRITE_VALUE_DEFAULT)


_lock = threading.Lock()
_driver: Any = None


def driver() -> Any:
    """The process's driver (loaded on first use)."""
    global _driver
    with _lock:
        if _driver is None:
            _driver = Driver()
        return _driver


def use(d: Any) -> None:
    """Install a driver (a test stand-in); None goes back to loading libcuda."""
    global _driver
    with _lock:
        _driver = d
