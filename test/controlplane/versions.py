"""The pinned upstream versions of the real control plane used by the `real` tests.

Changing any value here changes the versions hash, so the next run builds a new cache folder.

Why these versions:
- Trainer v2.3.0's go.mod requires k8s.io/api v0.36.2 and sigs.k8s.io/jobset v0.12.0, so the
  control plane is Kubernetes v1.36 (the newest v1.36 patch on the module proxy) and JobSet v0.12.0.
- Kubernetes v1.36 is built and tested against etcd v3.6.8 (its go.mod); Debian bookworm's
  `etcd-server` is 3.4.23, two minors older, so etcd is built from its server module at v3.6.8.
- Kueue v0.19.2 is the newest release on the module proxy; its go.mod requires JobSet v0.12.0 and
  k8s.io/api v0.36 like Trainer v2.3.0's, and its `trainer.kubeflow.org/trainjob` integration handles
  TrainJobs (trainer.kubeflow.org/v1alpha1, the API Trainer v2.3.0 serves).
"""

KUBERNETES = "v1.36.3"
#: The version matrix of the `real` stage: the Kubernetes releases whose kube-apiserver,
#: kube-controller-manager and kube-scheduler the tests also run on, beside the controllers above
#: (built once, on KUBERNETES' libraries). Select one with NEMO_KUBEFLOW_KUBERNETES=<version>.
#: - v1.37.2: the newest Kubernetes on the module proxy (2026-11-27: v1.37.3 is refused with 403).
#: - v1.31.13: the oldest minor Trainer v2.3.0 supports ("Kubernetes >= 1.31" in its
#:   docs/operator-guides/installation.md and chart README; its own e2e matrix starts at 1.32), the newest patch
#:   the module proxy serves whole (v1.31.14 resolves, but its staging modules k8s.io/kube-controller-manager and
#:   k8s.io/endpointslice v0.31.14 are refused with 403).
#:   etcd stays at ETCD for every entry (its v3 API is kept compatible across minors; not yet run with 1.31 here).
KUBERNETES_MATRIX = (KUBERNETES, "v1.37.2", "v1.31.13")
#: The entries .ci/run's real stage runs. Not v1.31.13: its kube-apiserver refuses Trainer v2.3.0's
#: ClusterTrainingRuntime CRD (422: the CEL rule Trainer embeds from JobSet's volumeClaimPolicies,
#: `self.templates.all(t, !has(t.metadata.namespace) || ...)`, is invalid there; run 2026-11-27), so no test can
#: start on it: Trainer v2.3.0 does not install on Kubernetes 1.31 (docs/compatibility.md).
KUBERNETES_CI = (KUBERNETES, "v1.37.2")
#: The environment variable that selects the Kubernetes release of the matrix a run uses.
KUBERNETES_ENV = "NEMO_KUBEFLOW_KUBERNETES"
ETCD = "v3.6.8"
TRAINER = "v2.3.0"
JOBSET = "v0.12.0"
KUEUE = "v0.19.2"

#: Bump when the build recipe itself changes (flags, layout), to force a rebuild.
RECIPE = 2


def staging_version(kubernetes_version: str) -> str:
    """k8s.io/api and the other staging modules are tagged v0.<minor>.<patch> for Kubernetes v1.<minor>.<patch>."""
    major, minor, patch = kubernetes_version.lstrip("v").split(".")
    return f"v0.{minor}.{patch}"


def selected_kubernetes(environ=None) -> str:
    """The Kubernetes release this run's control plane uses: KUBERNETES unless the environment picks
    another entry of KUBERNETES_MATRIX (any other value is refused, naming the matrix)."""
    import os

    chosen = (os.environ if environ is None else environ).get(KUBERNETES_ENV) or KUBERNETES
    if chosen not in KUBERNETES_MATRIX:
        raise ValueError(f"{KUBERNETES_ENV}={chosen} is not in test/controlplane/versions.py's KUBERNETES_MATRIX "
                         f"{', '.join(KUBERNETES_MATRIX)}: add it there (pinned) to test on it")
    return chosen


def pins() -> dict:
    return {
        "kubernetes": KUBERNETES,
        "etcd": ETCD,
        "trainer": TRAINER,
        "jobset": JOBSET,
        "kueue": KUEUE,
        "recipe": RECIPE,
    }
