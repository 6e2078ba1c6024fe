"""The reaper of a simulated Ray cluster: its processes end when the host that started them dies, even by SIGKILL.

Why it exists. Ray (``ray._private.services.start_ray_process``, ``fate_share``)
starts each node's GCS, raylet, monitor, dashboard and log monitor with
``PR_SET_PDEATHSIG`` = SIGKILL, so those die with the host. The two agents a
raylet starts itself (``ray::DashboardAgent``, ``ray::RuntimeEnvAgent``) are
tied to their raylet only by a pipe: they see it close at once, then report
the raylet's death to the GCS (``process_watcher.report_raylet_error_logs``),
which died at the same moment, and block in that call until its 60 s timeout.
After a ``kill -9`` of ``subagents demo --pool ray`` six of them (a head and
two nodes) ran on for a minute, their parent pid 1; the actors' workers end
on their own within about 2 s, their core worker seeing the raylet's socket
close. The 60 s is written into Ray's code (``publish_error_to_driver``): no
setting shortens it, and no setting gives the agents a ``PR_SET_PDEATHSIG``.

How. ``ClusterReaper.start()`` starts this file as a small stdlib-only
process (in a session of its own, so a Ctrl-C or hangup aimed at the host's
process group does not end it first) holding the read end of a pipe whose
write end only the host has (``os.pipe`` is close-on-exec: Ray's and the
pool's processes, which exec, never inherit it). The host sends it the
processes to watch, each as ``pid start-time``: the services and their
children (the agents) once the head and each node are up; an actor's worker,
started later, is not sent and needs not be. The reaper opens a pidfd for
each one whose start time still matches, so a pid reused later can never be
signalled. When the pipe reaches EOF, which the kernel delivers when the host
dies however it dies, the reaper SIGKILLs the watched processes still alive,
waits for them to end, and exits. It kills nothing it was not sent, and it
never runs ``ray stop``. A normal ``stop()`` says ``stop`` first and then
closes the pipe, so a process the cluster's shutdown left behind is ended
too and reported by the host; the reaper's exit status says whether any was.

A process that the host makes with a bare ``fork()`` (no exec) while the
reaper runs inherits the write end, and the reaper then waits for that
process to end as well.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import select
import signal
import subprocess
import sys
import time
from typing import Iterable

__all__ = ["ClusterReaper", "start_time"]

log = logging.getLogger("subagents.supervisor.cluster_reaper")

# the reaper's exit status after a stop that left processes it had to kill (0: none left; 1 is a crash)
EXIT_KILLED_LEFTOVERS = 3
# how long the reaper waits for the processes it killed to end, and the host for the reaper after a stop
_KILL_WAIT_S = 5.0
_CLOSE_WAIT_S = 10.0


def start_time(pid: int) -> int | None:
    """The start time of ``pid`` in clock ticks since boot (``/proc/PID/stat`` field 22), None once it is gone:
    with the pid, it names one process, never a later one given the same pid."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] in ("Z", "X") else int(fields[19])


class ClusterReaper:
    """The host's side: the reaper process and the write end of its pipe."""

    def __init__(self, process: subprocess.Popen[bytes], write_fd: int) -> None:
        self.process = process
        self._fd = write_fd
        self._sent: set[tuple[int, int]] = set()

    @classmethod
    def start(cls) -> "ClusterReaper":
        read_fd, write_fd = os.pipe()
        try:
            process = subprocess.Popen(
                [sys.executable, "-I", os.path.abspath(__file__), str(read_fd), "json" if _host_logs_json() else "text"],
                pass_fds=(read_fd,), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, cwd="/", start_new_session=True,
            )
        except BaseException:
            os.close(write_fd)
            raise
        finally:
            os.close(read_fd)
        log.debug("cluster reaper %d started", process.pid)
        return cls(process, write_fd)

    def watch(self, pids: Iterable[int]) -> None:
        """Have the reaper end these processes (those not sent before) if the host dies."""
        lines = []
        for pid in pids:
            started = start_time(pid)
            if started is not None and (pid, started) not in self._sent:
                self._sent.add((pid, started))
                lines.append(f"{pid} {started}\n")
        if lines and self._fd >= 0:
            self._send("".join(lines))

    def close(self) -> None:
        """After the cluster's stop: the reaper ends what the stop left behind, then exits; this waits for it."""
        if self._fd < 0:
            return
        self._send("stop\n")
        os.close(self._fd)
        self._fd = -1
        try:
            code = self.process.wait(timeout=_CLOSE_WAIT_S)
        except subprocess.TimeoutExpired:
            log.warning("cluster reaper %d did not exit %.0f s after the stop; killing it", self.process.pid, _CLOSE_WAIT_S)
            self.process.kill()
            code = self.process.wait()
        if code == EXIT_KILLED_LEFTOVERS:
            log.warning("the simulated Ray cluster's stop left processes running; its reaper killed them")
        elif code != 0:
            log.warning("cluster reaper %d exited with status %s", self.process.pid, code)

    def _send(self, text: str) -> None:
        data = text.encode()
        try:
            while data:
                data = data[os.write(self._fd, data):]
        except BrokenPipeError:
            log.warning("cluster reaper %d is gone (status %s): the cluster no longer ends with this host",
                        self.process.pid, self.process.poll())


def _host_logs_json() -> bool:
    """Whether this process logs JSON lines (the CLI's ``--log-json``): the reaper writes to the same stderr alike."""
    from subagents.worker.logformat import JsonFormatter  # here, not at the top: the reaper process imports only the stdlib

    return any(isinstance(handler.formatter, JsonFormatter) for handler in logging.getLogger().handlers)


# ---- the reaper process (stdlib only: it runs as ``python -I cluster_reaper.py FD FORMAT``) ----


class _Format(logging.Formatter):
    """The two line forms of ``worker/logformat.py`` (text, or one JSON object), without importing the package."""

    def __init__(self, as_json: bool) -> None:
        super().__init__("%(levelname)s %(name)s: %(message)s")
        self.as_json = as_json

    def format(self, record: logging.LogRecord) -> str:
        if not self.as_json:
            return super().format(record)
        return json.dumps({"ts": record.created, "level": record.levelname, "logger": record.name, "message": record.getMessage()})


class _Watched:
    """One process to end: a pidfd when the kernel has them, else its pid and start time, checked again at the kill."""

    def __init__(self, pid: int, started: int) -> None:
        self.pid, self.started = pid, started
        self.fd = -1
        try:
            self.fd = os.pidfd_open(pid)
        except ProcessLookupError:
            return  # already gone: ``alive()`` says so
        except OSError as exc:  # no pidfd (kernel < 5.3): the start time alone, checked again at the kill
            if exc.errno != errno.ENOSYS:
                raise
        if not self.alive():  # ended, its pid maybe reused, between the host's read and the open
            self.close()

    def alive(self) -> bool:
        """Whether it still runs (a zombie does not; a later process with its pid is another one)."""
        return start_time(self.pid) == self.started

    def kill(self) -> bool:
        """SIGKILL it if it still runs; True if it did. The pidfd, when there is one, is what is signalled."""
        if not self.alive():
            return False
        try:
            if self.fd >= 0:
                signal.pidfd_send_signal(self.fd, signal.SIGKILL)
            else:
                os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            return False
        return True

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        self.started = -1


def _reap(watched: list[_Watched]) -> list[int]:
    """Kill every watched process still alive and wait (bounded) for them to end; the pids killed."""
    killed = [w for w in watched if w.kill()]
    poller = select.poll()
    pending = {w.fd: w for w in killed if w.fd >= 0}
    for fd in pending:
        poller.register(fd, select.POLLIN)  # a pidfd turns readable when its process has ended
    deadline = time.monotonic() + _KILL_WAIT_S
    while pending and time.monotonic() < deadline:
        for fd, _event in poller.poll(100):
            poller.unregister(fd)
            pending.pop(fd, None)
    for w in killed:  # those without a pidfd
        while w.fd < 0 and w.alive() and time.monotonic() < deadline:
            time.sleep(0.05)
    return [w.pid for w in killed]


def main(argv: list[str]) -> int:
    fd, as_json = int(argv[1]), argv[2] == "json"
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_Format(as_json))
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    for signum in (signal.SIGINT, signal.SIGHUP):  # only the pipe's end, or a kill by pid, ends the reaper
        signal.signal(signum, signal.SIG_IGN)
    watched: list[_Watched] = []
    stopped = False
    pending = b""
    while chunk := os.read(fd, 65536):
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            if line == b"stop":
                stopped = True
            elif line:
                pid, started = (int(x) for x in line.split())
                watched.append(_Watched(pid, started))
    killed = _reap(watched)
    if killed and not stopped:
        log.warning("the host of a simulated Ray cluster died: killed its %d remaining processes (%s)",
                    len(killed), " ".join(map(str, killed)))
    return EXIT_KILLED_LEFTOVERS if killed and stopped else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
