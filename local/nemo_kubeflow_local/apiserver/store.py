"""Object storage: what etcd plus the generic registry and the garbage collector do.

Stored objects are immutable snapshots: every write stores a new dict, so listeners and
watch history can hold references without copying. Callers always get deep copies.
"""

from __future__ import annotations

import builtins
import copy
import threading
import uuid
from collections import deque
from typing import Callable, Iterable, Optional

from nemo_kubeflow_local.apiserver import frozen
from nemo_kubeflow_local.apiserver import resources as R
from nemo_kubeflow_local.apiserver.apierrors import ApiError, already_exists, conflict, not_found
from nemo_kubeflow_local.apiserver.resources import ResourceType
from nemo_kubeflow_local.timeutil import now_rfc3339

Listener = Callable[[str, ResourceType, dict], None]

#: How many past changes a watch can resume from (etcd compacts too; older gives 410 Expired).
HISTORY = 4096


class Store:
    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._data: dict[str, dict[tuple[str, str], dict]] = {rt.key: {} for rt in R.ALL if rt.storage is None}
        self._types = {rt.key: rt for rt in R.ALL if rt.storage is None}
        self._rv = 0
        self._history: deque[tuple[int, str, ResourceType, dict]] = deque(maxlen=HISTORY)
        self._listeners: list[Listener] = []
        #: Keep stored objects read-only, so a change in place raises at its writer (frozen.py).
        self._freeze = frozen.enabled()
        #: Owner uid -> (resource key, (namespace, name)) of each object whose ownerReferences name it, in the
        #: order they first did: the garbage collector's dependents without a scan of every object (1,000
        #: TrainJobs deleted scanned every stored object about five times each: over a minute).
        self._dependents_of: dict[str, dict[tuple[str, tuple[str, str]], None]] = {}

    # --- plumbing -------------------------------------------------------------------------------

    def add_listener(self, listener: Listener) -> None:
        """`listener(event_type, resource, obj)` runs under the store lock, in commit order:
        it must only read `obj` and hand work to another thread."""
        with self._lock:
            self._listeners.append(listener)

    def remove_listener(self, listener: Listener) -> None:
        with self._lock:
            if listener in self._listeners:
                self._listeners.remove(listener)

    def _commit(self, event: str, rt: ResourceType, obj: dict) -> dict:
        self._rv += 1
        obj["metadata"]["resourceVersion"] = str(self._rv)
        if self._freeze:
            obj = frozen.freeze(obj)
        key = (obj["metadata"].get("namespace", ""), obj["metadata"]["name"])
        if event == "DELETED":
            self._index_owners(rt.key, key, self._data[rt.key].pop(key, None), None)
        else:
            self._index_owners(rt.key, key, self._data[rt.key].get(key), obj)
            self._data[rt.key][key] = obj
        self._history.append((self._rv, event, rt, obj))
        for listener in list(self._listeners):
            listener(event, rt, obj)
        return obj

    def _index_owners(self, rt_key: str, key: tuple[str, str], old: Optional[dict], new: Optional[dict]) -> None:
        """Keep ``_dependents_of`` as the object stored at ``key`` goes from ``old`` to ``new`` (None: none)."""
        before, after = _owner_uids(old), _owner_uids(new)
        for uid in before - after:
            dependents = self._dependents_of.get(uid)
            if dependents is not None:
                dependents.pop((rt_key, key), None)
                if not dependents:
                    del self._dependents_of[uid]
        for uid in after - before:
            self._dependents_of.setdefault(uid, {})[(rt_key, key)] = None

    @property
    def resource_version(self) -> str:
        with self._lock:
            return str(self._rv)

    def history_since(self, rv: int) -> Optional[list[tuple[int, str, ResourceType, dict]]]:
        """Changes after `rv`, or None when they are no longer kept. Call with the lock held."""
        if rv < self._rv and (not self._history or self._history[0][0] > rv + 1):
            return None
        return [entry for entry in self._history if entry[0] > rv]

    @property
    def lock(self) -> threading.RLock:
        return self._lock

    # --- reads -------------------------------------------------------------------------------------

    def _stored(self, rt: ResourceType, namespace: str, name: str) -> Optional[dict]:
        return self._data[rt.key].get((namespace if rt.namespaced else "", name))

    def get(self, rt: ResourceType, namespace: str, name: str) -> dict:
        with self._lock:
            obj = self._stored(rt, namespace, name)
            if obj is None:
                raise not_found(rt, name)
            return copy.deepcopy(obj)

    def find(self, rt: ResourceType, namespace: str, name: str) -> Optional[dict]:
        with self._lock:
            obj = self._stored(rt, namespace, name)
            return copy.deepcopy(obj) if obj is not None else None

    def snapshot(self, rt: ResourceType, namespace: str, name: str) -> dict:
        """The stored object itself, not a copy (ApiError 404 if absent), for a caller that only
        reads it, such as each poll of a pod's log: stored objects are never modified in place."""
        with self._lock:
            obj = self._stored(rt, namespace, name)
            if obj is None:
                raise not_found(rt, name)
            return obj

    def list(
        self, rt: ResourceType, namespace: Optional[str] = None, match: Optional[Callable[[dict], bool]] = None
    ) -> tuple[list[dict], str]:
        items, rv = self.stored_list(rt, namespace, match)
        # Copied outside the lock (stored objects are never modified in place): a list of a thousand pods
        # does not hold up every other reader and writer meanwhile.
        return [copy.deepcopy(obj) for obj in items], rv

    def stored_list(
        self, rt: ResourceType, namespace: Optional[str] = None, match: Optional[Callable[[dict], bool]] = None
    ) -> tuple[builtins.list[dict], str]:
        """``list`` without the copies, for a caller that only reads the objects (a controller's look at a
        thousand pods on each change)."""
        with self._lock:
            items = [
                obj
                for (ns, _), obj in sorted(self._data[rt.key].items())
                if (namespace is None or ns == namespace) and (match is None or match(obj))
            ]
            return items, str(self._rv)

    def stored_objects(self, rt: ResourceType) -> builtins.list[dict]:  # `list` here is the method below
        """The stored objects themselves, not copies, for a caller that only reads them (persistence.py)."""
        with self._lock:
            return list(self._data[rt.key].values())

    def namespace_exists(self, name: str) -> bool:
        with self._lock:
            return self._stored(R.NAMESPACES, "", name) is not None

    def restore(self, objects: dict[ResourceType, builtins.list[dict]], resource_version: int) -> None:
        """Load objects kept by a previous run (persistence.py) into this empty store, with their uids
        and resourceVersions; later writes continue from ``resource_version``. No watch can resume
        from before it (no history): clients list again, as after an etcd compaction."""
        with self._lock:
            for rt, items in objects.items():
                for obj in items:
                    meta = obj["metadata"]
                    key = (meta.get("namespace", "") if rt.namespaced else "", meta["name"])
                    self._index_owners(rt.key, key, self._data[rt.key].get(key), obj)
                    self._data[rt.key][key] = frozen.freeze(obj) if self._freeze else obj
            self._rv = max(self._rv, resource_version)

    # --- writes ------------------------------------------------------------------------------------

    def create(self, rt: ResourceType, obj: dict, uid: Optional[str] = None) -> dict:
        """Store a new object; metadata.name must be set (generateName is resolved by the caller).
        `uid`: the one to give it, for a controller whose object names its own uid (a Job's selector)."""
        with self._lock:
            meta = obj["metadata"]
            if rt.namespaced and not self.namespace_exists(meta["namespace"]):
                raise not_found(R.NAMESPACES, meta["namespace"])
            if self._stored(rt, meta.get("namespace", ""), meta["name"]) is not None:
                raise already_exists(rt, meta["name"])
            obj = copy.deepcopy(obj)
            meta = obj["metadata"]
            meta["uid"] = uid or str(uuid.uuid4())
            meta["creationTimestamp"] = now_rfc3339()
            if rt.has_generation:
                meta["generation"] = 1
            created = copy.deepcopy(self._commit("ADDED", rt, obj))
            self._collect_if_orphaned(rt, created)
            return created

    def replace(self, rt: ResourceType, obj: dict, *, expected_rv: Optional[str] = None) -> dict:
        """Store a new version of an existing object (server-owned metadata is kept)."""
        with self._lock:
            meta = obj["metadata"]
            old = self._stored(rt, meta.get("namespace", ""), meta["name"])
            if old is None:
                raise not_found(rt, meta["name"])
            if expected_rv and expected_rv != old["metadata"]["resourceVersion"]:
                raise conflict(rt, meta["name"])
            obj = copy.deepcopy(obj)
            meta = obj["metadata"]
            for key in ("uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds", "generation"):
                if key in old["metadata"]:
                    meta[key] = old["metadata"][key]
                else:
                    meta.pop(key, None)
            if rt.has_generation and _spec_changed(old, obj, rt):
                meta["generation"] = old["metadata"].get("generation", 1) + 1
            meta["resourceVersion"] = old["metadata"]["resourceVersion"]
            if obj == old:
                return copy.deepcopy(old)  # a no-op write keeps the resourceVersion, as in Kubernetes
            if meta.get("deletionTimestamp") and not meta.get("finalizers") and rt is not R.PODS:
                self._remove(rt, obj)
                return copy.deepcopy(obj)
            stored = copy.deepcopy(self._commit("MODIFIED", rt, obj))
            if meta.get("ownerReferences") != old["metadata"].get("ownerReferences"):
                self._collect_if_orphaned(rt, stored)
            return stored

    def mutate(
        self, rt: ResourceType, namespace: str, name: str, change: Callable[[dict], Optional[dict]]
    ) -> Optional[dict]:
        """Atomic read-modify-write for controllers. `change` edits a copy and returns it, or
        returns None to leave the object alone. Returns the stored result, or None when the
        object is absent or `change` declined."""
        with self._lock:
            old = self._stored(rt, namespace, name)
            if old is None:
                return None
            new = change(copy.deepcopy(old))
            if new is None:
                return None
            if new == old:
                return copy.deepcopy(old)
            if rt.has_generation and _spec_changed(old, new, rt):
                new["metadata"]["generation"] = old["metadata"].get("generation", 1) + 1
            return copy.deepcopy(self._commit("MODIFIED", rt, new))

    def delete(
        self,
        rt: ResourceType,
        namespace: str,
        name: str,
        *,
        propagation: str = "Background",
        grace_seconds: Optional[int] = None,
        preconditions: Optional[dict] = None,
    ) -> tuple[dict, bool]:
        """Delete (or start deleting) an object. Returns (object, removed_now).

        Pods on a node and objects with finalizers only get a deletionTimestamp: the kubelet
        (or whoever owns the finalizer) removes them later.
        """
        with self._lock:
            old = self._stored(rt, namespace, name)
            if old is None:
                raise not_found(rt, name)
            pre = preconditions or {}
            if pre.get("uid") and pre["uid"] != old["metadata"]["uid"]:
                raise ApiError(
                    409,
                    f"Precondition failed: UID in precondition: {pre['uid']}, "
                    f"UID in object meta: {old['metadata']['uid']}",
                    reason="Conflict",
                )
            if pre.get("resourceVersion") and pre["resourceVersion"] != old["metadata"]["resourceVersion"]:
                raise conflict(rt, name)
            obj = copy.deepcopy(old)
            if propagation == "Orphan":
                self._orphan(obj["metadata"]["uid"])
            graceful = rt is R.PODS and _pod_needs_grace(obj, grace_seconds)
            if graceful or obj["metadata"].get("finalizers"):
                if obj["metadata"].get("deletionTimestamp"):
                    return copy.deepcopy(old), False
                obj["metadata"]["deletionTimestamp"] = now_rfc3339()
                if graceful:
                    grace = (
                        grace_seconds
                        if grace_seconds is not None
                        else obj["spec"].get("terminationGracePeriodSeconds", 30)
                    )
                    obj["metadata"]["deletionGracePeriodSeconds"] = grace
                return copy.deepcopy(self._commit("MODIFIED", rt, obj)), False
            self._remove(rt, obj)
            return copy.deepcopy(obj), True

    def remove(self, rt: ResourceType, namespace: str, name: str, uid: Optional[str] = None) -> None:
        """Remove an object now (the kubelet, once a pod's containers are gone)."""
        with self._lock:
            old = self._stored(rt, namespace, name)
            if old is not None and (uid is None or old["metadata"]["uid"] == uid):
                self._remove(rt, copy.deepcopy(old))

    def _remove(self, rt: ResourceType, obj: dict) -> None:
        self._commit("DELETED", rt, obj)
        uid = obj["metadata"]["uid"]
        if rt is R.NAMESPACES:
            for key, objects in self._data.items():
                for ns, name in [k for k in objects if k[0] == obj["metadata"]["name"]]:
                    self._delete_quietly(self._types[key], ns, name)
        for rt_dep, dependent in list(self._dependents(uid)):
            self._collect_or_drop_owner(rt_dep, dependent)

    def _collect_or_drop_owner(self, rt: ResourceType, dependent: dict) -> None:
        """An owner of ``dependent`` is gone: the garbage collector deletes it when all its owners are gone,
        else removes the dangling references and keeps it (Kubernetes' GC, attemptToDeleteItem)."""
        meta = dependent["metadata"]
        refs = meta.get("ownerReferences") or []
        solid = [ref for ref in refs if not self._owner_gone(dependent, ref)]
        if not solid:
            self._delete_quietly(rt, meta.get("namespace", ""), meta["name"])
            return
        obj = copy.deepcopy(dependent)
        obj["metadata"]["ownerReferences"] = solid
        self._commit("MODIFIED", rt, obj)

    def _collect_if_orphaned(self, rt: ResourceType, obj: dict) -> None:
        """The garbage collector deletes an object whose owners are all gone. Deleting an owner
        collects the dependents it has then; this takes one created (or given its owners) later,
        say by a controller that read the owner just before it was deleted."""
        refs = obj["metadata"].get("ownerReferences") or []
        if refs and all(self._owner_gone(obj, ref) for ref in refs):
            self._delete_quietly(rt, obj["metadata"].get("namespace", ""), obj["metadata"]["name"])

    def _owner_gone(self, dependent: dict, ref: dict) -> bool:
        """The GC's "dangling" check: no owner of that kind and name, or one with another uid."""
        owner_rt = R.by_kind(ref.get("apiVersion", ""), ref.get("kind", ""))
        if owner_rt is None:
            return False  # a kind not served here: the GC cannot look it up and keeps the dependent
        owner = self._stored(owner_rt, dependent["metadata"].get("namespace", ""), ref.get("name", ""))
        return owner is None or owner["metadata"]["uid"] != ref.get("uid")

    def _delete_quietly(self, rt: ResourceType, namespace: str, name: str) -> None:
        try:
            self.delete(rt, namespace, name)
        except ApiError:
            pass  # already gone through another owner

    def _dependents(self, uid: str) -> Iterable[tuple[ResourceType, dict]]:
        """The objects whose ownerReferences name ``uid``, kind by kind as stored."""
        order = {key: i for i, key in enumerate(self._data)}
        found = sorted(self._dependents_of.get(uid, {}), key=lambda entry: order[entry[0]])
        for rt_key, key in found:
            obj = self._data[rt_key].get(key)
            if obj is not None:
                yield self._types[rt_key], obj

    def _orphan(self, uid: str) -> None:
        for rt, dependent in list(self._dependents(uid)):
            obj = copy.deepcopy(dependent)
            obj["metadata"]["ownerReferences"] = [
                ref for ref in obj["metadata"]["ownerReferences"] if ref.get("uid") != uid
            ] or None
            if obj["metadata"]["ownerReferences"] is None:
                del obj["metadata"]["ownerReferences"]
            self._commit("MODIFIED", rt, obj)


def _spec_changed(old: dict, new: dict, rt: ResourceType) -> bool:
    ignored = {"metadata", "status"} if rt.status_subresource else {"metadata"}
    strip = lambda o: {k: v for k, v in o.items() if k not in ignored}  # noqa: E731
    return strip(old) != strip(new)


def _pod_needs_grace(pod: dict, grace_seconds: Optional[int]) -> bool:
    """Pods that never reached a node, or already finished, are deleted at once (pod strategy)."""
    if grace_seconds == 0:
        return False
    return bool(pod["spec"].get("nodeName")) and pod.get("status", {}).get("phase") not in ("Succeeded", "Failed")


def _owner_uids(obj: Optional[dict]) -> set[str]:
    """The uids the ownerReferences of ``obj`` name (none for None)."""
    if obj is None:
        return set()
    return {ref["uid"] for ref in obj["metadata"].get("ownerReferences") or () if ref.get("uid")}
