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


def pins() -> dict:
    return {
        "kubernetes": KUBERNETES,
        "etcd": ETCD,
        "trainer": TRAINER,
        "jobset": JOBSET,
        "kueue": KUEUE,
        "recipe": RECIPE,
    }
