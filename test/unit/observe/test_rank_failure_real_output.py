"""read_rank_failure on logs that torchrun and ft_launcher really wrote (test/data/torch-output/README.md says
how): the failed rank and its exception, whatever prefixes the launcher and torch put before the lines."""

import locations
import pytest

from nemo_kubeflow.observe.rank_failure import DIAGNOSIS_TAIL, read_rank_failure

CAPTURED = locations.DATA / "torch-output"
ERROR = "ValueError: S3BOOM: rank 1 got a bad batch"


def captured(name: str) -> list[str]:
    """The log's lines, without the first (the capture's own note), as many as why_failed reads."""
    lines = (CAPTURED / name).read_text().splitlines()
    assert lines[0].startswith("# captured ") and "torch " in lines[0]
    return lines[1:][-DIAGNOSIS_TAIL:]


@pytest.mark.parametrize(
    "name",
    [
        "torchrun-raise-after-init.log",  # [rank1]:[rank1]: ValueError
        "torchrun-raise-before-init.log",  # [rank1]:ValueError
        "torchrun-role-prefix-raise-after-init.log",  # [default1]:[rank1]: ValueError
        "torchrun-no-tee-raise-after-init.log",  # [rank1]: ValueError
    ],
)
def test_torchruns_failed_rank_is_told_with_its_exception(name):
    why = read_rank_failure(captured(name), 1)
    assert (why.rank, why.local_rank, why.exitcode) == (1, 1, 1)
    assert why.headline(0) == f"rank 1 on node 0: {ERROR}"
    # The rank's own traceback, without any prefix (not rank 0's gloo error, nor torchrun's ChildFailedError).
    assert why.traceback[0] == "Traceback (most recent call last):"
    assert why.traceback[-2].startswith("    raise ValueError(") and why.traceback[-1] == ERROR
    assert all(not line.startswith("[") for line in why.traceback)


def test_ft_launchers_failed_rank_is_told_with_its_exception():
    why = read_rank_failure(captured("ft_launcher-raise-after-init.log"), 1)
    assert (why.rank, why.local_rank, why.exitcode) == (1, 1, 1)
    assert why.headline(0) == f"rank 1 on node 0: {ERROR}"
    assert why.traceback[-1] == ERROR


def test_torchs_prefix_names_the_global_rank_under_torchruns_prefix_of_local_ranks():
    # Two nodes of two processes: rank 3 is node 1's local rank 1, "[default1]:[rank3]: ValueError...".
    why = read_rank_failure(captured("torchrun-role-prefix-2-nodes-rank-3-raises-node-1.log"), 1)
    assert (why.rank, why.local_rank) == (3, 1)
    assert why.headline(1) == "rank 3 on node 1: ValueError: S3BOOM: rank 3 got a bad batch"
    # Node 0's ranks failed after it, in their barrier: its own log tells that, not rank 3's exception.
    peer = read_rank_failure(captured("torchrun-role-prefix-2-nodes-rank-3-raises-node-0.log"), 1)
    assert peer.headline(0).startswith("rank 0 on node 0: RuntimeError: [")
    assert "Connection closed by peer" in peer.error
