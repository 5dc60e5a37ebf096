"""The API server's request pipeline for one resource: decode, default, validate, admit, store.

The HTTP layer (`server.py`) turns requests into calls here; controllers write to the store directly.
"""

from __future__ import annotations

import builtins
import copy
import json
import random
import uuid
from dataclasses import dataclass, field
from typing import Any, Optional

from nemo_kubeflow_local.apiserver import admission, chunking, kueue_schema, pod_admission
from nemo_kubeflow_local.apiserver import core_validation as validation
from nemo_kubeflow_local.apiserver import resources as R
from nemo_kubeflow_local.apiserver.apierrors import ApiError, FieldError, bad_request, conflict, invalid, not_found
from nemo_kubeflow_local.apiserver.patch import json_patch, merge_patch, strategic_merge_patch
from nemo_kubeflow_local.apiserver.resources import ResourceType
from nemo_kubeflow_local.apiserver.selectors import field_matcher, label_matcher
from nemo_kubeflow_local.apiserver.store import Store
from nemo_kubeflow_local.timeutil import now_rfc3339

#: How often a patch is applied again after losing a race with another writer before the 409 is
#: answered (GuaranteedUpdate retries without a bound; this keeps a livelock visible).
PATCH_ATTEMPTS = 20

#: utilrand.String's alphabet: no vowels (no words), no 0/1/3 (no look-alikes).
NAME_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"


def random_suffix(n: int = 5) -> str:
    return "".join(random.choice(NAME_ALPHABET) for _ in range(n))


@dataclass
class Result:
    code: int
    body: dict
    warnings: list[str] = field(default_factory=list)


def success_status(rt: ResourceType, obj: dict) -> dict:
    details = {"name": obj["metadata"]["name"], "kind": rt.plural, "uid": obj["metadata"]["uid"]}
    if rt.group:
        details["group"] = rt.group
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "details": details}


# --- defaults the API server applies (pkg/apis/core/v1/defaults.go and the registry strategies) ---------


#: The DefaultTolerationSeconds admission plugin's two tolerations (300 s each).
DEFAULT_NOEXECUTE_TAINTS = ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")
DEFAULT_TOLERATION_SECONDS = 300


def apply_pod_template_defaults(spec: dict) -> None:
    """SetDefaults_PodSpec and friends: what the API server fills in any pod template (a Job's too)."""
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("securityContext", {})
    for container in (spec.get("initContainers") or []) + (spec.get("containers") or []):
        container.setdefault("terminationMessagePath", "/dev/termination-log")
        container.setdefault("terminationMessagePolicy", "File")
        image = container.get("image", "")
        latest = ":" not in image.rsplit("/", 1)[-1] or image.endswith(":latest")
        container.setdefault("imagePullPolicy", "Always" if latest else "IfNotPresent")
        resources = container.setdefault("resources", {})
        if resources.get("limits"):  # requests default to the limits, resource by resource
            resources["requests"] = {**resources["limits"], **(resources.get("requests") or {})}
        for port in container.get("ports") or []:
            port.setdefault("protocol", "TCP")
        for env in container.get("env") or []:
            _default_field_ref(((env.get("valueFrom") or {}).get("fieldRef")))
    for volume in spec.get("volumes") or []:
        for source in ("configMap", "secret", "downwardAPI", "projected"):
            if source in volume:
                volume[source].setdefault("defaultMode", 0o644)
        if "hostPath" in volume:
            volume["hostPath"].setdefault("type", "")
        items = list((volume.get("downwardAPI") or {}).get("items") or [])
        for projection in (volume.get("projected") or {}).get("sources") or []:
            items += (projection.get("downwardAPI") or {}).get("items") or []
        for item in items:
            _default_field_ref(item.get("fieldRef"))


def _default_field_ref(ref: Optional[dict]) -> None:
    if ref is not None:
        ref.setdefault("apiVersion", "v1")


def apply_pod_defaults(pod: dict) -> None:
    """A created pod: the template defaults plus what only pods get (admission plugins included)."""
    spec = pod.setdefault("spec", {})
    apply_pod_template_defaults(spec)
    spec.setdefault("enableServiceLinks", True)
    spec.setdefault("serviceAccountName", "default")
    spec["serviceAccount"] = spec["serviceAccountName"]  # the deprecated twin, kept equal
    # Priority admission: no PriorityClass objects here, so every pod gets the default 0.
    spec.setdefault("priority", 0)
    spec.setdefault("preemptionPolicy", "PreemptLowerPriority")
    tolerations = spec.get("tolerations") or []
    for key in DEFAULT_NOEXECUTE_TAINTS:
        tolerated = any(
            t.get("key") in (key, None, "") and t.get("effect") in ("NoExecute", None, "") for t in tolerations
        )
        if not tolerated:
            tolerations.append(
                {
                    "key": key,
                    "operator": "Exists",
                    "effect": "NoExecute",
                    "tolerationSeconds": DEFAULT_TOLERATION_SECONDS,
                }
            )
    if tolerations:
        spec["tolerations"] = tolerations
    per_container = [c["resources"] for c in spec.get("containers") or []]
    if per_container and all(r.get("limits") and r.get("requests") == r.get("limits") for r in per_container):
        qos = "Guaranteed"
    elif any(r.get("limits") or r.get("requests") for r in per_container):
        qos = "Burstable"
    else:
        qos = "BestEffort"
    pod["status"] = {"phase": "Pending", "qosClass": qos}


def _prepare_for_create(rt: ResourceType, obj: dict) -> None:
    if rt is R.PODS:
        apply_pod_defaults(obj)
    elif rt is R.SECRETS:
        validation.normalize_secret(obj)
    elif rt is R.NAMESPACES:
        obj.setdefault("spec", {"finalizers": ["kubernetes"]})
        obj["status"] = {"phase": "Active"}
        obj["metadata"].setdefault("labels", {})["kubernetes.io/metadata.name"] = obj["metadata"]["name"]
    elif rt is R.PVCS:
        # No provisioner to wait for: claims bind at once (documented difference).
        obj.setdefault("spec", {}).setdefault("volumeMode", "Filesystem")
        obj["spec"].setdefault("volumeName", "pvc-" + str(uuid.uuid4()))
        storage = ((obj["spec"].get("resources") or {}).get("requests") or {}).get("storage", "1Gi")
        obj["status"] = {
            "phase": "Bound",
            "accessModes": obj["spec"].get("accessModes", ["ReadWriteOnce"]),
            "capacity": {"storage": storage},
        }
    elif rt.status_subresource:
        obj.pop("status", None)  # the status subresource owns it
    if rt is R.LIMITRANGES:
        pod_admission.default_limit_range(obj)
    if rt is R.TRAINJOBS:
        kueue_schema.default_trainjob(obj)  # Kueue's mutating webhook (create only)
    if rt.is_custom:
        admission.apply_defaults(rt, obj)


# --- the pipeline -------------------------------------------------------------------------------------


class Registry:
    def __init__(self, store: Store):
        self.store = store

    # reads

    def get(self, rt: ResourceType, namespace: str, name: str) -> Result:
        if rt is R.EVENTS_V1:
            return Result(200, event_v1(self.store.get(R.EVENTS, namespace, name)))
        return Result(200, self.store.get(rt, namespace, name))

    def list(self, rt: ResourceType, namespace: Optional[str], query: dict) -> Result:
        labels = label_matcher(query.get("labelSelector"))
        fields = field_matcher(query.get("fieldSelector"), rt.plural)
        source = R.EVENTS if rt is R.EVENTS_V1 else rt
        stored, rv = self.store.stored_list(source, namespace, lambda o: labels(o) and fields(o))
        page, more = chunking.chunk(
            stored,
            query,
            rv,
            cluster_wide=namespace is None,
            selected=bool(query.get("labelSelector") or query.get("fieldSelector")),
        )
        items = [copy.deepcopy(obj) for obj in page]
        if rt is R.EVENTS_V1:
            items = [event_v1(e) for e in items]
        if not rt.is_custom:  # typed lists carry kind/apiVersion on the list only
            for item in items:
                item.pop("kind", None)
                item.pop("apiVersion", None)
        return Result(
            200,
            {
                "kind": f"{rt.kind}List",
                "apiVersion": rt.api_version,
                "metadata": {"resourceVersion": rv, **more},
                "items": items,
            },
        )

    # writes

    def create(self, rt: ResourceType, namespace: str, body: Any, query: dict) -> Result:
        _writable(rt)
        obj = self._decode(rt, namespace, body)
        meta = obj["metadata"]
        if meta.get("resourceVersion"):
            raise ApiError(500, "resourceVersion should not be set on objects to be created")
        for key in ("uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds", "generation"):
            meta.pop(key, None)
        if not meta.get("name") and meta.get("generateName") and rt is not R.PODS:
            meta["name"] = meta["generateName"] + random_suffix()  # a pod's after its mutating admission
        warnings = self._prune_unknown(rt, obj, query)
        if rt.namespaced and not self.store.namespace_exists(namespace):
            raise not_found(R.NAMESPACES, namespace)
        _prepare_for_create(rt, obj)
        dry_run = query.get("dryRun") == "All"
        if rt is R.PODS:
            created, more = pod_admission.create_pod(
                self.store, obj, random_suffix, validate_spec=lambda pod: self._validate(rt, pod, None), dry_run=dry_run
            )
            if dry_run:
                meta.update(uid=str(uuid.uuid4()), creationTimestamp=now_rfc3339(), generation=1)
            return Result(201, created, warnings + more)
        self._validate(rt, obj, None)
        if rt.is_custom:
            warnings += admission.admit(self.store, rt, obj, None)
        if rt.namespaced and rt is not R.EVENTS:
            created = pod_admission.create_counted(self.store, rt, obj, dry_run=dry_run)
        else:
            created = obj if dry_run else self.store.create(rt, obj)
        if dry_run:
            meta.update(uid=str(uuid.uuid4()), creationTimestamp=now_rfc3339())
            if rt.has_generation:
                meta["generation"] = 1
            return Result(201, obj, warnings)
        if rt is R.NAMESPACES:
            self._default_service_account(created["metadata"]["name"])
        return Result(201, created, warnings)

    def _default_service_account(self, namespace: str) -> None:
        """The ServiceAccount controller's `default` in each new namespace (at once here; kube-controller-manager
        makes it within a second), which pods run as unless they name another."""
        if self.store.find(R.SERVICEACCOUNTS, namespace, "default") is None:
            self.store.create(
                R.SERVICEACCOUNTS,
                {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default", "namespace": namespace}},
            )

    def update(
        self, rt: ResourceType, namespace: str, name: str, body: Any, query: dict, subresource: str = ""
    ) -> Result:
        _writable(rt)
        obj = self._decode(rt, namespace, body)
        if obj["metadata"].get("name") != name:
            raise bad_request(
                f"the name of the object ({obj['metadata'].get('name', '')}) does not match the name "
                f"on the URL ({name})"
            )
        return self._update(rt, self.store.get(rt, namespace, name), obj, query, subresource)

    def patch(
        self,
        rt: ResourceType,
        namespace: str,
        name: str,
        body: Any,
        content_type: str,
        query: dict,
        subresource: str = "",
    ) -> Result:
        _writable(rt)
        kind = content_type.split(";")[0].strip()
        accepted = ["application/json-patch+json", "application/merge-patch+json"]
        if not rt.is_custom:
            accepted.append("application/strategic-merge-patch+json")
        if kind not in accepted:
            raise ApiError(
                415,
                "the body of the request was in an unknown format - accepted media types include: "
                + ", ".join(accepted),
            )
        # GuaranteedUpdate: the patch applies to the object as stored now. When another writer (a
        # controller writing status) got in between the read and the write, it is re-read and the
        # patch applied again; only a resourceVersion the patch itself carries makes a 409.
        attempts_left = PATCH_ATTEMPTS
        while True:
            old = self.store.get(rt, namespace, name)
            patched = self._apply_patch(rt, namespace, name, old, body, kind)
            precondition = patched["metadata"].get("resourceVersion")
            if precondition and precondition != old["metadata"]["resourceVersion"]:
                raise conflict(rt, name)
            try:
                return self._update(rt, old, patched, query, subresource)
            except ApiError as error:
                attempts_left -= 1
                if error.code != 409 or error.reason != "Conflict" or not attempts_left:
                    raise

    def _apply_patch(self, rt: ResourceType, namespace: str, name: str, old: dict, body: Any, kind: str) -> dict:
        if kind == "application/json-patch+json":
            patched = json_patch(old, body)
        elif kind == "application/merge-patch+json":
            patched = merge_patch(old, _patch_object(body))
        else:
            patched = strategic_merge_patch(old, _patch_object(body))
        if not isinstance(patched, dict):
            raise bad_request("the patch did not produce an object")
        if patched.get("metadata", {}).get("name") != name:
            raise bad_request(
                f"the name of the object ({patched.get('metadata', {}).get('name', '')}) does not "
                f"match the name on the URL ({name})"
            )
        return self._decode(rt, namespace, patched)

    def _update(self, rt: ResourceType, old: dict, obj: dict, query: dict, subresource: str) -> Result:
        meta = obj["metadata"]
        expected = meta.get("resourceVersion") or None
        if expected is None and rt.is_custom:
            raise invalid(
                rt, meta["name"], [FieldError.invalid("metadata.resourceVersion", 0, "must be specified for an update")]
            )
        warnings = self._prune_unknown(rt, obj, query)
        if subresource == "status":
            obj = {**old, "status": obj.get("status")}
            if obj["status"] is None:
                del obj["status"]
        elif rt.status_subresource:
            obj.pop("status", None)
            if "status" in old:
                obj["status"] = old["status"]
        if rt is R.SECRETS:
            validation.normalize_secret(obj)
        if rt is R.LIMITRANGES:
            pod_admission.default_limit_range(obj)
        if rt.is_custom:
            admission.apply_defaults(rt, obj)
        obj["metadata"]["resourceVersion"] = expected or old["metadata"]["resourceVersion"]
        if subresource != "status":
            self._validate(rt, obj, old)
            if rt.is_custom:
                warnings += admission.admit(self.store, rt, obj, old)
        if query.get("dryRun") == "All":
            return Result(200, obj, warnings)
        return Result(200, self.store.replace(rt, obj, expected_rv=expected), warnings)

    def delete(self, rt: ResourceType, namespace: str, name: str, body: Any, query: dict) -> Result:
        if not rt.deletable:
            _writable(rt)
        options = body if isinstance(body, dict) else {}
        propagation = options.get("propagationPolicy") or query.get("propagationPolicy") or "Background"
        grace = options.get("gracePeriodSeconds", query.get("gracePeriodSeconds"))
        dry_run = query.get("dryRun") == "All" or options.get("dryRun") == ["All"]
        if dry_run:
            return Result(200, success_status(rt, self.store.get(rt, namespace, name)))
        obj, removed = self.store.delete(
            rt,
            namespace,
            name,
            propagation=propagation,
            grace_seconds=int(grace) if grace is not None else None,
            preconditions=options.get("preconditions"),
        )
        # Objects that linger (graceful pods, finalizers) come back as they are; the rest as a Status.
        return Result(200, success_status(rt, obj) if removed else obj)

    def delete_collection(self, rt: ResourceType, namespace: Optional[str], body: Any, query: dict) -> Result:
        listed = self.list(rt, namespace, query).body["items"]
        for item in listed:
            try:
                self.delete(rt, item["metadata"].get("namespace", ""), item["metadata"]["name"], body, query)
            except ApiError as error:
                if error.code != 404:
                    raise
        return Result(200, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success"})

    # steps

    def _decode(self, rt: ResourceType, namespace: str, body: Any) -> dict:
        if not isinstance(body, dict):
            raise bad_request(
                f'{rt.kind} in version "{rt.version}" cannot be handled as a {rt.kind}: json: '
                f"cannot unmarshal {type(body).__name__} into Go value of type {rt.kind}"
            )
        obj = copy.deepcopy(body)
        if rt.is_custom and not obj.get("kind"):
            raise bad_request(f"Object 'Kind' is missing in '{_short_json(body)}'")
        obj.setdefault("apiVersion", rt.api_version)
        obj.setdefault("kind", rt.kind)
        if obj["apiVersion"] != rt.api_version:
            raise bad_request(
                f"the API version in the data ({obj['apiVersion']}) does not match the expected API "
                f"version ({rt.api_version})"
            )
        if obj["kind"] != rt.kind:
            raise bad_request(f"the kind in the data ({obj['kind']}) does not match the expected kind ({rt.kind})")
        meta = obj.get("metadata")
        if meta is None:
            meta = obj["metadata"] = {}
        if not isinstance(meta, dict):
            raise bad_request(
                f'{rt.kind} in version "{rt.version}" cannot be handled as a {rt.kind}: json: cannot '
                f"unmarshal {type(meta).__name__} into Go struct field {rt.kind}.metadata of type "
                "v1.ObjectMeta"
            )
        if rt.namespaced:
            if meta.get("namespace") and meta["namespace"] != namespace:
                raise bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request"
                )
            meta["namespace"] = namespace
        else:
            meta.pop("namespace", None)  # cluster-scoped objects never carry one
        return obj

    def _prune_unknown(self, rt: ResourceType, obj: dict, query: dict) -> builtins.list[str]:  # `list`: the method
        mode = query.get("fieldValidation") or "Warn"
        if mode not in ("Strict", "Warn", "Ignore"):
            raise bad_request(f"fieldValidation parameter unsupported: {mode}")
        unknown = validation.decode(rt, obj)
        if not unknown:
            return []
        names = [validation.format_path(path) for path in unknown]
        if mode == "Strict":
            listing = ", ".join(f'unknown field "{n}"' for n in names)
            raise bad_request(
                f'{rt.kind} in version "{rt.version}" cannot be handled as a {rt.kind}: '
                f"strict decoding error: {listing}"
            )
        validation.prune(obj, unknown)
        return [f'unknown field "{n}"' for n in names] if mode == "Warn" else []

    def _validate(self, rt: ResourceType, obj: dict, old: Optional[dict]) -> None:
        errors = validation.validate(rt, obj, old)
        if rt is R.NAMESPACES:
            errors += pod_admission.namespace_label_errors(obj)
        elif rt is R.VALIDATING_POLICIES:
            errors += pod_admission.policy_errors(obj)
        if rt.is_custom:
            errors += admission.crd_errors(rt, obj, old)
        if errors:
            raise invalid(rt, obj["metadata"].get("name", ""), errors)


def _writable(rt: ResourceType) -> None:
    if rt is R.EVENTS_V1:
        raise ApiError(
            405,
            "the server does not allow this method on the requested resource "
            "(events.k8s.io/v1 events are read-only here)",
        )
    if rt.read_only:
        raise ApiError(
            405,
            f"the server does not allow this method on the requested resource ({rt.qualified} "
            "are read-only on the local cluster: its emulated controllers write them)",
        )


def _patch_object(body: Any) -> dict:
    if not isinstance(body, dict):
        raise bad_request("json: cannot unmarshal array into Go value of type map[string]interface {}")
    return body


def _short_json(body: Any) -> str:
    text = json.dumps(body, separators=(",", ":"))
    return text if len(text) < 200 else text[:200] + "..."


def event_v1(event: dict) -> dict:
    """core/v1 Event -> events.k8s.io/v1 Event (the same storage, renamed fields)."""
    return {
        "kind": "Event",
        "apiVersion": "events.k8s.io/v1",
        "metadata": event["metadata"],
        "eventTime": event.get("eventTime"),
        "reportingController": event.get("reportingComponent") or (event.get("source") or {}).get("component", ""),
        "reportingInstance": event.get("reportingInstance", ""),
        "action": event.get("action", ""),
        "reason": event.get("reason", ""),
        "regarding": event.get("involvedObject", {}),
        "note": event.get("message", ""),
        "type": event.get("type", ""),
        "deprecatedSource": event.get("source", {}),
        "deprecatedFirstTimestamp": event.get("firstTimestamp"),
        "deprecatedLastTimestamp": event.get("lastTimestamp"),
        "deprecatedCount": event.get("count"),
    }
