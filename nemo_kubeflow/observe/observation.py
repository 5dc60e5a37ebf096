"""What one look at a job found: its state, why, and the repairs it recommends. Plain data.

``describe`` (nemo_run/scheduler.py) only reads and returns an ``Observation``; the repairs it lists are
applied by ``repair.steps.apply``, which the attached wait and ``nemo-kubeflow watch`` call, never a
status query (docs/architecture.md, "The describe path").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from torchx.specs import AppState

#: The TrainJob can never start as configured (an image the registry does not have): delete it, and
#: record the outcome in the app record so that later looks, which find no TrainJob, still report it.
DELETE_UNSTARTABLE = "delete-unstartable"
#: A node fault restarted the gang: move the job off that node (repair/node_avoidance.py), or go on
#: with a move under way, or record why a node is not avoided.
MOVE_OFF_NODES = "move-off-nodes"
#: The job finished: save the logs still readable (pods, lines kept while waiting) next to the job.
KEEP_NODE_LOGS = "keep-node-logs"


@dataclass(frozen=True)
class RepairAction:
    kind: str
    #: Why, in the words status shows.
    why: str
    #: The nodes it concerns (node names for MOVE_OFF_NODES, node indexes for KEEP_NODE_LOGS).
    targets: tuple[str, ...] = ()


@dataclass(frozen=True)
class Observation:
    """One look at one app: what ``describe`` reports, and what it recommends doing."""

    app_id: str
    state: AppState
    message: str
    nodes: int
    role: str
    #: The TrainJob as read (None: it does not exist, or could not be read).
    trainjob: Optional[dict] = None
    actions: tuple[RepairAction, ...] = ()
    #: More to say after the message (where the job stands with the nodes that failed it).
    notes: tuple[str, ...] = ()
    #: What a look at one of many tasks asked together did not read (their node logs), and what reads it: said
    #: last in the answer, not in the console line (one per task of a thousand would drown what matters).
    unread: str = ""
