"""Where a container sees its volumes: at their mount paths, in a mount namespace of its own.

The kubelet rewrites mount paths where it can see them (command, args, env, workingDir, ConfigMap files:
volumes.PathMap), but not in what the code builds or decodes (a `run.Partial`'s arguments travel zlib+base64).
So each container also runs in a private mount namespace (container_init.private_mounts) where every volume's
directory is bind-mounted at its mount path: a write to `/checkpoints/x` lands in the claim's directory.

A mount is honoured there when its path exists on the host (the host's directory is hidden from the pod, not
touched), when its first directory does not exist on the host (the container gets a new root holding the
host's entries plus that directory), or when it lies inside a volume mounted before it. Any other mount path
(one under a host directory that lacks it, one that would hide this machine's Python or the cluster's own
directory, `/` itself) cannot be honoured. A volume the pod may write to (a claim, an emptyDir, anything but
configMap, secret, projected and downwardAPI) at such a path, or on a machine that makes no mount namespace
(`NEMO_KUBEFLOW_LOCAL_MOUNT_NAMESPACE=0` says so, for tests), fails the container with `StartError`, the
reason and the fix: the code's own writes never reach the host's root. Read-only volumes fall back to the
path rewriting alone, as does every volume with `NEMO_KUBEFLOW_LOCAL_MOUNT_NAMESPACE=rewrite`.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

#: "0": make no mount namespace (a machine that allows none, for tests); "rewrite": none, and refuse nothing
#: (mount paths rewritten in command, args and env only); unset or "1": a namespace for each container.
MODE_ENV = "NEMO_KUBEFLOW_LOCAL_MOUNT_NAMESPACE"
MODES = ("", "1", "0", "rewrite")
READ_ONLY_KINDS = ("configMap", "secret", "projected", "downwardAPI")
FIX = (
    "allow unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1 and user.max_user_namespaces "
    "above 0; in a Docker container, --security-opt seccomp=unconfined --security-opt apparmor=unconfined), or set "
    f"{MODE_ENV}=rewrite to accept mount paths rewritten in command, args and env only (docs/local-cluster.md)"
)


@dataclass(frozen=True)
class Mount:
    volume: str
    #: The container's mount path, normalized.
    path: str
    #: The volume's directory (or file, with a subPath) on the host.
    source: Path
    writable: bool

    @property
    def shared_memory(self) -> bool:
        """/dev/shm: the host's own (memory, as the emptyDir of medium Memory it stands for) is left in place,
        never refused."""
        return self.path == "/dev/shm"


@dataclass(frozen=True)
class Mounts:
    """What a container's init mounts (container_init.private_mounts)."""

    binds: tuple[Mount, ...]
    #: Fail the container when the machine makes no mount namespace (a writable volume is among the binds).
    required: bool
    #: An empty directory of the pod's own for the container's new root, when it needs one.
    scratch: Path

    def init_args(self) -> list[str]:
        if not self.binds:
            return ["0"]
        pairs = [str(p) for b in self.binds for p in (b.source, b.path)]
        return [str(len(self.binds)), "1" if self.required else "0", str(self.scratch), *pairs]


class MountRefusal(Exception):
    """A mount that cannot be honoured, said as runc says a failed mount, with the reason and the fix."""

    def __init__(self, mount: Mount, reason: str):
        super().__init__(reason)
        self.mount, self.reason = mount, reason

    @property
    def message(self) -> str:
        return (
            "failed to create containerd task: failed to create shim task: OCI runtime create failed: runc create "
            "failed: unable to start container process: error during container init: error mounting "
            f'"{self.mount.volume}" to rootfs at "{self.mount.path}": {self.reason}: unknown'
        )


def host_paths(workdir: Path) -> list[str]:
    """What every pod needs from the host: this Python, its packages and the cluster's directory."""
    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix, str(Path(sys.executable).parent), str(workdir)}
    paths.update(p for p in sys.path if p and os.path.isabs(p) and os.path.isdir(p))
    return sorted(os.path.normpath(p) for p in paths)


def plan(mounts: list[Mount], needed: list[str], scratch: Path, mode: Optional[str] = None) -> Mounts:
    """The mounts the container's init makes; raises MountRefusal for a writable volume it cannot honour."""
    mode = os.environ.get(MODE_ENV, "") if mode is None else mode
    if mode not in MODES and mounts:
        raise MountRefusal(mounts[0], f"{MODE_ENV}={mode!r} is not one of {', '.join(map(repr, MODES))}: fix it")
    if mode == "rewrite":
        return Mounts((), False, scratch)
    if mode == "0":
        for mount in mounts:
            if mount.writable and not mount.shared_memory:
                raise MountRefusal(mount, no_namespace(f"{MODE_ENV}=0", mount))
        return Mounts((), False, scratch)
    binds: list[Mount] = []
    seen: set[str] = set()
    for mount in sorted(mounts, key=lambda m: (m.path.count("/"), m.path)):
        if mount.path in seen or mount.shared_memory:
            continue  # /dev/shm: the host's stands in, in memory as the volume is
        seen.add(mount.path)
        reason = _unbindable(mount, needed, [b.path for b in binds])
        if reason is None:
            binds.append(mount)
        elif mount.writable:
            raise MountRefusal(mount, reason)
    return Mounts(tuple(binds), any(b.writable for b in binds), scratch)


def no_namespace(cause: str, mount: Mount) -> str:
    return (
        f"the local cluster makes no mount namespace for the container here ({cause}), so a path the code "
        f"builds under {mount.path} would reach this machine's own {mount.path} instead of the volume: {FIX}"
    )


def refused_by_init(mounts: Mounts, code: int, index: int) -> MountRefusal:
    """What the container's init reported (`refused <errno> <index>`), said for the user."""
    if index < 0:
        first = next(b for b in mounts.binds if b.writable)
        return MountRefusal(first, no_namespace(f"unshare: {os.strerror(code)}", first))
    mount = mounts.binds[index]
    return MountRefusal(
        mount, f"the container's init could not mount it ({os.strerror(code)}) without writing to the host"
    )


def _inside(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory.rstrip("/") + "/")


def _unbindable(mount: Mount, needed: list[str], bound: list[str]) -> Optional[str]:
    """Why `mount` cannot be bind-mounted at its path, or None."""
    path = mount.path
    if path == "/":
        return "the local cluster cannot mount a volume over the host's whole filesystem: choose another mount path"
    hidden = next((n for n in needed if _inside(n, path)), None)
    if hidden is not None:
        return (
            f"a volume at {path} would hide {hidden}, which every pod of the local cluster needs from this machine "
            "(its Python, packages or the cluster's directory): choose a mount path that does not hold it"
        )
    if any(_inside(path, b) for b in bound):
        return None  # its mount point is made inside the volume above it, as a kubelet does
    existing = path
    while not os.path.lexists(existing):
        existing = os.path.dirname(existing)
    if os.path.realpath(existing) != existing:
        return f"{existing} is a link on this machine: choose a mount path without links"
    if existing == path:
        if os.path.isdir(path) != mount.source.is_dir():
            kind = "a directory" if os.path.isdir(path) else "a file"
            return f"{path} is {kind} on this machine and the volume is not: choose another mount path"
        return None
    if existing == "/":
        return None
    missing = existing.rstrip("/") + "/" + path[len(existing) :].strip("/").split("/")[0]
    return (
        f"{existing} exists on this machine but {missing} does not, and the local cluster never creates a mount "
        f"point on the host: create {missing} on the host first, or mount at a path whose first directory the host lacks "
        f"(such as /{path.strip('/').split('/')[-1]})"
    )
