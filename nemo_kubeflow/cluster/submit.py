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
   so Kubernetes deletes them with it (cancel, or cleanup by anyone).
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
from nemo_kubeflow.cluster.client import Cluster, describe_target, kubectl_delete
from nemo_kubeflow.cluster.versions import check_runtime_ttl
from nemo_kubeflow.constants import (
    CLUSTER_RUNTIME_KIND,
    KUEUE_GROUP,
    KUEUE_VERSIONS,
    LOCALQUEUE_KIND,
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
from nemo_kubeflow.schema.validation import pod_name_problems, runtime_patch_conflicts

log = logging.getLogger(__name__)

#: A submission's deadline when none is given (the executor's ``submit_timeout_seconds`` default).
SUBMIT_TIMEOUT_S = 60.0
#: The deadline of removing what a failed or stopped submission created (its deletes, retries included).
ROLLBACK_TIMEOUT_S = 20.0
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
        if kind == "env":
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
        elif kind == "file":
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
        else:
            raise ConfigError(f"secret_env_vars[{key!r}]: unknown source {kind!r}; use env: or file:")
    return values


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
) -> SubmitResult:
    """Create everything in ``sub``; on failure remove what was created and raise.

    ``known_runtimes``: runtimes (``runtime_key``) that earlier submissions to the same cluster
    created or reused; theirs is not sent again. Updated in place. ``timeout``: seconds the whole
    submission may take (``submit_timeout_seconds``). ``stop``: asked before each write up to the
    resume; ``True`` removes what was created and raises ``SubmissionStopped``.
    """
    ns = sub.namespace
    created_pvcs: list[str] = []
    created_runtime: Optional[dict] = None
    trainjob: Optional[dict] = None
    trainjob_sent = False  # a create whose answer was lost may still be applied by the server
    actions: list[tuple[str, str, str]] = []
    secret_values = read_secret_values(sub.secret_sources) if sub.secret_sources else mf.SecretValues()
    # Tells our own TrainJob apart from someone else's when a create whose answer was lost
    # (timeout, dropped connection) is retried and answered 409.
    submission_id = uuid.uuid4().hex
    known = known_runtimes if known_runtimes is not None else set()

    def check_stop() -> None:
        if stop is not None and stop():
            raise SubmissionStopped(f"the submission of TrainJob {ns}/{sub.name} was stopped before the job started")

    runtime = sub.runtime  # the rendered runtime this submission creates; None with runtime_name

    def create_runtime() -> None:
        nonlocal created_runtime
        check_stop()
        if runtime is not None and _create_or_reuse(cluster, runtime, actions):
            created_runtime = runtime

    with cluster.deadline(timeout, TIMEOUT_SETTING):  # the rollback below has its own
        # With runtime_name the admin's runtime is read once, for the checks only: never sent back.
        checked = runtime if runtime is not None else check_existing_runtime(cluster, sub)
        check_runtime_ttl(cluster, checked)
        queue = queue_name(sub.trainjob)
        if queue:
            check_queue(cluster, ns, queue)
        try:
            for pvc in sub.pvcs:
                check_stop()
                if _create_or_reuse(cluster, pvc, actions):
                    created_pvcs.append(pvc["metadata"]["name"])
            if runtime is not None and runtime_key(runtime) in known:
                actions.append(("reuse", runtime["kind"], runtime["metadata"]["name"]))
            elif runtime is not None:
                create_runtime()
            # A runtime this submission did not create (known, or answered 409) may be deleted before the
            # TrainJob arrives (`nemo-kubeflow gc`): then the TrainJob is refused, and the runtime created again.
            recreate = create_runtime if sub.runtime is not None and created_runtime is None else None
            check_stop()
            trainjob_sent = True
            trainjob = _create_trainjob(cluster, sub, submission_id, actions, runtime_wait=runtime_wait, sleep=sleep,
                                        ensure_runtime=recreate)
            owner = mf.owner_reference(trainjob)
            for obj in _owned_objects(sub, owner, secret_values):
                check_stop()
                _create_owned(cluster, obj, owner["uid"])
                actions.append(("create", obj["kind"], obj["metadata"]["name"]))
            check_stop()
            if resume and not queue:  # with a queue, Kueue unsuspends the job when it admits it
                trainjob = cluster.patch(TRAINJOB_KIND, sub.name, ns, {"spec": {"suspend": False}})
                actions.append(("patch", TRAINJOB_KIND, sub.name))
            if sub.runtime is not None:
                known.add(runtime_key(sub.runtime))
            return SubmitResult(trainjob=trainjob, actions=actions)
        except BaseException as e:
            with cluster.deadline(ROLLBACK_TIMEOUT_S):
                if trainjob is None and trainjob_sent:
                    trainjob = _late_trainjob(cluster, sub, submission_id)
                left = _rollback(cluster, ns, trainjob, created_runtime, created_pvcs)
            if created_runtime is not None:
                known.discard(runtime_key(created_runtime))
            _say_what_was_left(e, sub.name, left)
            raise


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
        message = (f"submitting TrainJob {name!r} failed: {error}. {_describe_leftovers(left)}" if left
                   else f"submitting TrainJob {name!r} failed, nothing was left on the cluster: {error}")
        raise SubmissionError(
            message, status=error.status, reason=error.reason, server_message=error.server_message,
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
    (JobSet's rule, validation.pod_name_problems): else ``ManifestValidationError``, also before writing."""
    ref = sub.trainjob["spec"]["runtimeRef"]
    kind, name = ref.get("kind", CLUSTER_RUNTIME_KIND), ref["name"]
    namespace = None if kind == CLUSTER_RUNTIME_KIND else sub.namespace
    try:
        runtime = cluster.get(kind, name, namespace)
    except PermissionDeniedError as e:
        # Trainer's webhook still refuses a missing runtime, job or container; what only we check is not.
        log.warning("cannot read %s %r (%s), so these were not checked: that its replicated jobs leave room "
                    "for the pod names, and that the job's runtime patch (tolerations, node selector, volumes, "
                    "mounts, service account, security context, pod labels) replaces none of the runtime's own "
                    "settings; ask an admin for 'get' on %ss to have them checked", kind, name, e.reason, kind)
        return None
    if runtime is not None:
        # The name was planned without this runtime (plan.planned_jobs): its own replicated jobs decide;
        # the runtime patch may add to the admin's runtime, never replace (runtime_patch_conflicts).
        problems = pod_name_problems(sub.trainjob, runtime) + runtime_patch_conflicts(sub.trainjob, runtime)
        if problems:
            raise ManifestValidationError(TRAINJOB_KIND, sub.name, [
                f"{p} (runtime_name={name!r}: a {kind} on the cluster)" for p in problems])
        return runtime
    try:
        available = sorted(o["metadata"]["name"] for o in cluster.list(kind, namespace))
    except ClusterError:
        available = []
    where = f" in namespace {namespace!r}" if namespace else ""
    listing = ", ".join(available) if available else "none"
    raise NotFoundError(
        f"runtime_name={name!r}: no {kind} of that name{where} (available: {listing}); "
        "fix runtime_name, or leave it unset to let nemo_kubeflow render a runtime",
        status=404, reason="NotFound",
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
    try:
        available = ", ".join(sorted(o["metadata"]["name"] for o in cluster.list(LOCALQUEUE_KIND, namespace)))
        listing = f"queues in this namespace: {available or 'none'}"
    except NotFoundError:
        listing = (f"this cluster serves none of Kueue's LocalQueue APIs ({KUEUE_GROUP} "
                   f"{' or '.join(KUEUE_VERSIONS)}): is Kueue installed?")
    except ClusterError:
        listing = "the existing queues could not be listed"
    raise NotFoundError(
        f"queue_name={queue!r}: there is no Kueue LocalQueue {queue!r} in namespace {namespace!r} ({listing}); "
        "the TrainJob would wait in it forever. Fix queue_name, ask an admin for the LocalQueue, "
        "or leave queue_name unset",
        status=404, reason="NotFound",
    )


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


def _create_trainjob(cluster: Cluster, sub: Submission, submission_id: str, actions: list, *,
                     runtime_wait: float, sleep: Callable[[float], None],
                     ensure_runtime: Optional[Callable[[], None]] = None) -> dict:
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
            existing = cluster.get(TRAINJOB_KIND, sub.name, sub.namespace)
            annotations = (existing or {}).get("metadata", {}).get("annotations") or {}
            if existing is not None and annotations.get(SUBMISSION_ANNOTATION) == submission_id:
                actions.append(("create", TRAINJOB_KIND, sub.name))
                return existing
            # Never delete-and-recreate: the existing job may be someone's running work.
            raise AlreadyExistsError(
                f"a TrainJob named {sub.name!r} already exists in namespace {sub.namespace!r} "
                "(an earlier run of the same experiment?); it was left untouched. Start a new "
                "experiment, or delete the old job first if it is yours",
                status=e.status, reason=e.reason, server_message=e.server_message,
            ) from None
        except ClusterError as e:
            # Trainer's webhook reads runtimes through a cache: a runtime created a moment
            # ago can still be "not found" for the TrainJob admission. Retry briefly.
            message = (e.server_message or "").lower()
            if "must be created before" in message and ensure_runtime is not None:
                ensure_runtime()  # a 409 here means it exists after all: the webhook's cache lags, wait below
                ensure_runtime = None
                deadline = time.monotonic() + runtime_wait
                continue
            if "must be created before" in message and time.monotonic() < deadline:
                sleep(delay)
                delay = min(delay * 2, 1.0)
                continue
            raise


def _late_trainjob(cluster: Cluster, sub: Submission, submission_id: str) -> Optional[dict]:
    """Our TrainJob, if a create whose answer never came was applied after all (a stalled server)."""
    try:
        existing = cluster.get(TRAINJOB_KIND, sub.name, sub.namespace)
    except ClusterError as e:
        log.warning("rollback: cannot look for TrainJob %s/%s: %s", sub.namespace, sub.name, e)
        return None
    annotations = (existing or {}).get("metadata", {}).get("annotations") or {}
    return existing if annotations.get(SUBMISSION_ANNOTATION) == submission_id else None


def _rollback(cluster: Cluster, ns: str, trainjob: Optional[dict], runtime: Optional[dict],
              pvcs: list[str]) -> list[tuple[str, str, Optional[str], Exception]]:
    """Best-effort removal of what this submission created; never masks the first error.

    Returns what could not be deleted: (kind, name, namespace, why)."""
    steps: list[tuple[str, str, Optional[str]]] = []
    if trainjob is not None:
        steps.append((TRAINJOB_KIND, trainjob["metadata"]["name"], ns))
    if runtime is not None:
        kind = runtime["kind"]
        steps.append((kind, runtime["metadata"]["name"], None if kind == CLUSTER_RUNTIME_KIND else ns))
    steps += [("PersistentVolumeClaim", name, ns) for name in pvcs]
    left: list[tuple[str, str, Optional[str], Exception]] = []
    for kind, name, namespace in steps:
        try:
            cluster.delete(kind, name, namespace)
        except ClusterError as e:
            log.warning("rollback: %s; delete it with: %s", e, kubectl_delete(kind, name, namespace))
            left.append((kind, name, namespace, e))
    return left


def _describe_leftovers(left: list[tuple[str, str, Optional[str], Exception]]) -> str:
    """What a failed rollback left on the cluster, each with why and the command that deletes it."""
    items = "; ".join(
        f"{describe_target(kind, name, namespace)} ({getattr(e, 'reason', None) or e}),"
        f" delete it with `{kubectl_delete(kind, name, namespace)}`"
        for kind, name, namespace, e in left
    )
    return f"Removing what it had created failed too, so this is left on the cluster: {items}"
