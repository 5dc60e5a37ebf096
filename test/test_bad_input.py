"""Bad input, as a new user would give it: each case runs through `run.run` against the local
cluster and must fail with a specific message, leaving zero objects behind.

Cases marked `offline` must fail before the cluster hears a single request. The others are
only detectable by the server (RBAC, missing namespace, unreachable server...): they may
send requests, but the submission rolls back whatever it created.
"""

import os
from dataclasses import dataclass, field
from typing import Callable, Optional

import nemo_run as run
import pytest

from nemo_kubeflow import ConfigMapPackager, KubeflowExecutor, PVCMount, SecretMount, TCPXOConfig
from nemo_kubeflow.parts.templates import templates_dir

RESOURCES = (
    "configmaps",
    "secrets",
    "persistentvolumeclaims",
    "trainjobs",
    "clustertrainingruntimes",
    "trainingruntimes",
    "pods",
)
TEMPLATE = (templates_dir() / "training_runtime.yaml.j2").read_text()


@dataclass
class Case:
    id: str
    message: str
    executor: dict = field(default_factory=dict)
    task: Optional[Callable] = None
    setup: Optional[Callable] = None  # (local_cluster, tmp_path) -> dict of extra executor kwargs
    offline: bool = True
    name: Optional[str] = None  # of the run (run.run's name); default bad-<id>


def template(tmp_path, body: str) -> dict:
    path = tmp_path / "runtime.yaml.j2"
    path.write_text(body)
    return {"runtime_template": str(path)}


def big_file_package(tmp_path, mode="plain", max_shards=16, size=3 * 1024 * 1024):
    code = tmp_path / "proj"
    code.mkdir()
    (code / "weights.bin").write_bytes(os.urandom(size))
    (code / "train.py").write_text("print(1)\n")
    return {
        "packager": ConfigMapPackager(relative_path=str(code), include_pattern="*", mode=mode, max_shards=max_shards)
    }


def escaping_symlink(tmp_path):
    code = tmp_path / "proj"
    code.mkdir()
    (code / "leak").symlink_to("/etc/passwd")
    return {"packager": ConfigMapPackager(relative_path=str(code), include_pattern="*")}


def unreachable(tmp_path):
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: c, cluster: {server: 'http://127.0.0.1:9'}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u}}]\nusers: [{name: u, user: {token: t}}]\n"
    )
    return {"kubeconfig": str(kubeconfig)}


def deny(verb, resource):
    def setup(local, tmp_path):
        local.deny(verb, resource)
        return {}

    return setup


TYPO_TEMPLATE = TEMPLATE.replace("    torch: {}", "    torch:\n      numProcPerNod: 8")
CASES = [
    # --- names -------------------------------------------------------------------------
    Case("namespace-uppercase", "namespace='Team_A': must be a DNS-1123 label", {"namespace": "Team_A"}),
    Case("namespace-dots", "namespace='team.a': must be a DNS-1123 label", {"namespace": "team.a"}),
    Case("namespace-too-long", "must be a DNS-1123 label", {"namespace": "n" * 64}),
    Case("namespace-missing", "create the namespace", {"namespace": "no-such-ns"}, offline=False),
    Case(
        "runtime-name-invalid",
        "runtime_name='Bad_Name': not a valid Kubernetes object name",
        {"runtime_name": "Bad_Name"},
    ),
    Case(
        "pvc-claim-invalid",
        "claim_name 'Claim_1' is not a valid Kubernetes name",
        {"pvc_mounts": [PVCMount(claim_name="Claim_1", mount_path="/d")]},
    ),
    Case(
        "secret-env-from-invalid",
        "secret_env_from: 'My_Secret' is not a valid Secret name",
        {"secret_env_from": ["My_Secret"]},
    ),
    Case(
        "secret-mount-invalid",
        "secret_mounts: 'Bad Secret' is not a valid Secret name",
        {"secret_mounts": [SecretMount(secret_name="Bad Secret", mount_path="/s")]},
    ),
    Case("label-too-long", "label values are at most 63", {"labels": {"team": "x" * 64}}),
    Case(
        "pod-label-bad-chars",
        "label values are at most 63 characters of [A-Za-z0-9_.-]",
        {"pod_labels": {"team": "a b"}},
    ),
    # --- sizes ----------------------------------------------------------------------------
    Case("nodes-zero", "nodes=0: must be an integer >= 1", {"nodes": 0}),
    Case("nodes-negative", "nodes=-2: must be an integer >= 1", {"nodes": -2}),
    Case("nodes-string", "nodes='2': must be an integer, not str (write 2, without quotes)", {"nodes": "2"}),
    Case("nprocs-zero", "nprocs_per_node=0: must be an integer >= 1", {"nprocs_per_node": 0}),
    Case("gpus-negative", "gpus_per_node=-1: must be an integer >= 0", {"gpus_per_node": -1}),
    Case("gpus-too-few", "nprocs_per_node=8 exceeds gpus_per_node=4", {"gpus_per_node": 4, "nprocs_per_node": 8}),
    # --- quantities -----------------------------------------------------------------------
    Case("cpu-word", "cpu_request='eight': not a Kubernetes quantity", {"cpu_request": "eight"}),
    Case("memory-gb", "memory_limit='64GB': not a Kubernetes quantity", {"memory_limit": "64GB"}),
    Case(
        "memory-request-over-limit",
        "memory_request='8Gi' is larger than memory_limit='4Gi'",
        {"memory_request": "8Gi", "memory_limit": "4Gi"},
    ),
    Case(
        "cpu-request-over-limit",
        "cpu_request='4' is larger than cpu_limit='500m'",
        {"cpu_request": "4", "cpu_limit": "500m"},
    ),
    Case("shm-size", "shm_size='big': not a Kubernetes quantity", {"shm_size": "big"}),
    Case(
        "extra-resource",
        "extra_resources['vpc.amazonaws.com/efa']='four'",
        {"extra_resources": {"vpc.amazonaws.com/efa": "four"}},
    ),
    Case("gpu-as-extra", "set GPUs with gpus_per_node instead", {"extra_resources": {"nvidia.com/gpu": "8"}}),
    Case(
        "pvc-no-size",
        "create=True needs size",
        {"pvc_mounts": [PVCMount(claim_name="c", mount_path="/c", create=True)]},
    ),
    Case(
        "pvc-bad-size",
        "create=True needs size",
        {"pvc_mounts": [PVCMount(claim_name="c", mount_path="/c", create=True, size="10 Gi")]},
    ),
    Case(
        "pvc-access-mode",
        "invalid access_modes ['ReadWriteAll']",
        {
            "pvc_mounts": [
                PVCMount(claim_name="c", mount_path="/c", create=True, size="1Gi", access_modes=["ReadWriteAll"])
            ]
        },
    ),
    # --- environment and secrets -------------------------------------------------------------
    Case(
        "pet-env",
        "environment variable PET_NODE_RANK is set by Kubeflow Trainer's torch plugin",
        {"env_vars": {"PET_NODE_RANK": "0"}},
    ),
    Case(
        "pet-env-in-script",
        "spec.trainer.env[0].name: PET_MASTER_ADDR is set by Kubeflow Trainer",
        task=lambda: run.Script(inline="echo hi", env={"PET_MASTER_ADDR": "x"}),
    ),
    Case("env-leading-digit", "environment variable '1X'", {"env_vars": {"1X": "v"}}),
    Case("env-space", "environment variable 'MY VAR'", {"env_vars": {"MY VAR": "v"}}),
    Case("env-duplicate", "K is set twice", {"env_vars": {"K": "1"}, "secret_key_refs": {"K": "s/k"}}),
    Case("secret-literal", "literal values are refused", {"secret_env_vars": {"TOKEN": "hunter2"}}),
    Case(
        "secret-env-missing",
        "reads $NEMO_KF_UNSET_VAR, which is not set",
        {"secret_env_vars": {"TOKEN": "env:NEMO_KF_UNSET_VAR"}},
    ),
    Case(
        "secret-file-missing",
        "cannot read '/nonexistent/token'",
        {"secret_env_vars": {"TOKEN": "file:/nonexistent/token"}},
    ),
    Case("secret-key-ref-format", "expected 'secret-name/key'", {"secret_key_refs": {"K": "only-a-name"}}),
    # --- image ---------------------------------------------------------------------------------
    Case("image-missing", "container_image is not set", {"container_image": ""}),
    Case("image-whitespace", "must not contain whitespace", {"container_image": "nvcr.io/nemo 25.02"}),
    # --- mounts ---------------------------------------------------------------------------------
    Case(
        "mount-relative",
        "mount_path 'data' must be an absolute path",
        {"pvc_mounts": [PVCMount(claim_name="d", mount_path="data")]},
    ),
    Case(
        "mount-over-workspace",
        "is already used by workspace_mount_path",
        {"pvc_mounts": [PVCMount(claim_name="d", mount_path="/nemo_run")]},
    ),
    Case(
        "mount-twice",
        "mount_path '/d' is already used by pvc_mounts[a]",
        {"pvc_mounts": [PVCMount(claim_name="a", mount_path="/d"), PVCMount(claim_name="b", mount_path="/d")]},
    ),
    Case(
        "mount-over-shm",
        "is already used by shm_size",
        {"secret_mounts": [SecretMount(secret_name="s", mount_path="/dev/shm")]},
    ),
    Case("workspace-relative", "workspace_mount_path='ws': must be an absolute path", {"workspace_mount_path": "ws"}),
    # --- templates and runtimes ----------------------------------------------------------------
    Case("template-missing", "runtime_template '/nope.j2' does not exist", {"runtime_template": "/nope.j2"}),
    Case("template-syntax", "template syntax error", setup=lambda c, t: template(t, "kind: {{ kind }\n")),
    Case(
        "template-undefined", "'cluster_name' is undefined", setup=lambda c, t: template(t, "x: {{ cluster_name }}\n")
    ),
    Case("template-bad-yaml", "rendered invalid YAML", setup=lambda c, t: template(t, "a: [b\n")),
    Case(
        "template-wrong-kind",
        "must render one ClusterTrainingRuntime or TrainingRuntime",
        setup=lambda c, t: template(t, "kind: Deployment\n"),
    ),
    Case(
        "template-typo-numprocpernode",
        "spec.mlPolicy.torch.numProcPerNod: unknown field",
        setup=lambda c, t: template(t, TYPO_TEMPLATE),
    ),
    Case(
        "template-container-not-node",
        "no container named node",
        setup=lambda c, t: template(
            t,
            TEMPLATE.replace(
                "- name: node\n                      image", "- name: trainer\n                      image"
            ),
        ),
    ),
    Case(
        "template-ancestor-replicas",
        "must have one replica",
        setup=lambda c, t: template(t, TEMPLATE.replace("replicas: 1", "replicas: 2")),
    ),
    Case(
        "template-bad-quantity",
        'sizeLimit: "sixteen" is not a Kubernetes quantity',
        setup=lambda c, t: template(
            t, TEMPLATE.replace("{{ volume | tojson }}", '{{ volume | tojson | replace("16Gi", "sixteen") }}')
        ),
    ),
    Case("runtime-kind", "runtime_kind='MyRuntime'", {"runtime_kind": "MyRuntime"}),
    Case(
        "runtime-name-and-template",
        "runtime_name and runtime_template are exclusive",
        {"runtime_name": "torch-distributed", "runtime_template": "/x.j2"},
    ),
    Case(
        "runtime-missing", "no ClusterTrainingRuntime of that name", {"runtime_name": "torch-distributd"}, offline=False
    ),
    # --- packaging -------------------------------------------------------------------------------
    Case("package-too-large-plain", "weights.bin", setup=lambda c, t: big_file_package(t)),
    Case("package-too-many-shards", "weights.bin", setup=lambda c, t: big_file_package(t, "sharded", max_shards=1)),
    Case(
        "package-pattern-no-match",
        "matched no files",
        executor={"packager": ConfigMapPackager(include_pattern="no_such_file_*.py")},
    ),
    Case("package-symlink-escape", "/etc/passwd", setup=lambda c, t: escaping_symlink(t)),
    # --- other settings ----------------------------------------------------------------------------
    Case("deadline-zero", "active_deadline_seconds=0", {"active_deadline_seconds": 0}),
    Case("retries-negative", "retries=-1", {"retries": -1}),
    Case("tcpxo-without-gpus", "enable_tcpxo needs gpus_per_node > 0", {"enable_tcpxo": True}),
    Case(
        "tcpxo-networks",
        "give one network per NIC",
        {"gpus_per_node": 8, "enable_tcpxo": True, "tcpxo": TCPXOConfig(nic_count=8, network_names=["a", "b"])},
    ),
    Case(
        "restricted-with-tcpxo",
        "restricted_security and enable_tcpxo are exclusive",
        {"gpus_per_node": 8, "enable_tcpxo": True, "restricted_security": True},
    ),
    Case(
        "restricted-as-root",
        "the restricted profile forbids running as root",
        {"restricted_security": True, "run_as_user": 0},
    ),
    # --- cluster access ------------------------------------------------------------------------------
    Case(
        "kubeconfig-missing",
        "kubeconfig '/nonexistent/kubeconfig' does not exist",
        {"kubeconfig": "/nonexistent/kubeconfig"},
    ),
    Case("context-missing", "context 'nope'", {"kube_context": "nope"}),
    Case(
        "unreachable",
        "http://127.0.0.1:9 did not answer (Connection refused",
        setup=lambda c, t: unreachable(t),
        offline=False,
    ),
    Case(
        "rbac-runtime",
        "or set runtime_kind='TrainingRuntime'",
        setup=deny("create", "clustertrainingruntimes"),
        offline=False,
    ),
    Case("rbac-trainjob", "permission to create trainjobs", setup=deny("create", "trainjobs"), offline=False),
    Case("rbac-configmap", "permission to create configmaps", setup=deny("create", "configmaps"), offline=False),
    Case(
        "rbac-secret",
        "permission to create secrets",
        setup=deny("create", "secrets"),
        offline=False,
        executor={"secret_env_vars": {"TOKEN": "env:HOME"}},
    ),
    Case(
        "rbac-pvc",
        "permission to create persistentvolumeclaims",
        setup=deny("create", "persistentvolumeclaims"),
        offline=False,
        executor={"pvc_mounts": [PVCMount(claim_name="c", mount_path="/c", create=True, size="1Gi")]},
    ),
    Case("rbac-resume", "permission to patch trainjobs", setup=deny("patch", "trainjobs"), offline=False),
    # --- issue 13: accepted, then failed in the pod or stayed Pending -------------------------------
    Case(
        "image-uppercase-repository",
        "container_image='nvcr.io/nvidia/NeMo:25.02': the repository 'nvidia/NeMo' "
        "must be lowercase (write 'nvidia/nemo')",
        {"container_image": "nvcr.io/nvidia/NeMo:25.02"},
    ),
    Case(
        "image-short-digest",
        "the digest 'sha256:abc123': sha256 takes exactly 64 lowercase hex digits",
        {"container_image": "python@sha256:abc123"},
    ),
    Case(
        "image-digest-algorithm",
        "with algorithm one of sha256, sha384, sha512",
        {"container_image": "python@md5:" + "0" * 32},
    ),
    Case("image-bad-tag", "the tag '-slim' must be 1 to 128 letters", {"container_image": "python:-slim"}),
    Case(
        "image-two-tags",
        "the repository 'python:3.11' must be '/'-separated components",
        {"container_image": "python:3.11:slim"},
    ),
    Case(
        "image-bad-registry",
        "registry 'my_registry:5000' is not a host name",
        {"container_image": "my_registry:5000/team/img"},
    ),
    Case("task-name-slash", "task name 'team/llama': must not contain '/'", name="team/llama"),
    Case("script-missing-py", "run.Script path 'missing.py': no such file in", task=lambda: run.Script("missing.py")),
    Case(
        "script-missing-sh",
        "run.Script path 'scripts/missing.sh': no such file in",
        task=lambda: run.Script("scripts/missing.sh"),
    ),
    Case(
        "script-missing-torchrun",
        "run.Script path 'missing_train.py': no such file in",
        task=lambda: run.Script("missing_train.py", entrypoint="python"),
        executor={"nprocs_per_node": 2},
    ),
    Case("node-selector-key", "node_selector['gpu type']: not a valid key", {"node_selector": {"gpu type": "h100"}}),
    Case(
        "node-selector-value",
        "node_selector['gpu']='H100 80GB': node label values are at most 63",
        {"node_selector": {"gpu": "H100 80GB"}},
    ),
    Case(
        "service-account-invalid",
        "service_account='Trainer_SA': must be a Kubernetes object name",
        {"service_account": "Trainer_SA"},
    ),
    Case(
        "pull-secret-invalid",
        "image_pull_secrets[0]='NGC Key': must be a Kubernetes object name",
        {"image_pull_secrets": ["NGC Key"]},
    ),
    Case(
        "pvc-sub-path-dotdot",
        "sub_path='../other-team' must not contain '..'",
        {"pvc_mounts": [PVCMount(claim_name="data", mount_path="/data", sub_path="../other-team")]},
    ),
    Case(
        "pvc-sub-path-absolute",
        "sub_path='/runs' must be a relative path",
        {"pvc_mounts": [PVCMount(claim_name="data", mount_path="/data", sub_path="/runs")]},
    ),
    Case(
        "secret-mount-key",
        "secret_mounts[creds]: keys has 'gcp/key.json', not a Secret key",
        {"secret_mounts": [SecretMount(secret_name="creds", mount_path="/creds", keys=["gcp/key.json"])]},
    ),
    Case("image-int", "container_image=5: must be a string, not int (quote it: '5')", {"container_image": 5}),
    Case(
        "env-value-int",
        "env_vars['OMP_NUM_THREADS']=4: must be a string, not int (quote it: '4')",
        {"env_vars": {"OMP_NUM_THREADS": 4}},
    ),
    Case(
        "env-value-none",
        "env_vars['HF_HOME']=None: must be a string, not None (remove the entry, or give '')",
        {"env_vars": {"HF_HOME": None}},
    ),
    Case("gpus-bool", "gpus_per_node=True: must be an integer, not bool", {"gpus_per_node": True}),
    Case(
        "script-env-int",
        "the task's env['WORLD_SEED']=7: must be a string, not int (quote it: '7')",
        task=lambda: run.Script(inline="echo hi", env={"WORLD_SEED": 7}),
    ),
    Case(
        "script-env-none",
        "the task's env['WANDB_MODE']=None: must be a string, not None",
        task=lambda: run.Script(inline="echo hi", env={"WANDB_MODE": None}),
    ),
    # --- the same classes of mistake, elsewhere ------------------------------------------------------
    Case("nodes-bool", "nodes=True: must be an integer, not bool", {"nodes": True}),
    Case("nodes-float", "nodes=2.0: must be an integer, not float (write 2)", {"nodes": 2.0}),
    Case("retries-string", "retries='3': must be an integer, not str", {"retries": "3"}),
    Case(
        "deadline-bool", "active_deadline_seconds=True: must be an integer, not bool", {"active_deadline_seconds": True}
    ),
    Case(
        "restricted-string", "restricted_security='yes': must be True or False, not str", {"restricted_security": "yes"}
    ),
    Case(
        "labels-list", "labels=['team=nlp']: must be a dict of strings to strings, not list", {"labels": ["team=nlp"]}
    ),
    Case("pod-label-int", "pod_labels['run']=3: must be a string, not int", {"pod_labels": {"run": 3}}),
    Case(
        "secret-env-from-string",
        "secret_env_from='wandb': must be a list of strings, not str",
        {"secret_env_from": "wandb"},
    ),
    Case(
        "pvc-mount-dict",
        "pvc_mounts[0]={'claim_name': 'data', 'mount_path': '/data'}: must be a PVCMount, not dict",
        {"pvc_mounts": [{"claim_name": "data", "mount_path": "/data"}]},
    ),
    Case(
        "pvc-read-only-string",
        "pvc_mounts[0].read_only='false': must be True or False, not str",
        {"pvc_mounts": [PVCMount(claim_name="data", mount_path="/data", read_only="false")]},
    ),
    Case(
        "tolerations-dict",
        "tolerations={'key': 'nvidia.com/gpu'}: must be a list of dicts, not dict",
        {"tolerations": {"key": "nvidia.com/gpu"}},
    ),
    Case(
        "toleration-typo",
        "tolerations[0]: unknown field(s) 'opertor'",
        {"tolerations": [{"key": "nvidia.com/gpu", "opertor": "Exists"}]},
    ),
    Case(
        "toleration-operator",
        "tolerations[0]: operator='In' must be one of Equal, Exists",
        {"tolerations": [{"key": "nvidia.com/gpu", "operator": "In", "value": "x"}]},
    ),
    Case(
        "toleration-effect",
        "tolerations[0]: effect='NoSchedul' must be one of NoSchedule",
        {"tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedul"}]},
    ),
    Case(
        "toleration-exists-value",
        "operator 'Exists' takes no value",
        {"tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "value": "present"}]},
    ),
    Case(
        "toleration-seconds",
        "tolerationSeconds applies to effect 'NoExecute' only",
        {"tolerations": [{"key": "spot", "operator": "Exists", "effect": "NoSchedule", "tolerationSeconds": 60}]},
    ),
    Case("label-key-invalid", "labels['team name']: not a valid key", {"labels": {"team name": "nlp"}}),
    Case("annotation-key-invalid", "pod_annotations['a/b/c']: not a valid key", {"pod_annotations": {"a/b/c": "x"}}),
    Case(
        "secret-key-ref-key",
        "secret_key_refs['TOKEN']='hf/token:v1': 'token:v1' is not a Secret key",
        {"secret_key_refs": {"TOKEN": "hf/token:v1"}},
    ),
    Case(
        "secret-mount-mode",
        "default_mode=1000 must be a file mode 0o000..0o777",
        {"secret_mounts": [SecretMount(secret_name="creds", mount_path="/creds", default_mode=1000)]},
    ),
    Case(
        "storage-class-invalid",
        "storage_class='Fast SSD' must be a Kubernetes object name",
        {"pvc_mounts": [PVCMount(claim_name="c", mount_path="/c", create=True, size="1Gi", storage_class="Fast SSD")]},
    ),
    Case(
        "priority-class-invalid",
        "priority_class_name='High_Priority': not a valid Kubernetes object name",
        {"priority_class_name": "High_Priority"},
    ),
    Case(
        "queue-name-invalid", "queue_name='Team Queue': must be a Kubernetes object name", {"queue_name": "Team Queue"}
    ),
    Case(
        "extra-resource-unqualified",
        "extra_resources['efa']: 'efa' is not a resource name",
        {"extra_resources": {"efa": "4"}},
    ),
    Case(
        "extra-resource-fraction",
        "extra_resources['vpc.amazonaws.com/efa']='0.5': extended resources are whole",
        {"extra_resources": {"vpc.amazonaws.com/efa": "0.5"}},
    ),
    Case("cpu-negative", "cpu_request='-2': must not be negative", {"cpu_request": "-2"}),
    Case("gpu-resource-name", "gpu_resource_name: 'gpu' is not a resource name", {"gpu_resource_name": "gpu"}),
]


def objects(local):
    return {r: sorted(o["metadata"]["name"] for o in local.objects(r, None)) for r in RESOURCES}


def test_corpus_is_large_enough():
    assert len(CASES) >= 60 and len({c.id for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_bad_input_fails_clearly_and_leaves_nothing(case, local, tmp_path, monkeypatch):
    monkeypatch.delenv("NEMO_KF_UNSET_VAR", raising=False)
    local.allow_all()
    kwargs = {"container_image": "python:3.11", "nodes": 2, "kubeconfig": str(local.kubeconfig_path), **case.executor}
    if case.setup:
        kwargs.update(case.setup(local, tmp_path))
    before = objects(local)
    local.clear_requests()
    task = case.task() if case.task else run.Script(inline="echo hello")
    with pytest.raises(Exception) as err:
        executor = KubeflowExecutor(**kwargs)
        run.run(task, executor=executor, name=case.name or f"bad-{case.id}"[:40], detach=True)
    assert case.message in str(err.value), f"{case.id}: {err.value}"
    if case.offline:
        assert local.requests == [], f"{case.id} reached the cluster: {local.requests}"
    assert objects(local) == before


def test_a_script_path_is_refused_only_where_the_pod_cannot_have_it(local, tmp_path, monkeypatch):
    """The rule of the script-missing-* cases, from the other side: an absolute path not found
    here is a file of the image, and a relative path that exists here is shipped."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("print('trained')\n")
    executor = KubeflowExecutor(container_image="python:3.11", kubeconfig=str(local.kubeconfig_path))
    for script in (run.Script("/opt/app/train.py", entrypoint="python"), run.Script("train.py", entrypoint="python")):
        with run.Experiment("script-paths") as exp:
            exp.add(script, executor=executor.clone(), name="t")
            exp.dryrun(delete_exp_dir=False)
        [job] = exp.jobs
        manifests = os.path.join(job.executor.job_dir, "manifests")
        trainjob = next(f for f in sorted(os.listdir(manifests)) if "trainjob" in f)
        text = open(os.path.join(manifests, trainjob)).read()
        assert ("/opt/app/train.py" in text) if script.path.startswith("/") else ("/nemo_run/code/train.py" in text)
