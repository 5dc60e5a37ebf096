"""Functions that NeMo-Run Partial tasks run inside the local cluster's pods, for test_rank_exceptions.py
(shipped by ConfigMapPackager(relative_path="test", include_pattern="rank_failures.py"))."""

import os
import time


def raise_on_rank(rank_to_fail: int, message: str) -> None:
    """Rank ``rank_to_fail`` raises ``ValueError(message)`` at once; the others wait to be stopped."""
    if int(os.environ["RANK"]) == rank_to_fail:
        raise ValueError(message)
    time.sleep(60)
