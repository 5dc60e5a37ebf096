"""Bearer tokens the local API server takes besides its kubeconfig's own, each for a while and revocable: as
kube-apiserver takes a bound service-account token (TokenRequest) until it expires or the object it is bound
to is deleted, and then answers ``401 Unauthorized``. What an exec plugin's short-lived tokens need
(``LocalCluster.issue_api_token``, ``revoke_api_token``); they act as the kubeconfig's user."""

from __future__ import annotations

import secrets
import threading
import time


class ApiTokens:
    """The tokens issued and when each expires (``time.monotonic()``)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._expiry: dict[str, float] = {}

    def issue(self, seconds: float) -> str:
        token = secrets.token_urlsafe(32)
        with self._lock:
            self._expiry[token] = time.monotonic() + seconds
        return token

    def revoke(self, token: str) -> None:
        with self._lock:
            self._expiry.pop(token, None)

    def accepts(self, authorization: str) -> bool:
        """Whether an ``Authorization`` header carries a token issued here, not expired nor revoked."""
        token = authorization.removeprefix("Bearer ")
        with self._lock:
            return self._expiry.get(token, -1.0) > time.monotonic()
