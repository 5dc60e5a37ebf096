"""Kubernetes names for the objects of a submission.

Pure functions: the inputs (experiment id, task name, content) fully determine the
names, so dry runs and golden tests are reproducible and a re-run of the same
experiment maps onto the same TrainJob instead of creating a look-alike.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from nemo_kubeflow.constants import DNS_LABEL_MAX, TRAINJOB_NAME_MAX

# Used with fullmatch: `$` would also accept a trailing newline.
_RFC1035_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
_RFC1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_RFC1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
_QUALIFIED_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_ENV_VAR_NAME = re.compile(r"[-._a-zA-Z][-._a-zA-Z0-9]*")
_CONFIG_KEY = re.compile(r"[-._a-zA-Z0-9]+")
#: RFC 1123 subdomains (most object names, label and annotation key prefixes) are at most 253 characters.
DNS_SUBDOMAIN_MAX = 253

#: Length of the hash suffix that keeps sanitised names unique.
HASH_LEN = 6


def short_hash(*parts: Any, length: int = HASH_LEN) -> str:
    """A stable hex digest of ``parts`` (JSON-encoded, so dicts hash by content)."""
    payload = json.dumps(parts, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(payload.encode()).hexdigest()[:length]


def sanitize(text: str) -> str:
    """Lowercase, map every run of characters outside ``[a-z0-9]`` to one ``-``, trim dashes."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def is_rfc1035_label(name: str, max_len: int = DNS_LABEL_MAX) -> bool:
    return len(name) <= max_len and bool(_RFC1035_LABEL.fullmatch(name))


def is_rfc1123_label(name: str) -> bool:
    return len(name) <= DNS_LABEL_MAX and bool(_RFC1123_LABEL.fullmatch(name))


def is_rfc1123_subdomain(name: str) -> bool:
    return len(name) <= DNS_SUBDOMAIN_MAX and bool(_RFC1123_SUBDOMAIN.fullmatch(name))


def is_label_value(value: str) -> bool:
    return len(value) <= DNS_LABEL_MAX and bool(_LABEL_VALUE.fullmatch(value))


def is_qualified_name_part(name: str) -> bool:
    """The name part of a label or annotation key (after an optional ``prefix/``)."""
    return len(name) <= DNS_LABEL_MAX and bool(_QUALIFIED_NAME.fullmatch(name))


def is_qualified_name(key: str) -> bool:
    """A label or annotation key: an optional RFC 1123 subdomain prefix and ``/``, then the name part."""
    prefix, slash, name = key.rpartition("/")
    return (not slash or is_rfc1123_subdomain(prefix)) and is_qualified_name_part(name)


def is_env_var_name(name: str) -> bool:
    """An environment variable name the API server accepts (IsEnvVarName)."""
    return bool(_ENV_VAR_NAME.fullmatch(name))


def is_config_key(key: str) -> bool:
    """A ConfigMap or Secret data key (IsConfigMapKey): no '/', not '.', not starting with '..'."""
    return (len(key) <= DNS_SUBDOMAIN_MAX and bool(_CONFIG_KEY.fullmatch(key))
            and key != "." and not key.startswith(".."))


def trainjob_name(experiment_id: str, task_name: str, max_len: int = TRAINJOB_NAME_MAX) -> str:
    """The TrainJob name for one task of one experiment run.

    An RFC-1035 label of at most ``max_len`` characters: readable parts of the experiment
    and task, then a hash of the *unsanitised* pair, so names that differ only in case,
    punctuation or truncated tails (``llama3_8b`` vs ``llama3-8b``) never collide.
    """
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
