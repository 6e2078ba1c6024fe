"""A private network namespace for a Ray cluster started on this host.

Ray advertises the host's interface address, not loopback, and probes public
addresses to find it. A cluster started for tests, benchmarks or the demo
must not touch any network but loopback, so its processes start inside a
fresh network namespace whose only interface is ``lo``: there Ray falls back
to 127.0.0.1. ``enter()`` moves the *calling thread* (and every process or
thread it starts afterwards) into a new namespace and brings ``lo`` up;
``leave()`` moves it back. Needs CAP_SYS_ADMIN (root, or a user namespace
made before any thread started); callers skip or fail clearly without it.

Not guaranteed: threads started before ``enter()`` stay in the old namespace.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import socket
import struct
from dataclasses import dataclass

__all__ = ["NamespaceError", "PrivateNetwork", "enter", "leave", "loopback_only"]

_CLONE_NEWNET = 0x40000000
_SIOCGIFFLAGS = 0x8913
_SIOCSIFFLAGS = 0x8914
_IFF_UP = 0x1
_IFREQ = struct.Struct("16sH14s")  # struct ifreq: name, then ifr_flags in the union


class NamespaceError(OSError):
    """Raised when this process may not make a network namespace (no CAP_SYS_ADMIN)."""


@dataclass
class PrivateNetwork:
    """The namespace the calling thread was in before ``enter()`` (an open fd of it)."""

    previous_fd: int


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def enter() -> PrivateNetwork:
    """Move the calling thread into a new network namespace with ``lo`` up."""
    previous = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    if _libc().unshare(_CLONE_NEWNET) != 0:
        code = ctypes.get_errno()
        os.close(previous)
        raise NamespaceError(code, f"cannot make a private network namespace: {os.strerror(code)}")
    try:
        _loopback_up()
    except OSError:
        leave(PrivateNetwork(previous))
        raise
    return PrivateNetwork(previous)


def leave(network: PrivateNetwork) -> None:
    """Move the calling thread back to the namespace it left (processes started inside stay there)."""
    if _libc().setns(network.previous_fd, _CLONE_NEWNET) != 0:
        code = ctypes.get_errno()
        raise NamespaceError(code, f"cannot return to the previous network namespace: {os.strerror(code)}")
    os.close(network.previous_fd)


def _loopback_up() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        raw = fcntl.ioctl(probe, _SIOCGIFFLAGS, _IFREQ.pack(b"lo", 0, b""))
        flags = _IFREQ.unpack(raw)[1]
        fcntl.ioctl(probe, _SIOCSIFFLAGS, _IFREQ.pack(b"lo", flags | _IFF_UP, b""))


def loopback_only() -> bool:
    """True when the calling thread's namespace has no interface but ``lo`` (nothing routes out)."""
    return [name for _index, name in socket.if_nameindex()] == ["lo"]


def available() -> bool:
    """Whether ``enter()`` can work here (tried for real, then undone)."""
    try:
        leave(enter())
    except OSError as exc:
        if exc.errno in (errno.EPERM, errno.EINVAL, errno.ENOSYS):
            return False
        raise
    return True


__all__ += ["available"]
