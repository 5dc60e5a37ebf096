"""Clients that several threads make from one kubeconfig at the same moment all connect.

The kubernetes client writes a kubeconfig's inline certificates (``certificate-authority-data``, a client
certificate and key) to temp files that the whole process shares, one per content, and it hands out a file's
name before it has written the file: a second thread loading the same kubeconfig just then got an empty CA
file, and its first request failed with ``[X509: NO_CERTIFICATE_OR_CRL_FOUND]`` ("cannot reach the API server").
Seen once in a test run, where log followers and a submission made clients at once; our clients now load
kubeconfigs one at a time. The window is widened here by slowing the library's write of each temp file."""

from __future__ import annotations

import os
import threading
import time

from kubernetes.config import kube_config

from nemo_kubeflow.cluster.client import KubernetesCluster

THREADS = 4
#: How long each temp file stays empty after its name is handed out: longer than a client's load and first
#: request take here, so that without one load at a time every thread but the first would read it empty.
WRITE_DELAY_SECONDS = 1.0


def test_clients_loaded_at_once_from_one_kubeconfig_all_connect(local, monkeypatch):
    # As in a process that has not loaded this kubeconfig yet: no temp file of its certificates made.
    fresh: dict = {}
    monkeypatch.setattr(kube_config, "_temp_files", fresh)

    def slow_open(name, mode="r", *args, **kwargs):
        if mode == "wb":  # the library's write of a temp file it has already named
            time.sleep(WRITE_DELAY_SECONDS)
        return open(name, mode, *args, **kwargs)

    monkeypatch.setattr(kube_config, "open", slow_open, raising=False)
    start = threading.Barrier(THREADS)
    answers: dict[int, object] = {}

    def first_request(i: int) -> None:
        start.wait()
        try:
            # One try: a retry could hide the empty file behind the write that comes meanwhile.
            answers[i] = KubernetesCluster(str(local.kubeconfig_path), max_attempts=1).list("Namespace", None)
        except Exception as e:  # noqa: BLE001 - reported below, with the thread it came from
            answers[i] = e

    threads = [threading.Thread(target=first_request, args=(i,)) for i in range(THREADS)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    finally:
        for path in fresh.values():
            if os.path.exists(path):
                os.remove(path)
    failed = {i: a for i, a in answers.items() if not isinstance(a, list)}
    assert len(answers) == THREADS and not failed, failed
    assert all(any(ns["metadata"]["name"] == "default" for ns in a) for a in answers.values())
