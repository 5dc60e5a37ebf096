"""What ``log_iter`` shows for a node whose pod's log is gone: the lines kept next to the job, or why there are
none (its pod is gone and none was kept, or it printed nothing)."""

from __future__ import annotations

from nemo_kubeflow.cluster.client import ClusterReader
from nemo_kubeflow.constants import TRAINJOB_KIND
from nemo_kubeflow.observe.kept_logs import kept_node_log, node_log_path
from nemo_kubeflow.observe.log_follower import node_selector


def kept_or_no_log(cluster: ClusterReader, namespace: str, name: str, k: int, job_dir: str) -> list[str]:
    """Node ``k``'s log as kept next to the job, or why it has none (``no_log``)."""
    kept = kept_node_log(job_dir, k) if job_dir else []
    return kept or no_log(cluster, namespace, name, k, job_dir)


def no_log(cluster: ClusterReader, namespace: str, name: str, k: int, job_dir: str) -> list[str]:
    """Why node ``k`` has no log to show: its pod is gone and none was kept, or it printed nothing."""
    if cluster.list("Pod", namespace, node_selector(name, k)):
        return []  # the pod is there and printed nothing (yet)
    gone = "no longer exists" if cluster.get(TRAINJOB_KIND, name, namespace) is None else "has no pod for it"
    where = (
        f"logs are kept in {node_log_path(job_dir, k)} when they are followed (an attached run, "
        "`nemo-kubeflow logs -f`) or saved when the job fails"
        if job_dir
        else "this job has no job directory to keep logs in"
    )
    return [
        f"--- node {k}: no log: TrainJob {namespace}/{name} {gone}, so its pods and their logs are gone, "
        f"and no log was kept ({where})\n"
    ]
