"""While the API server does not answer, the client says so once (INFO), its further retries go to DEBUG, and
the first answer after the outage is said (INFO): over HTTP to the local cluster, its connections dropped."""

import logging

import pytest

from nemo_kubeflow.cluster.client import KubernetesCluster
from nemo_kubeflow.errors import ClusterUnreachableError


def test_an_outage_is_said_once_then_quietly_then_its_end(local, caplog):
    client = KubernetesCluster(str(local.kubeconfig_path), max_attempts=4, backoff=0.01, max_backoff=0.02)
    client.get("Namespace", "default")  # connected
    caplog.set_level(logging.DEBUG, logger="nemo_kubeflow.cluster")
    outage = local.inject_fault(drop_connection=True, times=10**9)
    try:
        for _ in range(3):  # three looks, each tried 4 times
            with pytest.raises(ClusterUnreachableError, match="did not answer"):
                client.get("Namespace", "default")
    finally:
        outage.remove()
    client.get("Namespace", "default")
    client.get("Namespace", "default")
    said = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "nemo_kubeflow.cluster.client"]
    info = [message for level, message in said if level >= logging.INFO]
    assert len(info) == 2, said
    assert "retrying in" in info[0] and "does not answer: its retries are logged at DEBUG" in info[0], info
    assert info[1].startswith(f"the API server at {client.api_client.configuration.host} answers again"), info
    # The other retries of the three looks (3 x 3, the first said at INFO) are there, at DEBUG.
    assert len([m for level, m in said if level == logging.DEBUG and "retrying in" in m]) == 8, said
