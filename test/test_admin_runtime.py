"""A job on an admin's runtime (``runtime_name``: Trainer v2.3's own torch-distributed) gets every pod setting
the executor carries in its runtime patch, on the real pods, on both back ends (the ``backend`` fixture)."""

from __future__ import annotations

import copy

import nemo_run as run
from backends import logs
from kubernetes import client
from torchx.specs import AppState
from unit.schema.test_validation import TORCH_DISTRIBUTED

from nemo_kubeflow import PVCMount, SecretMount

TRAINER = ("trainer.kubeflow.org", "v1alpha1", "clustertrainingruntimes")


def test_pod_settings_reach_the_pods_of_a_job_on_trainers_torch_distributed(backend):
    runtime = copy.deepcopy(TORCH_DISTRIBUTED)
    runtime["metadata"]["name"] = name = f"{backend.namespace}-torch-distributed"  # cluster-scoped: one per test
    custom, core = backend.custom_objects(), backend.core()
    custom.create_cluster_custom_object(*TRAINER, runtime)
    try:
        core.create_namespaced_service_account(backend.namespace, {"metadata": {"name": "trainer-sa"}})
        core.create_namespaced_secret(
            backend.namespace, {"metadata": {"name": "creds"}, "stringData": {"user": "someone"}}
        )
        backend.provide_volume("admin-data", "1Gi")
        executor = backend.executor(
            runtime_name=name,
            nodes=2,
            tolerations=[{"key": "example.com/pool", "operator": "Exists", "effect": "NoSchedule"}],
            node_selector={"kubernetes.io/os": "linux"},
            pvc_mounts=[PVCMount(claim_name="admin-data", mount_path="/data", create=True, size="1Gi")],
            secret_mounts=[SecretMount(secret_name="creds", mount_path="/creds")],
            shm_size="64Mi",
            service_account="trainer-sa",
            image_pull_secrets=["pull"],
            pod_labels={"team": "a"},
            pod_annotations={"example.com/note": "admin"},
            run_as_user=None,
            fs_group=1000,
            termination_grace_period_seconds=45,
        )
        script = run.Script(
            inline='{ cat /creds/user; echo; } | sed "s/^/secret file: /"; test -d /data && echo "claim mounted"'
        )
        with run.Experiment("be-admin-runtime", executor=executor, log_level="WARN") as exp:
            exp.add(script, name="admin")
            exp.run(sequential=True)
            job = exp.jobs[0]
        lines = logs(job, "admin")
        assert exp.status(return_dict=True)[job.id]["status"] == AppState.SUCCEEDED, lines
        pods = [p for p in core.list_namespaced_pod(backend.namespace).items if p.metadata.labels.get("team") == "a"]
        assert len(pods) == 2, [p.metadata.name for p in pods]
        for pod in pods:
            spec = pod.spec
            assert spec.service_account_name == "trainer-sa"
            assert spec.node_selector == {"kubernetes.io/os": "linux"}
            assert {"key": "example.com/pool", "operator": "Exists", "effect": "NoSchedule"} in [
                {k: v for k, v in t.to_dict().items() if v is not None and k != "toleration_seconds"}
                for t in spec.tolerations or []
            ]
            assert [s.name for s in spec.image_pull_secrets or []] == ["pull"]
            assert pod.metadata.annotations.get("example.com/note") == "admin"
            assert spec.termination_grace_period_seconds == 45
            assert spec.security_context.fs_group == 1000  # the pod securityContext, patched
            volumes = {v.name: v for v in spec.volumes}
            assert volumes["pvc-0"].persistent_volume_claim.claim_name == "admin-data"
            assert volumes["secret-0"].secret.secret_name == "creds"
            assert volumes["dshm"].empty_dir.medium == "Memory"
            (node,) = [c for c in spec.containers if c.name == "node"]
            assert {m.mount_path for m in node.volume_mounts} >= {"/data", "/creds", "/dev/shm"}
        for rank in (0, 1):
            assert f"[node-{rank}] secret file: someone\n" in lines and f"[node-{rank}] claim mounted\n" in lines, lines
    finally:
        try:
            custom.delete_cluster_custom_object(*TRAINER, name)
        except client.ApiException:
            pass
