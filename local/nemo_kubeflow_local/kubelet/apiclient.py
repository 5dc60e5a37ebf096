"""The node agent's client of a Kubernetes API server: the ``kubernetes`` library's connection (the
kubeconfig's server, credentials and CA) and raw JSON requests, as a kubelet makes them.

Transient failures (no answer, 429, 5xx) are tried again a few times with backoff; anything else
raises ``ApiRequestError`` with the status and the server's message (``NotFound`` for 404).
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any, Optional

logger = logging.getLogger(__name__)

#: Statuses worth another try: throttled, or the server (or what is in front of it) failed.
TRANSIENT_STATUS = frozenset({429, 500, 502, 503, 504})


class ApiRequestError(Exception):
    """A request the API server refused or never answered (``status`` 0)."""

    def __init__(self, method: str, path: str, status: int, message: str):
        super().__init__(f"{method} {path}: " + (f"HTTP {status}: {message}" if status else message))
        self.status = status
        self.message = message


class NotFound(ApiRequestError):
    """404: the object (or the API) does not exist."""


class ApiClient:
    """Requests to the API server of ``kubeconfig`` (its current context, or ``context``)."""

    def __init__(
        self,
        kubeconfig: str,
        context: Optional[str] = None,
        *,
        attempts: int = 5,
        backoff: float = 0.2,
        request_timeout: float = 30.0,
    ):
        from kubernetes import client, config

        configuration = client.Configuration()
        config.load_kube_config(config_file=kubeconfig, context=context, client_configuration=configuration)
        self._client = client.ApiClient(configuration)
        self.host: str = configuration.host
        self.attempts = attempts
        self.backoff = backoff
        self.request_timeout = request_timeout

    def call(
        self,
        method: str,
        path: str,
        *,
        query: Optional[list] = None,
        body: Any = None,
        content_type: str = "application/json",
        stream: bool = False,
        retry: bool = True,
    ) -> Any:
        """The decoded JSON answer, or the raw urllib3 response when ``stream`` (the caller releases it)."""
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        attempts = self.attempts if retry else 1
        delay = self.backoff
        for attempt in range(1, attempts + 1):
            try:
                resp = self._client.call_api(
                    path,
                    method,
                    query_params=query or [],
                    body=body,
                    auth_settings=["BearerToken"],
                    header_params={"Accept": "application/json", "Content-Type": content_type},
                    _preload_content=False,
                    _return_http_data_only=True,
                    # (connect, read); a watch has no read timeout: the server ends it (timeoutSeconds).
                    _request_timeout=(10.0, None if stream else self.request_timeout),
                )
                if stream:
                    return resp
                return json.loads(resp.data) if resp.data else {}
            except ApiException as error:
                status = int(error.status or 0)
                if status in TRANSIENT_STATUS and attempt < attempts:
                    logger.info("%s %s: HTTP %s, trying again in %.1fs", method, path, status, delay)
                    time.sleep(delay)
                    delay *= 2
                    continue
                cls = NotFound if status == 404 else ApiRequestError
                raise cls(method, path, status, _message(error)) from None
            except (HTTPError, OSError) as error:
                if attempt < attempts:
                    logger.info("%s %s: %s, trying again in %.1fs", method, path, type(error).__name__, delay)
                    time.sleep(delay)
                    delay *= 2
                    continue
                raise ApiRequestError(
                    method, path, 0, f"the API server at {self.host} did not answer: {type(error).__name__}"
                ) from None
        raise AssertionError("unreachable")  # pragma: no cover


def _message(error: Any) -> str:
    """The ``message`` of the server's Status, else its reason."""
    try:
        return str(json.loads(error.body)["message"])
    except (TypeError, ValueError, KeyError):
        return str(error.reason or "")
