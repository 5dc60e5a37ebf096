"""Reading the logs of a TrainJob's nodes through the ``Cluster`` interface.

Pods are found by the labels JobSet and the Job controller put on them (TrainJob
labels do not reach pods). Unlike the Kubeflow SDK, which returns nothing for a
Pending pod, following a node waits for its pod to start, and follows the node's
newest pod across gang restarts until the job ends.
"""

from __future__ import annotations

import time
from typing import Callable, Iterator, Optional

from nemo_kubeflow.cluster import Cluster
from nemo_kubeflow.constants import (
    COMPLETION_INDEX_LABEL,
    JOBSET_NAME_LABEL,
    REPLICATED_JOB_LABEL,
    TRAINER_NODE,
    TRAINJOB_KIND,
)
from nemo_kubeflow.status import job_status, newest_pods_by_node


def node_selector(trainjob: str, index: Optional[int] = None) -> str:
    selector = f"{JOBSET_NAME_LABEL}={trainjob},{REPLICATED_JOB_LABEL}={TRAINER_NODE}"
    if index is not None:
        selector += f",{COMPLETION_INDEX_LABEL}={index}"
    return selector


def _newest_pod(cluster: Cluster, namespace: str, trainjob: str, index: int) -> Optional[dict]:
    pods = cluster.list("Pod", namespace, node_selector(trainjob, index))
    return newest_pods_by_node(pods).get(index)


def node_log_lines(
    cluster: Cluster,
    namespace: str,
    trainjob: str,
    index: int,
    *,
    follow: bool = False,
    poll: float = 1.0,
    sleep: Callable[[float], None] = time.sleep,
) -> Iterator[str]:
    """Lines (ending in newline) of node ``index``, each prefixed ``[node-<index>]``."""
    prefix = f"[node-{index}] "
    seen_pod: Optional[str] = None
    while True:
        pod = _newest_pod(cluster, namespace, trainjob, index)
        phase = ((pod or {}).get("status") or {}).get("phase")
        name = (pod or {}).get("metadata", {}).get("name")
        if pod is not None and phase != "Pending" and name != seen_pod:
            if seen_pod is not None:
                restart = pod["metadata"].get("labels", {}).get("jobset.sigs.k8s.io/restart-attempt", "?")
                yield f"{prefix}--- gang restart: following pod {name} (restart attempt {restart}) ---\n"
            seen_pod = name
            for line in cluster.pod_log(name, namespace, container=TRAINER_NODE, follow=follow):
                yield prefix + line + "\n"
            if not follow:
                return
            continue
        if not follow:
            return
        # Following: stop once the job is over and no newer pod will come.
        state = job_status(cluster.get(TRAINJOB_KIND, trainjob, namespace), name=trainjob).state
        if state.name in ("SUCCEEDED", "FAILED", "CANCELLED"):
            return
        sleep(poll)
