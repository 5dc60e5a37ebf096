"""The init process of one local container: it owns every process the container starts.

Run by the kubelet as `python -I -S container_init.py <control fd> <program> [args...]` (a script,
not a module: `-I -S` keep its start fast and keep the container's PYTHON* variables off it).

Why a process of its own: a container's processes do not stay in one process group (torchrun
starts each worker in a new session), and a process whose parent dies is re-parented away from
its tree, so neither killing a group nor walking the tree from the kubelet finds them all. This
process marks itself a child subreaper (`prctl(PR_SET_CHILD_SUBREAPER)`): every orphan below it is
re-parented to it, so the living descendants of its PID are exactly the container's processes, and
"no child left to wait for" means the container is gone. It needs no root and no cgroups.

The kubelet holds the other end of the control socket and writes `T` (SIGTERM to every process
of the container) or `K` (SIGKILL to every one, then exit). End of file, when the kubelet closes
it or its process dies (even by SIGKILL), means `K`: that is what guarantees nothing outlives the
cluster's owner. (`PR_SET_PDEATHSIG` is not used: it fires when the *thread* that started us ends,
and it would kill this process without its descendants.)

The program is exec'd in a session of its own; when it exits, the rest of the container is
killed (a container ends with its PID 1) and this process exits with its code (128 + signal for
a signal). It reports `started <pid>` or `failed <errno>` on the control socket first.
"""

# _signal, not signal: the signal module imports enum, which would add tens of milliseconds to
# every container's start.
import _signal as signal
import errno
import os
import select
import sys
import time
from typing import Any

PR_SET_CHILD_SUBREAPER = 36


def prctl(option: int, value: int) -> int:
    """prctl(2) through _ctypes alone: importing ctypes would add tens of milliseconds to every
    container's start (what ctypes.CDLL(None).prctl does, minus building the whole module)."""
    try:
        import _ctypes

        # The private module's stubs admit neither dlopen(None) (the program itself, as ctypes.CDLL(None)
        # opens it) nor a library given as an object with a `_handle`, which CFuncPtr reads as CDLL does.
        private: Any = _ctypes

        class CInt(private._SimpleCData):
            _type_ = "i"

        class Function(private.CFuncPtr):
            _flags_ = private.FUNCFLAG_CDECL
            _restype_ = CInt

        class Libc:
            _handle = private.dlopen(None, 0)

        return Function(("prctl", Libc()))(option, value, 0, 0, 0)
    except (ImportError, AttributeError, TypeError, OSError):
        import ctypes

        return ctypes.CDLL(None).prctl(option, value, 0, 0, 0)


def living_descendants(root: int) -> list[int]:
    """PIDs below `root` (not zombies), read from /proc/<pid>/stat."""
    children: dict[int, list[int]] = {}
    alive: set[int] = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()  # the command name may hold spaces and ')'
        pid, state, ppid = int(entry), fields[0], int(fields[1])
        children.setdefault(ppid, []).append(pid)
        if state not in (b"Z", b"X"):
            alive.add(pid)
    found, queue = [], [root]
    while queue:
        for child in children.get(queue.pop(), ()):
            found.append(child)
            queue.append(child)
    return [pid for pid in found if pid in alive]


def signal_all(sig: int) -> list[int]:
    pids = living_descendants(os.getpid())
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
    return pids


def main() -> int:
    control = int(sys.argv[1])
    argv = sys.argv[2:]
    if prctl(PR_SET_CHILD_SUBREAPER, 1) != 0:
        os.write(2, b"container init: prctl(PR_SET_CHILD_SUBREAPER) failed; orphans may escape\n")
    # Signals reach the container through the control socket only: a container that signals its
    # own group (`kill 0`) must not take its init down with it.
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(sig, signal.SIG_IGN)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)

    error_r, error_w = os.pipe()  # close-on-exec: end of file means the exec worked
    main_pid = os.fork()
    if main_pid == 0:
        try:
            os.setsid()
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGCHLD):
                signal.signal(sig, signal.SIG_DFL)
            signal.set_wakeup_fd(-1)
            os.execvp(argv[0], argv)
        except OSError as error:
            os.write(error_w, str(error.errno or errno.ENOENT).encode())
        finally:
            os._exit(127)
    os.close(error_w)
    failure = b""
    while chunk := os.read(error_r, 64):
        failure += chunk
    os.close(error_r)
    if failure:
        os.waitpid(main_pid, 0)
        os.write(control, b"failed " + failure + b"\n")
        return 127
    os.write(control, b"started %d\n" % main_pid)

    main_code = None
    while True:
        while True:  # reap every child that ended: the program, and orphans handed to us
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            if pid == main_pid:
                code = os.waitstatus_to_exitcode(status)
                main_code = 128 - code if code < 0 else code
        if main_code is not None:
            break
        readable, _, _ = select.select([control, wake_r], [], [])
        if wake_r in readable:
            os.read(wake_r, 4096)
        if control in readable:
            try:
                command = os.read(control, 64)
            except OSError:
                command = b""
            if not command or b"K" in command:
                break
            if b"T" in command:
                signal_all(signal.SIGTERM)
    kill_everything()
    return 137 if main_code is None else main_code


def kill_everything() -> None:
    """SIGKILL every descendant until none is left, then reap them all."""
    try:
        if os.waitpid(-1, os.WNOHANG) == (0, 0):
            pass  # a child lives: look for every descendant below
    except ChildProcessError:
        return  # no child at all, so no descendant (orphans would be our children): the usual end
    while signal_all(signal.SIGKILL):
        try:
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        except ChildProcessError:
            pass
        time.sleep(0.005)
    # Nothing below us lives, so nothing can start another child: wait for the last zombies.
    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return


if __name__ == "__main__":
    sys.exit(main())
