"""A private network namespace for a Ray cluster started on this host.

Ray advertises the host's interface address, not loopback, and probes public
addresses to find it. A cluster started for tests, benchmarks or the demo
must not touch any network but loopback, so its processes start inside a
fresh network namespace whose only interface is ``lo``: there Ray falls back
to 127.0.0.1.

``PrivateNetwork.create()`` makes such a namespace (``lo`` up) and keeps an
fd of it; ``with network.entered():`` moves the *calling thread* into it and
back out at the end. Processes and threads started while inside stay inside
for their whole life; the calling thread itself returns, so the rest of the
process (and a multiprocessing forkserver it may start later) keeps the
host's network. Needs CAP_SYS_ADMIN (root); ``available()`` says whether
this process has it.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
import socket
import struct
from dataclasses import dataclass
from typing import Iterator

__all__ = ["NamespaceError", "PrivateNetwork", "available", "loopback_only"]

_CLONE_NEWNET = 0x40000000
_SIOCGIFFLAGS = 0x8913
_SIOCSIFFLAGS = 0x8914
_IFF_UP = 0x1
_IFREQ = struct.Struct("16sH14s")  # struct ifreq: the name, then ifr_flags in the union
_SELF = "/proc/thread-self/ns/net"


class NamespaceError(OSError):
    """Raised when this process may not make or enter a network namespace (no CAP_SYS_ADMIN)."""


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _setns(fd: int) -> None:
    if _libc().setns(fd, _CLONE_NEWNET) != 0:
        code = ctypes.get_errno()
        raise NamespaceError(code, f"cannot enter a network namespace: {os.strerror(code)}")


@dataclass
class PrivateNetwork:
    """A network namespace with only ``lo`` (up), held open by ``fd`` until ``close()``."""

    fd: int

    @classmethod
    def create(cls) -> "PrivateNetwork":
        previous = os.open(_SELF, os.O_RDONLY | os.O_CLOEXEC)
        try:
            if _libc().unshare(_CLONE_NEWNET) != 0:
                code = ctypes.get_errno()
                raise NamespaceError(code, f"cannot make a private network namespace: {os.strerror(code)}")
            try:
                _loopback_up()
                fd = os.open(_SELF, os.O_RDONLY | os.O_CLOEXEC)
            finally:
                _setns(previous)
        finally:
            os.close(previous)
        return cls(fd)

    @contextlib.contextmanager
    def entered(self) -> Iterator[None]:
        """Run the block with the calling thread inside this namespace."""
        previous = os.open(_SELF, os.O_RDONLY | os.O_CLOEXEC)
        try:
            _setns(self.fd)
            try:
                yield
            finally:
                _setns(previous)
        finally:
            os.close(previous)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _loopback_up() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        raw = fcntl.ioctl(probe, _SIOCGIFFLAGS, _IFREQ.pack(b"lo", 0, b""))
        flags = _IFREQ.unpack(raw)[1]
        fcntl.ioctl(probe, _SIOCSIFFLAGS, _IFREQ.pack(b"lo", flags | _IFF_UP, b""))


def loopback_only() -> bool:
    """True when the calling thread's namespace has no interface but ``lo`` (nothing routes out)."""
    return [name for _index, name in socket.if_nameindex()] == ["lo"]


def available() -> bool:
    """Whether this process may make private network namespaces (tried for real, then dropped)."""
    try:
        PrivateNetwork.create().close()
    except OSError as exc:
        if exc.errno in (errno.EPERM, errno.EINVAL, errno.ENOSYS):
            return False
        raise
    return True
