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
#: - v1.32.9: the oldest minor Trainer v2.3.0 installs on (1.31 refuses its CRDs, below; Trainer's own e2e matrix
#:   starts at 1.32), the newest patch the module proxy serves whole (2026-11-27: k8s.io/kubernetes v1.32.14 to
#:   v1.32.16 and v1.32.12 are refused with 403; v1.32.13, v1.32.11 and v1.32.10 resolve, but staging modules
#:   their binaries import are refused: k8s.io/endpointslice v0.32.13, k8s.io/kms and csi-translation-lib
#:   v0.32.11, k8s.io/kube-controller-manager and endpointslice v0.32.10).
KUBERNETES_MATRIX = (KUBERNETES, "v1.37.2", "v1.32.9", "v1.31.13")
#: The entries .ci/run's real stage runs: KUBERNETES runs the whole `real` tier, the others the MINOR_SENSITIVE
#: scenarios. Not v1.31.13: its kube-apiserver refuses Trainer v2.3.0's ClusterTrainingRuntime CRD (422: the CEL
#: rule Trainer embeds from JobSet's volumeClaimPolicies, `self.templates.all(t, !has(t.metadata.namespace) ||
#: ...)`, is invalid there; run 2026-11-27), so no test can start on it: Trainer v2.3.0 does not install on
#: Kubernetes 1.31 (docs/compatibility.md).
KUBERNETES_CI = (KUBERNETES, "v1.37.2", "v1.32.9")
#: The `real` scenarios whose outcome depends on the Kubernetes minor, each with the part of Kubernetes it goes
#: through; test/conftest.py marks them `minor_sensitive`, and .ci/run runs only these (`-m "real and
#: minor_sensitive"`) on the entries of KUBERNETES_CI other than KUBERNETES. What a minor changes is in
#: kube-apiserver (validation, defaulting, CEL, admission, discovery, its words), kube-controller-manager (the
#: Job, garbage-collector, taint-eviction and volume-binding controllers) and kube-scheduler; the scenarios left
#: out exercise Trainer, JobSet, Kueue, our node agent and the pods' own processes (in-job restarts, logs,
#: rendezvous, TTLs), the same binaries on every entry, through the paths the listed ones already cover.
MINOR_SENSITIVE = {
    "test/test_controlplane_matrix.py::test_the_real_api_server_is_the_selected_release_of_the_matrix": "the entry is the release it claims (/version)",
    "test/test_real_controlplane.py::test_components_are_the_pinned_upstream_releases": "kube-apiserver accepts and serves Trainer's, JobSet's and Kueue's CRDs and webhooks (CEL rules: what 1.31 "
    "refuses)",
    "test/test_real_controlplane.py::test_trainjob_becomes_jobset_jobs_and_pending_pods_then_cancel_collects_them": "the Job controller's pods, the scheduler's Pending reason without nodes, the garbage collector",
    "test/local/test_emulator_rules.py::test_the_real_api_server_words_name_refusals_as_the_emulator_does": "kube-apiserver's validation and its words, which the product and the emulator repeat",
    "test/test_backends.py::test_script_and_inline_tasks_succeed_with_logs_of_every_node": "a job from submission to Succeeded: Job controller, scheduler, pods/log through kube-apiserver",
    "test/test_backends.py::test_a_failing_rank_fails_the_job_with_its_rank_node_and_exit_code": "the Job controller's podFailurePolicy and backoffLimit",
    "test/test_backends.py::test_detach_reconnect_status_cancel_and_garbage_collection": "the garbage collector deleting the JobSet's Jobs, pods and ConfigMaps",
    "test/test_backends.py::test_secret_env_and_a_created_claim_reach_every_node": "Secret env resolution and the volume-binding controller binding the created claim",
    "test/test_backends.py::test_a_native_sidecar_starts_before_training_and_stops_after_it": "restartPolicy: Always init containers (native sidecars: beta up to 1.32, GA in 1.33)",
    "test/test_backends.py::test_pods_waiting_for_their_claim_are_described_with_the_claims_name": "the scheduler's unschedulable message for an unbound claim, which describe reads",
    "test/test_backends_resilience.py::test_a_user_error_fails_at_once_with_its_exit_code_and_no_gang_restart": "the Job controller's podFailurePolicy FailJob rule",
    "test/test_backends_resilience.py::test_a_node_fault_restarts_the_gang_and_the_next_attempt_avoids_the_node": "the taint-eviction controller (its own controller since 1.29) and node affinity in the scheduler",
    "test/test_doctor.py::test_on_the_real_control_plane_as_admin_a_job_can_run": "SelfSubjectAccessReview, server-side dry run, Pod Security admission, API discovery",
    "test/test_doctor.py::test_on_the_real_control_plane_as_a_namespaced_service_account": "RBAC for a ServiceAccount with a namespaced Role, as kube-apiserver evaluates it",
    "test/test_kueue_versions.py::test_the_real_kueue_is_read_in_the_version_it_serves": "API discovery of the served CRD versions",
    "test/test_real_controlplane.py::test_kueues_visibility_api_is_available_through_the_aggregator_where_the_machine_has_an_address": "kube-apiserver's aggregation layer (the aggregator reads a Service's Endpoints up to 1.32, its "
    "EndpointSlices since 1.33) serving Kueue's visibility API, where a waiting task's place comes from",
}
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
        raise ValueError(
            f"{KUBERNETES_ENV}={chosen} is not in test/controlplane/versions.py's KUBERNETES_MATRIX "
            f"{', '.join(KUBERNETES_MATRIX)}: add it there (pinned) to test on it"
        )
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
