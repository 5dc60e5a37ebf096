"""The local cluster's mounts are real paths: a path the code builds under a mount path (one the kubelet cannot
rewrite) reaches the volume, in the container's own mount namespace; a mount that cannot be honoured, or a
machine without mount namespaces (forced here with NEMO_KUBEFLOW_LOCAL_MOUNT_NAMESPACE=0), fails the container
with the reason and the fix; nothing is ever written to the host's own paths."""

from __future__ import annotations

import os
import sys
import uuid
from pathlib import Path

import pytest

from nemo_kubeflow_local.kubelet.mounts import MODE_ENV

#: A command that builds the path at run time (the kubelet sees only `$TOP`, no path): `<TOP>/<rest>`.
BUILT = 'from pathlib import Path; p = Path("/" + "{top}") / "{rest}"; p.parent.mkdir(exist_ok=True); p.write_text("{text}"); print(sorted(q.name for q in Path("/" + "{top}").iterdir()))'


#: Whether the container has a mount at `/<top>` (the path built at run time, out of the kubelet's sight).
MOUNTED = 'print(any(line.split()[4] == "/" + "{top}" for line in open("/proc/self/mountinfo")))'


def claim(core, ns: str, name: str) -> None:
    core.create_namespaced_persistent_volume_claim(
        ns,
        {
            "metadata": {"name": name},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
        },
    )


def run_pod(cluster, core, ns: str, command: list[str], mounts: list[dict], volumes: list[dict], env=None):
    name = "p-" + uuid.uuid4().hex[:6]
    core.create_namespaced_pod(
        ns,
        {
            "metadata": {"name": name},
            "spec": {
                "restartPolicy": "Never",
                "containers": [
                    {
                        "name": "main",
                        "image": "busybox",
                        "command": command,
                        "volumeMounts": mounts,
                        "env": [{"name": k, "value": v} for k, v in (env or {}).items()],
                    }
                ],
                "volumes": volumes,
            },
        },
    )
    pod = cluster.wait_for(
        lambda: (lambda p: p if p.status.phase in ("Succeeded", "Failed") else None)(
            core.read_namespaced_pod(name, ns)
        ),
        timeout=30,
    )
    return pod, core.read_namespaced_pod_log(name, ns)


def fresh_top() -> str:
    top = "nkf-mount-" + uuid.uuid4().hex[:8]
    assert not os.path.lexists("/" + top)
    return top


def test_a_path_built_by_the_code_under_a_claim_lands_in_the_claim(cluster, core, ns):
    top = fresh_top()
    claim(core, ns, "ckpt")
    code = BUILT.format(top=top, rest="run/last.ckpt", text="weights")
    # The host's Python, its packages and /tmp are still there beside the mount.
    code += f'; import nemo_kubeflow_local; print(Path("{cluster.workdir}").is_dir(), Path("/tmp").is_dir())'
    code += "; " + MOUNTED.format(top=top)
    pod, log = run_pod(
        cluster,
        core,
        ns,
        [sys.executable, "-c", code],
        [{"name": "ckpt", "mountPath": f"/{top}"}],
        [{"name": "ckpt", "persistentVolumeClaim": {"claimName": "ckpt"}}],
    )
    assert pod.status.phase == "Succeeded", log
    assert log.splitlines() == ["['run']", "True True", "True"]
    assert (cluster.workdir / "pvcs" / ns / "ckpt" / "run" / "last.ckpt").read_text() == "weights"
    assert not os.path.lexists("/" + top)


def test_a_mount_over_an_existing_host_directory_hides_it_and_leaves_it_untouched(cluster, core, ns, tmp_path):
    host = tmp_path / "existing"
    host.mkdir()
    (host / "host-file").write_text("host")
    # The path is built from $D at run time: only the namespace can show it the volume.
    code = 'import os; d = os.path.join(os.environ["D"], "existing"); print(os.listdir(d)); open(d + "/new", "w")'
    pod, log = run_pod(
        cluster,
        core,
        ns,
        [sys.executable, "-c", code],
        [{"name": "scratch", "mountPath": str(host)}],
        [{"name": "scratch", "emptyDir": {}}],
        env={"D": str(tmp_path)},
    )
    assert pod.status.phase == "Succeeded", log
    assert log.splitlines() == ["[]"]
    assert sorted(p.name for p in host.iterdir()) == ["host-file"]
    assert [p.name for p in (cluster.pod_dir(pod.metadata.name, ns) / "volumes" / "scratch").iterdir()] == ["new"]


def refused(cluster, core, ns: str, tmp_path: Path, volume: dict, path: str) -> str:
    """Runs a pod with `volume` at `path` that must not start; returns its container's message."""
    marker = tmp_path / "ran"
    pod, _ = run_pod(cluster, core, ns, ["touch", str(marker)], [{"name": volume["name"], "mountPath": path}], [volume])
    terminated = pod.status.container_statuses[0].state.terminated
    assert (pod.status.phase, terminated.exit_code, terminated.reason) == ("Failed", 128, "StartError")
    assert f'error mounting "{volume["name"]}" to rootfs at "{path}": ' in terminated.message
    assert not marker.exists()
    return terminated.message


def test_without_a_mount_namespace_a_writable_volume_is_refused_before_the_code_runs(
    cluster, core, ns, monkeypatch, tmp_path
):
    monkeypatch.setenv(MODE_ENV, "0")
    top = fresh_top()
    claim(core, ns, "ckpt")
    volume = {"name": "ckpt", "persistentVolumeClaim": {"claimName": "ckpt"}}
    message = refused(cluster, core, ns, tmp_path, volume, f"/{top}/ckpt")
    assert f'to rootfs at "/{top}/ckpt": the local cluster makes no mount namespace for the container' in message
    assert f"({MODE_ENV}=0)" in message and f"{MODE_ENV}=rewrite" in message and "user namespaces" in message
    events = [e.message for e in core.list_namespaced_event(ns).items if e.reason == "Failed"]
    assert events == [f"Error: {message}"]
    assert not os.path.lexists("/" + top)


def test_without_a_mount_namespace_read_only_volumes_and_dev_shm_still_run(cluster, core, ns, monkeypatch):
    monkeypatch.setenv(MODE_ENV, "0")
    top = fresh_top()
    core.create_namespaced_config_map(ns, {"metadata": {"name": "cfg"}, "data": {"a.txt": "from the map"}})
    pod, log = run_pod(
        cluster,
        core,
        ns,
        ["cat", f"/{top}/a.txt"],
        [{"name": "cfg", "mountPath": f"/{top}"}, {"name": "shm", "mountPath": "/dev/shm"}],
        [{"name": "cfg", "configMap": {"name": "cfg"}}, {"name": "shm", "emptyDir": {"medium": "Memory"}}],
    )
    assert (pod.status.phase, log) == ("Succeeded", "from the map")


@pytest.mark.parametrize("where", ["under", "python"])
def test_a_mount_path_that_cannot_be_honoured_is_refused(cluster, core, ns, tmp_path, where):
    path = str(tmp_path / "absent" / "ckpt") if where == "under" else str(Path(sys.prefix))
    message = refused(cluster, core, ns, tmp_path, {"name": "scratch", "emptyDir": {}}, path)
    if where == "under":
        assert f"{tmp_path} exists on this machine but {tmp_path / 'absent'} does not" in message
        assert not (tmp_path / "absent").exists()
    else:
        assert f"a volume at {path} would hide {path}, which every pod" in message


def test_with_rewrite_a_writable_volume_runs_with_its_path_rewritten_only(cluster, core, ns, monkeypatch):
    monkeypatch.setenv(MODE_ENV, "rewrite")
    top = fresh_top()
    claim(core, ns, "ckpt")
    pod, log = run_pod(
        cluster,
        core,
        ns,
        ["bash", "-c", f"echo kept > /{top}/x; ls /{top}; {sys.executable} -c '{MOUNTED.format(top=top)}'"],
        [{"name": "ckpt", "mountPath": f"/{top}"}],
        [{"name": "ckpt", "persistentVolumeClaim": {"claimName": "ckpt"}}],
    )
    assert (pod.status.phase, log.splitlines()) == ("Succeeded", ["x", "False"])  # no mount: the path rewritten
    assert (cluster.workdir / "pvcs" / ns / "ckpt" / "x").read_text() == "kept\n"
    assert not os.path.lexists("/" + top)


def test_a_mount_inside_another_gets_its_mount_point_inside_that_volume(cluster, core, ns):
    top = fresh_top()
    claim(core, ns, "data")
    core.create_namespaced_config_map(ns, {"metadata": {"name": "code"}, "data": {"main.py": "print('code ran')"}})
    code = f'import runpy; runpy.run_path("/" + "{top}" + "/code/main.py")'
    pod, log = run_pod(
        cluster,
        core,
        ns,
        [sys.executable, "-c", code],
        [{"name": "code", "mountPath": f"/{top}/code"}, {"name": "data", "mountPath": f"/{top}"}],
        [
            {"name": "data", "persistentVolumeClaim": {"claimName": "data"}},
            {"name": "code", "configMap": {"name": "code"}},
        ],
    )
    assert (pod.status.phase, log.splitlines()) == ("Succeeded", ["code ran"])
    assert [p.name for p in (cluster.workdir / "pvcs" / ns / "data").iterdir()] == ["code"]  # the mount point
    assert not os.path.lexists("/" + top)


def test_an_unknown_setting_of_the_switch_is_refused_naming_it(cluster, core, ns, monkeypatch, tmp_path):
    monkeypatch.setenv(MODE_ENV, "off")
    message = refused(cluster, core, ns, tmp_path, {"name": "scratch", "emptyDir": {}}, "/scratch")
    assert f"{MODE_ENV}='off' is not one of '', '1', '0', 'rewrite': fix it" in message
