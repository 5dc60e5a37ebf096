"""One container run: the container's `command + args` exec'd directly (no shell, as a container runtime
does) in a new session, its output pumped into the container's log."""

from __future__ import annotations

import errno
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

from nemo_kubeflow_local.apiserver.container_logs import ContainerLog, pump

_CONTAINER_INIT = Path(__file__).with_name("container_init.py")


class ContainerRun:
    """A container's processes, under their own init (container_init.py), output piped into its log.

    The init is the subreaper of everything the container starts (sessions of their own included)
    and kills it all when told, when the program exits, or when this process dies.
    """

    def __init__(self, argv: list[str], env: dict[str, str], cwd: Path, log: ContainerLog):
        self.log = log
        self._control, theirs = socket.socketpair()
        read_fd, write_fd = os.pipe()
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-I", "-S", str(_CONTAINER_INIT), str(theirs.fileno()), *argv],
                env=env,
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=write_fd,
                stderr=write_fd,
                start_new_session=True,
                close_fds=True,
                pass_fds=(theirs.fileno(),),
            )
        except BaseException:
            os.close(read_fd)
            self._control.close()
            log.finish()
            raise
        finally:
            os.close(write_fd)
            theirs.close()
        self._pump = threading.Thread(target=pump, args=(read_fd, log), daemon=True, name=f"log-{self.process.pid}")
        self._pump.start()
        report = self._read_report()
        if not report.startswith(b"started "):
            self.process.wait()
            self._finish()
            code = int(report.split()[1]) if report.startswith(b"failed ") else errno.EIO
            raise OSError(code, os.strerror(code), argv[0])
        #: The program's PID (its session and process group have the same number).
        self.pid = int(report.split()[1])
        self.container_id = f"local://{self.pid}"

    def _read_report(self) -> bytes:
        report = b""
        while not report.endswith(b"\n"):
            chunk = self._control.recv(64)
            if not chunk:
                break
            report += chunk
        return report

    def running(self) -> bool:
        return self.process.poll() is None

    def terminate(self) -> None:
        """SIGTERM to every process of the container."""
        self._send(b"T")

    def kill(self) -> None:
        """SIGKILL to every process of the container; its init exits once they are all gone."""
        self._send(b"K")

    def _send(self, command: bytes) -> None:
        try:
            self._control.send(command)
        except OSError:
            pass  # the init has exited: so has everything it owned

    def wait(self) -> int:
        code = self.process.wait()
        self._finish()
        return 128 - code if code < 0 else code

    def _finish(self) -> None:
        self._control.close()
        self._pump.join(timeout=2.0)
        self.log.finish()
