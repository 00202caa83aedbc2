"""The few libbpf calls the running agent needs, through ctypes on Debian's libbpf1.

The agent never compiles BPF (exporter/sources/kernel/bpf/loader.py does that in a short-lived
process); it only reads a ring buffer and one array map through file descriptors it was handed.
libbpf.so.1 is ~300 KiB with no LLVM behind it, and its ring buffer consumer is the reference
implementation of the kernel's producer/consumer protocol, so it is used rather than a
hand-written reader of the mmapped pages.

API (libbpf 1.x, tools/lib/bpf/libbpf.h):
  struct ring_buffer *ring_buffer__new(int map_fd, ring_buffer_sample_fn cb, void *ctx,
                                       const struct ring_buffer_opts *opts);  NULL + errno
  int ring_buffer__consume(struct ring_buffer *rb);   records consumed, or -errno
  int ring_buffer__poll(struct ring_buffer *rb, int timeout_ms);
  int ring_buffer__epoll_fd(const struct ring_buffer *rb);
  void ring_buffer__free(struct ring_buffer *rb);
  int bpf_map_lookup_elem(int fd, const void *key, void *value);   0 or -errno
  int bpf_map_update_elem(int fd, const void *key, const void *value, __u64 flags);
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
from typing import Any, Callable

LIBRARY = "libbpf.so.1"
FIX = "apt-get install libbpf1 (scripts/setup.sh run installs it)"

# int (*ring_buffer_sample_fn)(void *ctx, void *data, size_t size): a non-zero return stops
# the consume loop, so the callback always returns 0 and reports problems itself.
SAMPLE_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)

_lib: ctypes.CDLL | None = None


class LibbpfMissing(OSError):
    """libbpf.so.1 cannot be loaded; str() names the fix."""


def lib() -> ctypes.CDLL:
    """libbpf.so.1, loaded once, with the prototypes declared (ctypes would guess int)."""
    global _lib
    if _lib is not None:
        return _lib
    try:
        handle = ctypes.CDLL(LIBRARY, use_errno=True)
    except OSError as e:
        raise LibbpfMissing(f"cannot load {LIBRARY}: {e} (fix: {FIX})") from e
    handle.ring_buffer__new.restype = ctypes.c_void_p
    handle.ring_buffer__new.argtypes = [ctypes.c_int, SAMPLE_FN, ctypes.c_void_p,
                                        ctypes.c_void_p]
    handle.ring_buffer__consume.restype = ctypes.c_int
    handle.ring_buffer__consume.argtypes = [ctypes.c_void_p]
    handle.ring_buffer__poll.restype = ctypes.c_int
    handle.ring_buffer__poll.argtypes = [ctypes.c_void_p, ctypes.c_int]
    handle.ring_buffer__epoll_fd.restype = ctypes.c_int
    handle.ring_buffer__epoll_fd.argtypes = [ctypes.c_void_p]
    handle.ring_buffer__free.restype = None
    handle.ring_buffer__free.argtypes = [ctypes.c_void_p]
    handle.bpf_map_lookup_elem.restype = ctypes.c_int
    handle.bpf_map_lookup_elem.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
    handle.bpf_map_update_elem.restype = ctypes.c_int
    handle.bpf_map_update_elem.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                                           ctypes.c_uint64]
    _lib = handle
    return handle


def _check(ret: int, what: str) -> int:
    if ret < 0:
        raise OSError(-ret, f"{what}: {os.strerror(-ret)}")
    return ret


class RingBuffer:
    """A BPF_MAP_TYPE_RINGBUF consumer. `on_sample(address, size)` runs in the thread that
    calls consume()/poll(), once per record, while the record is still in the ring: copy what
    you keep before returning (the space is given back to the producer afterwards)."""

    def __init__(self, map_fd: int, on_sample: Callable[[int, int], None]):
        self._lib = lib()
        self._on_sample = on_sample
        self._errors: list[BaseException] = []
        self._callback = SAMPLE_FN(self._sample)  # keep a reference: C holds the pointer
        ctypes.set_errno(0)
        rb = self._lib.ring_buffer__new(map_fd, self._callback, None, None)
        if not rb:
            err = ctypes.get_errno() or 22
            raise OSError(err, f"ring_buffer__new(fd {map_fd}): {os.strerror(err)}")
        self._rb: int | None = rb

    def _sample(self, _ctx: Any, data: Any, size: int) -> int:
        try:
            self._on_sample(data, size)
        except BaseException as e:  # an exception cannot cross the C frames: re-raise after
            self._errors.append(e)
        return 0

    def epoll_fd(self) -> int:
        """An fd that polls readable when records are waiting (for the caller's own poll)."""
        assert self._rb is not None
        return _check(self._lib.ring_buffer__epoll_fd(self._rb), "ring_buffer__epoll_fd")

    def consume(self) -> int:
        """Hand every waiting record to on_sample, without blocking; how many there were."""
        assert self._rb is not None
        n = self._lib.ring_buffer__consume(self._rb)
        self._raise_pending()
        return _check(n, "ring_buffer__consume")

    def poll(self, timeout_ms: int) -> int:
        assert self._rb is not None
        n = self._lib.ring_buffer__poll(self._rb, timeout_ms)
        self._raise_pending()
        if n == -4:  # EINTR: a signal, nothing consumed
            return 0
        return _check(n, "ring_buffer__poll")

    def _raise_pending(self) -> None:
        if self._errors:
            error, self._errors = self._errors[0], []
            raise error

    def close(self) -> None:
        if self._rb is not None:
            self._lib.ring_buffer__free(self._rb)
            self._rb = None


def lookup_u64(map_fd: int, key: int = 0) -> int:
    """One u64 value of an array or hash map with a u32 key."""
    k, v = ctypes.c_uint32(key), ctypes.c_uint64(0)
    _check(lib().bpf_map_lookup_elem(map_fd, ctypes.byref(k), ctypes.byref(v)),
           f"bpf_map_lookup_elem(fd {map_fd})")
    return v.value


def lookup_s64(map_fd: int, key: int = 0) -> int:
    """One s64 value of an array map with a u32 key (a signed running sum)."""
    k, v = ctypes.c_uint32(key), ctypes.c_int64(0)
    _check(lib().bpf_map_lookup_elem(map_fd, ctypes.byref(k), ctypes.byref(v)),
           f"bpf_map_lookup_elem(fd {map_fd})")
    return v.value


def update_u64(map_fd: int, value: int, key: int = 0) -> None:
    """Set one u64 value of an array map with a u32 key (BPF_ANY)."""
    k, v = ctypes.c_uint32(key), ctypes.c_uint64(value)
    _check(lib().bpf_map_update_elem(map_fd, ctypes.byref(k), ctypes.byref(v), 0),
           f"bpf_map_update_elem(fd {map_fd})")
