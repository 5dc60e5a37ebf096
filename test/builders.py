"""The tests' builders of submissions: an executor, a role and files through ``build_submission``, and
the parts of the result the tests look at. Each test module binds its own defaults around these."""

import signal
from typing import Any, Mapping, Optional, Sequence

from nemo_run.run.torchx_backend.components import torchrun as nr_torchrun
from torchx.specs import Role

from nemo_kubeflow import KubeflowExecutor
from nemo_kubeflow.build.plan import Submission, build_submission
from nemo_kubeflow.config.packager import BundleFile
from nemo_kubeflow.schema.validation import check_manifests


def bash_role(command: str = "python train.py", name: str = "train") -> Role:
    """A role running ``bash -c <command>``."""
    return Role(name=name, image="", entrypoint="bash", args=["-c", command])


def torchrun_role(
    nodes: int,
    nprocs: int,
    env: Optional[Mapping[str, str]] = None,
    *,
    args: Sequence[str] = ("train.py",),
    image: str = "nvcr.io/nvidia/nemo:25.02",
) -> Role:
    """NeMo-Run's torchrun component for ``train.py`` on ``nodes`` x ``nprocs``, its macros applied as an
    executor of ``image`` applies them."""
    role = nr_torchrun.torchrun(*args, script="train.py", j=f"{nodes}x{nprocs}", env=dict(env or {})).roles[0]
    return KubeflowExecutor(container_image=image).macro_values().apply(role)


def submission(
    executor: KubeflowExecutor,
    *,
    role: Optional[Role] = None,
    files: Sequence[BundleFile] = (),
    task: str = "train",
    check: bool = False,
) -> Submission:
    """``executor`` validated, then built for ``role`` (default: ``bash_role()``) and ``files``; with
    ``check``, its manifests pass offline validation."""
    executor.validate()
    sub = build_submission(executor, role if role is not None else bash_role(), list(files), task_name=task)
    if check:
        check_manifests(sub.manifests())
    return sub


def replicated_jobs(sub: Submission) -> dict[str, dict]:
    """The runtime's replicated jobs by name."""
    return {j["name"]: j for j in sub.runtime["spec"]["template"]["spec"]["replicatedJobs"]}


def node_pod_template(sub: Submission) -> dict[str, Any]:
    """The pod template (metadata and spec) of the runtime's ``node`` job."""
    return replicated_jobs(sub)["node"]["template"]["spec"]["template"]


def sigint_as_in_a_terminal() -> None:
    """``preexec_fn`` of a script the tests press Ctrl-C on: SIGINT at its default, as in a terminal. A test
    process that ignores SIGINT (started with ``cmd &`` by a non-interactive shell, as some CI runners do, with
    a fixture putting that disposition back) passes it on to its children: Python then installs no
    KeyboardInterrupt handler, nor do we, and the Ctrl-C the test sends does nothing."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
