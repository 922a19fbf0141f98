"""Cross-memory attach: read another process's memory with one kernel copy (``process_vm_readv``).

This is how a receiver takes a large payload straight out of a peer's private array, which is not in
shared memory: one copy instead of two (the sender's copy into a shared segment, then the receiver's
copy out). It needs the right to trace the peer (same user; no Yama ``ptrace_scope`` 2 or 3; seccomp
allowing the call), so a transport probes it once per peer with :func:`readable` and falls back to
shared-memory copies where it is refused.
"""

from __future__ import annotations

import ctypes
import errno
import os


class _Iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


try:
    _libc = ctypes.CDLL(None, use_errno=True)
    _readv = _libc.process_vm_readv
    _readv.restype = ctypes.c_ssize_t
    _readv.argtypes = [ctypes.c_int, ctypes.POINTER(_Iovec), ctypes.c_ulong, ctypes.POINTER(_Iovec),
                       ctypes.c_ulong, ctypes.c_ulong]
except (OSError, AttributeError):  # not Linux, or a libc without the call
    _readv = None


class Reader:
    """Copies bytes from process ``pid`` into local memory; reuses its two iovecs."""

    def __init__(self, pid: int):
        self.pid = pid
        self._local = _Iovec()
        self._remote = _Iovec()

    def read(self, dest_address: int, src_address: int, nbytes: int) -> None:
        """Copy ``nbytes`` from ``src_address`` in the peer to ``dest_address`` here.

        Raises:
            ProcessLookupError: the peer is gone. OSError: any other failure (bad address, refused).
        """
        local, remote = self._local, self._remote
        while nbytes:
            local.base, local.len = dest_address, nbytes
            remote.base, remote.len = src_address, nbytes
            done = _readv(self.pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
            if done <= 0:
                code = ctypes.get_errno() if done < 0 else errno.EFAULT
                if code == errno.EINTR:
                    continue
                if code == errno.ESRCH:
                    raise ProcessLookupError(code, os.strerror(code))
                raise OSError(code, os.strerror(code))
            dest_address += done
            src_address += done
            nbytes -= done


def readable(pid: int, address: int, expected: bytes) -> bool:
    """Whether :class:`Reader` works on ``pid``: read ``len(expected)`` bytes at ``address`` and compare."""
    if _readv is None or pid <= 0:
        return False
    probe = ctypes.create_string_buffer(len(expected))
    try:
        Reader(pid).read(ctypes.addressof(probe), address, len(expected))
    except OSError:
        return False
    return probe.raw == expected
