"""A pod's volumes as directories under its pod directory (ConfigMap, Secret, downward API, emptyDir, claims),
and the path map that points a container's mount paths at them."""

from __future__ import annotations

import base64
import os
import re
from pathlib import Path

from nemo_kubeflow_local.apiserver import resources as R
from nemo_kubeflow_local.kubelet.environment import ContainerConfigError, Objects, field_ref


class MountError(Exception):
    """A volume cannot be set up yet: the pod waits (FailedMount)."""


class PathMap:
    """Container paths -> local paths. A mount path is replaced only where it starts a path
    (nothing path-like before it) and ends one (`/`, end, or a non-path character after it)."""

    def __init__(self, mounts: dict[str, Path]):
        self.mounts = {path.rstrip("/") or "/": local for path, local in mounts.items()}
        paths = sorted(self.mounts, key=len, reverse=True)  # longest first: /a/b before /a
        alternatives = "|".join(re.escape(p) for p in paths)
        self._pattern = re.compile(rf"(?<![\w.\-/])({alternatives})(?=/|$|[^\w.\-])") if paths else None

    def apply(self, text: str) -> str:
        if self._pattern is None:
            return text
        return self._pattern.sub(lambda m: str(self.mounts[m.group(1)]), text)


def _write_file(path: Path, content: bytes, mode: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists():
        path.chmod(0o600)
    path.write_bytes(content)
    path.chmod(mode)


def _replace_file(path: Path, content: bytes, mode: int) -> None:
    """``path`` replaced whole: written aside, then renamed over it."""
    aside = path.with_name(f".{path.name}.new")
    _write_file(aside, content, mode)
    os.replace(aside, path)


class Volumes:
    """Materialises a pod's volumes under `<pod dir>/volumes/<name>` (PVCs under `<workdir>/pvcs`)."""

    def __init__(self, store: Objects, pod: dict, pod_dir: Path, workdir: Path):
        self.store, self.pod, self.pod_dir, self.workdir = store, pod, pod_dir, workdir
        self.namespace = pod["metadata"].get("namespace", "default")

    def local_dir(self, volume: dict) -> Path:
        if "persistentVolumeClaim" in volume:
            return self.workdir / "pvcs" / self.namespace / volume["persistentVolumeClaim"]["claimName"]
        return self.pod_dir / "volumes" / volume["name"]

    def missing_claims(self) -> list[str]:
        return [
            v["persistentVolumeClaim"]["claimName"]
            for v in self.pod["spec"].get("volumes") or []
            if "persistentVolumeClaim" in v
            and self.store.find(R.PVCS, self.namespace, v["persistentVolumeClaim"]["claimName"]) is None
        ]

    def set_up(self, remap: PathMap) -> None:
        """Create every volume; raises MountError naming the first that cannot be set up yet."""
        containers = (self.pod["spec"].get("initContainers") or []) + self.pod["spec"].get("containers", [])
        for volume in self.pod["spec"].get("volumes") or []:
            target = self.local_dir(volume)
            target.mkdir(parents=True, exist_ok=True)
            if not any(k in volume for k in ("configMap", "secret", "projected", "downwardAPI")):
                # The kubelet creates a missing subPath directory (of a claim, an emptyDir...).
                for mount in (m for c in containers for m in c.get("volumeMounts") or []):
                    if mount["name"] == volume["name"] and mount.get("subPath"):
                        (target / mount["subPath"]).mkdir(parents=True, exist_ok=True)
            files: dict[str, tuple[bytes, int]] = {}
            try:
                if "configMap" in volume or "secret" in volume:
                    files = self._source_files(
                        volume.get("configMap") or volume.get("secret"),
                        "configmap" if "configMap" in volume else "secret",
                    )
                elif "projected" in volume:
                    for source in volume["projected"].get("sources") or []:
                        for kind, key in (("configmap", "configMap"), ("secret", "secret")):
                            if key in source:
                                files.update(
                                    self._source_files(
                                        {**source[key], "defaultMode": volume["projected"].get("defaultMode", 0o644)},
                                        kind,
                                    )
                                )
                        if "downwardAPI" in source:
                            files.update(self._downward_files(source["downwardAPI"]))
                        if "serviceAccountToken" in source:
                            files.update(
                                self._token_file(
                                    source["serviceAccountToken"], volume["projected"].get("defaultMode", 0o644)
                                )
                            )
                elif "downwardAPI" in volume:
                    files = self._downward_files(volume["downwardAPI"])
            except ContainerConfigError as error:
                raise MountError(f'MountVolume.SetUp failed for volume "{volume["name"]}" : {error}') from None
            for relative, (content, mode) in files.items():
                _write_file(target / relative, _remap_text(content, remap), mode)

    def _source_files(self, ref: dict, kind: str) -> dict[str, tuple[bytes, int]]:
        name = ref.get("name") or ref.get("secretName", "")
        obj = self.store.find(R.CONFIGMAPS if kind == "configmap" else R.SECRETS, self.namespace, name)
        if obj is None:
            if ref.get("optional"):
                return {}
            raise ContainerConfigError(f'{kind} "{name}" not found')
        if kind == "configmap":
            data = {k: v.encode() for k, v in (obj.get("data") or {}).items()}
            data.update({k: base64.b64decode(v) for k, v in (obj.get("binaryData") or {}).items()})
        else:
            data = {k: base64.b64decode(v) for k, v in (obj.get("data") or {}).items()}
        mode = ref.get("defaultMode", 0o644)
        items = ref.get("items")
        if not items:
            return {key: (value, mode) for key, value in data.items()}
        files = {}
        for item in items:
            if item["key"] not in data:
                if ref.get("optional"):
                    continue
                raise ContainerConfigError(f"{kind} references non-existent config key: {item['key']}")
            files[item["path"]] = (data[item["key"]], item.get("mode", mode))
        return files

    def refresh_tokens(self) -> int:
        """Replace each projected service-account token file already written with a new token, as the
        kubelet's rotation does (atomically: a reader sees the old token or the new one). Returns how many."""
        refreshed = 0
        for volume in self.pod["spec"].get("volumes") or []:
            projected = volume.get("projected") or {}
            for source in projected.get("sources") or []:
                if "serviceAccountToken" not in source:
                    continue
                path = self.local_dir(volume) / source["serviceAccountToken"]["path"]
                if path.exists():
                    [(content, mode)] = self._token_file(
                        source["serviceAccountToken"], projected.get("defaultMode", 0o644)
                    ).values()
                    _replace_file(path, content, mode)
                    refreshed += 1
        return refreshed

    def _token_file(self, source: dict, mode: int) -> dict[str, tuple[bytes, int]]:
        """A projected service-account token (rewritten only by ``refresh_tokens``)."""
        account = self.pod["spec"].get("serviceAccountName") or "default"
        try:
            token = self.store.service_account_token(
                self.namespace, account, source.get("audience") or "", int(source.get("expirationSeconds") or 3600)
            )
        except Exception as error:  # noqa: BLE001 - the API's refusal, said as the kubelet says it
            raise ContainerConfigError(f"failed to fetch token: {error}") from None
        return {source["path"]: (token.encode(), mode)}

    def _downward_files(self, source: dict) -> dict[str, tuple[bytes, int]]:
        return {
            item["path"]: (
                field_ref(self.pod, item["fieldRef"]["fieldPath"]).encode(),
                item.get("mode", source.get("defaultMode", 0o644)),
            )
            for item in source.get("items") or []
            if "fieldRef" in item
        }


def _remap_text(content: bytes, remap: PathMap) -> bytes:
    """Scripts and configs in ConfigMaps name the container paths too: remap text files."""
    if b"\0" in content:
        return content
    try:
        return remap.apply(content.decode("utf-8")).encode("utf-8")
    except UnicodeDecodeError:
        return content
