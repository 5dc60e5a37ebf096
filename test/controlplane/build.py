"""Build the upstream control plane's binaries from Go modules, once per machine, into a cache folder.

Usage (from the repository root):

    python test/controlplane/build.py            # build what is missing, print the bin folder
    python test/controlplane/build.py --print    # only print where the cache folder is / would be

The cache folder is `$NEMO_KUBEFLOW_CONTROLPLANE_CACHE` or
`${XDG_CACHE_HOME:-~/.cache}/nemo-kubeflow/controlplane`; under it, `<versions-hash>/bin` holds the
binaries and `<versions-hash>/build-info.json` (written last, so its presence means the build is
complete) records versions, binaries, module folders (their manifests are read by the fixture) and
build times. GOPATH, GOMODCACHE and GOCACHE live in `<cache>/go`, shared by every versions hash, so a
version bump only recompiles what changed. Nothing is written inside the repository.

Each component is built in a generated, throw-away main module in `<versions-hash>/work/<component>`
that requires the component's module at its pinned version (so its own go.mod decides every dependency
version, as upstream released it) and turns each of its local-path `replace` lines (k8s.io/kubernetes'
`./staging/src/k8s.io/api`, etcd server's `../api`) into the published module at the matching version.
(`go install module/cmd/x@version` would do for Trainer, JobSet and Kueue, but it asks the proxy for the
module's version list to check deprecations, which some module proxies refuse; a pinned go.mod does not.)
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

try:  # imported as the package `controlplane` (the test fixture) or run as a script from this folder
    from . import versions
except ImportError:
    import versions

CACHE_ENV = "NEMO_KUBEFLOW_CONTROLPLANE_CACHE"
BUILD_INFO = "build-info.json"


class BuildUnavailable(RuntimeError):
    """The control plane cannot be built here (no Go toolchain, no module proxy, a failed build)."""


@dataclass(frozen=True)
class Component:
    name: str
    module: str
    version: str
    #: binary name -> Go package path of its main package
    binaries: dict
    #: version given to the published modules that replace the upstream's local-path replaces
    replace_version: str | None = None
    ldflags: tuple = field(default_factory=tuple)


def components() -> list[Component]:
    k8s_minor = versions.KUBERNETES.lstrip("v").split(".")[1]
    k8s_version_pkg = "k8s.io/component-base/version"
    return [
        Component(
            "jobset", "sigs.k8s.io/jobset", versions.JOBSET,
            {"jobset-controller-manager": "sigs.k8s.io/jobset"},
        ),
        Component(
            "trainer", "github.com/kubeflow/trainer/v2", versions.TRAINER,
            {"trainer-controller-manager": "github.com/kubeflow/trainer/v2/cmd/trainer-controller-manager"},
        ),
        Component(
            "kueue", "sigs.k8s.io/kueue", versions.KUEUE,
            {"kueue-controller-manager": "sigs.k8s.io/kueue/cmd/kueue"},
        ),
        Component(
            "etcd", "go.etcd.io/etcd/server/v3", versions.ETCD,
            {"etcd": "go.etcd.io/etcd/server/v3"},
            replace_version=versions.ETCD,
        ),
        Component(
            "kubernetes", "k8s.io/kubernetes", versions.KUBERNETES,
            {
                "kube-apiserver": "k8s.io/kubernetes/cmd/kube-apiserver",
                "kube-controller-manager": "k8s.io/kubernetes/cmd/kube-controller-manager",
                "kube-scheduler": "k8s.io/kubernetes/cmd/kube-scheduler",
            },
            replace_version=versions.staging_version(versions.KUBERNETES),
            # what hack/lib/version.sh stamps, so /version reports the real release
            ldflags=(
                f"-X {k8s_version_pkg}.gitVersion={versions.KUBERNETES}",
                f"-X {k8s_version_pkg}.gitMajor=1",
                f"-X {k8s_version_pkg}.gitMinor={k8s_minor}",
                f"-X {k8s_version_pkg}.gitTreeState=clean",
            ),
        ),
    ]


def versions_hash() -> str:
    text = json.dumps(versions.pins(), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def cache_root() -> Path:
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "nemo-kubeflow" / "controlplane"


def build_dir() -> Path:
    return cache_root() / versions_hash()


def load_build_info() -> dict | None:
    """The completed build for the pinned versions, or None when it has not been built yet."""
    path = build_dir() / BUILD_INFO
    if not path.is_file():
        return None
    info = json.loads(path.read_text())
    if all(Path(p).is_file() for p in info["binaries"].values()):
        return info
    return None


def go_env(root: Path) -> dict:
    env = dict(os.environ)
    gopath = root / "go"
    env.update(
        GOPATH=str(gopath),
        GOMODCACHE=str(gopath / "pkg" / "mod"),
        GOCACHE=str(gopath / "build-cache"),
        # the proxy is the only source: no VCS checkouts, no toolchain downloads
        GOTOOLCHAIN="local",
        GOFLAGS="-modcacherw -buildvcs=false",
        CGO_ENABLED="0",
    )
    env.setdefault("GOPROXY", "https://proxy.golang.org,direct")
    env.pop("GOBIN", None)
    return env


def _run(cmd: list, env: dict, cwd: Path, log, check: bool = True) -> str:
    log.write(f"$ {' '.join(cmd)}   (in {cwd})\n")
    log.flush()
    proc = subprocess.run(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    log.write(proc.stdout)
    log.flush()
    if proc.returncode != 0 and check:
        lines = [line for line in proc.stdout.strip().splitlines() if line.strip()] or ["(no output)"]
        raise BuildUnavailable(f"`go {cmd[1]} ... {cmd[-1]}` failed (exit {proc.returncode}): {lines[-1].strip()} "
                               f"(full output in {log.name})")
    return proc.stdout


def download(component: Component, env: dict, cwd: Path, log) -> dict:
    out = _run(["go", "mod", "download", "-json", f"{component.module}@{component.version}"], env, cwd, log,
               check=False)
    try:
        info = json.loads(out)
    except ValueError:
        info = {"Error": out.strip().splitlines()[-1] if out.strip() else "no output"}
    if info.get("Error"):
        raise BuildUnavailable(f"cannot download {component.module}@{component.version} from the Go module proxy "
                               f"({env.get('GOPROXY')}): {info['Error']}")
    return info


_LOCAL_REPLACE = re.compile(r"^\s*(?:replace\s+)?(\S+)(?:\s+v\S+)?\s+=>\s+(\.\.?/\S*)\s*$")


def generated_go_mod(component: Component, upstream_go_mod: str) -> str:
    """A main module that requires the component and maps its local-path replaces to published modules."""
    replaces = []
    for line in upstream_go_mod.splitlines():
        m = _LOCAL_REPLACE.match(line)
        if not m or "FORBIDDEN" in m.group(2) or component.replace_version is None:
            continue
        replaces.append(f"\t{m.group(1)} => {m.group(1)} {component.replace_version}")
    go_line = next((line for line in upstream_go_mod.splitlines() if line.startswith("go ")), "go 1.24.0")
    return (
        "// Generated by nemo_kubeflow's test/controlplane/build.py: a throw-away module to build\n"
        f"// {component.module}@{component.version} with its local replaces mapped to published modules.\n"
        f"module nemo-kubeflow.test/controlplane/{component.name}\n\n{go_line}\n\n"
        f"require {component.module} {component.version}\n\nreplace (\n" + "\n".join(replaces) + "\n)\n"
    )


def build_component(component: Component, bin_dir: Path, work: Path, env: dict, log) -> dict:
    work.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    module = download(component, env, work, log)
    flags = ["-trimpath", "-ldflags=" + " ".join(("-s", "-w") + component.ldflags)]
    (work / "go.mod").write_text(generated_go_mod(component, Path(module["GoMod"]).read_text()))
    # upstream's go.sum: its checksums verify the dependencies without asking the checksum database
    # (which does not know every module the proxy serves, e.g. Kueue's sigs.k8s.io/scheduler-library)
    shutil.copyfile(Path(module["Dir"]) / "go.sum", work / "go.sum")
    os.chmod(work / "go.sum", 0o644)
    menv = dict(env, GOFLAGS=env["GOFLAGS"] + " -mod=mod")
    for name, package in component.binaries.items():
        _run(["go", "build", *flags, "-o", str(bin_dir / name), package], menv, work, log)
    return {"module_dir": module["Dir"], "seconds": round(time.monotonic() - start, 1)}


def go_version(env: dict) -> str:
    if shutil.which("go") is None:
        raise BuildUnavailable("no Go toolchain on PATH (`go` not found); install Go >= 1.26 to build it")
    return subprocess.run(["go", "env", "GOVERSION"], env=env, capture_output=True, text=True).stdout.strip()


def ensure_built(only: list | None = None, out=sys.stderr) -> dict:
    """Build what is missing for the pinned versions (under a lock) and return the build info."""
    info = load_build_info()
    if info is not None and not only:
        return info
    root = cache_root()
    target = build_dir()
    bin_dir = target / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    env = go_env(root)
    gover = go_version(env)
    with open(root / f"{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        info = load_build_info()
        if info is not None and not only:
            return info
        partial_path = target / "build-partial.json"
        partial = json.loads(partial_path.read_text()) if partial_path.is_file() else {}
        with open(target / "build.log", "a") as log:
            for component in components():
                if only and component.name not in only:
                    continue
                done = partial.get(component.name)
                if done and all((bin_dir / b).is_file() for b in component.binaries):
                    continue
                print(f"controlplane: building {component.name} {component.version} ...", file=out, flush=True)
                result = build_component(component, bin_dir, target / "work" / component.name, env, log)
                result["version"] = component.version
                result["module"] = component.module
                partial[component.name] = result
                partial_path.write_text(json.dumps(partial, indent=2))
                print(f"controlplane: {component.name} built in {result['seconds']} s", file=out, flush=True)
        if only and set(partial) != {c.name for c in components()}:
            return {"components": partial}
        info = {
            "versions": versions.pins(),
            "go": gover,
            "components": partial,
            "binaries": {
                name: str(bin_dir / name) for c in components() for name in c.binaries
            },
        }
        (target / BUILD_INFO).write_text(json.dumps(info, indent=2))
        return info


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--print", action="store_true", help="print the build folder and exit")
    parser.add_argument("--only", action="append", help="build only this component (repeatable)")
    args = parser.parse_args(argv)
    if args.print:
        print(build_dir())
        return 0
    start = time.monotonic()
    try:
        info = ensure_built(args.only)
    except BuildUnavailable as exc:
        print(f"controlplane: cannot build: {exc}", file=sys.stderr)
        return 1
    for name, comp in info["components"].items():
        print(f"{name:12} {comp['version']:10} built in {comp['seconds']} s")
    print(f"done in {time.monotonic() - start:.1f} s; binaries in {build_dir() / 'bin'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
