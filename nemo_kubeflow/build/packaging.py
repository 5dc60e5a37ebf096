"""Ship a task's files to the training pods through ConfigMaps: files in, manifests out.

:func:`build_code_package` is pure: the files :meth:`ConfigMapPackager.collect
<nemo_kubeflow.config.packager.ConfigMapPackager.collect>` read, in; ConfigMap manifests (one plain
ConfigMap, or a tar.gz in shards), pod volumes, mounts and a shell prologue, out. The scheduler calls it
during dry-run, so it never does I/O.

Pod-side layout, relative to the workspace (``/nemo_run`` by default)::

    __main__.py                <- <experiment_dir>/__main__.py (fdl_runner loads configs/../../)
    <task_dir>/configs/<file>  <- <job_dir>/configs/<file>, *_executor.yaml with env_vars redacted
    scripts/<file>             <- <job_dir>/scripts/<file> (NeMo-Run runs /nemo_run/scripts/x.sh)
    code/<relpath>             <- user code chosen by include_pattern / use_git
"""

import base64
import gzip
import hashlib
import io
import re
import shlex
import tarfile
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Callable, Mapping, Sequence

from nemo_kubeflow.config.packager import MODES, BundleFile, human_bytes

# Experiments saved before parts/ name their packager here (fiddle stores a class by module).
from nemo_kubeflow.config.packager import ConfigMapPackager as ConfigMapPackager
from nemo_kubeflow.constants import (
    BUNDLE_HASH_ANNOTATION,
    CONFIGMAP_MAX_BYTES,
    DNS_LABEL_MAX,
    MANAGED_BY_LABEL,
    MANAGED_BY_VALUE,
    NEMO_RUN_POD_DIR,
    SHARED_CODE_LABEL,
)
from nemo_kubeflow.errors import ConfigError, PackageTooLargeError, PackagingError
from nemo_kubeflow.parts import naming

#: Where the shard ConfigMaps are mounted in sharded mode, one directory per shard.
BUNDLE_MOUNT_ROOT = "/var/run/nemo-kubeflow/bundle"
#: The single binaryData key of each shard ConfigMap.
SHARD_KEY = "bundle.tar.gz.part"
CODE_VOLUME = "nemo-kubeflow-code"
WORKSPACE_VOLUME = "nemo-kubeflow-workspace"
SHARD_VOLUME_PREFIX = "nemo-kubeflow-bundle-"
#: Room left under the 1 MiB limit for keys and metadata: the API server counts only values, but
#: etcd stores the whole object, and a near-limit ConfigMap leaves no slack for label changes.
CONFIGMAP_MARGIN_BYTES = 16 * 1024
#: Plain mode lists one volume item per file in the pod spec, which is copied into the TrainJob,
#: JobSet, Job and every Pod; past this many files "auto" switches to sharded to keep them small.
PLAIN_MAX_FILES = 1000
#: The name of a shared ConfigMap of code: this prefix and the first hex digits of its content's digest.
SHARED_NAME_PREFIX = "nemo-kubeflow-code-"
SHARED_DIGEST_CHARS = 32
#: Code smaller than this is not shared: adding a TrainJob to a shared ConfigMap's owners is one more request per
#: task, which only pays when it saves sending (and storing in etcd) this much code again for every task.
SHARE_MIN_BYTES = 64 * 1024

_KEY_UNSAFE_RE = re.compile(r"[^-._a-zA-Z0-9]")
_KEY_MAX = naming.DNS_SUBDOMAIN_MAX
_LARGEST_SHOWN = 5


# --------------------------------------------------------------------------------------------
# Pure part: files -> manifests
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CodePackage:
    """What the scheduler needs to put a package into a pod."""

    #: Full v1 ConfigMap manifests, without ownerReferences (the caller adds them).
    configmaps: list[dict]
    #: Pod volumes: one configMap volume (plain), or an emptyDir workspace plus one per shard.
    volumes: list[dict]
    #: Mounts for the training container.
    volume_mounts: list[dict]
    #: Bash to run before the command: "" in plain mode, the unpack step in sharded mode.
    prologue: str
    #: sha256 hex of the content (paths, modes, data), independent of the mode and names.
    digest: str
    #: "plain" or "sharded".
    mode: str
    file_count: int
    #: Uncompressed bytes of all files.
    total_bytes: int
    #: Names of the ConfigMaps shared with every task of the same code (``SHARED_CODE_LABEL``): they may exist
    #: already, owned by other TrainJobs; this task's TrainJob becomes one more owner.
    shared: tuple[str, ...] = ()


def build_code_package(
    files: Sequence[BundleFile],
    *,
    name: str,
    namespace: str,
    labels: Mapping[str, str] | None = None,
    mount_path: str = NEMO_RUN_POD_DIR,
    mode: str = "auto",
    max_shards: int = 16,
    share_code: bool = False,
) -> CodePackage:
    """Turn ``files`` into ConfigMaps plus the pod volumes, mounts and prologue that use them.

    ``mode`` is "plain" (one ConfigMap named ``name``, files as keys, mounted read-only at
    ``mount_path``), "sharded" (a deterministic tar.gz split over ConfigMaps ``name-0`` ..
    ``name-<n-1>``, unpacked by ``prologue`` into an emptyDir at ``mount_path``) or "auto" (plain
    when it fits, else sharded).

    ``share_code``: in plain mode, code (``code/``) of ``SHARE_MIN_BYTES`` or more goes into a ConfigMap of its own
    named by its content
    (``nemo-kubeflow-code-<digest>``, labelled ``SHARED_CODE_LABEL`` and nothing task-specific), which every
    task shipping the same code shares, and the task's own files (if any) into ``name``; one projected volume
    puts them together at ``mount_path``. Sharded packages are never shared.

    Raises:
        ConfigError: invalid name, namespace, mount path, mode or max_shards.
        PackagingError: two files with the same path.
        PackageTooLargeError: the files do not fit (plain: one ConfigMap; sharded: max_shards).
    """
    _check_package_arguments(name, namespace, mount_path, mode, max_shards)
    ordered = _sorted_by_path(files)
    digest = _content_digest(ordered)
    total = sum(len(f.data) for f in ordered)

    def metadata(cm_name: str) -> dict:
        return _metadata(cm_name, namespace, labels or {}, digest)

    if mode != "sharded":
        problem = _plain_problem(ordered, total)
        shared = None
        if problem is None and share_code:
            shared = _shared_package(
                ordered,
                name=name,
                namespace=namespace,
                labels=labels,
                mount_path=mount_path,
                digest=digest,
                total=total,
            )
        if shared is not None:
            return shared
        if problem is None:
            return _plain_package(ordered, name, metadata(name), mount_path, digest, total)
        if mode == "plain":
            raise PackageTooLargeError(
                f"the package ({len(ordered)} files, {human_bytes(total)}) does not fit in one "
                f"ConfigMap: {problem}. Largest files: {_format_largest(ordered)}. "
                'Use mode="sharded" (or "auto"), add exclude patterns, or put large files on a '
                "PVC.",
                largest=_largest(ordered),
            )
    return _sharded_package(ordered, name, metadata, mount_path, max_shards, digest, total)


def is_shared_path(path: str) -> bool:
    """Whether a packaged file is code, the same for every task that ships it (``code/``), as opposed to a task's
    own files (``__main__.py``, ``<task_dir>/configs/``, ``scripts/``: NeMo-Run's records of the experiment and
    the task, its executor's settings included)."""
    return path.startswith("code/")


def _shared_package(
    every: Sequence[BundleFile],
    *,
    name: str,
    namespace: str,
    labels: Mapping[str, str] | None,
    mount_path: str,
    digest: str,
    total: int,
) -> CodePackage | None:
    """The code (``code/``) in a ConfigMap named by its content, the task's own files (if any) in ``name``,
    one projected volume of both at ``mount_path``; ``None`` when there is less than ``SHARE_MIN_BYTES`` of code."""
    shared = [f for f in every if is_shared_path(f.path)]
    if sum(len(f.data) for f in shared) < SHARE_MIN_BYTES:
        return None
    shared_digest = _content_digest(shared)
    shared_cm, shared_items = _shared_configmap(
        shared,
        _metadata(SHARED_NAME_PREFIX + shared_digest[:SHARED_DIGEST_CHARS], namespace, SHARED_LABELS, shared_digest),
    )
    configmaps, sources = [shared_cm], [_projected(shared_cm, shared_items)]
    own = [f for f in every if not is_shared_path(f.path)]
    if own:
        own_cm, own_items = _plain_configmap(own, _metadata(name, namespace, labels or {}, _content_digest(own)))
        configmaps.append(own_cm)
        sources.append(_projected(own_cm, own_items))
    volume = {"name": CODE_VOLUME, "projected": {"defaultMode": 0o644, "sources": sources}}
    return _read_only(configmaps, volume, mount_path, digest, len(every), total, (shared_cm["metadata"]["name"],))


#: The shared code's ConfigMap (without metadata) and volume items by its digest, the last few: a sweep's tasks
#: build it once and hold one copy of its text between their dry runs and their submission (NeMo-Run builds
#: every task's dry run first). Strings are immutable; every task still gets dicts and lists of its own.
_SHARED_BUILT: dict[str, tuple[dict, list[dict]]] = {}
_SHARED_BUILT_MAX = 16


def _shared_configmap(files: Sequence[BundleFile], metadata: dict) -> tuple[dict, list[dict]]:
    """``_plain_configmap`` of the shared code, its text built once per content."""
    digest = metadata["annotations"][BUNDLE_HASH_ANNOTATION]
    built = _SHARED_BUILT.get(digest)
    if built is None:
        if len(_SHARED_BUILT) >= _SHARED_BUILT_MAX:
            _SHARED_BUILT.clear()
        built = _SHARED_BUILT[digest] = _plain_configmap(files, {})
    configmap, items = built
    fresh = {**configmap, "metadata": metadata, "data": dict(configmap["data"])}
    if "binaryData" in configmap:
        fresh["binaryData"] = dict(configmap["binaryData"])
    return fresh, [dict(item) for item in items]


#: The labels of a shared ConfigMap: nothing of one task, experiment or TrainJob (it serves many).
SHARED_LABELS = {MANAGED_BY_LABEL: MANAGED_BY_VALUE, SHARED_CODE_LABEL: "true"}


def _metadata(name: str, namespace: str, labels: Mapping[str, str], digest: str) -> dict:
    """A ConfigMap's metadata: fresh dicts each time, so a caller editing one manifest does not edit them all."""
    return {
        "name": name,
        "namespace": namespace,
        "labels": dict(labels),
        "annotations": {BUNDLE_HASH_ANNOTATION: digest},
    }


def _projected(configmap: dict, items: list[dict]) -> dict:
    """A projected volume's source: ``configmap``'s keys at their paths."""
    return {"configMap": {"name": configmap["metadata"]["name"], "items": items}}


def _check_package_arguments(name: str, namespace: str, mount_path: str, mode: str, max_shards: int) -> None:
    if mode not in MODES:
        raise ConfigError(f"mode must be one of {', '.join(MODES)}, not {mode!r}")
    if max_shards < 1:
        raise ConfigError(f"max_shards must be at least 1, not {max_shards}")
    _check_subdomain(name, "ConfigMap name")
    _check_label(namespace, "namespace")
    _check_mount_path(mount_path)


def _sorted_by_path(files: Sequence[BundleFile]) -> list[BundleFile]:
    """The files sorted by path; two with the same path are refused."""
    ordered = sorted(files, key=lambda f: f.path)
    for prev, cur in zip(ordered, ordered[1:]):
        if prev.path == cur.path:
            raise PackagingError(f"two files have the same path {cur.path!r}")
    return ordered


def _plain_package(
    files: Sequence[BundleFile], name: str, metadata: dict, mount_path: str, digest: str, total: int
) -> CodePackage:
    """One ConfigMap, mounted read-only at ``mount_path`` with one volume item per file."""
    configmap, items = _plain_configmap(files, metadata)
    volume = {"name": CODE_VOLUME, "configMap": {"name": name, "defaultMode": 0o644, "items": items}}
    return _read_only([configmap], volume, mount_path, digest, len(files), total)


def _read_only(
    configmaps: list[dict],
    volume: dict,
    mount_path: str,
    digest: str,
    file_count: int,
    total: int,
    shared: tuple[str, ...] = (),
) -> CodePackage:
    """A plain package: ``volume`` (of ``configmaps``) mounted read-only at ``mount_path``, no prologue."""
    return CodePackage(
        configmaps=configmaps,
        volumes=[volume],
        volume_mounts=[{"name": CODE_VOLUME, "mountPath": mount_path, "readOnly": True}],
        prologue="",
        digest=digest,
        mode="plain",
        file_count=file_count,
        total_bytes=total,
        shared=shared,
    )


def describe_package(pkg: CodePackage) -> str:
    """A one-line summary, e.g. ``plain, 12 files, 34.5 KiB in 1 ConfigMap``."""
    count = len(pkg.configmaps)
    where = f"in {count} ConfigMap{'' if count == 1 else 's'}" + (f" ({len(pkg.shared)} shared)" if pkg.shared else "")
    if pkg.mode == "sharded":
        compressed = sum(_b64_decoded_len(cm["binaryData"][SHARD_KEY]) for cm in pkg.configmaps)
        return f"sharded, {pkg.file_count} files, {human_bytes(pkg.total_bytes)} ({human_bytes(compressed)} compressed) {where}"
    return f"plain, {pkg.file_count} files, {human_bytes(pkg.total_bytes)} {where}"


def _plain_problem(files: Sequence[BundleFile], total: int) -> str | None:
    """Why the files cannot go in one plain ConfigMap, or None when they can."""
    if len(files) > PLAIN_MAX_FILES:
        return f"{len(files)} files exceed the plain-mode limit of {PLAIN_MAX_FILES}"
    # The API server sums data values plus *decoded* binaryData; keys count against our margin.
    budget = CONFIGMAP_MAX_BYTES - CONFIGMAP_MARGIN_BYTES
    if total + sum(len(_configmap_key(f.path)) for f in files) > budget:
        return f"{human_bytes(total)} of content plus keys exceeds {human_bytes(budget)}"
    return None


def _plain_configmap(files: Sequence[BundleFile], metadata: dict) -> tuple[dict, list[dict]]:
    """The ConfigMap (one key per file) and the volume items that put each key at its path."""
    data: dict[str, str] = {}
    binary: dict[str, str] = {}
    items = []
    paths_by_key: dict[str, str] = {}
    for f in files:
        key = _configmap_key(f.path)
        if key in paths_by_key:
            # Only a verbatim top-level name can equal a hashed key, and only on purpose.
            raise PackagingError(f"{f.path!r} and {paths_by_key[key]!r} map to the same ConfigMap key {key!r}")
        paths_by_key[key] = f.path
        text = _as_text(f.data)
        if text is None:
            binary[key] = base64.b64encode(f.data).decode("ascii")
        else:
            data[key] = text
        items.append({"key": key, "path": f.path, "mode": f.mode})
    manifest = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata,
        # Immutable: the kubelet stops watching it, and nobody can swap files under a running job.
        "immutable": True,
        "data": data,
    }
    if binary:
        manifest["binaryData"] = binary
    return manifest, items


def _sharded_package(
    files: Sequence[BundleFile],
    name: str,
    metadata: Callable[[str], dict],
    mount_path: str,
    max_shards: int,
    digest: str,
    total: int,
) -> CodePackage:
    archive = _deterministic_targz(files)
    shards = _shards(archive)
    if len(shards) > max_shards:
        raise PackageTooLargeError(
            f"the package ({len(files)} files, {human_bytes(total)}, {human_bytes(len(archive))} compressed) "
            f"needs {len(shards)} ConfigMaps but max_shards is {max_shards}. "
            f"Largest files: {_format_largest(files)}. "
            "Add exclude patterns, raise max_shards, or put large files on a PVC or in the image.",
            largest=_largest(files),
        )
    names = [f"{name}-{i}" for i in range(len(shards))]
    for shard_name in names:
        _check_subdomain(shard_name, "ConfigMap shard name")
    configmaps = [_shard_configmap(metadata(shard_name), shard) for shard_name, shard in zip(names, shards)]
    volumes, mounts, parts = _shard_volumes(names, mount_path)
    prologue = _unpack_prologue(
        parts=parts,
        archive_sha256=hashlib.sha256(archive).hexdigest(),
        mount_path=mount_path,
        shard_names=names,
        check_paths=_check_paths(files),
    )
    return CodePackage(
        configmaps=configmaps,
        volumes=volumes,
        volume_mounts=mounts,
        prologue=prologue,
        digest=digest,
        mode="sharded",
        file_count=len(files),
        total_bytes=total,
    )


def _shards(archive: bytes) -> list[bytes]:
    """The archive cut into pieces that each fit in a ConfigMap (at least one)."""
    chunk = CONFIGMAP_MAX_BYTES - CONFIGMAP_MARGIN_BYTES
    count = max(1, -(-len(archive) // chunk))
    return [archive[i * chunk : (i + 1) * chunk] for i in range(count)]


def _shard_configmap(metadata: dict, shard: bytes) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata,
        "immutable": True,
        "binaryData": {SHARD_KEY: base64.b64encode(shard).decode("ascii")},
    }


def _shard_volumes(names: Sequence[str], mount_path: str) -> tuple[list[dict], list[dict], list[str]]:
    """The pod volumes and mounts of sharded mode (an emptyDir workspace at ``mount_path``, each shard
    read-only in a directory of its own), and where each shard's part is in the pod."""
    volumes: list[dict] = [{"name": WORKSPACE_VOLUME, "emptyDir": {}}]
    mounts: list[dict] = [{"name": WORKSPACE_VOLUME, "mountPath": mount_path}]
    parts = []
    for i, shard_name in enumerate(names):
        volume, shard_dir = f"{SHARD_VOLUME_PREFIX}{i}", f"{BUNDLE_MOUNT_ROOT}/{i}"
        volumes.append({"name": volume, "configMap": {"name": shard_name, "defaultMode": 0o444}})
        mounts.append({"name": volume, "mountPath": shard_dir, "readOnly": True})
        parts.append(f"{shard_dir}/{SHARD_KEY}")
    return volumes, mounts, parts


def _unpack_prologue(
    *,
    parts: list[str],
    archive_sha256: str,
    mount_path: str,
    shard_names: list[str],
    check_paths: list[str],
) -> str:
    """Bash that reassembles the shards and unpacks them into ``mount_path``, or exits 1 saying why.

    Never ``set -x``: the prologue runs in the same shell as the user's command.
    """
    q_parts = " ".join(shlex.quote(p) for p in parts)
    q_dest = shlex.quote(mount_path)
    shards = shard_names[0] if len(shard_names) == 1 else f"{shard_names[0]}..{shard_names[-1]}"

    def fail(message: str) -> str:
        return f"{{ echo {shlex.quote('nemo-kubeflow: ' + message)} >&2; exit 1; }}"

    lines = [
        f"# nemo-kubeflow: unpack the code bundle ({len(parts)} shard(s)) into {mount_path}",
        f"for nk_part in {q_parts}; do",
        '  [ -r "$nk_part" ] || { echo "nemo-kubeflow: code bundle shard $nk_part is missing or'
        ' unreadable" >&2; exit 1; }',
        "done",
        # The checksum catches shards from different packages (e.g. one ConfigMap recreated).
        "if command -v sha256sum >/dev/null 2>&1; then",
        f"  nk_sum=$(cat {q_parts} | sha256sum)",
        f'  [ "${{nk_sum%% *}}" = {archive_sha256} ] || '
        + fail(
            f"code bundle checksum mismatch: ConfigMap(s) {shards} do not hold the package this pod was created with"
        ),
        "fi",
        # -m: files get the unpack time rather than the archive's fixed mtime 0.
        f"cat {q_parts} | tar -xzmf - -C {q_dest} || "
        + fail(f"could not unpack the code bundle into {mount_path} (does the image have tar and gzip?)"),
    ]
    for path in check_paths:
        lines.append(
            f"[ -f {shlex.quote(mount_path + '/' + path)} ] || "
            + fail(f"{path} is missing from {mount_path} after unpacking the code bundle")
        )
    lines.append("unset nk_part nk_sum")
    return "\n".join(lines) + "\n"


def _check_paths(files: Sequence[BundleFile]) -> list[str]:
    """Files whose presence proves the unpack went through: the last entry and the longest path
    (a tar without long-name support would mangle it while still exiting 0)."""
    if not files:
        return []
    last = files[-1].path
    longest = max((f.path for f in files), key=len)
    return [last] if longest == last else [last, longest]


def _deterministic_targz(files: Sequence[BundleFile]) -> bytes:
    """A tar.gz whose bytes depend only on the files: sorted, mtime 0, root-owned, and no name or
    time in the gzip header."""
    buf = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buf, mtime=0, compresslevel=6) as gz:
        with tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for f in files:
                info = tarfile.TarInfo(f.path)
                info.size = len(f.data)
                info.mode = f.mode
                info.mtime = 0
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                tar.addfile(info, io.BytesIO(f.data))
    return buf.getvalue()


def _content_digest(files: Sequence[BundleFile]) -> str:
    h = hashlib.sha256()
    for f in files:
        # Length-prefixed fields, so no two different file lists hash the same stream.
        h.update(f"{len(f.path.encode())}:{f.path}:{f.mode:o}:{len(f.data)}:".encode())
        h.update(f.data)
    return h.hexdigest()


def _configmap_key(path: str) -> str:
    """A valid, unique ConfigMap key for ``path``: the path itself when it is already a valid key,
    else a readable flattened form plus a hash of the path (so ``a/b.py``, ``a-b.py`` and
    ``a_b.py`` stay distinct)."""
    if naming.is_config_key(path):
        return path
    suffix = "." + hashlib.sha256(path.encode()).hexdigest()[:12]
    # Keep the tail when too long: it holds the file name, which is what a reader looks for.
    flat = _KEY_UNSAFE_RE.sub("_", path)[-(_KEY_MAX - len(suffix)) :]
    if flat.startswith(".."):  # the API server rejects keys starting with '..'
        flat = "_" + flat[1:]
    return flat + suffix


def _as_text(data: bytes) -> str | None:
    """The UTF-8 text of ``data``, or None when it must go in binaryData."""
    if b"\0" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _largest(files: Sequence[BundleFile]) -> list[tuple[str, int]]:
    ranked = sorted(files, key=lambda f: (-len(f.data), f.path))
    return [(f.path, len(f.data)) for f in ranked[:_LARGEST_SHOWN]]


def _format_largest(files: Sequence[BundleFile]) -> str:
    return ", ".join(f"{p} ({human_bytes(n)})" for p, n in _largest(files)) or "none"


def _b64_decoded_len(text: str) -> int:
    return len(text) * 3 // 4 - text[-2:].count("=") if text else 0


def _check_subdomain(value: str, what: str) -> None:
    if not naming.is_rfc1123_subdomain(value):
        raise ConfigError(
            f"{what} {value!r} is not a DNS-1123 subdomain: at most {naming.DNS_SUBDOMAIN_MAX} characters of "
            "lower-case letters, digits, '-' and '.', starting and ending with a letter or digit"
        )


def _check_label(value: str, what: str) -> None:
    if not naming.is_rfc1123_label(value):
        raise ConfigError(
            f"{what} {value!r} is not a DNS-1123 label: at most {DNS_LABEL_MAX} characters of "
            "lower-case letters, digits and '-', starting and ending with a letter or digit"
        )


def _check_mount_path(path: str) -> None:
    if not path.startswith("/") or path == "/" or str(PurePosixPath(path)) != path or ".." in path.split("/"):
        raise ConfigError(
            f"workspace_mount_path={path!r}: must be a normalized absolute path other than '/', "
            "where the task's files are mounted, e.g. '/nemo_run'"
        )


__all__ = ["CodePackage", "build_code_package", "describe_package", "is_shared_path"]
