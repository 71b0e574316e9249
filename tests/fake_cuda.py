"""A stand-in for offload_lib._cuda.Driver: "device memory" in host memory, streams as
threads that run their work in order, so that the staging path's stream ordering is tested
without a GPU.

It is strict where the real driver would misbehave silently: a copy's device side must lie
in device memory and its host side in registered (pinned) host memory, and every stream
operation runs strictly after the ones queued before it on that stream. ``kernel`` queues a
Python callable, standing in for a producer or consumer kernel.
"""
from __future__ import annotations

import ctypes
import queue
import threading
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import numpy as np

LEGACY_STREAM = 1


class _Stream:
    def __init__(self, name: str) -> None:
        self.work: queue.Queue[Callable[[], None] | None] = queue.Queue()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            job = self.work.get()
            if job is None:
                return
            try:
                job()
            except BaseException as e:  # reported by synchronize()
                self.error = self.error or e


class FakeDriver:
    name = "fake"

    def __init__(self) -> None:
        self._lock = threading.Condition()
        self._device: list[tuple[int, int, np.ndarray]] = []  # (addr, nbytes, backing)
        self._pinned: dict[int, int] = {}
        self._streams = {LEGACY_STREAM: _Stream("fake-legacy-stream")}
        self._next_stream = 100
        self._events: dict[int, threading.Event] = {}
        self._next_event = 1
        self.copies = {"d2h": 0, "h2d": 0}
        self.fail_h2d = 0  # the next this-many host-to-device copies raise, as a CUDA error would

    # -- memory -----------------------------------------------------------------------------
    def device_empty(self, nbytes: int) -> int:
        backing = np.zeros(max(nbytes, 1), np.uint8)
        addr = backing.ctypes.data
        with self._lock:
            self._device.append((addr, nbytes, backing))
        return addr

    def _in_device(self, addr: int, nbytes: int) -> bool:
        return any(a <= addr and addr + nbytes <= a + n for a, n, _ in self._device)

    def _in_pinned(self, addr: int, nbytes: int) -> bool:
        return any(a <= addr and addr + nbytes <= a + n for a, n in self._pinned.items())

    def device_of(self, ptr: int) -> tuple[int, int]:
        if not self._in_device(ptr, 1):
            raise AssertionError(f"device_of({ptr:#x}): not device memory")
        return 1, 0

    @contextmanager
    def scope(self, ctx: int) -> Iterator[None]:
        assert ctx == 1, ctx
        yield

    def host_register(self, addr: int, nbytes: int) -> None:
        assert not self._in_device(addr, 1), "host_register of device memory"
        self._pinned[addr] = nbytes

    def host_unregister(self, addr: int) -> None:
        self._pinned.pop(addr, None)

    def alloc_word(self) -> int:
        return self.device_empty(4)

    def free(self, ptr: int) -> None:
        with self._lock:
            self._device = [e for e in self._device if e[0] != ptr]

    def dmabuf(self, ptr: int, nbytes: int) -> int:
        raise AssertionError("the emulator stages GPU buffers; it never asks for a dma-buf")

    def allocation(self, ptr: int) -> tuple[int, int]:
        raise AssertionError("the emulator stages GPU buffers; it never registers them")

    def flush_rdma_writes(self) -> None:
        raise AssertionError("no GPUDirect writes to flush in the emulator")

    # -- copies -----------------------------------------------------------------------------
    def copy_async(self, c: Any, to_device: bool, stream: int) -> None:
        span_src = c.src_pitch * (c.height - 1) + c.width
        span_dst = c.dst_pitch * (c.height - 1) + c.width
        dev, host = ((c.dst, span_dst), (c.src, span_src)) if to_device else \
            ((c.src, span_src), (c.dst, span_dst))
        assert c.width <= c.src_pitch and c.width <= c.dst_pitch, c
        assert self._in_device(*dev), f"copy {c}: the device side is not device memory"
        assert self._in_pinned(*host), f"copy {c}: the host side is not pinned host memory"
        if to_device and self.fail_h2d:
            self.fail_h2d -= 1
            raise RuntimeError("injected CUDA error in a host-to-device copy")
        self.copies["h2d" if to_device else "d2h"] += c.width * c.height

        def run() -> None:
            for row in range(c.height):
                ctypes.memmove(c.dst + row * c.dst_pitch, c.src + row * c.src_pitch, c.width)
        self._queue(stream, run)

    # -- streams and events -----------------------------------------------------------------
    def _queue(self, stream: int, job: Callable[[], None]) -> None:
        self._streams[stream].work.put(job)

    def kernel(self, stream: int, fn: Callable[[], None]) -> None:
        self._queue(stream, fn)

    def stream_create(self) -> int:
        with self._lock:
            sid = self._next_stream
            self._next_stream += 1
            self._streams[sid] = _Stream(f"fake-stream-{sid}")
        return sid

    def stream_destroy(self, stream: int) -> None:
        s = self._streams.pop(stream)
        s.work.put(None)

    def synchronize(self, stream: int, timeout: float = 30.0) -> None:
        done = threading.Event()
        self._queue(stream, done.set)
        if not done.wait(timeout):
            raise AssertionError(f"stream {stream} did not drain within {timeout} s")
        err = self._streams[stream].error
        if err is not None:
            raise err

    def event_record(self, stream: int) -> int:
        with self._lock:
            eid = self._next_event
            self._next_event += 1
            ev = self._events[eid] = threading.Event()
        self._queue(stream, ev.set)
        return eid

    def event_synchronize(self, ev: int) -> None:
        if not self._events[ev].wait(60):
            raise AssertionError(f"event {ev} never completed")

    def event_destroy(self, ev: int) -> None:
        self._events.pop(ev, None)

    def stream_wait_event(self, stream: int, ev: int) -> None:
        event = self._events[ev]
        self._queue(stream, lambda: event.wait())

    def _word(self, addr: int) -> ctypes.c_uint32:
        assert self._in_device(addr, 4), "stream memory op on a word that is not device memory"
        return ctypes.c_uint32.from_address(addr)

    def stream_wait_value(self, stream: int, addr: int, value: int) -> None:
        word = self._word(addr)

        def wait() -> None:
            with self._lock:
                while ctypes.c_int32(word.value - value).value < 0:
                    self._lock.wait()
        self._queue(stream, wait)

    def stream_write_value(self, stream: int, addr: int, value: int) -> None:
        word = self._word(addr)

        def write() -> None:
            with self._lock:
                word.value = value & 0xFFFFFFFF
                self._lock.notify_all()
        self._queue(stream, write)


class _Device:
    """cupy's Device: a context manager making it current (there is one device here)."""
    id = 0

    def __enter__(self) -> _Device:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


DEVICE0 = _Device()


class DeviceArray:
    """A "GPU array" of the fake driver, exporting ``__cuda_array_interface__`` (version 3,
    with the stream its producer uses). Views (``view(dtype)``, ``reshape``, row slices)
    share its memory, as cupy's do."""

    def __init__(self, drv: FakeDriver, shape: Any, dtype: Any, stream: int = LEGACY_STREAM,
                 readonly: bool = False, strides: Any = None, ptr: int | None = None) -> None:
        self.dtype = np.dtype(dtype)
        self.shape = tuple(shape) if isinstance(shape, (tuple, list)) else (int(shape),)
        self.nbytes = int(np.prod(self.shape)) * self.dtype.itemsize
        self.drv, self.stream, self.readonly, self.strides = drv, stream, readonly, strides
        self.ptr = drv.device_empty(self.nbytes) if ptr is None else ptr

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        return {"shape": self.shape, "typestr": self.dtype.str, "version": 3,
                "data": (self.ptr, self.readonly), "strides": self.strides,
                "stream": self.stream}

    device = DEVICE0

    def _like(self, shape: Any, dtype: Any = None, offset: int = 0) -> DeviceArray:
        return type(self)(self.drv, shape, self.dtype if dtype is None else dtype, self.stream,
                          ptr=self.ptr + offset)

    def host(self) -> np.ndarray:
        """Its memory as numpy (for kernels, which run on the stream)."""
        buf = (ctypes.c_uint8 * max(self.nbytes, 1)).from_address(self.ptr)
        return np.frombuffer(buf, np.uint8)[:self.nbytes].view(self.dtype).reshape(self.shape)

    def view(self, dtype: Any) -> DeviceArray:
        dt = np.dtype(dtype)
        assert dt.itemsize == self.dtype.itemsize, "the fake views same-size dtypes only"
        return self._like(self.shape, dt)

    def reshape(self, *shape: Any) -> DeviceArray:
        return self._like(self.host().reshape(*shape).shape)

    def __getitem__(self, key: slice) -> DeviceArray:
        assert isinstance(key, slice) and key.step in (None, 1), key
        start, stop, _ = key.indices(self.shape[0])
        row = self.nbytes // self.shape[0] if self.shape[0] else 0
        return self._like((max(0, stop - start), *self.shape[1:]), offset=start * row)

    def get(self) -> np.ndarray:
        """A host copy, after the work queued on its stream (as cupy's get() does)."""
        self.drv.synchronize(self.stream)
        return self.host().copy()


class FakeCupy:
    """Just enough of cupy for the MoE Dispatcher: install it as sys.modules["cupy"]."""

    class ndarray(DeviceArray):  # noqa: N801 - cupy's name
        pass

    ndarray.__module__ = "cupy._core.core"

    def __init__(self, drv: FakeDriver, stream: int) -> None:
        self.drv, self.stream = drv, stream

    def empty(self, shape: Any, dtype: Any) -> DeviceArray:
        return self.ndarray(self.drv, shape, dtype, self.stream)

    def asarray(self, arr: Any) -> DeviceArray:
        host = np.ascontiguousarray(arr)
        out = self.empty(host.shape, host.dtype)
        self.drv.kernel(self.stream, lambda: out.host().__setitem__(..., host))
        return out


class DLPackOnly:
    """A CUDA-device DLPack exporter without the CUDA array interface (as JAX arrays are)."""

    def __init__(self, arr: DeviceArray) -> None:
        self._arr = arr

    def __dlpack_device__(self) -> tuple[int, int]:
        return (2, 0)  # kDLCUDA, device 0

    def __dlpack__(self, stream: Any = None) -> Any:
        assert stream == LEGACY_STREAM, stream
        return self._arr.host().__dlpack__()
