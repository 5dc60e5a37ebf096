"""The repair step: apply what a look at a job recommends (``Observation.actions``).

``describe`` only reads; this is the one place its recommendations turn into writes. It runs from the
attached wait (NeMo-Run's ``Runner.wait`` polling ``describe``: scheduler.py) and from ``nemo-kubeflow
watch``, never from a status query. Each action returns the line that names it in the output.

* ``DELETE_UNSTARTABLE``: delete the TrainJob, and record the outcome in the app record (records.py), so
  that later looks, in any process, report why it ended.
* ``MOVE_OFF_NODES``: one step of moving the job off the nodes that failed it (node_avoidance.move); off
  when the executor says ``avoid_failed_nodes=False`` (the TrainJob's opt-out annotation).
* ``KEEP_NODE_LOGS``: save the logs still readable next to the job, ``<job_dir>/logs/node-<k>.log``.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

from nemo_kubeflow.cluster import records
from nemo_kubeflow.constants import TRAINJOB_KIND
from nemo_kubeflow.errors import ClusterError
from nemo_kubeflow.observe.observation import (
    DELETE_UNSTARTABLE,
    KEEP_NODE_LOGS,
    MOVE_OFF_NODES,
    Observation,
    RepairAction,
)
from nemo_kubeflow.observe.status import newest_pods_by_node
from nemo_kubeflow.repair import node_avoidance

if TYPE_CHECKING:
    from nemo_kubeflow.cluster.client import Cluster
    from nemo_kubeflow.observe.kept_logs import NodeLogKeeper


@dataclass(frozen=True)
class Repaired:
    """What one action did: its kind and the line that says so ("" when there was nothing to say)."""

    kind: str
    line: str


def apply(
    cluster: Cluster,
    observation: Observation,
    record: Optional[records.AppRecord],
    keeper: Optional[NodeLogKeeper] = None,
) -> list[Repaired]:
    """Apply each recommended action, in order; what each did."""
    app = records.parse_app_id(observation.app_id)
    done = []
    for action in observation.actions:
        line = _carry_out(cluster, app, observation, action, record, keeper)
        if line is not None:
            done.append(Repaired(action.kind, line))
    return done


def _carry_out(
    cluster: Cluster,
    app: tuple[str, str],
    observation: Observation,
    action: RepairAction,
    record: Optional[records.AppRecord],
    keeper: Optional[NodeLogKeeper],
) -> Optional[str]:
    """Apply one action to the job ``app`` (namespace, name): the line that names what it did; ``None`` when
    what it needs is missing (the TrainJob to move, the job directory to keep logs in)."""
    namespace, name = app
    if action.kind == DELETE_UNSTARTABLE:
        return delete_unstartable(cluster, namespace, name, record, action.why)
    if action.kind == MOVE_OFF_NODES and observation.trainjob is not None:
        return node_avoidance.move(cluster, namespace, name, observation.trainjob, observation.nodes)
    if action.kind == KEEP_NODE_LOGS and record is not None and record.job_dir:
        return keep_node_logs(cluster, namespace, name, record.job_dir, keeper)
    return None


def delete_unstartable(
    cluster: Cluster, namespace: str, name: str, record: Optional[records.AppRecord], why: str
) -> str:
    """A job that can never start as configured (``job_view.why_waiting`` says fatal: an image the registry
    does not have): stop waiting and free the cluster. The app record keeps the outcome, so that later looks
    (which find no TrainJob) still report it."""
    cluster.delete(TRAINJOB_KIND, name, namespace)
    if record is not None:
        records.save(dataclasses.replace(record, outcome_state="FAILED", outcome_message=why))
    return f"deleted TrainJob {namespace}/{name}: it can never start ({why.split('; the TrainJob')[0]})"


def keep_node_logs(cluster: Cluster, namespace: str, name: str, job_dir: str, keeper: Optional[NodeLogKeeper]) -> str:
    """Save each node's log that has no file yet: from its pod, else the last lines kept while waiting (also
    for a pod gone between its list and its read: the Job controller deletes a failed Job's running pods)."""
    from nemo_kubeflow.observe.kept_logs import save_node_logs

    directory = os.path.join(job_dir, "logs")
    pods = _pods_by_node(cluster, namespace, name)
    kept = keeper.kept_nodes() if keeper is not None else set()
    saved = save_node_logs(cluster, namespace, pods, directory, kept) if pods else ""
    if keeper is not None and keeper.save():
        saved = directory
    return f"node logs saved in {saved}" if saved else ""


def _pods_by_node(cluster: Cluster, namespace: str, name: str) -> dict[int, dict]:
    """The newest pod of the job on each node; none when they cannot be listed (the kept lines serve then)."""
    from nemo_kubeflow.observe.log_follower import node_selector

    try:
        return newest_pods_by_node(cluster.list("Pod", namespace, node_selector(name)))
    except ClusterError:
        return {}
