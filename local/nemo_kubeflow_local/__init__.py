"""A local stand-in for a Kubernetes cluster with Kubeflow Trainer v2.3.

`LocalCluster` serves the Kubernetes API (core v1 and trainer.kubeflow.org/v1alpha1) on
127.0.0.1 and runs TrainJobs as local processes, so the real `kubernetes` client and the
Kubeflow SDK work against it through a kubeconfig. See docs/local-cluster.md for what it is
and every way it differs from a real cluster.
"""

__version__ = "0.1.0"

from nemo_kubeflow_local.apiserver.faults import FaultHandle, RequestRecord
from nemo_kubeflow_local.local_cluster import LocalCluster

__all__ = ["FaultHandle", "LocalCluster", "RequestRecord"]
