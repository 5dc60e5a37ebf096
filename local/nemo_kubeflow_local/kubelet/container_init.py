"""The init process of one local container: it owns every process the container starts.

Run by the kubelet as `python -I -S container_init.py <control fd> <mounts> [<required> <scratch>
<source> <mount path>...] <program> [args...]` (a script, not a module: `-I -S` keep its start fast and keep the
container's PYTHON* variables off it). With `<mounts>` above 0, the init first gives the container a private mount
namespace (private_mounts below) in which each volume's directory is bind-mounted at its mount path.

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
a signal). It reports `started <pid>`, `failed <errno>` (the exec failed) or `refused <errno> <index>` (the
mount namespace, index -1, or the index-th mount could not be made) on the control socket first.
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


CLONE_NEWNS, CLONE_NEWUSER = 0x00020000, 0x10000000
MS_BIND, MS_MOVE, MS_REC, MS_PRIVATE = 0x1000, 0x2000, 0x4000, 0x40000


class MountRefused(Exception):
    def __init__(self, code: int, index: int):
        super().__init__(code, index)
        self.code, self.index = code, index


def private_mounts(mounts: list[tuple[str, str]], scratch: str) -> None:
    """This process (and all it starts) in a mount namespace of its own where each `(source, mount path)` is
    bind-mounted at its mount path. Root makes the namespace alone; anyone else makes a user namespace too,
    mapping only their own uid and gid (so files keep their owners, and the program runs without privileges).

    A mount path whose first directory does not exist on the host puts the container on a new root: a tmpfs
    (in ``scratch``) holding a bind mount of each entry of the host's `/` and the missing directories, so that
    nothing is ever created on the host's own root filesystem. A missing mount point is created only there or
    inside a volume mounted before it (the kubelet sorts the mounts and refuses any other, mounts.py).
    Raises MountRefused."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]

    def check(result: int, index: int) -> None:
        if result != 0:
            raise MountRefused(ctypes.get_errno() or errno.EPERM, index)

    def mount(source, target: str, flags: int, index: int, fstype=None, data=None) -> None:
        check(libc.mount(source and source.encode(), target.encode(), fstype, flags, data), index)

    uid, gid = os.getuid(), os.getgid()
    if libc.unshare(CLONE_NEWNS) != 0:
        check(libc.unshare(CLONE_NEWUSER | CLONE_NEWNS), -1)
        try:
            for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
                with open(f"/proc/self/{name}", "w") as f:
                    f.write(text)
        except OSError as error:
            raise MountRefused(error.errno or errno.EPERM, -1) from None
    mount("none", "/", MS_REC | MS_PRIVATE, -1)  # nothing below reaches the host's mounts
    root = ""
    if any(not os.path.lexists("/" + target.strip("/").split("/")[0]) for _, target in mounts):
        root = scratch
        mount("tmpfs", root, 0, -1, b"tmpfs", b"mode=755")
        for name in os.listdir("/"):
            host, inside = "/" + name, root + "/" + name
            try:
                if os.path.islink(host):
                    os.symlink(os.readlink(host), inside)
                    continue
                if os.path.isdir(host):
                    os.mkdir(inside)
                else:
                    open(inside, "w").close()
            except OSError as error:
                raise MountRefused(error.errno or errno.EIO, -1) from None
            mount(host, inside, MS_BIND | MS_REC, -1)
    bound: list[str] = []
    made: set[str] = set()  # directories made in the new root (a tmpfs), never on the host
    for index, (source, target) in enumerate(mounts):
        path = root + target
        if not os.path.lexists(path):
            existing = os.path.dirname(target.rstrip("/"))
            while not os.path.lexists(root + existing):
                existing = os.path.dirname(existing)
            inside_volume = any(existing == b or existing.startswith(b.rstrip("/") + "/") for b in bound)
            base = os.path.realpath(root) if root else ""
            plain = os.path.realpath(root + existing) == (base + existing if existing != "/" else base or "/")
            if not plain or not (inside_volume or (root and (existing == "/" or existing in made))):
                raise MountRefused(errno.ENOENT, index)  # never a directory made on the host itself
            try:
                parent = target if os.path.isdir(source) else os.path.dirname(target.rstrip("/"))
                while parent != existing and parent != "/":
                    made.add(parent)
                    parent = os.path.dirname(parent)
                if os.path.isdir(source):
                    os.makedirs(path)
                else:
                    os.makedirs(os.path.dirname(path), exist_ok=True)
                    open(path, "w").close()
            except OSError as error:
                raise MountRefused(error.errno or errno.EIO, index) from None
        mount(source, path, MS_BIND | MS_REC, index)
        bound.append(target)
    if root:
        cwd = os.getcwd()
        os.chdir(root)
        mount(root, "/", MS_MOVE, -1)
        check(libc.chroot(b"."), -1)
        os.chdir(cwd)


def main() -> int:
    control = int(sys.argv[1])
    count = int(sys.argv[2])
    if count:
        required, scratch = sys.argv[3] == "1", sys.argv[4]
        pairs = sys.argv[5 : 5 + 2 * count]
        argv = sys.argv[5 + 2 * count :]
        try:
            private_mounts(list(zip(pairs[::2], pairs[1::2])), scratch)
        except MountRefused as refused:
            if required or refused.index >= 0:
                os.write(control, b"refused %d %d\n" % (refused.code, refused.index))
                return 127
    else:
        argv = sys.argv[3:]
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
