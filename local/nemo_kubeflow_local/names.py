"""The name rules of the components the local cluster emulates, ported from their sources.

* k8s.io/apimachinery v0.36 (Kubernetes 1.36, the release the API server emulates):
  ``pkg/util/validation`` for DNS-1035 and DNS-1123 labels, DNS-1123 subdomains (object names),
  ConfigMap keys and the relaxed environment variable name, and ``pkg/api/validate/content`` for
  label keys (qualified names) and label values, whose length limits it words in bytes. Each
  ``*_errors`` function returns the messages the API server prints, in its order (length first,
  then format), an empty list for a valid value. Lengths are Go's ``len``: bytes.
* JobSet v0.12.0's validating webhook (``pkg/webhooks/jobset_webhook.go``, ``ValidateCreate``) with
  ``pkg/util/placement``'s job and pod names: ``jobset_name_errors``.

These are the emulator's own; the product keeps its own copies for its offline checks, so that a
mistake in one is caught by the other (test/local/test_emulator_rules.py checks these against the
values the real API server and webhook gave).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable

from nemo_kubeflow_local.constants import DNS_LABEL_MAX, DNS_SUBDOMAIN_MAX, POD_NAME_SAMPLE_SUFFIX

DNS1123_LABEL_FORMAT = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
DNS1123_SUBDOMAIN_FORMAT = f"{DNS1123_LABEL_FORMAT}(\\.{DNS1123_LABEL_FORMAT})*"
DNS1035_LABEL_FORMAT = "[a-z]([-a-z0-9]*[a-z0-9])?"
QUALIFIED_NAME_FORMAT = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
LABEL_VALUE_FORMAT = f"({QUALIFIED_NAME_FORMAT})?"
CONFIG_KEY_FORMAT = "[-._a-zA-Z0-9]+"

# Go's regexp.MatchString against "^...$": fullmatch here (`$` in Python also accepts a final newline).
_DNS1123_LABEL = re.compile(DNS1123_LABEL_FORMAT)
_DNS1123_SUBDOMAIN = re.compile(DNS1123_SUBDOMAIN_FORMAT)
_DNS1035_LABEL = re.compile(DNS1035_LABEL_FORMAT)
_QUALIFIED_NAME = re.compile(QUALIFIED_NAME_FORMAT)
_LABEL_VALUE = re.compile(LABEL_VALUE_FORMAT)
_CONFIG_KEY = re.compile(CONFIG_KEY_FORMAT)


def max_length_error(length: int) -> str:
    """pkg/util/validation's MaxLenError."""
    return f"must be no more than {length} characters"


def max_bytes_error(length: int) -> str:
    """pkg/api/validate/content's MaxLenError (label keys and values)."""
    return f"must be no more than {length} bytes"


def _size(value: str) -> int:
    return len(value.encode())


def regex_error(message: str, pattern: str, *examples: str) -> str:
    """apimachinery's RegexError: the rule, its examples, then the pattern."""
    if not examples:
        return f"{message} (regex used for validation is '{pattern}')"
    listed = " or ".join(f"'{example}', " for example in examples)
    return f"{message} (e.g. {listed}regex used for validation is '{pattern}')"


def dns1123_label_errors(value: str) -> list[str]:
    errors = []
    if _size(value) > DNS_LABEL_MAX:
        errors.append(max_length_error(DNS_LABEL_MAX))
    if not _DNS1123_LABEL.fullmatch(value):
        if _DNS1123_SUBDOMAIN.fullmatch(value):
            errors.append("must not contain dots")  # a subdomain of the right length: only the dots are wrong
        else:
            errors.append(
                regex_error(
                    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must "
                    "start and end with an alphanumeric character",
                    DNS1123_LABEL_FORMAT,
                    "my-name",
                    "123-abc",
                )
            )
    return errors


def _length_and_format(
    value: str,
    limit: int,
    pattern: re.Pattern,
    rule: str,
    *examples: str,
    too_long: Callable[[int], str] = max_length_error,
) -> list[str]:
    """The two checks most apimachinery rules make, in their order: the length, then the format."""
    errors = [too_long(limit)] if _size(value) > limit else []
    if not pattern.fullmatch(value):
        errors.append(regex_error(rule, pattern.pattern, *examples))
    return errors


def dns1123_subdomain_errors(value: str, too_long: Callable[[int], str] = max_length_error) -> list[str]:
    return _length_and_format(
        value,
        DNS_SUBDOMAIN_MAX,
        _DNS1123_SUBDOMAIN,
        "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must "
        "start and end with an alphanumeric character",
        "example.com",
        too_long=too_long,
    )


def dns1035_label_errors(value: str) -> list[str]:
    return _length_and_format(
        value,
        DNS_LABEL_MAX,
        _DNS1035_LABEL,
        "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic "
        "character, and end with an alphanumeric character",
        "my-name",
        "abc-123",
    )


def qualified_name_errors(value: str) -> list[str]:
    """A label or annotation key (IsQualifiedName): an optional DNS-1123 subdomain prefix and '/',
    then the name part."""
    rule = (
        "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric "
        "character"
    )
    parts = value.split("/")
    if len(parts) > 2:
        return [
            "a valid label key "
            + regex_error(rule, QUALIFIED_NAME_FORMAT, "MyName", "my.name", "123-abc")
            + " with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')"
        ]
    errors = []
    name = parts[-1]
    if len(parts) == 2:
        prefix = parts[0]
        if not prefix:
            errors.append("prefix part must be non-empty")
        else:
            errors.extend("prefix part " + e for e in dns1123_subdomain_errors(prefix, max_bytes_error))
    if not name:
        errors.append("name part must be non-empty")
    elif _size(name) > DNS_LABEL_MAX:
        errors.append("name part " + max_bytes_error(DNS_LABEL_MAX))
    if not _QUALIFIED_NAME.fullmatch(name):
        errors.append("name part " + regex_error(rule, QUALIFIED_NAME_FORMAT, "MyName", "my.name", "123-abc"))
    return errors


def label_value_errors(value: str) -> list[str]:
    return _length_and_format(
        value,
        DNS_LABEL_MAX,
        _LABEL_VALUE,
        "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must "
        "start and end with an alphanumeric character",
        "MyValue",
        "my_value",
        "12345",
        too_long=max_bytes_error,
    )


def config_key_errors(value: str) -> list[str]:
    """A ConfigMap or Secret data key (IsConfigMapKey)."""
    errors = []
    if _size(value) > DNS_SUBDOMAIN_MAX:
        errors.append(max_length_error(DNS_SUBDOMAIN_MAX))
    if not _CONFIG_KEY.fullmatch(value):
        errors.append(
            regex_error(
                "a valid config key must consist of alphanumeric characters, '-', '_' or '.'",
                CONFIG_KEY_FORMAT,
                "key.name",
                "KEY_NAME",
                "key-name",
            )
        )
    if value in (".", ".."):
        errors.append(f"must not be '{value}'")
    elif value.startswith(".."):
        errors.append("must not start with '..'")
    return errors


def relaxed_env_var_name_errors(value: str) -> list[str]:
    """IsRelaxedEnvVarName, the API server's rule since Kubernetes 1.32: printable ASCII but '='."""
    if not value:
        return ["environment variable name must be non-empty"]
    if any(not " " <= c <= "~" or c == "=" for c in value):
        return ["a valid environment variable name must consist only of printable ASCII characters other than '='"]
    return []


# --- JobSet's webhook: the names of the Jobs and pods a JobSet will have ---------------------------------

#: The webhook's words for a job or pod name over 63 characters (it replaces IsDNS1035Label's length message).
JOB_NAME_TOO_LONG = "JobSet name is too long, job names generated for this JobSet will exceed 63 characters"
POD_NAME_TOO_LONG = "JobSet name is too long, pod names generated for this JobSet will exceed 63 characters"


def job_name(jobset: str, replicated_job: str, job_index: int) -> str:
    """placement.GenJobName: the Job of replica ``job_index`` of a replicated job."""
    return f"{jobset}-{replicated_job}-{job_index}"


def pod_name_prefix(jobset: str, replicated_job: str, job_index: int, pod_index: int) -> str:
    """placement.GenPodName: a pod's name before the Job controller's random suffix."""
    return f"{job_name(jobset, replicated_job, job_index)}-{pod_index}"


@dataclass(frozen=True)
class NameRefusal:
    """One refusal: the field (``spec.replicatedJobs[i].name``), the value quoted and the message."""

    path: str
    value: str
    message: str


def jobset_name_errors(jobset: str, spec: dict) -> list[NameRefusal]:
    """What JobSet's ValidateCreate says about the names of ``jobset``'s Jobs and pods, in its order.

    Per replicated job: the longest Job name (the last replica's index) must be a DNS-1035 label,
    and for an Indexed job with ``completions`` the longest pod name (last replica, last completion
    index, then the sample suffix ``-abcde``) too. A length failure is reworded; a format failure
    keeps apimachinery's message. Both quote the longest Job name.
    """
    errors: list[NameRefusal] = []
    for i, rjob in enumerate(spec.get("replicatedJobs") or []):
        path = f"spec.replicatedJobs[{i}].name"
        replicas = _int(rjob.get("replicas"), 1)
        longest_job = job_name(jobset, rjob.get("name", ""), replicas - 1)
        errors.extend(
            NameRefusal(path, longest_job, _reworded(m, JOB_NAME_TOO_LONG)) for m in dns1035_label_errors(longest_job)
        )
        job_spec = (rjob.get("template") or {}).get("spec") or {}
        completions = job_spec.get("completions")
        if job_spec.get("completionMode") != "Indexed" or completions is None:
            continue
        longest_pod = pod_name_prefix(jobset, rjob.get("name", ""), replicas - 1, _int(completions, 0) - 1)
        longest_pod += POD_NAME_SAMPLE_SUFFIX
        errors.extend(
            NameRefusal(path, longest_job, _reworded(m, POD_NAME_TOO_LONG)) for m in dns1035_label_errors(longest_pod)
        )
    return errors


def _reworded(message: str, too_long: str) -> str:
    return too_long if max_length_error(DNS_LABEL_MAX) in message else message


def _int(value: Any, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def longest_fitting_jobset_name(replicated_job: str, replicas: int = 1, completions: int = 1) -> int:
    """The longest JobSet (so TrainJob) name whose pods of ``replicated_job`` pass the webhook."""
    overhead = len(pod_name_prefix("", replicated_job, replicas - 1, completions - 1) + POD_NAME_SAMPLE_SUFFIX)
    return DNS_LABEL_MAX - overhead
