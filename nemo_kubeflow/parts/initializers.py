"""Dataset and model initializers: the Kubeflow SDK's ``Initializer`` on a ``KubeflowExecutor``.

Trainer runs an initializer as a replicated job of the runtime (``dataset-initializer``,
``model-initializer``) before ``node``, and copies the TrainJob's ``spec.initializer`` (storage
URI and settings) into its container's environment. We render those jobs into the runtime (images,
command, the shared ``initializer`` volume, ``dependsOn``) and build ``spec.initializer`` with the
SDK's own converters, so the SDK's types mean here what they mean to ``TrainerClient.train``.
Everything here is pure. See docs/initializers.md.

No ``from __future__ import annotations``: NeMo-Run's CLI reads ``InitializerSettings``'s
annotations at run time.
"""

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterator, Optional, Protocol, Sequence

from nemo_kubeflow.parts import naming
from nemo_kubeflow.parts.escapes import literal_env
from nemo_kubeflow.parts.steps import DATASET_INITIALIZER, MODEL_INITIALIZER
from nemo_kubeflow.quantity import parse_quantity

if TYPE_CHECKING:
    from kubeflow.trainer.types.types import Initializer
    from kubeflow_trainer_api import models as m

# The Kubeflow SDK (and kubeflow_trainer_api under it) is imported inside the functions that need
# it, and only once an initializer is set, when the SDK's types are already imported: the `nemo`
# CLI imports the executor module, hence this one, for every command.

#: The Kubeflow SDK's defaults (``ContainerBackendConfig``); test_initializers checks they agree.
SDK_DATASET_IMAGE = "ghcr.io/kubeflow/trainer/dataset-initializer:latest"
SDK_MODEL_IMAGE = "ghcr.io/kubeflow/trainer/model-initializer:latest"
#: The SDK's ``DATASET_PATH``/``MODEL_PATH``: where the initializers write and training reads.
DATASET_PATH = "/workspace/dataset"
MODEL_PATH = "/workspace/model"
#: The volume Trainer's TrainJob webhook requires on each initializer container (jobset plugin,
#: ``VolumeNameInitializer``).
VOLUME = "initializer"
#: The pod label holding the JobSet (= TrainJob) name, which the data cache needs.
_JOBSET_NAME_FIELD = "metadata.labels['jobset.sigs.k8s.io/jobset-name']"
#: Credentials the SDK types accept as literal values; they would end up in the TrainJob in clear.
_CREDENTIAL_FIELDS = ("access_token", "access_key_id", "secret_access_key")
#: The access modes a PersistentVolumeClaim can ask for.
_ACCESS_MODES = {"ReadWriteOnce", "ReadOnlyMany", "ReadWriteMany", "ReadWriteOncePod"}


@dataclass(kw_only=True)
class InitializerSettings:
    """How the initializer steps run, used when ``KubeflowExecutor.initializer`` is set.

    The initializers download into a PersistentVolumeClaim, which the training pods mount at the
    Kubeflow SDK's paths: ``/workspace/dataset`` and ``/workspace/model`` (sub-directories
    ``dataset/`` and ``model/`` of the claim).
    """

    #: The claim shared by the initializer and training pods. Required for Hugging Face and S3
    #: sources (not for a data cache). Multi-node jobs need a ``ReadWriteMany`` claim.
    claim_name: str = ""
    #: Create the claim if it does not exist. It is never deleted: it keeps the downloads for the next job.
    create_claim: bool = False
    #: Requested size when creating, e.g. ``"200Gi"``.
    claim_size: Optional[str] = None
    #: StorageClass when creating; ``None`` uses the cluster default.
    storage_class: Optional[str] = None
    #: Access modes when creating.
    access_modes: list[str] = field(default_factory=lambda: ["ReadWriteMany"])
    #: Image of the ``dataset-initializer`` container (default: the Kubeflow SDK's).
    dataset_image: str = SDK_DATASET_IMAGE
    #: Image of the ``model-initializer`` container (default: the Kubeflow SDK's).
    model_image: str = SDK_MODEL_IMAGE
    #: Command of the ``dataset-initializer`` container; empty runs the image's entrypoint.
    dataset_command: list[str] = field(default_factory=list)
    #: Command of the ``model-initializer`` container; empty runs the image's entrypoint.
    model_command: list[str] = field(default_factory=list)
    #: Existing Secret whose keys become the dataset initializer's environment
    #: (``spec.initializer.dataset.secretRef``): ``ACCESS_TOKEN`` for Hugging Face,
    #: ``ACCESS_KEY_ID``/``SECRET_ACCESS_KEY`` for S3.
    dataset_secret: Optional[str] = None
    #: The same for the model initializer (``spec.initializer.model.secretRef``).
    model_secret: Optional[str] = None
    #: Image of the cache servers a ``DataCacheInitializer`` starts (``CACHE_IMAGE``).
    data_cache_image: str = "ghcr.io/kubeflow/trainer/data-cache:v2.3.0"
    #: Service account of the dataset initializer with a ``DataCacheInitializer``: it creates the
    #: cache servers, so it needs the RBAC Trainer's data-cache install gives this account.
    data_cache_service_account: str = "kubeflow-trainer-cache-initializer"


@dataclass(frozen=True)
class Step:
    """One initializer replicated job, as the runtime template renders it."""

    name: str
    image: str
    command: list[str]
    #: Environment of the container in the runtime (the TrainJob adds STORAGE_URI and the rest).
    env: list[dict]
    #: Where the step writes (the SDK's path) and the claim's sub-directory behind it.
    mount_path: str
    sub_path: str
    #: Whether training reads what the step writes (not so for a data cache, which serves it).
    feeds_training: bool = True
    service_account: Optional[str] = None

    @property
    def mount(self) -> dict:
        return {"name": VOLUME, "mountPath": self.mount_path, "subPath": self.sub_path}


class InitializerExecutor(Protocol):
    """What the initializer checks read of an executor (``KubeflowExecutor`` has it; config sits above this
    package): its initializer, their settings, and the paths its other volumes are mounted at."""

    @property
    def initializer(self) -> Any: ...
    @property
    def initializer_settings(self) -> Optional["InitializerSettings"]: ...
    @property
    def workspace_mount_path(self) -> str: ...
    @property
    def pvc_mounts(self) -> Sequence[Any]: ...
    @property
    def secret_mounts(self) -> Sequence[Any]: ...


def settings(executor: InitializerExecutor) -> InitializerSettings:
    """The executor's ``initializer_settings``, or the defaults where it has ``None``."""
    value = executor.initializer_settings
    return InitializerSettings() if value is None else value


def steps(init: Optional["Initializer"], s: InitializerSettings) -> list[Step]:
    """The initializer jobs of the runtime for ``initializer`` and its settings, dataset first."""
    if init is None:
        return []
    from kubeflow.trainer.types.types import DataCacheInitializer

    out = []
    if isinstance(init.dataset, DataCacheInitializer):
        # As Trainer's torch-distributed-with-cache runtime: the initializer starts the cache servers.
        env: list[dict] = [
            literal_env("CACHE_IMAGE", s.data_cache_image),
            {"name": "TRAIN_JOB_NAME", "valueFrom": {"fieldRef": {"fieldPath": _JOBSET_NAME_FIELD}}},
        ]
        out.append(
            Step(
                DATASET_INITIALIZER,
                s.dataset_image,
                list(s.dataset_command),
                env,
                DATASET_PATH,
                "dataset",
                feeds_training=False,
                service_account=s.data_cache_service_account,
            )
        )
    elif init.dataset is not None:
        out.append(Step(DATASET_INITIALIZER, s.dataset_image, list(s.dataset_command), [], DATASET_PATH, "dataset"))
    if init.model is not None:
        out.append(Step(MODEL_INITIALIZER, s.model_image, list(s.model_command), [], MODEL_PATH, "model"))
    return out


def volume(s: InitializerSettings) -> dict:
    """The shared ``initializer`` volume: the claim, or an emptyDir when only a data cache runs."""
    claim = s.claim_name
    if claim:
        return {"name": VOLUME, "persistentVolumeClaim": {"claimName": claim}}
    return {"name": VOLUME, "emptyDir": {}}


def node_mounts(steps: Sequence[Step]) -> list[dict]:
    """Mounts of the downloads in the training container, at the SDK's dataset and model paths."""
    return [st.mount for st in steps if st.feeds_training]


def node_env(steps: Sequence[Step]) -> list[dict]:
    """Runtime environment of the training container: the data cache's clients need the job name."""
    if any(not st.feeds_training for st in steps):
        return [{"name": "TRAIN_JOB_NAME", "valueFrom": {"fieldRef": {"fieldPath": _JOBSET_NAME_FIELD}}}]
    return []


def trainjob_initializer(
    init: Optional["Initializer"], s: InitializerSettings
) -> Optional["m.TrainerV1alpha1Initializer"]:
    """``spec.initializer``, through the Kubeflow SDK's own converters (``get_dataset_initializer``,
    ``get_model_initializer``), plus the ``secretRef`` of each step."""
    if init is None or (init.dataset is None and init.model is None):
        return None
    from kubeflow.trainer.backends.kubernetes.utils import get_dataset_initializer, get_model_initializer
    from kubeflow_trainer_api import models as m

    return m.TrainerV1alpha1Initializer(
        dataset=_converted_step(init.dataset, get_dataset_initializer, s.dataset_secret),
        model=_converted_step(init.model, get_model_initializer, s.model_secret),
    )


def _converted_step(value: object, convert: Callable[[Any], Any], secret: Optional[str]) -> Any:
    """One step of ``spec.initializer``: the SDK's ``convert``-ion of ``value`` with the step's ``secret``
    as its ``secretRef`` (``None`` when the step is unset)."""
    if value is None:
        return None
    from kubeflow_trainer_api import models as m

    converted = convert(value)
    if not converted.env:
        converted.env = None  # the converters give [] when there is nothing to pass
    if secret:
        converted.secret_ref = m.IoK8sApiCoreV1LocalObjectReference(name=secret)
    return converted


# --- validation -----------------------------------------------------------------------------------------

#: The URI scheme Trainer's initializer images read for each SDK type.
_SCHEMES = {
    "HuggingFaceDatasetInitializer": "hf",
    "HuggingFaceModelInitializer": "hf",
    "S3DatasetInitializer": "s3",
    "S3ModelInitializer": "s3",
    "DataCacheInitializer": "cache",
}


def initializer_problems(executor: InitializerExecutor) -> Iterator[str]:
    """Configuration problems of ``initializer``/``initializer_settings`` (pure; part of ``validate()``)."""
    init = executor.initializer
    s = settings(executor)
    if not isinstance(s, InitializerSettings):
        # Even with no initializer: the runtime is rendered from these settings either way.
        yield (
            f"initializer_settings: expected InitializerSettings(...), got {type(s).__name__} ({s!r}); use "
            "nemo_kubeflow.InitializerSettings(...), or leave it None for the defaults"
        )
        return
    if init is None:
        return
    problem = _shape_problem(init, s)
    if problem:
        yield problem
        return
    yield from _dataset_and_model_problems(init, s)
    planned = steps(init, s)
    yield from _download_path_problems(executor, planned)
    yield from _claim_problems(planned, s)
    yield from _image_problems(s)


def _image_problems(s: InitializerSettings) -> Iterator[str]:
    """The initializer images: set, without whitespace (the executor checks their grammar)."""
    for what in ("dataset_image", "model_image", "data_cache_image"):
        image = getattr(s, what)
        if not image or any(c.isspace() for c in image):
            yield f"initializer_settings.{what}={image!r}: give an image reference without whitespace"


def _dataset_and_model_problems(init: "Initializer", s: InitializerSettings) -> Iterator[str]:
    """The problems of the dataset and the model initializer that are set, with their settings."""
    for step, value, command, secret in (
        ("dataset", init.dataset, s.dataset_command, s.dataset_secret),
        ("model", init.model, s.model_command, s.model_secret),
    ):
        if value is not None:
            yield from _step_problems(step, value, command, secret)


def _shape_problem(init: object, s: object) -> Optional[str]:
    """What makes ``initializer``/``initializer_settings`` unreadable (the wrong types, nothing to fetch),
    or None: the other checks need neither."""
    if not isinstance(s, InitializerSettings):
        return f"initializer_settings: expected InitializerSettings(...), got {type(s).__name__}"
    from kubeflow.trainer.types import types as sdk

    if not isinstance(init, sdk.Initializer):
        return f"initializer: expected kubeflow.trainer.Initializer(dataset=..., model=...), got {type(init).__name__}"
    if init.dataset is None and init.model is None:
        return "initializer has neither dataset nor model: set one, or leave initializer unset"
    return None


def _step_problems(step: str, value: object, command: list[str], secret: Optional[str]) -> Iterator[str]:
    """Problems of the ``step`` ("dataset" or "model") initializer ``value`` and its settings."""
    from kubeflow.trainer.types import types as sdk

    allowed: tuple[type, ...] = (
        (sdk.HuggingFaceDatasetInitializer, sdk.S3DatasetInitializer, sdk.DataCacheInitializer)
        if step == "dataset"
        else (sdk.HuggingFaceModelInitializer, sdk.S3ModelInitializer)
    )
    if not isinstance(value, allowed):
        names = ", ".join(t.__name__ for t in allowed)
        yield f"initializer.{step}: {type(value).__name__} is not a {step} initializer ({names})"
        return
    yield from _source_problems(step, value, command)
    yield from _credential_problems(step, value)
    if secret is not None and not naming.is_rfc1123_subdomain(secret):
        yield f"initializer_settings.{step}_secret={secret!r}: not a valid Secret name"


def _download_path_problems(executor: InitializerExecutor, planned: list[Step]) -> Iterator[str]:
    """The executor's mounts at a path where the training pods mount a download."""
    taken = {executor.workspace_mount_path: "workspace_mount_path"}
    taken.update({m.mount_path: f"pvc_mounts[{m.claim_name}]" for m in executor.pvc_mounts})
    taken.update({m.mount_path: f"secret_mounts[{m.secret_name}]" for m in executor.secret_mounts})
    for st in planned:
        if st.feeds_training and st.mount_path in taken:
            yield f"{taken[st.mount_path]}: {st.mount_path} is where {st.name} puts its download; mount elsewhere"


def _credential_problems(step: str, value: object) -> Iterator[str]:
    """The literal credentials of the ``step`` initializer ``value``: refused, a Secret holds them."""
    for cred in _CREDENTIAL_FIELDS:
        if getattr(value, cred, None):
            yield (
                f"initializer.{step}.{cred}: literal credentials are refused (NeMo-Run saves the executor "
                f"to disk and the TrainJob would carry them in clear); put {cred.upper()} in a Secret and "
                f"set initializer_settings.{step}_secret"
            )


def _claim_problems(planned: list[Step], s: InitializerSettings) -> Iterator[str]:
    """Problems of the claim the initializers download into."""
    yield from _missing_claim_problems(planned, s)
    if s.claim_name and not naming.is_rfc1123_subdomain(s.claim_name):
        yield f"initializer_settings.claim_name={s.claim_name!r}: not a valid Kubernetes name"
    if s.create_claim:
        yield from _new_claim_problems(s)


def _missing_claim_problems(planned: list[Step], s: InitializerSettings) -> Iterator[str]:
    """No claim named, though a step downloads for training (only a data cache needs none)."""
    needs_claim = [st.name for st in planned if st.feeds_training]
    if needs_claim and not s.claim_name:
        yield (
            f"initializer_settings.claim_name is not set: {' and '.join(needs_claim)} download into a "
            "PersistentVolumeClaim that the training pods mount; name one (create_claim=True creates it)"
        )


def _new_claim_problems(s: InitializerSettings) -> Iterator[str]:
    """With ``create_claim``: what the claim to create needs, a size and valid access modes."""
    if s.claim_size is None or parse_quantity(str(s.claim_size)) is None:
        yield "initializer_settings: create_claim=True needs claim_size, e.g. claim_size='200Gi'"
    if (refused := refused_access_modes(s.access_modes)) is not None:
        yield f"initializer_settings.access_modes: invalid {refused}"


def refused_access_modes(modes: Sequence[str]) -> Optional[Sequence[str]]:
    """The access modes to name when refusing a claim to create with ``modes``: the unknown ones, or the
    empty ``modes``; ``None`` when they are fine."""
    unknown = sorted(set(modes) - _ACCESS_MODES)
    if unknown:
        return unknown
    return None if modes else modes


def _scheme_hint(kind: str, uri: str) -> str:
    """How to fix ``uri`` that has no scheme, for the SDK type ``kind`` (Hugging Face's: prefix ``hf://``)."""
    return f"; write 'hf://{uri}'" if _SCHEMES[kind] == "hf" and uri else ""


def _source_problems(step: str, value, command: list[str]) -> Iterator[str]:
    uri = value.storage_uri or ""
    kind = type(value).__name__
    scheme, sep, rest = uri.partition("://")
    if not sep or not rest or not scheme[:1].isalpha():
        yield (
            f"initializer.{step}.storage_uri={uri!r}: Trainer takes a URI of the form scheme://..."
            f"{_scheme_hint(kind, uri)}"
        )
    elif not command and scheme != _SCHEMES[kind]:
        # Only a command of your own (dataset_command/model_command) can read other schemes.
        yield (
            f"initializer.{step}.storage_uri={uri!r}: Trainer's {step} initializer reads "
            f"{_SCHEMES[kind]}:// URIs for {kind}; use that scheme, or give initializer_settings.{step}_command"
        )
