"""Functions that NeMo-Run Partial tasks run inside the local cluster's pods, for test_rank_exceptions.py
(shipped by ConfigMapPackager(relative_path="test", include_pattern="rank_failures.py"))."""

import os
import time


def raise_on_rank(rank_to_fail: int, message: str) -> None:
    """Rank ``rank_to_fail`` raises ``ValueError(message)`` at once; the others wait to be stopped."""
    if int(os.environ["RANK"]) == rank_to_fail:
        raise ValueError(message)
    time.sleep(60)


def raise_on_rank_after_init(rank_to_fail: int, message: str) -> None:
    """``raise_on_rank`` after ``init_process_group("gloo")``: torch (2.3 on) then prefixes the exception's lines
    with its own ``[rank<N>]: ``, inside torchrun's prefix. The others wait, outside any collective, to be stopped
    (so that the failing rank's node fails first)."""
    import torch.distributed as dist

    dist.init_process_group("gloo")
    if dist.get_rank() == rank_to_fail:
        raise ValueError(message)
    time.sleep(60)
