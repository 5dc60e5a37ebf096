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
from typing import Optional

from nemo_kubeflow_local.apiserver.container_logs import ContainerLog, pump
from nemo_kubeflow_local.kubelet.mounts import Mounts

_CONTAINER_INIT = Path(__file__).with_name("container_init.py")


class MountRefusedError(OSError):
    """The container's init could not make its mount namespace (``index`` -1) or its ``index``-th mount."""

    def __init__(self, code: int, index: int):
        super().__init__(code, os.strerror(code))
        self.index = index


class ContainerRun:
    """A container's processes, under their own init (container_init.py), output piped into its log.

    The init is the subreaper of everything the container starts (sessions of their own included)
    and kills it all when told, when the program exits, or when this process dies.
    """

    def __init__(
        self,
        argv: list[str],
        env: dict[str, str],
        cwd: Path,
        log: ContainerLog,
        mounts: Optional[Mounts] = None,
    ):
        """``mounts``: each volume's directory bind-mounted at its mount path in a mount namespace of the
        container's own (container_init.private_mounts)."""
        self.log = log
        namespace = ["0"] if mounts is None else mounts.init_args()
        self._control, theirs = socket.socketpair()
        read_fd, write_fd = os.pipe()
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-I", "-S", str(_CONTAINER_INIT), str(theirs.fileno()), *namespace, *argv],
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
            if report.startswith(b"refused "):
                raise MountRefusedError(int(report.split()[1]), int(report.split()[2]))
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
