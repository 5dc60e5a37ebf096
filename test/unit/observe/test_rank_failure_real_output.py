"""read_rank_failure on logs that torchrun and ft_launcher really wrote, with every torch minor of 2.4 on
(test/data/torch-output/<minor>/, README.md there says how): the failed rank and its exception, whatever prefixes
the launcher and torch put before the lines."""

import re

import locations
import pytest

from nemo_kubeflow.observe.rank_failure import DIAGNOSIS_TAIL, read_rank_failure

CAPTURED = locations.DATA / "torch-output"
ERROR = "ValueError: S3BOOM: rank 1 got a bad batch"
#: Every torch minor captured: its folder's name, "2.4" ... "2.13".
VERSIONS = sorted(
    (folder.name for folder in CAPTURED.iterdir() if re.fullmatch(r"\d+\.\d+", folder.name)),
    key=lambda name: tuple(map(int, name.split("."))),
)
#: The torchrun runs where rank 1 of one node raises, by what their lines look like.
TORCHRUN_RUNS = [
    "torchrun-raise-after-init.log",  # [rank1]:[rank1]: ValueError
    "torchrun-raise-before-init.log",  # [rank1]:ValueError
    "torchrun-role-prefix-raise-after-init.log",  # [default1]:[rank1]: ValueError
    "torchrun-no-tee-raise-after-init.log",  # [rank1]: ValueError
]
#: The run of two nodes where rank 3 (node 1's local rank 1) raises: a log per node.
TWO_NODES = "torchrun-role-prefix-2-nodes-rank-3-raises"


def test_every_supported_torch_minor_is_captured_with_every_run():
    assert VERSIONS == [f"2.{minor}" for minor in range(4, 14)]
    runs = {*TORCHRUN_RUNS, "ft_launcher-raise-after-init.log", *(f"{TWO_NODES}-node-{n}.log" for n in (0, 1))}
    for version in VERSIONS:
        assert {log.name for log in (CAPTURED / version).glob("*.log")} == runs, version


def captured(version: str, name: str) -> list[str]:
    """The log's lines, without the first (the capture's own note), as many as why_failed reads."""
    lines = (CAPTURED / version / name).read_text().splitlines()
    # The note names the torch that wrote the log: the folder's minor.
    assert re.match(rf"# captured \S+ with torch {re.escape(version)}\.\d", lines[0]), lines[0]
    return lines[1:][-DIAGNOSIS_TAIL:]


@pytest.mark.parametrize("name", TORCHRUN_RUNS)
@pytest.mark.parametrize("version", VERSIONS)
def test_torchruns_failed_rank_is_told_with_its_exception(version, name):
    why = read_rank_failure(captured(version, name), 1)
    assert (why.rank, why.local_rank, why.exitcode) == (1, 1, 1)
    assert why.headline(0) == f"rank 1 on node 0: {ERROR}"
    # The rank's own traceback, without any prefix (not rank 0's gloo error, nor torchrun's ChildFailedError).
    assert why.traceback[0] == "Traceback (most recent call last):"
    assert why.traceback[-2].startswith("    raise ValueError(") and why.traceback[-1] == ERROR
    assert all(not line.startswith("[") for line in why.traceback)


@pytest.mark.parametrize("version", VERSIONS)
def test_ft_launchers_failed_rank_is_told_with_its_exception(version):
    why = read_rank_failure(captured(version, "ft_launcher-raise-after-init.log"), 1)
    assert (why.rank, why.local_rank, why.exitcode) == (1, 1, 1)
    assert why.headline(0) == f"rank 1 on node 0: {ERROR}"
    assert why.traceback[-1] == ERROR


@pytest.mark.parametrize("version", VERSIONS)
def test_torchs_prefix_names_the_global_rank_under_torchruns_prefix_of_local_ranks(version):
    # Two nodes of two processes: rank 3 is node 1's local rank 1, "[default1]:[rank3]: ValueError...".
    why = read_rank_failure(captured(version, f"{TWO_NODES}-node-1.log"), 1)
    assert (why.rank, why.local_rank) == (3, 1)
    assert why.headline(1) == "rank 3 on node 1: ValueError: S3BOOM: rank 3 got a bad batch"
    assert why.traceback[-1] == "ValueError: S3BOOM: rank 3 got a bad batch"
    # Node 0's ranks failed after it, in their barrier: its own log tells that, not rank 3's exception.
    peer = read_rank_failure(captured(version, f"{TWO_NODES}-node-0.log"), 1)
    assert peer.rank in (0, 1) and peer.headline(0).startswith(f"rank {peer.rank} on node 0: RuntimeError: [")
    assert "Connection closed by peer" in peer.error
    # So when node 0 ends first, why_failed reads on to node 1's log: rank 3 did not merely lose its peer.
    assert peer.lost_its_peer() and not why.lost_its_peer()


def test_a_rank_that_only_lost_its_peer_is_not_taken_for_the_first_failure():
    # torch 2.5.1 here: rank 1 raised, rank 0's barrier lost its peer in the same second; torchrun, which orders
    # failures by whole seconds then by rank, named rank 0 its "first observed failure".
    lines = captured("2.5", "torchrun-role-prefix-raise-after-init.log")
    report = lines[lines.index("Root Cause (first observed failure):") :]
    assert "  rank      : 0 (local_rank: 0)" in report
    why = read_rank_failure(lines, 1)
    assert why.headline(0) == f"rank 1 on node 0: {ERROR}"
    assert why.traceback[-1] == ERROR
