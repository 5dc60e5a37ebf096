"""The real upstream control plane for the `real` tests (see docs/real-control-plane.md).

- `build.py`: builds etcd, kube-apiserver, kube-controller-manager, kube-scheduler and the Trainer,
  JobSet and Kueue controller managers from Go modules at the versions pinned in `versions.py`, once
  per machine, into a cache folder outside the repository.
- `cluster.RealControlPlane`: starts them on loopback with random ports and stops every process.
- `manifests`: the upstream CRDs and webhook configurations, read from the modules, pointed at loopback.
"""

from .build import BuildUnavailable, build_dir, ensure_built, load_build_info
from .cluster import ControlPlaneError, RealControlPlane

__all__ = ["BuildUnavailable", "ControlPlaneError", "RealControlPlane", "build_dir", "ensure_built", "load_build_info"]
