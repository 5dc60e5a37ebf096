"""The cause of an in-job restart is the node whose worker died, named with its node: a signal over an exit code
(a peer's collective fails after a rank is killed), then the earliest; every node's restart lines are read."""

from nemo_kubeflow.observe.restarts import InJobRestarts, first_failure, read_in_job_restarts

#: ft_launcher's agents, after a SIGKILL of the rank on node 1: node 0's worker fails on the broken collective.
NODE_0 = [
    "[2026-11-27 06:25:40,100] [INFO] [ft_launcher1@vm] has joined round 0 of the rendezvous 'x-0' as rank 0",
    "[2026-11-27 06:25:48,316] [ERROR] [ft_launcher1@vm] failed (exitcode: 1) local_rank: 0 (pid: 476) of binary: python",
    "[2026-11-27 06:25:48,400] [INFO] [ft_launcher1@vm] Worker group FAILED. 2/2 attempts left; will restart worker group",
]
NODE_1 = [
    "[2026-11-27 06:25:40,101] [INFO] [ft_launcher2@vm] has joined round 0 of the rendezvous 'x-0' as rank 1",
    "[2026-11-27 06:25:48,900] [ERROR] [ft_launcher2@vm] failed (exitcode: -9) local_rank: 0 (pid: 486) of binary: python",
    "[2026-11-27 06:25:49,000] [INFO] [ft_launcher2@vm] Worker group FAILED. 2/2 attempts left; will restart worker group",
]
#: torchrun's agents (glog-style time), both exiting with a code: the earlier is the cause.
TORCHRUN_0 = [
    "E1127 06:23:09.100000 31265 torch/distributed/elastic/multiprocessing/api.py:1002] failed "
    "(exitcode: 1) local_rank: 1 (pid: 31448) of binary: python",
    "I1127 06:23:09.200000 31265 api.py:1] Worker group FAILED. 3/3 attempts left; will restart worker group",
]
TORCHRUN_1 = [
    "E1127 06:23:08.497000 31266 torch/distributed/elastic/multiprocessing/api.py:1002] failed "
    "(exitcode: 3) local_rank: 0 (pid: 31449) of binary: python",
    "I1127 06:23:09.300000 31266 api.py:1] Worker group FAILED. 3/3 attempts left; will restart worker group",
]


def test_the_killed_node_is_named_over_its_peers_side_effect_in_either_order():
    nodes = {0: read_in_job_restarts(NODE_0), 1: read_in_job_restarts(NODE_1)}
    for order in (nodes, dict(reversed(list(nodes.items())))):
        found = first_failure(order)
        assert found is not None and found.count == 1
        assert found.why == "local rank 0 on node 1 killed by signal 9"


def test_of_two_exit_codes_the_earliest_is_the_cause():
    found = first_failure({0: read_in_job_restarts(TORCHRUN_0), 1: read_in_job_restarts(TORCHRUN_1)})
    assert found is not None and found.why == "local rank 0 on node 1 exited with code 3"


def test_no_cause_and_no_log():
    assert first_failure({}) is None
    assert first_failure({0: InJobRestarts(2)}) == InJobRestarts(2)
