"""What the scenarios of test_backends.py and test_backends_resilience.py see of a back end: `local` (the
embedded LocalCluster) or `real` (the upstream control plane, test/controlplane/, with our node agent
running the pods). The `backend` fixture (conftest.py) makes one per test."""

from dataclasses import dataclass, field
from typing import Callable

import polling
from kubernetes import client
from kubernetes.config import new_client_from_config
from kueue_api import kueue_version
from torchx.specs import parse_app_handle

from nemo_kubeflow import ConfigMapPackager, KubeflowExecutor
from nemo_kubeflow.nemo_run.scheduler import create_scheduler
from nemo_kubeflow.parts.steps import step_selector

# Where each kind of object lives on an API server (the real one has no `objects()` back door).
API_PATHS = {
    "pods": "/api/v1",
    "configmaps": "/api/v1",
    "secrets": "/api/v1",
    "persistentvolumeclaims": "/api/v1",
    "events": "/api/v1",
    "jobs": "/apis/batch/v1",
    "jobsets": "/apis/jobset.x-k8s.io/v1alpha2",
    "trainjobs": "/apis/trainer.kubeflow.org/v1alpha1",
    "workloads": "/apis/kueue.x-k8s.io/v1beta2",
}
KUEUE = "kueue.x-k8s.io"


@dataclass
class Backend:
    """One back end, as the scenarios see it: a kubeconfig, a fresh namespace and a way to list objects."""

    name: str
    kubeconfig: str
    namespace: str
    list_objects: Callable[[str], list]
    #: Makes a claim of this namespace bindable: a PersistentVolume pre-bound to it on the real API server
    #: (no provisioner there), nothing on the local one (its kubelet needs only the claim).
    provide_volume: Callable[[str, str], None] = lambda claim, size: None
    #: Fails a node with the test's pods on it the way a cluster handles a node that goes bad and comes
    #: back: its pods get `DisruptionTarget` (reason `DeletionByTaintManager`) and are deleted, then the
    #: node takes pods again. Local: `LocalCluster.lose_node` (the marker `backend_nodes(3)` gives the
    #: local back end virtual nodes to fail). Real: a `NoExecute` taint on one of the node agent's three
    #: Nodes, which the real taint-eviction controller (kube-controller-manager) acts on, removed once the
    #: node's pods are gone.
    fail_node: Callable[[str], None] = None
    #: Cluster-scoped Kueue objects this test made (plural, name), deleted after it.
    made: list = field(default_factory=list)

    def provide_cluster_queue(self, cpu: str = "16", memory: str = "64Gi", preempt_lower_priority: bool = False) -> str:
        """A ClusterQueue for this namespace's LocalQueues to point at, with a ResourceFlavor (`be-flavor`,
        kept) and quota for `cpu` and `memory`; `preempt_lower_priority`: `preemption.withinClusterQueue:
        LowerPriority`. Deleted after the test. Returns its name."""
        custom = self.custom_objects()
        try:
            custom.create_cluster_custom_object(
                KUEUE,
                self.kueue_version(),
                "resourceflavors",
                {
                    "apiVersion": f"{KUEUE}/{self.kueue_version()}",
                    "kind": "ResourceFlavor",
                    "metadata": {"name": "be-flavor"},
                },
            )
        except client.ApiException as error:
            if error.status != 409:
                raise
        spec = {
            "namespaceSelector": {},
            "resourceGroups": [
                {
                    "coveredResources": ["cpu", "memory"],
                    "flavors": [
                        {
                            "name": "be-flavor",
                            "resources": [
                                {"name": "cpu", "nominalQuota": cpu},
                                {"name": "memory", "nominalQuota": memory},
                            ],
                        }
                    ],
                }
            ],
        }
        if preempt_lower_priority:
            spec["preemption"] = {"withinClusterQueue": "LowerPriority"}
        name = f"{self.namespace}-cq"
        custom.create_cluster_custom_object(
            KUEUE,
            self.kueue_version(),
            "clusterqueues",
            {
                "apiVersion": f"{KUEUE}/{self.kueue_version()}",
                "kind": "ClusterQueue",
                "metadata": {"name": name},
                "spec": spec,
            },
        )
        self.made.append(("clusterqueues", name))
        return name

    def provide_priority_class(self, name: str, value: int) -> str:
        """A Kueue WorkloadPriorityClass named after the namespace and `name`, deleted after the test."""
        name = f"{self.namespace}-{name}"
        self.custom_objects().create_cluster_custom_object(
            KUEUE,
            self.kueue_version(),
            "workloadpriorityclasses",
            {
                "apiVersion": f"{KUEUE}/{self.kueue_version()}",
                "kind": "WorkloadPriorityClass",
                "metadata": {"name": name},
                "value": value,
            },
        )
        self.made.append(("workloadpriorityclasses", name))
        return name

    def queue(self, name: str, spec: dict) -> None:
        """A LocalQueue of this namespace named `name`, with `spec` (created, or its spec merged if it exists)."""
        custom, version = self.custom_objects(), self.kueue_version()
        try:
            custom.patch_namespaced_custom_object(KUEUE, version, self.namespace, "localqueues", name, {"spec": spec})
        except client.ApiException as error:
            if error.status != 404:
                raise
            queue = {"apiVersion": f"{KUEUE}/{version}", "kind": "LocalQueue", "metadata": {"name": name}, "spec": spec}
            custom.create_namespaced_custom_object(KUEUE, version, self.namespace, "localqueues", queue)

    def clean_up(self) -> None:
        custom = self.custom_objects()
        for plural, name in reversed(self.made):
            custom.delete_cluster_custom_object(KUEUE, self.kueue_version(), plural, name)

    def kueue_version(self) -> str:
        """The Kueue version the back end serves, preferred first (a Kueue without v1beta1 on the real one)."""
        return kueue_version(new_client_from_config(config_file=self.kubeconfig))

    def custom_objects(self) -> client.CustomObjectsApi:
        return client.CustomObjectsApi(new_client_from_config(config_file=self.kubeconfig))

    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(new_client_from_config(config_file=self.kubeconfig))

    def objects(self, resource: str, owned_by: str = "") -> list[dict]:
        """The namespace's `resource` objects; with `owned_by`, those of that TrainJob (by name prefix)."""
        return [o for o in self.list_objects(resource) if o["metadata"]["name"].startswith(owned_by)]

    def step_logs(self, trainjob: str, step: str, container: str) -> dict[int, str]:
        """`container`'s log of each pod of a step, by completion index, through the API server's pods/log."""
        core = self.core()
        pods = core.list_namespaced_pod(self.namespace, label_selector=step_selector(trainjob, step)).items
        return {
            int(p.metadata.labels["batch.kubernetes.io/job-completion-index"]): core.read_namespaced_pod_log(
                p.metadata.name, self.namespace, container=container
            )
            for p in pods
        }

    def executor(self, **overrides) -> KubeflowExecutor:
        fields = dict(
            container_image="python:3.11",  # ignored by both back ends: the host's Python runs
            nodes=2,
            nprocs_per_node=1,
            namespace=self.namespace,
            kubeconfig=self.kubeconfig,
            shm_size=None,
            packager=ConfigMapPackager(relative_path="test", include_pattern="workloads.py"),
        )
        return KubeflowExecutor(**{**fields, **overrides})


def wait_for(predicate, what: str, timeout: float = 90.0):
    """``polling.wait_for`` with the back ends' default: the real control plane is slower to act."""
    return polling.wait_for(predicate, what, timeout=timeout, interval=0.3)


def app_id_of(job) -> str:
    return parse_app_handle(job.handle)[2]


def trainjob_of(job) -> str:
    return app_id_of(job).split(":", 1)[1]


def logs(job, role: str, nodes=(0, 1)) -> list[str]:
    """Each node's lines, tagged here with the node they were read from (log_iter adds no prefix)."""
    scheduler = create_scheduler("t")
    return [f"[node-{node}] {line}" for node in nodes for line in scheduler.log_iter(app_id_of(job), role, node)]
