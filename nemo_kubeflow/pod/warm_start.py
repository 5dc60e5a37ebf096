"""Warm worker starts for ``ft_launcher`` (the executor's ``worker_preload`` setting).

Runs inside the training pod, so it uses the standard library only: the pod script writes this
file to a temporary directory and starts it with the image's ``python3`` (docs/resilience.md).

``launch`` (the pod's main process) imports the preloaded modules (``torch``...), forks a
*template* process from that state, then becomes ``ft_launcher``. Each worker that ft_launcher
starts (first start and every in-job restart) is this file's ``client``: a small Python without
site packages that hands its argv, environment, working directory and stdin/stdout/stderr to the
template over a Unix socket. The template forks a worker with the modules already imported, and
reports how the worker ended; the client then ends the same way (exit code, or the same signal),
so ft_launcher sees what it would have seen from a plain ``python -u script``.

* A signal ft_launcher sends to the client (SIGTERM when it stops the workers) is passed on to the
  worker; when the client dies (SIGKILL), the worker is killed too (it watches the socket).
* The template dies with the launcher (``PR_SET_PDEATHSIG``); a worker whose template is gone keeps
  running until it ends or its client dies.
* When the template cannot be reached, the client runs the script in a new Python, as without
  warm starts, and says so on stderr.
* The installed nvidia-resiliency-ext's release decides what is patched (``RENDEZVOUS_BY_RELEASE``); on a
  release not listed there, ft_launcher runs plainly, and one ``NOT_APPLIED`` line on stderr says so.
"""

import io
import json
import os
import select
import signal
import socket
import struct
import sys
from typing import Callable, Dict, Optional, Tuple

#: The template's socket; set by ``launch`` for the workers ft_launcher starts.
SOCKET_ENV = "NEMO_KUBEFLOW_WARM_SOCKET"
#: How the pod script names its copy of this file (``<prefix><pid>.py`` in ``$TMPDIR``); the launcher
#: removes a copy so named when it exits.
POD_FILE_PREFIX = "nemo-kubeflow-warm-start-"
#: Signals a client passes on to its worker (SIGKILL cannot be caught: the worker watches the socket).
FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
_HEADER = struct.Struct("!I")
_PR_SET_PDEATHSIG = 1


def _send(sock, message, fds=()):
    data = json.dumps(message).encode()
    payload = _HEADER.pack(len(data)) + data
    if fds:
        sock.sendmsg([payload], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack(f"{len(fds)}i", *fds))])
    else:
        sock.sendall(payload)


def _send_if_open(sock, message):
    """``_send``, for a peer that may be gone already (then there is no one to tell)."""
    try:
        _send(sock, message)
    except OSError:
        pass


def _recv_exact(sock, size, fds):
    data = b""
    while len(data) < size:
        chunk, ancillary, _, _ = sock.recvmsg(size - len(data), socket.CMSG_SPACE(16 * 4))
        fds.extend(_passed_fds(ancillary))
        if not chunk:
            return None
        data += chunk
    return data


def _passed_fds(ancillary):
    """The file descriptors passed in a message's ancillary data (``SCM_RIGHTS``)."""
    fds: list[int] = []
    for level, kind, raw in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.extend(struct.unpack(f"{len(raw) // 4}i", raw[: len(raw) - len(raw) % 4]))
    return fds


def _recv(sock):
    """The next message and the file descriptors that came with it; ``(None, [])`` at EOF."""
    fds: list[int] = []
    header = _recv_exact(sock, _HEADER.size, fds)
    if header is None:
        return None, fds
    body = _recv_exact(sock, _HEADER.unpack(header)[0], fds)
    return (None if body is None else json.loads(body)), fds


def _exit_like(status):
    """End this process as the worker ended: the same exit code, or killed by the same signal."""
    sys.stdout.flush()
    sys.stderr.flush()
    if "signal" in status:
        sig = status["signal"]
        if sig not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [sig])
        os.kill(os.getpid(), sig)
        os._exit(128 + sig)
    os._exit(status["exit"])


# --------------------------------------------------------------------------------------------
# The client: what ft_launcher starts for a worker
# --------------------------------------------------------------------------------------------


def client(argv):
    """Have the template fork a worker running ``argv`` (``[script, args...]`` or
    ``["-m", module, args...]``); end as it ends."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(os.environ[SOCKET_ENV])
        _send(sock, {"argv": argv, "env": dict(os.environ), "cwd": os.getcwd()}, fds=[0, 1, 2])
        started, _ = _recv(sock)
        if not started or "pid" not in started:
            raise OSError(f"the template refused to start the worker: {started}")
    except (OSError, KeyError) as error:
        sock.close()
        print(
            f"nemo-kubeflow: warm start unavailable ({error!r}); starting the worker in a new Python",
            file=sys.stderr,
            flush=True,
        )
        os.execv(sys.executable, [sys.executable, "-u", *argv])

    for sig in FORWARDED_SIGNALS:
        signal.signal(sig, lambda signum, _frame: _send_if_open(sock, {"signal": signum}))
    status, _ = _recv(sock)
    # No status: the template died while the worker ran, and the worker has ended since (the socket's
    # last other end went with it); how it ended is lost.
    _exit_like(status or {"exit": 1})


# --------------------------------------------------------------------------------------------
# The template: forks workers with the preloaded modules imported
# --------------------------------------------------------------------------------------------


def _die_with_parent():
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def template(listener, parent):
    """Serve fork requests on ``listener`` until the launcher (``parent``) is gone."""
    _die_with_parent()
    _exit_if_orphaned(parent)
    wake_r, wake_w = _wake_on_sigchld()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C on the launcher's group is the launcher's
    workers: dict[int, socket.socket] = {}  # pid -> the client's connection
    while True:
        try:
            ready, _, _ = select.select([listener, wake_r], [], [], 1.0)
        except InterruptedError:
            continue
        _exit_if_orphaned(parent)
        if wake_r in ready:
            os.read(wake_r, 4096)
        _reap(workers)
        if listener in ready:
            _serve(listener, workers, (wake_r, wake_w))


def _exit_if_orphaned(parent):
    """The template ends when its launcher (``parent``) is gone."""
    if os.getppid() != parent:
        os._exit(0)


def _wake_on_sigchld():
    """A pipe that a SIGCHLD writes to (``signal.set_wakeup_fd``), so that the template's ``select`` wakes
    when a worker ends; its (read, write) ends."""
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    return wake_r, wake_w


def _reap(workers):
    """Tell each client whose worker has ended how it ended (``workers``: pid -> the client's connection)."""
    while workers:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if not pid:
            return
        conn = workers.pop(pid, None)
        if conn is not None:
            _send_if_open(conn, _how_it_ended(status))
            conn.close()


def _how_it_ended(status):
    """A wait status as the client's message: ``{"signal": N}`` or ``{"exit": code}``."""
    if os.WIFSIGNALED(status):
        return {"signal": os.WTERMSIG(status)}
    return {"exit": os.waitstatus_to_exitcode(status)}


def _serve(listener, workers, wake_fds):
    """Accept one fork request and fork its worker; the worker closes what is the template's."""
    conn, _ = listener.accept()
    try:
        request, fds = _recv(conn)
    except (OSError, ValueError):  # a client that died mid-request: serve the next one
        request, fds = None, []
    if not request:
        _close_fds(fds)
        conn.close()
        return
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        signal.set_wakeup_fd(-1)
        _close_fds(wake_fds)
        listener.close()
        for other in workers.values():
            other.close()
        _worker(conn, request, fds)  # never returns
    _close_fds(fds)
    workers[pid] = conn
    _send_if_open(conn, {"pid": pid})


def _close_fds(fds):
    for fd in fds:
        os.close(fd)


def _watch_client(conn):
    """In the worker: pass on the signals the client forwards; die when the client is gone."""
    while True:
        try:
            message, _ = _recv(conn)
        except (OSError, ValueError):
            message = None
        if not message:
            os.kill(os.getpid(), signal.SIGKILL)
        os.kill(os.getpid(), message["signal"])


def _worker(conn, request, fds):
    """Become the worker: the client's stdio, environment, directory and argv, then run it."""
    import atexit
    import threading

    code = 1
    try:
        _take_over_client(request, fds)
        threading.Thread(target=_watch_client, args=(conn,), name="nemo-kubeflow-client-watch", daemon=True).start()
        code = _run_program(request["argv"])
        threading._shutdown()  # type: ignore[attr-defined]  # private (joins non-daemon threads), not in typeshed
        atexit._run_exitfuncs()
    except BaseException:  # setting the worker up failed: say why, as a Python that cannot start would
        import traceback

        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            if code < 0:
                signal.signal(-code, signal.SIG_DFL)
                os.kill(os.getpid(), -code)
            os._exit(code & 0xFF)


def _take_over_client(request, fds):
    """In the worker: a session of its own, default signal handling, and the client's stdio (``fds``),
    directory and environment."""
    import atexit

    os.setsid()
    for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for target, fd in enumerate(fds[:3]):
        os.dup2(fd, target)
    _close_fds(fd for fd in fds if fd > 2)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    atexit._clear()  # the launcher's exit hooks are not the worker's
    _unbuffered_stdio()


def _unbuffered_stdio():
    """``python -u``: unbuffered stdout and stderr, as torchrun and ft_launcher start their workers, on the
    client's descriptors; the originals too, as in a fresh interpreter."""
    for name, fd in (("stdout", 1), ("stderr", 2)):
        old = getattr(sys, name)
        setattr(
            sys,
            name,
            io.TextIOWrapper(
                io.FileIO(fd, "w", closefd=False), write_through=True, encoding=old.encoding, errors=old.errors
            ),
        )
    sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding=sys.stdin.encoding)
    for name in ("stdout", "stderr", "stdin"):
        setattr(sys, f"__{name}__", getattr(sys, name))


def _run_program(argv):
    """Run ``argv`` (a script, or ``-m`` and a module) as ``__main__``; its exit code (negative: the signal
    it should end with)."""
    try:
        _run_main(argv)
        return 0
    except SystemExit as exit_:
        return _exit_status(exit_.code)
    except KeyboardInterrupt:
        return -signal.SIGINT
    except BaseException:
        sys.excepthook(*sys.exc_info())
        return 1


def _run_main(argv):
    import runpy

    if argv[0] == "-m":
        sys.argv = [argv[1], *argv[2:]]
        sys.path[0] = os.getcwd()
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = list(argv)
        sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
        runpy.run_path(argv[0], run_name="__main__")


def _exit_status(code):
    """The exit status of ``SystemExit(code)``, as Python gives it: None is 0, a message is printed and 1."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


# --------------------------------------------------------------------------------------------
# The launcher: the pod's main process
# --------------------------------------------------------------------------------------------


#: The nvidia-resiliency-ext releases whose ft_launcher this file knows, with the rendezvous implementations
#: each ships: 0.4 has the legacy c10d one only (``_ft_rendezvous``); 0.5 adds the barrier one
#: (``ft_rendezvous_barrier``, chosen with ``--ft-rdzv-impl barrier``), 0.6 makes it the default and 0.7
#: deletes the legacy one (NVRx#379). Warm starts are on only for these releases (docs/resilience.md).
RENDEZVOUS_BY_RELEASE: Dict[Tuple[int, int], Tuple[str, ...]] = {
    (0, 4): ("legacy",),
    (0, 5): ("legacy", "barrier"),
    (0, 6): ("legacy", "barrier"),
    (0, 7): ("barrier",),
}
#: How the pod's log says that a warm-start setting was not applied (read by observe/restarts.py for status).
NOT_APPLIED = "nemo-kubeflow: not applied:"


def nvrx_version() -> Optional[str]:
    """The installed nvidia-resiliency-ext's version string, or None when its metadata cannot be read."""
    import importlib.metadata

    for name in ("nvidia-resiliency-ext", "nvidia_resiliency_ext"):
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def nvrx_release(version: Optional[str]) -> Optional[Tuple[int, int]]:
    """``(major, minor)`` of a known release (a key of RENDEZVOUS_BY_RELEASE), else None."""
    parts = (version or "").split(".")
    try:
        release = (int(parts[0]), int(parts[1]))
    except (IndexError, ValueError):
        return None
    return release if release in RENDEZVOUS_BY_RELEASE else None


def _legacy_polls(poll: float) -> str:
    """The legacy c10d rendezvous (``_ft_rendezvous``, 0.4 to 0.6): the wait between two looks
    (``_delay(seconds=1)``) and how long a state read is reused (``cache_duration=1``) become ``poll``.
    Returns what is missing ("" when patched)."""
    import inspect

    from nvidia_resiliency_ext.fault_tolerance import _ft_rendezvous as rendezvous

    holder = getattr(rendezvous, "_BackendRendezvousStateHolder", None)
    delay = getattr(rendezvous, "_delay", None)
    if holder is None or delay is None or "cache_duration" not in inspect.signature(holder.__init__).parameters:
        return "_ft_rendezvous has no _delay/_BackendRendezvousStateHolder(cache_duration)"

    def _delay(seconds: float) -> None:
        delay(poll if seconds == 1 else seconds)

    init = holder.__init__

    def __init__(self, *args, **kwargs) -> None:
        init(self, *args, **kwargs)
        self._cache_duration = min(self._cache_duration, poll)

    rendezvous._delay = _delay
    holder.__init__ = __init__
    return ""


class _PollClock:
    """The ``time`` module as the barrier rendezvous sees it: its one-second polls
    (``time.sleep(1.0)``) last ``poll`` seconds; everything else is ``time``'s own."""

    def __init__(self, clock, poll: float) -> None:
        self._clock, self._poll = clock, poll

    def sleep(self, seconds: float) -> None:
        self._clock.sleep(self._poll if seconds == 1 else seconds)

    def __getattr__(self, name: str):
        return getattr(self._clock, name)


def _barrier_polls(poll: float) -> str:
    """The barrier rendezvous (``ft_rendezvous_barrier``, 0.5+): its one-second polls (a node waiting for
    the next round to open; 0.5's wait for the rank assignment) and the store host's one-second floor between
    two looks at who has joined (``_compute_step2_poll_interval``, 0.6+) become ``poll``.
    Returns what is missing ("" when patched)."""
    from nvidia_resiliency_ext.fault_tolerance import ft_rendezvous_barrier as rendezvous

    state = getattr(rendezvous, "_RendezvousBarrierState", None)
    clock = getattr(rendezvous, "time", None)
    if state is None or not hasattr(clock, "sleep"):
        return "ft_rendezvous_barrier has no _RendezvousBarrierState or time module"
    rendezvous.time = _PollClock(clock, poll)
    interval = state.__dict__.get("_compute_step2_poll_interval")
    if isinstance(interval, staticmethod):
        compute = interval.__func__

        def _compute_step2_poll_interval(*args, **kwargs) -> float:
            seconds = compute(*args, **kwargs)
            return poll if seconds == 1 else seconds

        state._compute_step2_poll_interval = staticmethod(_compute_step2_poll_interval)
    return ""


_POLLS: Dict[str, Callable[[float], str]] = {"legacy": _legacy_polls, "barrier": _barrier_polls}


def _faster_rendezvous(poll: float, release: Tuple[int, int]) -> str:
    """Have ft_launcher's agents look at their rendezvous every ``poll`` seconds instead of every second,
    in each rendezvous implementation that ``release`` ships (the one ft_launcher runs is its flags' choice).
    Returns why it could not ("" when done)."""
    for impl in RENDEZVOUS_BY_RELEASE[release]:
        try:
            missing = _POLLS[impl](poll)
        except ImportError as error:
            missing = f"its {impl} rendezvous cannot be imported ({error})"
        if missing:
            return missing
    return ""


def _launch_options(args):
    """``launch``'s own options, taken off the front of ``args``: (preload, poll, module)."""
    preload, poll, module = [], None, False
    while args and args[0] in ("--preload", "--poll", "--module"):
        flag = args.pop(0)
        if flag == "--preload":
            preload = [m for m in args.pop(0).split(",") if m]
        elif flag == "--poll":
            poll = float(args.pop(0))
        else:
            module = True
    return preload, poll, module


def _known_release(preload, poll):
    """The nvidia-resiliency-ext installed, and its release; with a release this file does not know, say
    once that the warm-start settings are not applied (the marked line reaches `status`)."""
    import importlib.util

    if importlib.util.find_spec("nvidia_resiliency_ext") is None:
        raise SystemExit(
            f"nemo-kubeflow: {sys.executable} cannot import nvidia_resiliency_ext, which "
            "worker_preload and rendezvous_poll_seconds run ft_launcher with: install it for the "
            "image's python3 (docs/resilience.md)"
        )
    version = nvrx_version()
    release = nvrx_release(version)
    if release is None and (preload or poll is not None):
        _say_unknown_release(version, preload, poll)
    return version, release


def _say_unknown_release(version, preload, poll):
    """Its internals are unknown: the rendezvous could not be patched, and how it starts workers may have
    changed. ft_launcher runs plainly; say so once, naming the settings given."""
    settings = " and ".join(
        name for name, given in (("worker_preload", preload), ("rendezvous_poll_seconds", poll is not None)) if given
    )
    print(
        f"{NOT_APPLIED} {settings} (nvidia-resiliency-ext {version} is not a "
        f"release this nemo-kubeflow knows: 0.4 to 0.7; ft_launcher runs without warm starts; use an image with "
        "one of those, or a nemo-kubeflow that knows this release)",
        file=sys.stderr,
        flush=True,
    )


def _start_template(preload, module):
    """Import ``preload``, fork the template that starts each worker, and return the ft_launcher flags
    that run each worker through it, and the socket's path and directory (to remove at the end)."""
    import importlib
    import tempfile

    # Before nvidia_resiliency_ext is imported: a worker gets the state of a Python that has
    # imported these modules, and nothing of the launcher's (logging, signal handlers).
    for name in preload:
        importlib.import_module(name)
    path = os.path.join(tempfile.mkdtemp(prefix="nemo-kubeflow-warm-"), "template.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    sys.stdout.flush()
    sys.stderr.flush()
    parent = os.getpid()
    if os.fork() == 0:
        try:
            template(listener, parent)
        finally:
            os._exit(0)
    listener.close()
    os.environ[SOCKET_ENV] = path
    client_argv = [sys.executable, "-I", "-S", os.path.abspath(__file__), "client", *(["-m"] if module else [])]
    return ["--no-python", *client_argv], [path, os.path.dirname(path)]


def _remove(paths):
    for leftover in paths:
        try:
            (os.rmdir if os.path.isdir(leftover) else os.unlink)(leftover)
        except OSError:
            pass


def launch(args):
    """``launch [--preload MOD,...] [--poll SECONDS] [--module] FT_FLAGS... -- PROGRAM ARGS...``:
    fork the template with the modules imported (when any are given), then run ft_launcher, each
    worker started by the template."""
    preload, poll, module = _launch_options(args)
    if "--" not in args:
        raise SystemExit(
            "usage: warm_start.py launch [--preload MOD,...] [--poll SECONDS] [--module] FT_FLAGS... -- PROGRAM ARGS..."
        )
    split = args.index("--")
    ft_flags, program = args[:split], args[split + 1 :]
    version, release = _known_release(preload, poll)
    if release is None:
        preload, poll = [], None
    leftovers = _pod_copy()
    if preload:
        flags, paths = _start_template(preload, module)
        ft_flags, leftovers = [*ft_flags, *flags], [*leftovers, *paths]
    elif module:
        ft_flags = [*ft_flags, "-m"]
    _poll_faster(poll, release, version)
    sys.argv = ["ft_launcher", *ft_flags, *program]
    from nvidia_resiliency_ext.fault_tolerance.launcher import main

    try:
        sys.exit(main())
    finally:  # the workers are gone: this copy of the file and the socket are no longer needed
        _remove(leftovers)


def _pod_copy():
    """This file, when it is the pod script's copy (removed at the end); else nothing."""
    return [os.path.abspath(__file__)] if os.path.basename(__file__).startswith(POD_FILE_PREFIX) else []


def _poll_faster(poll, release, version):
    """With a ``poll`` (rendezvous_poll_seconds), patch the rendezvous to look every ``poll`` seconds; say
    when it could not."""
    missing = _faster_rendezvous(poll, release) if poll is not None else ""
    if missing:
        print(
            f"{NOT_APPLIED} rendezvous_poll_seconds (nvidia-resiliency-ext {version}: {missing}; the "
            "rendezvous polls every second)",
            file=sys.stderr,
            flush=True,
        )


if __name__ == "__main__":
    if sys.argv[1:2] == ["client"]:
        client(sys.argv[2:])
    elif sys.argv[1:2] == ["launch"]:
        launch(sys.argv[2:])
    else:
        raise SystemExit("usage: warm_start.py launch ... | client ...")
