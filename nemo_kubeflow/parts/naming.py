"""Kubernetes names for the objects of a submission.

Pure functions: the inputs (experiment id, task name, content) fully determine the
names, so dry runs and golden tests are reproducible and a re-run of the same
experiment maps onto the same TrainJob instead of creating a look-alike.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any, Iterable, Optional

from nemo_kubeflow.constants import ANCESTOR_LABEL, ANCESTOR_TRAINER, DNS_LABEL_MAX, PET_ENV_VALUES

# The patterns of k8s.io/apimachinery/pkg/util/validation, spelled as the API server's messages quote
# them (the local cluster's validation quotes ``.pattern``). Use them with fullmatch: `$` would also
# accept a trailing newline. The length limits are separate (the is_* functions below apply them).
RFC1035_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
RFC1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
RFC1123_SUBDOMAIN = re.compile(rf"{RFC1123_LABEL.pattern}(\.{RFC1123_LABEL.pattern})*")
LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
QUALIFIED_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
ENV_VAR_NAME = re.compile(r"[-._a-zA-Z][-._a-zA-Z0-9]*")
CONFIG_KEY = re.compile(r"[-._a-zA-Z0-9]+")
#: RFC 1123 subdomains (most object names, label and annotation key prefixes) are at most 253 characters.
DNS_SUBDOMAIN_MAX = 253

#: Length of the hash suffix that keeps sanitised names unique.
HASH_LEN = 6
#: The field manager of our runtime patch (Trainer requires a domain-prefixed path).
PATCH_MANAGER = "nemo-kubeflow.nvidia.com/executor"


def short_hash(*parts: Any, length: int = HASH_LEN) -> str:
    """A stable hex digest of ``parts`` (JSON-encoded, so dicts hash by content)."""
    payload = json.dumps(parts, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(payload.encode()).hexdigest()[:length]


def sanitize(text: str) -> str:
    """Lowercase, map every run of characters outside ``[a-z0-9]`` to one ``-``, trim dashes."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def is_rfc1035_label(name: str, max_len: int = DNS_LABEL_MAX) -> bool:
    return len(name) <= max_len and bool(RFC1035_LABEL.fullmatch(name))


def is_rfc1123_label(name: str) -> bool:
    return len(name) <= DNS_LABEL_MAX and bool(RFC1123_LABEL.fullmatch(name))


def is_rfc1123_subdomain(name: str) -> bool:
    return len(name) <= DNS_SUBDOMAIN_MAX and bool(RFC1123_SUBDOMAIN.fullmatch(name))


def is_label_value(value: str) -> bool:
    return len(value) <= DNS_LABEL_MAX and bool(LABEL_VALUE.fullmatch(value))


def is_qualified_name_part(name: str) -> bool:
    """The name part of a label or annotation key (after an optional ``prefix/``)."""
    return len(name) <= DNS_LABEL_MAX and bool(QUALIFIED_NAME.fullmatch(name))


def is_qualified_name(key: str) -> bool:
    """A label or annotation key (apimachinery ``IsQualifiedName``): an optional RFC 1123 subdomain
    prefix and ``/``, then the name part."""
    if not isinstance(key, str):
        return False
    prefix, slash, name = key.rpartition("/")
    return (not slash or is_rfc1123_subdomain(prefix)) and is_qualified_name_part(name)


def is_env_var_name(name: str) -> bool:
    """An environment variable name the API server accepts (IsEnvVarName)."""
    return bool(ENV_VAR_NAME.fullmatch(name))


def is_relaxed_env_var_name(name: str) -> bool:
    """An environment variable name under the API server's relaxed rule (IsRelaxedEnvVarName, the
    default since Kubernetes 1.32): printable ASCII other than '='. The local cluster's API server
    applies it; our own checks keep the strict ``is_env_var_name``, which every version accepts."""
    return bool(name) and all(" " <= c <= "~" and c != "=" for c in name)


#: ``is_env_var_name`` in words, for messages.
ENV_VAR_NAME_RULE = "letters, digits, '_', '-' and '.', not starting with a digit"
#: ``is_label_value`` in words, for messages.
LABEL_VALUE_RULE = f"at most {DNS_LABEL_MAX} characters of [A-Za-z0-9_.-], starting and ending with a letter or digit"


def trainer_env_problem(name: str) -> Optional[str]:
    """Why a TrainJob's ``spec.trainer.env`` cannot set ``name`` (``None`` when it can): Kubeflow
    Trainer's torch plugin sets the PET_* variables itself, and its webhook rejects a TrainJob that
    sets one of them."""
    value = PET_ENV_VALUES.get(name)
    if value is None:
        return None
    return (
        f"{name} is set by Kubeflow Trainer's torch plugin, to {value}, and its webhook rejects TrainJobs that set it"
    )


def is_config_key(key: str) -> bool:
    """A ConfigMap or Secret data key (IsConfigMapKey): no '/', not '.', not starting with '..'."""
    return (
        isinstance(key, str)
        and len(key) <= DNS_SUBDOMAIN_MAX
        and bool(CONFIG_KEY.fullmatch(key))
        and key != "."
        and not key.startswith("..")
    )


# --- JobSet pod names ----------------------------------------------------------------------
#
# The rule mirrored here is JobSet v0.12.0's validating webhook (pkg/webhooks/jobset_webhook.go,
# ValidateCreate, "JobSet name is too long, pod names generated for this JobSet will exceed 63
# characters"): for every replicated job in Indexed completion mode it builds
# placement.GenPodName(jobSet, replicatedJob, str(replicas-1), str(completions-1)) + "-abcde"
# (pkg/util/placement: "<jobset>-<replicatedJob>-<jobIndex>-<podIndex>", then the Job controller's
# 5 random characters) and refuses the JobSet unless that is an RFC 1035 label of at most 63
# characters. JobSet defaults every replicated job to Indexed, and Trainer v2.3.0 sets completions to
# the pod count (JobSet.SyncParallelCount), so the rule applies to each of them. Trainer names the
# JobSet after the TrainJob: the TrainJob name carries the budget.

#: The sample random suffix the webhook appends ("-abcde").
POD_NAME_RANDOM_SUFFIX = "-abcde"


@dataclass(frozen=True)
class ReplicatedJobShape:
    """What decides the longest pod name of one replicated job."""

    name: str
    #: ``replicas`` of the replicated job: Jobs ``<jobset>-<name>-0`` .. ``-<replicas-1>``.
    replicas: int = 1
    #: Pods per Job (``completions``): completion indexes 0 .. ``completions-1``.
    completions: int = 1


def longest_pod_name(jobset: str, job: ReplicatedJobShape) -> str:
    """The name the JobSet webhook checks for ``job``: the largest job and pod index, a sample suffix."""
    return f"{jobset}-{job.name}-{max(job.replicas, 1) - 1}-{max(job.completions, 1) - 1}{POD_NAME_RANDOM_SUFFIX}"


def pod_completion_index(pod: str, jobset: str, replicated_job: str) -> Optional[int]:
    """The completion index (node rank) in the name of a pod of ``jobset``'s ``replicated_job``, of the
    form above; None for a pod of another JobSet or replicated job (in events the pod is only a name)."""
    prefix = f"{jobset}-{replicated_job}-"
    if not pod.startswith(prefix):
        return None
    parts = pod[len(prefix) :].split("-")
    if (
        len(parts) != 3
        or not parts[0].isdigit()
        or not parts[1].isdigit()
        or len(parts[2]) != len(POD_NAME_RANDOM_SUFFIX) - 1
    ):
        return None
    return int(parts[1])


def jobset_name_budget(jobs: Iterable[ReplicatedJobShape]) -> int:
    """The longest JobSet (= TrainJob) name whose pod names all fit in 63 characters."""
    overhead = max((len(longest_pod_name("", job)) for job in jobs), default=0)
    return DNS_LABEL_MAX - overhead


def longest_pod_names(jobset: str, jobs: Iterable[ReplicatedJobShape]) -> list[tuple[ReplicatedJobShape, str]]:
    """(job, longest pod name) for each job whose longest pod name exceeds 63 characters, longest first."""
    over = [(job, longest_pod_name(jobset, job)) for job in jobs]
    return sorted(((job, pod) for job, pod in over if len(pod) > DNS_LABEL_MAX), key=lambda item: -len(item[1]))


def _count(value: Any, default: int = 1) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else default


def replicated_job_shapes(
    replicated_jobs: Any, num_nodes: Optional[int] = None, ml_policy: Any = None
) -> list[ReplicatedJobShape]:
    """The shapes of the JobSet Trainer builds from a runtime's ``spec.template.spec.replicatedJobs``.

    As Trainer v2.3.0 counts pods (pkg/runtime/core/trainingruntime.go, then SyncParallelCount):
    a replicated job's ``parallelism`` (default 1), except the one labelled
    ``trainer.kubeflow.org/trainjob-ancestor-step: trainer``, which gets the TrainJob's
    ``numNodes`` (``num_nodes``), else the runtime's ``mlPolicy.numNodes``, else 1.
    Entries that are not objects with a string name are skipped (validation reports them).
    """
    policy_nodes = ml_policy.get("numNodes") if isinstance(ml_policy, dict) else None
    shapes = []
    for rjob in replicated_jobs if isinstance(replicated_jobs, list) else []:
        if not isinstance(rjob, dict) or not isinstance(rjob.get("name"), str):
            continue
        template = _object(rjob.get("template"))
        labels = _object(template.get("metadata")).get("labels")
        job_spec = _object(template.get("spec"))
        count = _count(job_spec.get("parallelism"))
        if isinstance(labels, dict) and labels.get(ANCESTOR_LABEL) == ANCESTOR_TRAINER:
            count = _count(num_nodes, _count(policy_nodes))
        shapes.append(ReplicatedJobShape(rjob["name"], _count(rjob.get("replicas")), count))
    return shapes


def _object(value: Any) -> dict:
    """``value`` if it is an object (a dict), else an empty one: a malformed manifest reads as absent here
    (validation reports it)."""
    return value if isinstance(value, dict) else {}


def runtime_job_shapes(runtime: dict, num_nodes: Optional[int] = None) -> list[ReplicatedJobShape]:
    """``replicated_job_shapes`` of a ClusterTrainingRuntime or TrainingRuntime manifest."""
    spec = _object(runtime.get("spec"))
    template = _object(spec.get("template"))
    jobset_spec = _object(template.get("spec"))
    return replicated_job_shapes(jobset_spec.get("replicatedJobs"), num_nodes, spec.get("mlPolicy"))


#: The shortest name budget ``trainjob_name`` can work with: a letter, "-" and the hash.
TRAINJOB_NAME_MIN = HASH_LEN + 2


def trainjob_name(experiment_id: str, task_name: str, max_len: int) -> str:
    """The TrainJob name for one task of one experiment run.

    An RFC-1035 label of at most ``max_len`` characters (``jobset_name_budget`` of the runtime's
    replicated jobs, so that every pod name fits): readable parts of the experiment and task,
    then a hash of the *unsanitised* pair, so names that differ only in case, punctuation or
    truncated tails (``llama3_8b`` vs ``llama3-8b``) never collide.
    """
    if max_len < TRAINJOB_NAME_MIN:
        raise ValueError(f"a TrainJob name needs at least {TRAINJOB_NAME_MIN} characters, the budget is {max_len}")
    max_len = min(max_len, DNS_LABEL_MAX)
    digest = short_hash(experiment_id, task_name)
    body = sanitize(f"{experiment_id}-{task_name}") or "job"
    if not body[0].isalpha():
        # RFC 1035 labels start with a letter; experiment ids often start with a date.
        body = f"j-{body}"
    body = body[: max_len - HASH_LEN - 1].rstrip("-")
    return f"{body}-{digest}"


def derived_name(base: str, suffix: str, max_len: int = DNS_LABEL_MAX) -> str:
    """``<base>-<suffix>`` kept within ``max_len`` (for ConfigMaps, Secrets tied to a TrainJob)."""
    name = f"{base}-{suffix}"
    if len(name) <= max_len:
        return name
    digest = short_hash(base, suffix)
    keep = max_len - len(suffix) - HASH_LEN - 2
    return f"{base[:keep].rstrip('-')}-{digest}-{suffix}"


def label_value(text: str) -> str:
    """Make ``text`` usable as a label value (63 chars, alphanumeric ends), keeping it readable."""
    value = re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-_.")
    if len(value) > DNS_LABEL_MAX:
        value = f"{value[: DNS_LABEL_MAX - HASH_LEN - 1].rstrip('-_.')}-{short_hash(text)}"
    return value


# --- keys, paths and image references (checked before submission) --------------------------


def descending_path_problem(path: str) -> str | None:
    """Why ``path`` cannot be a ``subPath`` or a volume item ``path`` (the API server's
    ``validateLocalDescendingPath``): it must be relative and stay below the volume."""
    if path.startswith("/"):
        return "must be a relative path (it is taken inside the volume)"
    if ".." in re.split(r"[/\\]", path):
        return "must not contain '..' (it must stay inside the volume)"
    return None


# Image references, after the grammar of github.com/distribution/reference (regexp.go and
# reference.go there; the kubelet and containerd parse images with it): a path of lowercase
# components separated by '.', '_', '__' or runs of '-', an optional registry host[:port] in
# front, an optional tag of at most 128 characters and an optional digest.
_IMAGE_PATH_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_IMAGE_PATH = re.compile(rf"{_IMAGE_PATH_COMPONENT}(?:/{_IMAGE_PATH_COMPONENT})*")
_IMAGE_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_IMAGE_DOMAIN = re.compile(
    rf"(?:{_IMAGE_DOMAIN_COMPONENT}(?:\.{_IMAGE_DOMAIN_COMPONENT})*|\[[a-fA-F0-9:]+\])(?::[0-9]+)?"
)
_IMAGE_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
_IMAGE_DIGEST = re.compile(r"([A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*):([0-9a-fA-F]{32,})")
#: Hex digits of the digest algorithms the OCI image spec registers (opencontainers/go-digest).
IMAGE_DIGEST_HEX_LEN = {"sha256": 64, "sha384": 96, "sha512": 128}
#: Longest image name, registry included (distribution/reference NameTotalLengthMax).
IMAGE_NAME_MAX = 255


def image_reference_problem(ref: str) -> str | None:
    """Why the container runtime would refuse the image reference ``ref`` (it leaves the pod
    in ``InvalidImageName``), or ``None`` when it parses. The phrase names the part at fault."""
    name_and_tag, at, digest = ref.partition("@")
    name, tag = name_and_tag, None
    colon = name_and_tag.rfind(":")
    if colon > name_and_tag.rfind("/"):
        name, tag = name_and_tag[:colon], name_and_tag[colon + 1 :]
    first, slash, rest = name.partition("/")
    # As reference.ParseNormalizedNamed splits it: a registry has a '.' or ':', is localhost, or is not lowercase.
    has_domain = bool(slash) and (any(c in first for c in ".:") or first == "localhost" or first != first.lower())
    domain, path = (first, rest) if has_domain else ("", name)
    if domain and not _IMAGE_DOMAIN.fullmatch(domain):
        return f"registry {domain!r} is not a host name or IP address with an optional ':port'"
    if not _IMAGE_PATH.fullmatch(path):
        if _IMAGE_PATH.fullmatch(path.lower()):
            return f"the repository {path!r} must be lowercase (write {path.lower()!r})"
        return (
            f"the repository {path!r} must be '/'-separated components of lowercase letters and "
            "digits, joined inside by '.', '_', '__' or '-'"
        )
    if len(name) > IMAGE_NAME_MAX:
        return f"the name is {len(name)} characters long; at most {IMAGE_NAME_MAX} are allowed"
    if tag is not None and not _IMAGE_TAG.fullmatch(tag):
        return "the tag {!r} must be 1 to 128 letters, digits, '_', '.' or '-', not starting with '.' or '-'".format(
            tag
        )
    if at:
        match = _IMAGE_DIGEST.fullmatch(digest)
        algorithm = match.group(1) if match else digest.partition(":")[0]
        want = IMAGE_DIGEST_HEX_LEN.get(algorithm)
        if want is None:
            return (
                f"the digest {digest!r} must be <algorithm>:<hex>, with algorithm one of "
                f"{', '.join(IMAGE_DIGEST_HEX_LEN)}"
            )
        if not re.fullmatch(rf"[0-9a-f]{{{want}}}", digest.partition(":")[2]):
            return f"the digest {digest!r}: {algorithm} takes exactly {want} lowercase hex digits"
    return None
