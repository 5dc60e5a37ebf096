"""Applying a built ``Submission`` to a cluster: the only code that writes.

Order, and why:

1. PVCs marked ``create`` (409 = the claim exists: use it). Claims hold data, so they
   are never owned by the TrainJob; one created here is removed again if the
   submission fails.
2. The runtime, named by its content hash (409 = identical runtime exists: reuse). Skipped
   when this process already created or reused it on this cluster (``known_runtimes``). If a
   runtime we did not create here is gone by the time the TrainJob arrives (deleted since, by
   ``nemo-kubeflow gc`` say), Trainer's webhook refuses the TrainJob ("must be created before
   the TrainJob"): the runtime is created then and the TrainJob sent again.
3. The TrainJob, created **suspended**: nothing runs yet.
4. The task's ConfigMaps and Secret, each with an ``ownerReference`` to the TrainJob,
   so Kubernetes deletes them with it (cancel, or cleanup by anyone). A shared ConfigMap of code
   (``SHARED_CODE_LABEL``, named by its content) may exist already, owned by other TrainJobs: this one is
   added to its owners (a strategic merge patch, which keeps the others), so Kubernetes deletes it with
   the last of them. Once this process has created or patched it, the next task patches it at once
   (one request; a 404 creates it again), else creates it (a 409 patches).
5. Resume: ``spec.suspend=false``, skipped with a Kueue queue (``queue_name``): Kueue unsuspends
   the job when it admits it. The LocalQueue is checked before step 1.

A failure at any step removes what this submission created (deleting the TrainJob
is enough for everything it owns), then raises ``SubmissionError`` with the server's
reason. A process killed between 3 and 5 leaves only a suspended TrainJob that owns
everything else: inert, and one delete away from nothing.

The whole submission has a deadline (``timeout``: the executor's ``submit_timeout_seconds``): a
stalled API server ends it there, with what it had created removed (the removal has its own,
``ROLLBACK_TIMEOUT_S``). ``stop`` (a Ctrl-C, nemo_run/interrupt.py) is asked before every write up
to the resume: when it says stop, what was created is removed the same way (nothing ran) and
``SubmissionStopped`` is raised. Once the resume is sent the job runs: a stop comes too late.
"""

from __future__ import annotations

import copy
import logging
import os
import sys
import time
import uuid
from dataclasses import dataclass, field
from typing import Callable, Optional

from nemo_kubeflow.build import manifests as mf
from nemo_kubeflow.build.plan import Submission
from nemo_kubeflow.cluster.admission import check_admission
from nemo_kubeflow.cluster.client import Cluster
from nemo_kubeflow.cluster.kinds import describe_target, kubectl_delete
from nemo_kubeflow.cluster.versions import check_runtime_ttl
from nemo_kubeflow.constants import (
    BUNDLE_HASH_ANNOTATION,
    CLUSTER_RUNTIME_KIND,
    KUEUE_GROUP,
    KUEUE_VERSIONS,
    LOCALQUEUE_KIND,
    SHARED_CODE_LABEL,
    SUBMISSION_ANNOTATION,
    TRAINJOB_KIND,
    queue_name,
)
from nemo_kubeflow.errors import (
    AlreadyExistsError,
    ClusterError,
    ConfigError,
    ManifestValidationError,
    NotFoundError,
    PermissionDeniedError,
    SubmissionError,
    SubmissionStopped,
)
from nemo_kubeflow.schema.names import pod_name_problems
from nemo_kubeflow.schema.patch_conflicts import runtime_patch_conflicts

log = logging.getLogger(__name__)

#: A submission's deadline when none is given (the executor's ``submit_timeout_seconds`` default).
SUBMIT_TIMEOUT_S = 60.0
#: The deadline of removing what a failed or stopped submission created (its deletes, retries included).
ROLLBACK_TIMEOUT_S = 20.0
#: Tries of adding a TrainJob to a shared ConfigMap's owners that other submissions' patches made conflict.
OWNER_PATCH_ATTEMPTS = 20
#: What sets a submission's deadline, as the error names it.
TIMEOUT_SETTING = "submit_timeout_seconds"


def read_secret_values(sources: dict[str, str]) -> mf.SecretValues:
    """Read ``env:NAME`` / ``file:PATH`` sources on the submitting machine into a ``SecretValues`` (masked
    in every repr). No value is ever a plain local here: a traceback with locals shows none.

    Raises ``ConfigError`` naming the variable and the source (never the value) when a source is missing,
    empty or (a file) not UTF-8 text.
    """
    values = mf.SecretValues()
    for key, source in sources.items():
        kind, _, ref = source.partition(":")
        reader = _SECRET_READERS.get(kind)
        if reader is None:
            raise ConfigError(f"secret_env_vars[{key!r}]: unknown source {kind!r}; use env: or file:")
        reader(values, key, ref)
    return values


def _set_from_env(values: mf.SecretValues, key: str, ref: str) -> None:
    """``values[key]`` from the environment variable ``ref`` (``env:NAME``), which must be set and not empty."""
    if ref not in os.environ:
        raise ConfigError(
            f"secret_env_vars[{key!r}] reads ${ref}, which is not set in this environment; "
            f"export {ref} before submitting"
        )
    values.set(key, os.environ[ref])
    if not values[key].strip():
        raise ConfigError(
            f"secret_env_vars[{key!r}] reads ${ref}, which is empty in this environment; "
            f"export {ref} with the secret's value before submitting"
        )


def _set_from_file(values: mf.SecretValues, key: str, ref: str) -> None:
    """``values[key]`` from the file ``ref`` (``file:PATH``), which must be readable, UTF-8 and not empty."""
    path = os.path.expanduser(ref)
    try:
        text = _read_text(path)
    except OSError as e:
        raise ConfigError(f"secret_env_vars[{key!r}]: cannot read {path!r}: {e.strerror}") from None
    if text is None:
        raise ConfigError(
            f"secret_env_vars[{key!r}]: {path!r} is not UTF-8 text; an env value must be text: "
            "store the secret as text (base64-encode binary data) and decode it in the task"
        )
    values.set(key, text.rstrip("\n"))
    del text
    if not values[key].strip():
        raise ConfigError(
            f"secret_env_vars[{key!r}]: {path!r} is empty; write the secret's value into it, "
            "or point the source at the file that holds it"
        )


#: How each kind of ``secret_env_vars`` source (``KIND:REF``) is read into the values.
_SECRET_READERS: dict[str, Callable[[mf.SecretValues, str, str], None]] = {
    "env": _set_from_env,
    "file": _set_from_file,
}


def _read_text(path: str) -> Optional[str]:
    """A file's UTF-8 text, ``None`` when it is not UTF-8 (the decode error, which carries the bytes,
    never leaves this frame)."""
    with open(path, "rb") as f:
        try:
            return f.read().decode("utf-8")
        except UnicodeDecodeError:
            return None


def check_secret_sources(sources: dict[str, str]) -> None:
    """The same checks as ``read_secret_values`` without keeping any value (for dry runs)."""
    read_secret_values(sources)


@dataclass
class SubmitResult:
    trainjob: dict
    #: (verb, kind, name) of every write, in order; for summaries and tests.
    actions: list[tuple[str, str, str]] = field(default_factory=list)


def submit(
    cluster: Cluster,
    sub: Submission,
    *,
    resume: bool = True,
    runtime_wait: float = 5.0,
    sleep: Callable[[float], None] = time.sleep,
    known_runtimes: Optional[set] = None,
    timeout: float = SUBMIT_TIMEOUT_S,
    stop: Optional[Callable[[], bool]] = None,
    rules_read: Optional[dict] = None,
) -> SubmitResult:
    """Create everything in ``sub``; on failure remove what was created and raise.

    ``known_runtimes``: runtimes (``runtime_key``) that earlier submissions to the same cluster
    created or reused; theirs is not sent again. Also the shared ConfigMaps they created or joined
    (``object_key``): those are patched at once. Updated in place. ``timeout``: seconds the whole
    submission may take (``submit_timeout_seconds``). ``stop``: asked before each write up to the
    resume; ``True`` removes what was created and raises ``SubmissionStopped``. ``rules_read``: the namespaces'
    rules earlier submissions to the same cluster read lately (cluster/admission.py), reused; updated in place.
    """
    secret_values = read_secret_values(sub.secret_sources) if sub.secret_sources else mf.SecretValues()
    applying = _Applying(cluster, sub, stop, known_runtimes if known_runtimes is not None else set())
    with cluster.deadline(timeout, TIMEOUT_SETTING):  # the rollback below has its own
        queue, checked = _check_before_writing(cluster, sub)
        try:
            # Reads only; inside the try so that a server that stops answering is a SubmissionError like the rest.
            check_admission(cluster, sub.trainjob, checked, sub.gpu_resource, rules_read)
            applying.create_pvcs()
            applying.send_runtime()
            trainjob = applying.create_trainjob(runtime_wait, sleep)
            applying.create_owned(trainjob, secret_values)
            applying.check_stop()
            if resume and not queue:  # with a queue, Kueue unsuspends the job when it admits it
                trainjob = cluster.patch(TRAINJOB_KIND, sub.name, sub.namespace, {"spec": {"suspend": False}})
                applying.actions.append(("patch", TRAINJOB_KIND, sub.name))
            applying.remember_runtime()
            return SubmitResult(trainjob=trainjob, actions=applying.actions)
        except BaseException as e:
            applying.roll_back(e)
            raise


def _check_before_writing(cluster: Cluster, sub: Submission) -> tuple[str, Optional[dict]]:
    """The checks that need the cluster, before anything is written: the runtime's JobSet TTL (and, with
    ``runtime_name``, that runtime), the LocalQueue. The job's queue name ("" without Kueue) and its runtime
    (``None``: an admin's that could not be read), for what the namespace admits (cluster/admission.py)."""
    # With runtime_name the admin's runtime is read once, for the checks only: never sent back.
    checked = sub.runtime if sub.runtime is not None else check_existing_runtime(cluster, sub)
    check_runtime_ttl(cluster, checked)
    queue = queue_name(sub.trainjob)
    if queue:
        check_queue(cluster, sub.namespace, queue)
    return queue, checked


@dataclass
class _Applying:
    """One submission under way: its steps, what they have created so far (what a rollback removes),
    and the log of its writes."""

    cluster: Cluster
    sub: Submission
    stop: Optional[Callable[[], bool]]
    #: ``submit``'s ``known_runtimes``, updated in place.
    known: set
    actions: list[tuple[str, str, str]] = field(default_factory=list)
    created_pvcs: list[str] = field(default_factory=list)
    created_runtime: Optional[dict] = None
    #: Shared ConfigMaps this submission created (``object_key``): gone with its TrainJob on a rollback.
    created_shared: list[tuple[str, Optional[str], str]] = field(default_factory=list)
    trainjob: Optional[dict] = None
    #: A create whose answer was lost may still be applied by the server.
    trainjob_sent: bool = False
    #: Tells our own TrainJob apart from someone else's when a create whose answer was lost
    #: (timeout, dropped connection) is retried and answered 409.
    submission_id: str = field(default_factory=lambda: uuid.uuid4().hex)

    def check_stop(self) -> None:
        if self.stop is not None and self.stop():
            raise SubmissionStopped(
                f"the submission of TrainJob {self.sub.namespace}/{self.sub.name} was stopped before the job started"
            )

    def create_pvcs(self) -> None:
        for pvc in self.sub.pvcs:
            self.check_stop()
            if _create_or_reuse(self.cluster, pvc, self.actions):
                self.created_pvcs.append(pvc["metadata"]["name"])

    def send_runtime(self) -> None:
        """Create the rendered runtime (``None`` with runtime_name), unless an earlier submission did."""
        runtime = self.sub.runtime
        if runtime is not None and runtime_key(runtime) in self.known:
            self.actions.append(("reuse", runtime["kind"], runtime["metadata"]["name"]))
        elif runtime is not None:
            self.create_runtime()

    def create_runtime(self) -> None:
        self.check_stop()
        runtime = self.sub.runtime
        if runtime is not None and _create_or_reuse(self.cluster, runtime, self.actions):
            self.created_runtime = runtime

    def create_trainjob(self, runtime_wait: float, sleep: Callable[[float], None]) -> dict:
        # A runtime this submission did not create (known, or answered 409) may be deleted before the
        # TrainJob arrives (`nemo-kubeflow gc`): then the TrainJob is refused, and the runtime created again.
        recreate = self.create_runtime if self.sub.runtime is not None and self.created_runtime is None else None
        self.check_stop()
        self.trainjob_sent = True
        self.trainjob = _create_trainjob(
            self.cluster,
            self.sub,
            self.submission_id,
            self.actions,
            runtime_wait=runtime_wait,
            sleep=sleep,
            ensure_runtime=recreate,
        )
        return self.trainjob

    def create_owned(self, trainjob: dict, secret_values: mf.SecretValues) -> None:
        """The ConfigMaps and the Secret, each owned by ``trainjob``."""
        owner = mf.owner_reference(trainjob)
        for obj in _owned_objects(self.sub, owner, secret_values):
            self.check_stop()
            if (obj["metadata"].get("labels") or {}).get(SHARED_CODE_LABEL):
                verb = self.join_shared(obj, owner)
            else:
                _create_owned(self.cluster, obj, owner["uid"])
                verb = "create"
            self.actions.append((verb, obj["kind"], obj["metadata"]["name"]))

    def join_shared(self, obj: dict, owner: dict) -> str:
        """Create the shared ConfigMap ``obj`` owned by ``owner``, or add ``owner`` to the owners of the one that
        exists. "create" or "share"."""
        key = object_key(obj)
        if key in self.known:
            shared = _add_owner(self.cluster, obj, owner)
            verb = "share"
            if shared is None:  # gone since (its last owner deleted): create it again
                shared, verb = self.cluster.create(obj), "create"
        else:
            try:
                shared, verb = self.cluster.create(obj), "create"
            except AlreadyExistsError:
                shared, verb = _add_owner(self.cluster, obj, owner), "share"
                if shared is None:  # deleted between the two requests
                    shared, verb = self.cluster.create(obj), "create"
        if verb == "create":
            self.created_shared.append(key)
        if not _same_code(obj, shared):
            # Someone else's ConfigMap under the name: leave it as it was (without us among its owners, the rollback
            # of our TrainJob cannot take it), and refuse it.
            meta = obj["metadata"]
            delete_owner = {"ownerReferences": [{"uid": owner["uid"], "$patch": "delete"}]}
            self.cluster.patch(
                obj["kind"], meta["name"], meta.get("namespace"), {"metadata": delete_owner}, strategic=True
            )
            raise _other_code(obj, shared)
        self.known.add(key)
        return verb

    def remember_runtime(self) -> None:
        if self.sub.runtime is not None:
            self.known.add(runtime_key(self.sub.runtime))

    def roll_back(self, error: BaseException) -> None:
        """Remove what this submission created (with a deadline of its own) and say what is left, if anything:
        a ``SubmissionError`` for a cluster ``error``, a note on any other."""
        with self.cluster.deadline(ROLLBACK_TIMEOUT_S):
            if self.trainjob is None and self.trainjob_sent:
                self.trainjob = _late_trainjob(self.cluster, self.sub, self.submission_id)
            left = _rollback(self.cluster, self.sub.namespace, self.trainjob, self.created_runtime, self.created_pvcs)
        if self.created_runtime is not None:
            self.known.discard(runtime_key(self.created_runtime))
        for key in self.created_shared:  # deleted with the TrainJob unless another joined it: ask again next time
            self.known.discard(key)
        _say_what_was_left(error, self.sub.name, left)


def object_key(obj: dict) -> tuple[str, Optional[str], str]:
    """(kind, namespace, name) of an object, for ``known_runtimes``."""
    meta = obj["metadata"]
    return obj["kind"], meta.get("namespace"), meta["name"]


def _add_owner(cluster: Cluster, obj: dict, owner: dict) -> Optional[dict]:
    """Add ``owner`` to the owners of ``obj`` on the server (a strategic merge patch merges ``ownerReferences``
    by uid: the others stay). ``None`` when it is not there."""
    meta = obj["metadata"]
    for attempt in range(1, OWNER_PATCH_ATTEMPTS + 1):
        try:
            return cluster.patch(
                obj["kind"],
                meta["name"],
                meta.get("namespace"),
                {"metadata": {"ownerReferences": [owner]}},
                strategic=True,
            )
        except NotFoundError:
            return None
        except ClusterError as e:
            # The tasks of an experiment are submitted in parallel: the API server retries a patch that met another
            # writer a few times (5 in kube-apiserver), then answers 409 Conflict. Apply it again.
            if e.status != 409 or attempt == OWNER_PATCH_ATTEMPTS:
                raise
            time.sleep(0.01 * attempt)
    raise AssertionError("unreachable")


def _same_code(obj: dict, shared: Optional[dict]) -> bool:
    """Whether the shared ConfigMap on the server holds the code of ``obj`` (its bundle hash): it is named by its
    content, so one of that name with other content is someone else's."""
    return _bundle_hash(shared) == _bundle_hash(obj)


def _bundle_hash(configmap: Optional[dict]) -> Optional[str]:
    return ((configmap or {}).get("metadata", {}).get("annotations") or {}).get(BUNDLE_HASH_ANNOTATION)


def _other_code(obj: dict, shared: Optional[dict]) -> AlreadyExistsError:
    meta = obj["metadata"]
    return AlreadyExistsError(
        f"ConfigMap {meta.get('namespace')}/{meta['name']} exists with other content (bundle hash "
        f"{_bundle_hash(shared)!r}, not {_bundle_hash(obj)!r}): it is not the shared code it is named for, and was "
        f"left as it was; delete it (`kubectl delete configmap -n {meta.get('namespace')} {meta['name']}`) "
        "and submit again",
        status=409,
        reason="AlreadyExists",
    )


def _owned_objects(sub: Submission, owner: dict, secret_values: mf.SecretValues) -> list[dict]:
    """The ConfigMaps and the Secret of ``sub``, owned by its TrainJob (``owner``); the Secret with its values."""
    owned = [mf.with_owner(cm, owner) for cm in sub.configmaps]
    if sub.secret is not None:
        meta = sub.secret["metadata"]
        secret = mf.secret_manifest(meta["name"], sub.namespace, secret_values, meta.get("labels", {}))
        owned.append(mf.with_owner(secret, owner))
    return owned


def _say_what_was_left(error: BaseException, name: str, left: list[tuple[str, str, Optional[str], Exception]]) -> None:
    """After the rollback: raise a ``SubmissionError`` for a cluster error, naming what is left (if anything);
    note it on any other exception (an interrupt), which the caller raises again."""
    if isinstance(error, ClusterError):
        message = (
            f"submitting TrainJob {name!r} failed: {error}. {_describe_leftovers(left)}"
            if left
            else f"submitting TrainJob {name!r} failed, nothing was left on the cluster: {error}"
        )
        raise SubmissionError(
            message,
            status=error.status,
            reason=error.reason,
            server_message=error.server_message,
        ) from error
    if left:
        note = f"submitting TrainJob {name!r} was interrupted. {_describe_leftovers(left)}"
        if sys.version_info >= (3, 11):
            error.add_note(note)
        else:  # no exception notes before Python 3.11: the log says it
            log.error("%s", note)


def runtime_key(runtime: dict) -> tuple[str, Optional[str], str]:
    """(kind, namespace, name) of a runtime, for ``known_runtimes``."""
    meta = runtime["metadata"]
    return runtime["kind"], meta.get("namespace"), meta["name"]


def check_existing_runtime(cluster: Cluster, sub: Submission) -> Optional[dict]:
    """With ``runtime_name``, the runtime must exist: say so before writing anything,
    and list the runtimes that do exist. Its replicated jobs must leave room for the pod names
    (JobSet's rule, names.pod_name_problems): else ``ManifestValidationError``, also before writing."""
    ref = sub.trainjob["spec"]["runtimeRef"]
    kind, name = ref.get("kind", CLUSTER_RUNTIME_KIND), ref["name"]
    namespace = None if kind == CLUSTER_RUNTIME_KIND else sub.namespace
    try:
        runtime = cluster.get(kind, name, namespace)
    except PermissionDeniedError as e:
        # Trainer's webhook still refuses a missing runtime, job or container; what only we check is not.
        log.warning(
            "cannot read %s %r (%s), so these were not checked: that its replicated jobs leave room "
            "for the pod names, and that the job's runtime patch (tolerations, node selector, volumes, "
            "mounts, service account, security context, pod labels) replaces none of the runtime's own "
            "settings; ask an admin for 'get' on %ss to have them checked",
            kind,
            name,
            e.reason,
            kind,
        )
        return None
    if runtime is None:
        raise _missing_runtime(cluster, kind, name, namespace)
    # The name was planned without this runtime (plan.planned_jobs): its own replicated jobs decide;
    # the runtime patch may add to the admin's runtime, never replace (runtime_patch_conflicts).
    problems = pod_name_problems(sub.trainjob, runtime) + runtime_patch_conflicts(sub.trainjob, runtime)
    if problems:
        raise ManifestValidationError(
            TRAINJOB_KIND, sub.name, [f"{p} (runtime_name={name!r}: a {kind} on the cluster)" for p in problems]
        )
    return runtime


def _missing_runtime(cluster: Cluster, kind: str, name: str, namespace: Optional[str]) -> NotFoundError:
    """The error for a ``runtime_name`` the cluster does not have, listing the runtimes it has."""
    try:
        available = sorted(o["metadata"]["name"] for o in cluster.list(kind, namespace))
    except ClusterError:
        available = []
    where = f" in namespace {namespace!r}" if namespace else ""
    listing = ", ".join(available) if available else "none"
    return NotFoundError(
        f"runtime_name={name!r}: no {kind} of that name{where} (available: {listing}); "
        "fix runtime_name, or leave it unset to let nemo_kubeflow render a runtime",
        status=404,
        reason="NotFound",
    )


def check_queue(cluster: Cluster, namespace: str, queue: str) -> None:
    """With ``queue_name``, the Kueue LocalQueue must exist: a job sent to a missing queue would stay
    suspended forever. Say so before writing anything, and list the queues that exist. Only a 404
    counts: without permission to read LocalQueues (or on any other failure) submit anyway."""
    try:
        if cluster.get(LOCALQUEUE_KIND, queue, namespace) is not None:
            return
    except ClusterError as e:
        log.debug("cannot check Kueue LocalQueue %s/%s, submitting anyway: %s", namespace, queue, e)
        return
    raise NotFoundError(
        f"queue_name={queue!r}: there is no Kueue LocalQueue {queue!r} in namespace {namespace!r} "
        f"({_queue_listing(cluster, namespace)}); "
        "the TrainJob would wait in it forever. Fix queue_name, ask an admin for the LocalQueue, "
        "or leave queue_name unset",
        status=404,
        reason="NotFound",
    )


def _queue_listing(cluster: Cluster, namespace: str) -> str:
    """The LocalQueues of ``namespace``, or why they cannot be listed."""
    try:
        available = ", ".join(sorted(o["metadata"]["name"] for o in cluster.list(LOCALQUEUE_KIND, namespace)))
    except NotFoundError:
        return (
            f"this cluster serves none of Kueue's LocalQueue APIs ({KUEUE_GROUP} "
            f"{' or '.join(KUEUE_VERSIONS)}): is Kueue installed?"
        )
    except ClusterError:
        return "the existing queues could not be listed"
    return f"queues in this namespace: {available or 'none'}"


def _create_or_reuse(cluster: Cluster, obj: dict, actions: list) -> bool:
    """Create ``obj``; ``True`` if this call created it, ``False`` if it already existed."""
    try:
        cluster.create(obj)
        actions.append(("create", obj["kind"], obj["metadata"]["name"]))
        return True
    except AlreadyExistsError:
        actions.append(("reuse", obj["kind"], obj["metadata"]["name"]))
        return False


def _create_owned(cluster: Cluster, obj: dict, owner_uid: str) -> dict:
    """Create an object owned by our TrainJob; a 409 for one already owned by it is success."""
    try:
        return cluster.create(obj)
    except AlreadyExistsError:
        meta = obj["metadata"]
        if owner_uid in _owner_uids(cluster.get(obj["kind"], meta["name"], meta.get("namespace"))):
            return obj
        raise


def _owner_uids(existing: Optional[dict]) -> list[str]:
    """The owners of an object read back (kept out of the raising frame: a Secret read back holds data)."""
    return [r.get("uid") for r in ((existing or {}).get("metadata", {}).get("ownerReferences") or [])]


def _create_trainjob(
    cluster: Cluster,
    sub: Submission,
    submission_id: str,
    actions: list,
    *,
    runtime_wait: float,
    sleep: Callable[[float], None],
    ensure_runtime: Optional[Callable[[], None]] = None,
) -> dict:
    """Create the TrainJob. ``ensure_runtime``: how to create its runtime if the webhook says it is
    missing (when this submission did not create it)."""
    trainjob = copy.deepcopy(sub.trainjob)
    trainjob["metadata"].setdefault("annotations", {})[SUBMISSION_ANNOTATION] = submission_id
    deadline = time.monotonic() + runtime_wait
    delay = 0.1
    while True:
        try:
            created = cluster.create(trainjob)
            actions.append(("create", TRAINJOB_KIND, sub.name))
            return created
        except AlreadyExistsError as e:
            existing = _our_trainjob(cluster, sub, submission_id, e)
            actions.append(("create", TRAINJOB_KIND, sub.name))
            return existing
        except ClusterError as e:
            # Trainer's webhook reads runtimes through a cache: a runtime created a moment
            # ago can still be "not found" for the TrainJob admission. Retry briefly.
            if "must be created before" not in (e.server_message or "").lower():
                raise
            if ensure_runtime is not None:
                ensure_runtime()  # a 409 here means it exists after all: the webhook's cache lags, wait below
                ensure_runtime = None
                deadline = time.monotonic() + runtime_wait
                continue
            if time.monotonic() >= deadline:
                raise
            sleep(delay)
            delay = min(delay * 2, 1.0)


def _our_trainjob(cluster: Cluster, sub: Submission, submission_id: str, error: AlreadyExistsError) -> dict:
    """The TrainJob of this name that a create answered 409 for, when it is ours (a create whose answer was
    lost, retried); another's is refused, and left untouched."""
    existing = cluster.get(TRAINJOB_KIND, sub.name, sub.namespace)
    if existing is not None and _submission_of(existing) == submission_id:
        return existing
    # Never delete-and-recreate: the existing job may be someone's running work.
    raise AlreadyExistsError(
        f"a TrainJob named {sub.name!r} already exists in namespace {sub.namespace!r} "
        "(an earlier run of the same experiment?); it was left untouched. Start a new "
        "experiment, or delete the old job first if it is yours",
        status=error.status,
        reason=error.reason,
        server_message=error.server_message,
    ) from None


def _submission_of(trainjob: Optional[dict]) -> Optional[str]:
    """The submission id a TrainJob was created with (``None``: no TrainJob, or not one of ours)."""
    return ((trainjob or {}).get("metadata", {}).get("annotations") or {}).get(SUBMISSION_ANNOTATION)


def _late_trainjob(cluster: Cluster, sub: Submission, submission_id: str) -> Optional[dict]:
    """Our TrainJob, if a create whose answer never came was applied after all (a stalled server)."""
    try:
        existing = cluster.get(TRAINJOB_KIND, sub.name, sub.namespace)
    except ClusterError as e:
        log.warning("rollback: cannot look for TrainJob %s/%s: %s", sub.namespace, sub.name, e)
        return None
    return existing if _submission_of(existing) == submission_id else None


def _rollback(
    cluster: Cluster, ns: str, trainjob: Optional[dict], runtime: Optional[dict], pvcs: list[str]
) -> list[tuple[str, str, Optional[str], Exception]]:
    """Best-effort removal of what this submission created; never masks the first error.

    Returns what could not be deleted: (kind, name, namespace, why)."""
    left: list[tuple[str, str, Optional[str], Exception]] = []
    for kind, name, namespace in _rollback_steps(ns, trainjob, runtime, pvcs):
        try:
            cluster.delete(kind, name, namespace)
        except ClusterError as e:
            log.warning("rollback: %s; delete it with: %s", e, kubectl_delete(kind, name, namespace))
            left.append((kind, name, namespace, e))
    return left


def _rollback_steps(
    ns: str, trainjob: Optional[dict], runtime: Optional[dict], pvcs: list[str]
) -> list[tuple[str, str, Optional[str]]]:
    """The (kind, name, namespace) a rollback deletes, in order: the TrainJob (which takes what it owns),
    the runtime, the claims."""
    steps: list[tuple[str, str, Optional[str]]] = []
    if trainjob is not None:
        steps.append((TRAINJOB_KIND, trainjob["metadata"]["name"], ns))
    if runtime is not None:
        kind = runtime["kind"]
        steps.append((kind, runtime["metadata"]["name"], None if kind == CLUSTER_RUNTIME_KIND else ns))
    return steps + [("PersistentVolumeClaim", name, ns) for name in pvcs]


def _describe_leftovers(left: list[tuple[str, str, Optional[str], Exception]]) -> str:
    """What a failed rollback left on the cluster, each with why and the command that deletes it."""
    items = "; ".join(
        f"{describe_target(kind, name, namespace)} ({getattr(e, 'reason', None) or e}),"
        f" delete it with `{kubectl_delete(kind, name, namespace)}`"
        for kind, name, namespace, e in left
    )
    return f"Removing what it had created failed too, so this is left on the cluster: {items}"
