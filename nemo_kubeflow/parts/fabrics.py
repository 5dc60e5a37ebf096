"""Network fabric profiles: what each GPU interconnect adds to the training runtime.

``KubeflowExecutor.network_fabric`` names a profile; the profile's parameters live in one small
dataclass per profile on the executor (``tcpxo``, ``gke_rdma``, ``aws_efa``, ``infiniband``), so a
misspelt parameter is a ``TypeError`` rather than a silently ignored key. ``build_fabric`` is pure:
it turns the executor into a ``Fabric`` (pod annotations, node env, per-node resources, volumes,
sidecars) that ``render.py`` puts into the shared runtime and ``manifests.py`` into
``resourcesPerNode``. What each profile needs from the cluster is in docs/fabrics.md.

``PROFILES`` is the registry: one ``Profile`` per profile (its name, the executor field and class of
its settings, its builder, the checks of its settings), which the executor's validation, the docs
(``docgen``) and the tests iterate. A new profile is a settings class, a builder and one entry
there, plus its field on ``KubeflowExecutor``.

No ``from __future__ import annotations``: NeMo-Run's CLI reads the profile dataclasses'
annotations at run time (``run.executor.gke_rdma.nic_count=4``).
"""

import difflib
import json
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping, Optional, Protocol

NONE = "none"
GKE_TCPXO = "gke-tcpxo"
GKE_RDMA = "gke-rdma"
AWS_EFA = "aws-efa"
INFINIBAND = "infiniband"

#: Capabilities the Pod Security "baseline" profile allows a container to add.
_BASELINE_CAPABILITIES = {
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "MKNOD",
    "NET_BIND_SERVICE",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
}


@dataclass(kw_only=True)
class TCPXOConfig:
    """GKE GPUDirect-TCPXO (A3 Mega) settings, used when ``network_fabric="gke-tcpxo"`` (or ``enable_tcpxo``).

    The sidecar needs ``NET_ADMIN`` and ``NET_BIND_SERVICE`` and host paths for the
    NVIDIA libraries and ``/proc/sys``/``/sys``: these fail the Pod Security
    "baseline" profile, so TCPXO needs a namespace that allows privileged pods.
    """

    #: Number of GPU NICs (``eth1``..``ethN``); A3 Mega has 8.
    nic_count: int = 8
    #: VPC network names for the GPU NICs, one per NIC (``networking.gke.io/interfaces``).
    #: Empty means ``vpc1``..``vpcN``, the names used in GKE's setup guide.
    network_names: list[str] = field(default_factory=list)
    #: Network of the default interface ``eth0``.
    default_network: str = "default"
    #: Image of the ``tcpxo-daemon`` (receive-datapath manager) sidecar. Its version is coupled
    #: with the NCCL plugin installer's on the nodes: v1.0.21 goes with installer v1.0.15 (see the
    #: release notes in container-engine-accelerators/gpudirect-tcpxo). Daemons before v1.0.18 also
    #: want ``--num_nics``, which this profile no longer passes.
    daemon_image: str = "us-docker.pkg.dev/gce-ai-infra/gpudirect-tcpxo/tcpgpudmarxd-dev:v1.0.21"
    #: Host directory holding the NVIDIA driver and the NCCL FasTrak plugin installed by GKE.
    nvidia_host_path: str = "/home/kubernetes/bin/nvidia"
    #: Extra or overriding NCCL environment variables for the training container.
    nccl_env: dict[str, str] = field(default_factory=dict)

    def networks(self) -> list[str]:
        return list(self.network_names) or [f"vpc{i}" for i in range(1, self.nic_count + 1)]


@dataclass(kw_only=True)
class GKERDMAConfig:
    """GKE GPUDirect-RDMA over RoCE with the gIB NCCL plugin (A3 Ultra, A4), used when
    ``network_fabric="gke-rdma"``.

    No sidecar: GKE's RDMA installer puts the gIB plugin on the node, and the pod mounts it and
    the NVIDIA libraries from host paths, which the Pod Security "baseline" profile forbids.
    """

    #: Number of RDMA NICs, one per GPU; A3 Ultra (H200) and A4 (B200) have 8.
    nic_count: int = 8
    #: RDMA network names, one per NIC (``networking.gke.io/interfaces``). Empty means
    #: ``rdma-0``..``rdma-<N-1>``, the names used in GKE's setup guide.
    network_names: list[str] = field(default_factory=list)
    #: Network of the default interface ``eth0``.
    default_network: str = "default"
    #: Network of the second gVNIC ``eth1`` (NCCL bootstrap and data traffic); ``""`` for none.
    gvnic_network: str = "gvnic-1"
    #: Host directory of the NVIDIA driver installed by GKE (mounted at ``/usr/local/nvidia``).
    nvidia_host_path: str = "/home/kubernetes/bin/nvidia"
    #: Host directory of the gIB NCCL plugin installed by GKE (mounted at ``/usr/local/gib``).
    gib_host_path: str = "/home/kubernetes/bin/gib"
    #: NCCL tuner configuration (``NCCL_TUNER_CONFIG_PATH``). ``None``: A4's
    #: ``/usr/local/gib/configs/tuner_config_a4.txtpb`` when ``node_selector`` picks B200 nodes
    #: (``cloud.google.com/gke-accelerator: nvidia-b200``), A3 Ultra's ``tuner_config_a3u.txtpb`` otherwise.
    tuner_config: Optional[str] = None
    #: Extra or overriding NCCL environment variables for the training container.
    nccl_env: dict[str, str] = field(default_factory=dict)

    def networks(self) -> list[str]:
        return list(self.network_names) or [f"rdma-{i}" for i in range(self.nic_count)]


@dataclass(kw_only=True)
class EFAConfig:
    """AWS Elastic Fabric Adapter (p4d, p5, p6), used when ``network_fabric="aws-efa"``.

    Needs the EFA device plugin on the nodes and an image with libfabric and the aws-ofi-nccl
    plugin. No privileges: the pods still pass the Pod Security "restricted" profile.
    """

    #: EFA devices requested per node: p4d.24xlarge has 4, p5.48xlarge 32, p5en.48xlarge 16,
    #: p6-b200.48xlarge 8. More than the instance has leaves the pods unschedulable.
    devices_per_node: int = 32
    #: The extended resource the EFA device plugin registers.
    resource_name: str = "vpc.amazonaws.com/efa"
    #: Prepended to ``LD_LIBRARY_PATH`` by the launch script: libfabric and aws-ofi-nccl in the
    #: image (these are the AWS Deep Learning Container paths). ``""`` leaves it alone.
    library_path: str = "/opt/amazon/efa/lib:/opt/amazon/ofi-nccl/lib/x86_64-linux-gnu"
    #: Extra or overriding NCCL / libfabric (``FI_*``) environment variables.
    nccl_env: dict[str, str] = field(default_factory=dict)


@dataclass(kw_only=True)
class InfiniBandConfig:
    """InfiniBand (or RoCE) through an RDMA device plugin, used when ``network_fabric="infiniband"``.

    The training container gets ``IPC_LOCK`` to pin RDMA memory, which the Pod Security
    "baseline" profile forbids.
    """

    #: The extended resource your RDMA device plugin registers, e.g. ``rdma/rdma_shared_device_a``
    #: (NVIDIA Network Operator's shared device plugin), ``nvidia.com/hostdev`` (its host-device
    #: network), ``nvidia.com/sriovlegacy`` (its SR-IOV example). The default ``rdma/ib`` is
    #: CoreWeave's name.
    resource_name: str = "rdma/ib"
    #: How many of them per node: 1 for a shared device, one per virtual function for SR-IOV.
    devices_per_node: int = 1
    #: ``NCCL_IB_HCA``: the HCAs NCCL may use, e.g. ``"mlx5"`` or ``"=mlx5_0,mlx5_1"``; ``""`` lets NCCL pick.
    hca: str = ""
    #: ``NCCL_IB_GID_INDEX``. ``None`` leaves it to NCCL, which picks a RoCE v2 GID itself since
    #: 2.21 (InfiniBand ignores it); force one only for an older NCCL or an unusual GID table.
    gid_index: Optional[int] = None
    #: Extra or overriding NCCL environment variables for the training container.
    nccl_env: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Fabric:
    """What a profile adds to the pods. Everything is shared by every task with the same settings,
    so it goes into the runtime, except ``resources``, which joins the TrainJob's ``resourcesPerNode``."""

    name: str = NONE
    #: Pod annotations (multi-NIC attachment, device injection), in rendering order.
    annotations: dict[str, str] = field(default_factory=dict)
    #: Environment of the training container (and of the preflight container).
    env: dict[str, str] = field(default_factory=dict)
    #: Extended resources per node, requested and limited alike.
    resources: dict[str, str] = field(default_factory=dict)
    #: Capabilities added to the training container.
    capabilities: tuple[str, ...] = ()
    #: Pod volumes, and their mounts in the training container.
    volumes: tuple[dict, ...] = ()
    mounts: tuple[dict, ...] = ()
    #: Native sidecars (init containers with ``restartPolicy: Always``) running beside training.
    sidecars: tuple[dict, ...] = ()
    #: Prepended to ``LD_LIBRARY_PATH`` by the launch script, so the image's own path survives.
    library_path: str = ""

    def privileges(self) -> list[str]:
        """What makes these pods fail the Pod Security "baseline" profile (empty: they pass)."""
        added = set(self.capabilities)
        for sidecar in self.sidecars:
            added |= set(sidecar.get("securityContext", {}).get("capabilities", {}).get("add", []))
        found = [f"the {cap} capability" for cap in sorted(added - _BASELINE_CAPABILITIES)]
        if any("hostPath" in v for v in self.volumes):
            found.append("host paths")
        return found


class FabricExecutor(Protocol):
    """What the profiles read of an executor (``KubeflowExecutor`` has it; config sits above this package)."""

    @property
    def network_fabric(self) -> str: ...
    @property
    def enable_tcpxo(self) -> bool: ...
    @property
    def gpus_per_node(self) -> int: ...
    @property
    def restricted_security(self) -> bool: ...
    @property
    def extra_resources(self) -> Mapping[str, str]: ...
    @property
    def node_selector(self) -> Mapping[str, str]: ...
    @property
    def pod_annotations(self) -> Mapping[str, str]: ...


def fabric_name(executor: FabricExecutor) -> str:
    """The profile in effect: ``enable_tcpxo`` is the older spelling of ``network_fabric="gke-tcpxo"``."""
    return GKE_TCPXO if executor.enable_tcpxo else executor.network_fabric


def fabric_label(executor: FabricExecutor) -> str:
    """How the user chose the profile, for error messages."""
    return "enable_tcpxo" if executor.enable_tcpxo else f"network_fabric={executor.network_fabric!r}"


def profile_settings(executor: FabricExecutor, name: str):
    """The settings of profile ``name``: the executor's, or the class defaults where it has ``None``."""
    profile = PROFILES[name]
    value = getattr(executor, profile.field)
    return profile.settings() if value is None else value


def build_fabric(executor: FabricExecutor) -> Fabric:
    """The ``Fabric`` of ``executor``'s profile; ``Fabric()`` for ``"none"``. Pure."""
    name = fabric_name(executor)
    if name == NONE:
        return Fabric()
    return PROFILES[name].build(profile_settings(executor, name), executor)


def _interfaces_annotation(default_network: str, networks: list[str]) -> str:
    interfaces = [{"interfaceName": "eth0", "network": default_network}] + [
        {"interfaceName": f"eth{i}", "network": net} for i, net in enumerate(networks, start=1)
    ]
    return json.dumps(interfaces, indent=2)


def _tcpxo(cfg: TCPXOConfig, gpus: int) -> Fabric:
    networks = cfg.networks()
    devices = [f"/dev/nvidia{i}" for i in range(gpus)] + [
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",
        "/dev/dmabuf_import_helper",
    ]
    gpu_nics = ",".join(f"eth{i}" for i in range(1, len(networks) + 1))
    # The plugin's current profile (nccl-env-profile.sh, installer v1.0.15): NCCL_ALGO and
    # NCCL_NVLS_ENABLE=0 are gone from it (NVLSTree is the default the tuner expects).
    env = {
        "NCCL_FASTRAK_CTRL_DEV": "eth0",
        "NCCL_FASTRAK_IFNAME": gpu_nics,
        "NCCL_SOCKET_IFNAME": "eth0",
        "NCCL_CROSS_NIC": "0",
        "NCCL_PROTO": "Simple,LL128",
        "NCCL_MIN_NCHANNELS": "4",
        "NCCL_TUNER_PLUGIN": "libnccl-tuner.so",
        "NCCL_TUNER_CONFIG_PATH": "/usr/local/nvidia/lib64/a3plus_tuner_config.textproto",
        "NCCL_SHIMNET_GUEST_CONFIG_CHECKER_CONFIG_FILE": "/usr/local/nvidia/lib64/a3plus_guest_config.textproto",
        "NCCL_P2P_NET_CHUNKSIZE": "524288",
        "NCCL_P2P_PCI_CHUNKSIZE": "524288",
        "NCCL_P2P_NVL_CHUNKSIZE": "1048576",
        "NCCL_FASTRAK_NUM_FLOWS": "2",
        "NCCL_FASTRAK_USE_SNAP": "1",
        "NCCL_FASTRAK_PLUGIN_ACCEPT_TIMEOUT_MS": "600000",
        "NCCL_FASTRAK_ENABLE_CONTROL_CHANNEL": "0",
        "NCCL_BUFFSIZE": "8388608",
        "NCCL_NET_GDR_LEVEL": "PIX",
        "NCCL_FASTRAK_ENABLE_HOTPATH_LOGGING": "0",
        "NCCL_FASTRAK_USE_LLCM": "1",
        "NCCL_FASTRAK_LLCM_DEVICE_DIRECTORY": "/dev/aperture_devices",
        # The plugin's guest config checker (installer >= v1.0.12) aborts a job without it.
        "NCCL_NVLSTREE_MAX_CHUNKSIZE": "131072",
        **cfg.nccl_env,
    }
    daemon = {
        "name": "tcpxo-daemon",
        "image": cfg.daemon_image,
        "restartPolicy": "Always",
        "imagePullPolicy": "Always",
        "command": ["/bin/sh", "-c"],
        "args": [
            "set -e; chmod 755 /fts/entrypoint_rxdm_container.sh; exec /fts/entrypoint_rxdm_container.sh --num_hops=2"
        ],
        "securityContext": {"capabilities": {"add": ["NET_ADMIN", "NET_BIND_SERVICE"]}},
        "env": [{"name": "LD_LIBRARY_PATH", "value": "/usr/local/nvidia/lib64"}],
        "volumeMounts": [
            {"name": "tcpxo-nvidia", "mountPath": "/usr/local/nvidia"},
            {"name": "tcpxo-sys", "mountPath": "/hostsysfs"},
            {"name": "tcpxo-proc-sys", "mountPath": "/hostprocsysfs"},
        ],
    }
    return Fabric(
        name=GKE_TCPXO,
        annotations={
            "devices.gke.io/container.tcpxo-daemon": "".join(f"- path: {d}\n" for d in devices),
            "networking.gke.io/default-interface": "eth0",
            "networking.gke.io/interfaces": _interfaces_annotation(cfg.default_network, networks),
        },
        env=env,
        volumes=(
            {"name": "tcpxo-nvidia", "hostPath": {"path": cfg.nvidia_host_path}},
            {"name": "tcpxo-sys", "hostPath": {"path": "/sys"}},
            {"name": "tcpxo-proc-sys", "hostPath": {"path": "/proc/sys"}},
            {"name": "tcpxo-aperture", "hostPath": {"path": "/dev/aperture_devices"}},
        ),
        mounts=(
            {"name": "tcpxo-nvidia", "mountPath": "/usr/local/nvidia"},
            {"name": "tcpxo-aperture", "mountPath": "/dev/aperture_devices"},
        ),
        sidecars=(daemon,),
        library_path="/usr/local/nvidia/lib64",
    )


#: GKE's accelerator node label, and the gIB tuner configuration of each machine it names.
GKE_ACCELERATOR_LABEL = "cloud.google.com/gke-accelerator"
_GIB_TUNER_CONFIGS = {"nvidia-b200": "/usr/local/gib/configs/tuner_config_a4.txtpb"}
_GIB_DEFAULT_TUNER_CONFIG = "/usr/local/gib/configs/tuner_config_a3u.txtpb"  # A3 Ultra (nvidia-h200-141gb)


def _gib_tuner_config(cfg: GKERDMAConfig, node_selector: dict) -> str:
    if cfg.tuner_config:
        return cfg.tuner_config
    return _GIB_TUNER_CONFIGS.get(node_selector.get(GKE_ACCELERATOR_LABEL, ""), _GIB_DEFAULT_TUNER_CONFIG)


def _gke_rdma(cfg: GKERDMAConfig, node_selector: dict) -> Fabric:
    extra = [cfg.gvnic_network] if cfg.gvnic_network else []
    # The NCCL settings of GKE's /usr/local/gib/scripts/set_nccl_env.sh (as cluster-toolkit's A3
    # Ultra image mirrors them), set here rather than sourced so that the task's NCCL_* still win.
    env = {
        "NCCL_NET": "gIB",
        "NCCL_CROSS_NIC": "0",
        "NCCL_NET_GDR_LEVEL": "PIX",
        "NCCL_P2P_NET_CHUNKSIZE": "131072",
        "NCCL_NVLS_CHUNKSIZE": "524288",
        "NCCL_IB_ADAPTIVE_ROUTING": "1",
        "NCCL_IB_QPS_PER_CONNECTION": "4",
        "NCCL_IB_TC": "52",
        "NCCL_IB_FIFO_TC": "84",
        "NCCL_TUNER_CONFIG_PATH": _gib_tuner_config(cfg, node_selector),
        "NCCL_SOCKET_IFNAME": "eth0,eth1" if extra else "eth0",
        **cfg.nccl_env,
    }
    return Fabric(
        name=GKE_RDMA,
        annotations={
            "networking.gke.io/default-interface": "eth0",
            "networking.gke.io/interfaces": _interfaces_annotation(cfg.default_network, extra + cfg.networks()),
        },
        env=env,
        volumes=(
            {"name": "gib-nvidia", "hostPath": {"path": cfg.nvidia_host_path}},
            {"name": "gib", "hostPath": {"path": cfg.gib_host_path}},
        ),
        mounts=(
            {"name": "gib-nvidia", "mountPath": "/usr/local/nvidia"},
            {"name": "gib", "mountPath": "/usr/local/gib"},
        ),
        library_path="/usr/local/gib/lib64:/usr/local/nvidia/lib64",
    )


def _aws_efa(cfg: EFAConfig) -> Fabric:
    # No FI_EFA_USE_DEVICE_RDMA: libfabric >= 1.18 uses RDMA where the device has it, and forcing it
    # aborts the job on an EFA device without. The rest is what aws-ofi-nccl sets itself on p4d/p5/p6
    # (it keeps values already set), spelled out so they show in the manifests.
    env = {
        "FI_PROVIDER": "efa",
        # Data loaders fork; old kernels (< 5.15) need it for registered memory, newer ones ignore it.
        "FI_EFA_FORK_SAFE": "1",
        "NCCL_BUFFSIZE": "8388608",
        "NCCL_P2P_NET_CHUNKSIZE": "524288",
        **cfg.nccl_env,
    }
    return Fabric(
        name=AWS_EFA,
        env=env,
        resources={cfg.resource_name: str(cfg.devices_per_node)},
        library_path=cfg.library_path,
    )


def _infiniband(cfg: InfiniBandConfig) -> Fabric:
    env = {"NCCL_IB_DISABLE": "0"}
    if cfg.hca:
        env["NCCL_IB_HCA"] = cfg.hca
    if cfg.gid_index is not None:
        env["NCCL_IB_GID_INDEX"] = str(cfg.gid_index)
    return Fabric(
        name=INFINIBAND,
        env={**env, **cfg.nccl_env},
        resources={cfg.resource_name: str(cfg.devices_per_node)},
        capabilities=("IPC_LOCK",),
    )


def fabric_problems(executor: FabricExecutor) -> Iterator[str]:
    """Configuration problems of the network fabric (pure; part of ``executor.validate()``)."""
    if executor.network_fabric not in FABRICS:
        close = difflib.get_close_matches(str(executor.network_fabric), FABRICS, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        yield f"network_fabric={executor.network_fabric!r} is not a profile: {hint}choose one of {', '.join(FABRICS)}"
        return
    if executor.enable_tcpxo and executor.network_fabric not in (NONE, GKE_TCPXO):
        yield (
            f"enable_tcpxo=True contradicts network_fabric={executor.network_fabric!r}: enable_tcpxo is the "
            "older spelling of network_fabric='gke-tcpxo'; drop it"
        )
        return
    name, label = fabric_name(executor), fabric_label(executor)
    if name == NONE:
        return
    if isinstance(executor.gpus_per_node, int) and executor.gpus_per_node <= 0:
        yield f"{label} needs gpus_per_node > 0 ({name} carries NCCL traffic between GPUs)"
    problems = list(_profile_problems(executor, name))
    if problems:  # the profile cannot be built from these settings
        yield from problems
        return
    fabric = build_fabric(executor)
    privileges = fabric.privileges()
    if executor.restricted_security and privileges:
        yield (
            f"restricted_security and {label} are exclusive: {name} needs {' and '.join(privileges)}, "
            "which the restricted (and baseline) profiles forbid"
        )
    for res in fabric.resources:
        if res in executor.extra_resources:
            yield f"extra_resources[{res!r}]: {label} already requests it; set the count in the profile's settings"
    for key in fabric.annotations:
        if key in executor.pod_annotations:
            yield f"pod_annotations[{key!r}]: {label} sets this annotation; remove it"


def _profile_problems(executor: FabricExecutor, name: str) -> Iterator[str]:
    profile = PROFILES[name]
    cfg = profile_settings(executor, name)
    if not isinstance(cfg, profile.settings):
        yield (
            f"{profile.field}: expected {profile.settings.__name__}(...) for {fabric_label(executor)}, "
            f"got {type(cfg).__name__}"
        )
        return
    yield from profile.checks(profile.field, cfg)


def _nic_problems(attr: str, cfg) -> Iterator[str]:
    """Profiles that attach one network per GPU NIC (``nic_count``, ``network_names``)."""
    if not isinstance(cfg.nic_count, int) or cfg.nic_count < 1:
        yield f"{attr}.nic_count={cfg.nic_count!r}: must be an integer >= 1"
    elif cfg.network_names and len(cfg.network_names) != cfg.nic_count:
        yield (
            f"{attr}.network_names has {len(cfg.network_names)} names for nic_count={cfg.nic_count}: "
            "give one network per NIC"
        )


def _device_problems(attr: str, cfg) -> Iterator[str]:
    """Profiles that request a device plugin's resource (``resource_name``, ``devices_per_node``)."""
    if not isinstance(cfg.devices_per_node, int) or cfg.devices_per_node < 1:
        yield f"{attr}.devices_per_node={cfg.devices_per_node!r}: must be an integer >= 1"
    if not cfg.resource_name or "/" not in cfg.resource_name:
        yield f"{attr}.resource_name={cfg.resource_name!r}: give the device plugin's resource, e.g. 'rdma/ib'"


# --- the registry ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Profile:
    """One network fabric profile."""

    #: The ``network_fabric`` value.
    name: str
    #: The ``KubeflowExecutor`` field holding its settings (``None`` there: ``settings()``).
    field: str
    #: The settings dataclass.
    settings: type
    #: (settings, executor) -> ``Fabric``; pure.
    build: Callable[[Any, Any], Fabric]
    #: (field, settings) -> problems of the settings, each naming ``field.<parameter>``.
    checks: Callable[[str, Any], Iterator[str]]
    #: The machines it is for (docs/fabrics.md).
    machines: str
    #: Settings fields holding container images, checked like ``container_image``.
    images: tuple[str, ...] = ()


PROFILES: dict[str, Profile] = {
    p.name: p
    for p in (
        Profile(
            GKE_TCPXO,
            "tcpxo",
            TCPXOConfig,
            lambda cfg, executor: _tcpxo(cfg, executor.gpus_per_node),
            _nic_problems,
            "GKE A3 Mega (H100 Mega)",
            images=("daemon_image",),
        ),
        Profile(
            GKE_RDMA,
            "gke_rdma",
            GKERDMAConfig,
            lambda cfg, executor: _gke_rdma(cfg, executor.node_selector),
            _nic_problems,
            "GKE A3 Ultra (H200), A4 (B200)",
        ),
        Profile(
            AWS_EFA,
            "aws_efa",
            EFAConfig,
            lambda cfg, executor: _aws_efa(cfg),
            _device_problems,
            "AWS p4d, p5, p5en, p6",
        ),
        Profile(
            INFINIBAND,
            "infiniband",
            InfiniBandConfig,
            lambda cfg, executor: _infiniband(cfg),
            _device_problems,
            "InfiniBand or RoCE clusters",
        ),
    )
}
#: Every ``network_fabric`` value.
FABRICS = (NONE, *PROFILES)
