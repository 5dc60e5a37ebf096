"""Functions that NeMo-Run Partial tasks run inside the (local cluster's) pods.

Shipped to the pods by ConfigMapPackager(relative_path="test", include_pattern="workloads.py").
"""

import os

#: The process that imported this module: a worker forked from a template that preloaded it
#: (``worker_preload=[..., "workloads"]``) sees the launcher's pid here, not its own.
IMPORTED_BY = os.getpid()


def greet(name: str = "world") -> None:
    print(f"hello {name} from node {os.environ.get('PET_NODE_RANK')}", flush=True)


def write_file(path: str, text: str) -> None:
    """Writes ``text`` at ``path`` (an absolute path under a mount, which reaches the pod inside the Partial's
    encoded arguments: no kubelet rewrites it)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)
    print(f"wrote {path}", flush=True)


def allreduce(expected_world_size: int) -> None:
    """Every rank contributes rank+1; the sum must be n(n+1)/2 on every rank."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    assert world == expected_world_size, (world, expected_world_size)
    value = torch.tensor([float(rank + 1)])
    dist.all_reduce(value)
    print(f"rank {rank}/{world}: all_reduce sum = {int(value.item())}", flush=True)
    dist.destroy_process_group()


def fail(code: int = 3) -> None:
    print("about to fail", flush=True)
    raise SystemExit(code)


def fault_tolerant_steps(steps: int, pid_dir: str, step_seconds: float = 0.3) -> None:
    """Gloo all-reduces, one per step; each process writes ``rank<R>-<pid>.pid`` so a test can kill it.
    (TORCHELASTIC_RESTART_COUNT counts only the failed agent's restarts: the others restart at 0.)"""
    import time
    from pathlib import Path

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    Path(pid_dir, f"rank{rank}-{os.getpid()}.pid").write_text(str(os.getpid()))
    for _ in range(steps):
        value = torch.ones(1)
        dist.all_reduce(value)
        time.sleep(step_seconds)
    print(f"rank {rank} finished {steps} steps", flush=True)
    dist.destroy_process_group()


def warm_steps(steps: int, pid_dir: str, step_seconds: float = 0.2) -> None:
    """``fault_tolerant_steps`` that also says how it was started and how it was stopped: each process
    writes ``rank<R>-<pid>.json`` (its parent, and who imported this module) and, on SIGTERM,
    ``sigterm-<pid>`` before it exits 143."""
    import json
    import signal
    import sys
    import time
    from pathlib import Path

    import torch
    import torch.distributed as dist

    def stop(signum, _frame):
        Path(pid_dir, f"sigterm-{os.getpid()}").touch()
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    Path(pid_dir, f"rank{rank}-{os.getpid()}.json").write_text(
        json.dumps({"pid": os.getpid(), "ppid": os.getppid(), "imported_by": IMPORTED_BY, "rank": rank})
    )
    for _ in range(steps):
        dist.all_reduce(torch.ones(1))
        time.sleep(step_seconds)
    dist.destroy_process_group()


def ignore_sigterm(pid_dir: str) -> None:
    """A rank that ignores SIGTERM and sleeps: only SIGKILL ends it."""
    import signal
    import time

    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    open(os.path.join(pid_dir, f"pid-{os.getpid()}"), "w").close()
    time.sleep(600)


def raise_on_rank(rank_to_fail: int, message: str) -> None:
    """One rank raises ``RuntimeError(message)`` every time it starts (the others wait): ft_launcher
    restarts the group until ``--max-restarts`` is used up, then the pod exits 1."""
    import time

    if int(os.environ["RANK"]) == rank_to_fail:
        raise RuntimeError(message)
    time.sleep(60)
