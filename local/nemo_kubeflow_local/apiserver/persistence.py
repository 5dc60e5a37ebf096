"""The API objects kept in the workdir, so that a local cluster restarted on the same workdir has them.

What etcd is to a real API server, in the simplest form: the store is written as one JSON file
(``STORE_FILE``, mode 0600: it holds the Secrets) at most once a second after a change, and once more
when the cluster stops; a restart reads it back before any controller runs. A crash loses at most the
last second of writes.

Kept: what clients create and what the controllers keep in it (namespaces, ConfigMaps, Secrets,
claims, TrainJobs and their status, runtimes, Kueue's queues, quotas and Workloads, and what a namespace's
admission reads: ServiceAccounts, ResourceQuotas, LimitRanges, PriorityClasses, policies). Not kept: what
lived with the processes of the stopped cluster (pods, and the Jobs, JobSets and Services the
emulated controllers built around them, whose progress they held in memory), Nodes (registered at
each start) and Events (a real cluster drops them after an hour).

A TrainJob whose run was under way when the cluster stopped (not finished, not suspended, with pods
or Jobs then) cannot go on: its processes are gone. It is restored ``Failed``, reason
``LocalClusterRestarted``, saying so; one that had not started yet starts now, as it would have.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from nemo_kubeflow_local import constants as C
from nemo_kubeflow_local.apiserver import resources as R
from nemo_kubeflow_local.apiserver.resources import ResourceType
from nemo_kubeflow_local.apiserver.store import Store
from nemo_kubeflow_local.timeutil import set_condition

logger = logging.getLogger(__name__)

STORE_FILE = "apiserver-store.json"
FORMAT_VERSION = 1
#: Written at most this often while objects change.
SAVE_INTERVAL_S = 1.0
#: Gone with the stopped cluster's processes, or rebuilt at start.
NOT_KEPT = (R.PODS, R.JOBS, R.JOBSETS, R.SERVICES, R.NODES, R.EVENTS)
INTERRUPTED_REASON = "LocalClusterRestarted"
INTERRUPTED_MESSAGE = (
    "the local cluster was stopped while this TrainJob ran and restarted on the same workdir: "
    "its pods' processes were killed when it stopped and are gone; submit it again"
)


class StoreUnreadable(RuntimeError):
    """The kept objects cannot be read back: the start stops rather than begin empty unannounced."""


def kept_types() -> list[ResourceType]:
    return [rt for rt in R.ALL if rt.storage is None and rt not in NOT_KEPT]


@dataclass
class Restored:
    """What a start found in the workdir."""

    path: Path
    #: Objects restored, per resource (``trainjobs.trainer.kubeflow.org``: 3).
    counts: dict[str, int] = field(default_factory=dict)
    #: ``namespace/name`` of the TrainJobs that were running and are now Failed.
    interrupted: list[str] = field(default_factory=list)

    def summary(self) -> str:
        kinds = ", ".join(f"{n} {key.split('.')[0]}" for key, n in sorted(self.counts.items()) if n)
        text = (
            f"Restored the API objects kept in {self.path} ({kinds or 'none'}); pods, Jobs, JobSets and "
            "events of the previous run are not kept."
        )
        if self.interrupted:
            text += (
                f"\n{len(self.interrupted)} TrainJob(s) were running when it stopped and are now Failed "
                f"({INTERRUPTED_REASON}): {', '.join(self.interrupted)}"
            )
        return text


def restore(store: Store, workdir: Path) -> Optional[Restored]:
    """Load ``workdir``'s kept objects into the (fresh) store; None when there is nothing kept."""
    path = workdir / STORE_FILE
    if not path.exists():
        return None
    try:
        saved = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise StoreUnreadable(
            f"cannot read the API objects kept in {path} ({type(error).__name__}: {error}); "
            "start with --forget (or remove the file) to start empty"
        ) from None
    if not isinstance(saved, dict) or saved.get("formatVersion") != FORMAT_VERSION:
        version = saved.get("formatVersion") if isinstance(saved, dict) else None
        raise StoreUnreadable(
            f"{path} was not written by this version of the local cluster (format {version!r}, this "
            f"one reads {FORMAT_VERSION}): start with --forget (or remove the file) to start empty"
        )
    types = {rt.key: rt for rt in kept_types()}
    objects = {types[key]: items for key, items in saved["objects"].items() if key in types}
    running = {(tj_ns, name) for tj_ns, name in (tuple(k) for k in saved.get("running", []))}
    report = Restored(path, {rt.key: len(items) for rt, items in objects.items()})
    for tj in objects.get(R.TRAINJOBS, []):
        key = (tj["metadata"]["namespace"], tj["metadata"]["name"])
        if key in running and not _finished(tj) and not (tj.get("spec") or {}).get("suspend"):
            _mark_interrupted(tj)
            report.interrupted.append("/".join(key))
    store.restore(objects, int(saved["resourceVersion"]))
    return report


def _finished(tj: dict) -> bool:
    return any(
        c.get("type") in ("Complete", "Failed") and c.get("status") == "True"
        for c in (tj.get("status") or {}).get("conditions") or []
    )


def _mark_interrupted(tj: dict) -> None:
    status = tj.setdefault("status", {})
    set_condition(status.setdefault("conditions", []), "Failed", "True", INTERRUPTED_REASON, INTERRUPTED_MESSAGE)
    for job in status.get("jobsStatus") or []:
        job.update(active=0, ready=0)


class Saver:
    """Writes the kept objects of ``store`` to ``workdir`` after changes (see the module's docstring)."""

    def __init__(self, store: Store, workdir: Path):
        self.store, self.path = store, workdir / STORE_FILE
        self._types = kept_types()
        self._dirty = threading.Event()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="store-saver", daemon=True)
        store.add_listener(self._on_change)

    def start(self) -> None:
        self.save()  # what was restored (a TrainJob now Failed) is kept even if nothing changes
        self._thread.start()

    def stop(self) -> None:
        self.store.remove_listener(self._on_change)
        self._stopping.set()
        self._dirty.set()
        if self._thread.is_alive():
            self._thread.join(10.0)
        self.save()

    def _on_change(self, event: str, rt: ResourceType, obj: dict) -> None:
        if rt not in (R.NODES, R.EVENTS):  # not kept, and frequent (heartbeats)
            self._dirty.set()

    def _loop(self) -> None:
        while not self._stopping.is_set():
            self._dirty.wait()
            if self._stopping.is_set():
                return
            self._dirty.clear()
            try:
                self.save()
            except OSError as error:
                logger.error("could not keep the API objects in %s: %s", self.path, error)
            self._stopping.wait(SAVE_INTERVAL_S)

    def save(self) -> None:
        with self.store.lock:  # stored objects are never changed in place: references are a snapshot
            objects = {rt.key: self.store.stored_objects(rt) for rt in self._types}
            rv = self.store.resource_version
            running = sorted(
                {
                    (p["metadata"]["namespace"], p["metadata"]["labels"][C.JOBSET_NAME_LABEL])
                    for rt in (R.PODS, R.JOBS)
                    for p in self.store.stored_objects(rt)
                    if C.JOBSET_NAME_LABEL in (p["metadata"].get("labels") or {})
                }
            )
        text = json.dumps(
            {"formatVersion": FORMAT_VERSION, "resourceVersion": rv, "running": running, "objects": objects},
            separators=(",", ":"),
        )
        fd, partial = tempfile.mkstemp(prefix=".store-", dir=self.path.parent)  # mode 0600: Secrets
        try:
            with os.fdopen(fd, "w") as f:
                f.write(text)
            os.replace(partial, self.path)
        except BaseException:
            if os.path.exists(partial):
                os.unlink(partial)
            raise
