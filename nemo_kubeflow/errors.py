"""Errors raised by nemo_kubeflow.

Every error says what is wrong and how to fix it. Errors that come from the API
server carry the server's own reason and message (``status``, ``reason``,
``server_message``), which the Kubeflow SDK hides behind ``RuntimeError``.
"""

from __future__ import annotations

from typing import Optional, Sequence


class NemoKubeflowError(Exception):
    """Base class of every error this package raises."""


class ConfigError(NemoKubeflowError, ValueError):
    """The executor configuration is invalid. Raised before anything reaches a cluster."""


class PackagingError(NemoKubeflowError):
    """The task's files cannot be packaged (missing, unreadable, escaping the root)."""


class PackageTooLargeError(PackagingError):
    """The package does not fit in the ConfigMaps allowed for it."""

    def __init__(self, message: str, largest: Sequence[tuple[str, int]] = ()):
        super().__init__(message)
        #: The largest files of the package, as (path, bytes), biggest first.
        self.largest = list(largest)


class TemplateError(ConfigError):
    """A runtime template failed to render, or rendered something that is not a valid manifest."""


class ManifestValidationError(ConfigError):
    """A manifest failed offline validation. ``problems`` lists each finding as ``path: message``."""

    def __init__(self, kind: str, name: str, problems: Sequence[str]):
        self.kind = kind
        self.name = name
        self.problems = list(problems)
        listing = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"{kind} {name!r} is invalid:\n{listing}")


class NotAdmittedError(ManifestValidationError):
    """The namespace would refuse the job's pods (its Pod Security level, a ResourceQuota, a LimitRange, a
    ServiceAccount or PriorityClass that does not exist): found by reads before anything was written.
    ``problems`` lists each refusal, naming the policy object, the numbers and the executor field to change."""

    def __init__(self, kind: str, name: str, namespace: str, problems: Sequence[str]):
        super().__init__(kind, name, problems)
        self.namespace = namespace
        listing = "\n".join(f"  - {p}" for p in self.problems)
        self.args = (
            f"{kind} {name!r} was not submitted (nothing was written): namespace {namespace!r} would refuse "
            f"its pods:\n{listing}",
        )


class ClusterError(NemoKubeflowError):
    """The cluster refused or failed a request.

    Carries the server's answer: ``status`` (HTTP code), ``reason`` (e.g. ``Forbidden``,
    ``AlreadyExists``, ``Invalid``) and ``server_message`` (the ``Status.message``).
    """

    def __init__(
        self,
        message: str,
        *,
        status: Optional[int] = None,
        reason: Optional[str] = None,
        server_message: Optional[str] = None,
    ):
        super().__init__(message)
        self.status = status
        self.reason = reason
        self.server_message = server_message


class ClusterUnreachableError(ClusterError):
    """No answer from the API server (connection refused, DNS, TLS, timeout)."""


class DeadlineExceededError(ClusterUnreachableError):
    """The API server did not answer before a deadline (a submission's ``submit_timeout_seconds``).
    ``tries``: the tries of the request that the deadline ended."""

    def __init__(self, message: str, *, tries: int = 0):
        super().__init__(message)
        self.tries = tries


class KubeconfigError(ClusterError, ConfigError):
    """The kubeconfig file or context cannot be loaded."""


class PermissionDeniedError(ClusterError):
    """RBAC denied a request (HTTP 403)."""


class AdmissionDeniedError(ClusterError):
    """An admission webhook (e.g. Trainer's) refused the object (HTTP 403 with a webhook message)."""


class AlreadyExistsError(ClusterError):
    """An object of that name already exists (HTTP 409) and was not created by this submission."""


class NotFoundError(ClusterError):
    """An object the submission needs does not exist (HTTP 404)."""


class SubmissionError(ClusterError):
    """A submission failed part-way; everything it had created was removed, or the message names
    what could not be removed and the kubectl command that deletes it."""


class SubmissionStopped(KeyboardInterrupt):
    """A Ctrl-C stopped a submission before its job started: what it had created was removed."""
