"""The training loop of the `recovery` benchmark (runs in the pods; shipped as the task's code).

Every step all-reduces a tensor across the ranks (gloo), so a rank cannot step while a peer is
gone; rank 0 then checkpoints the step (temporary file + rename) every ``checkpoint_every`` steps.
Each rank prints ``step N rank R t=<unix time> pid=<pid>`` and appends the same line to
``<out_dir>/steps-rank<R>.log`` (the local cluster's pods share the host's files, so the
benchmark reads the lines there: a gang restart deletes the pods, and their logs with them), and
writes ``<out_dir>/pids/rank<R>-<pid>`` (JSON: the pid, when the process was created, entered
``train`` and had its process group) so that the benchmark can SIGKILL a rank and say where a
restart's time went.
"""

import json
import os
import time
from pathlib import Path


def _created() -> float:
    """When this process was created (unix time), from /proc; NaN where there is none."""
    try:
        ticks = float(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return float("nan")
    return time.time() - uptime + ticks / os.sysconf("SC_CLK_TCK")


def train(steps: int, out_dir: str, step_seconds: float = 0.2, checkpoint_every: int = 1) -> None:
    """Train for ``steps`` steps in all, resuming from ``<out_dir>/checkpoint.pt`` when it exists."""
    entered = time.time()
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank, pid = dist.get_rank(), os.getpid()
    directory = Path(out_dir)
    (directory / "pids").mkdir(parents=True, exist_ok=True)
    (directory / "pids" / f"rank{rank}-{pid}").write_text(
        json.dumps({"pid": pid, "created": _created(), "entered": entered, "ready": time.time()})
    )
    checkpoint = directory / "checkpoint.pt"
    start = torch.load(checkpoint)["step"] if checkpoint.exists() else 0
    log = open(directory / f"steps-rank{rank}.log", "a", buffering=1)
    for step in range(start + 1, steps + 1):
        value = torch.ones(1)
        dist.all_reduce(value)
        if rank == 0 and step % checkpoint_every == 0:
            torch.save({"step": step}, directory / "checkpoint.tmp")
            os.replace(directory / "checkpoint.tmp", checkpoint)
        line = f"step {step} rank {rank} t={time.time():.3f} pid={pid}"
        print(line, flush=True)
        log.write(line + "\n")
        time.sleep(step_seconds)
    log.close()
    dist.destroy_process_group()


if __name__ == "__main__":  # python recovery_workload.py STEPS OUT_DIR STEP_SECONDS
    import sys

    train(int(sys.argv[1]), sys.argv[2], float(sys.argv[3]))
