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

The components are built in two groups, each in a generated, throw-away main module in
`<versions-hash>/work/<group>` that requires the group's modules at their pinned versions and turns each
local-path `replace` line of theirs (k8s.io/kubernetes' `./staging/src/k8s.io/api`, etcd server's
`../api`) into the published module at the matching version:

- `kubernetes`: kube-apiserver, kube-controller-manager, kube-scheduler, JobSet, Trainer and Kueue in ONE
  module and ONE `go build` invocation. They all build on Kubernetes v1.36's libraries (k8s.io/api,
  client-go, apiserver, controller-runtime v0.24, ...); in one module graph Go's minimal version
  selection gives each library one version (the newest any of them requires: the k8s.io/* staging
  modules at Kubernetes' own v0.36.3 where JobSet asks for v0.36.0 and Trainer/Kueue for v0.36.2, all
  patch releases of the same minor), so each shared package is compiled once instead of four times.
  That is most of what a cold build costs (docs/real-control-plane.md has the measurements).
- `etcd`: the etcd server on its own, with the dependency versions its release was built with.

The dependency versions are thus each module's own (go.mod) except where a shared library has a
newer patch or minor in the group; `work/<group>/go.mod` after the build shows what was chosen.
(`go install module/cmd/x@version` would do for Trainer, JobSet and Kueue, but it asks the proxy for the
module's version list to check deprecations, which some module proxies refuse; a pinned go.mod does not.)

Compiler flags: `-trimpath`, `-ldflags=-s -w` (no symbol table, no DWARF in the binaries) and
`-gcflags=all=-dwarf=false` (the compiler need not produce the DWARF the linker then drops). Code is
optimised as in a release build: the `real` tests run these binaries, and unoptimised ones are slower.
`work/<group>/trace.json` (`go build -debug-trace`) records where the compile time went.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
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
    #: the build group (one generated main module and one `go build` per group; see the module docstring)
    group: str = "kubernetes"
    #: version given to the published modules that replace the upstream's local-path replaces
    replace_version: str | None = None


K8S_VERSION_PKG = "k8s.io/component-base/version"


def components(kubernetes: str = versions.KUBERNETES) -> list[Component]:
    """The components at their pinned versions; `kubernetes` picks the Kubernetes release (an entry of
    versions.KUBERNETES_MATRIX) of kube-apiserver, kube-controller-manager and kube-scheduler."""
    return [
        Component(
            "jobset",
            "sigs.k8s.io/jobset",
            versions.JOBSET,
            {"jobset-controller-manager": "sigs.k8s.io/jobset"},
        ),
        Component(
            "trainer",
            "github.com/kubeflow/trainer/v2",
            versions.TRAINER,
            {"trainer-controller-manager": "github.com/kubeflow/trainer/v2/cmd/trainer-controller-manager"},
        ),
        Component(
            "kueue",
            "sigs.k8s.io/kueue",
            versions.KUEUE,
            {"kueue-controller-manager": "sigs.k8s.io/kueue/cmd/kueue"},
        ),
        Component(
            "etcd",
            "go.etcd.io/etcd/server/v3",
            versions.ETCD,
            {"etcd": "go.etcd.io/etcd/server/v3"},
            group="etcd",
            replace_version=versions.ETCD,
        ),
        Component(
            "kubernetes",
            "k8s.io/kubernetes",
            kubernetes,
            {
                "kube-apiserver": "k8s.io/kubernetes/cmd/kube-apiserver",
                "kube-controller-manager": "k8s.io/kubernetes/cmd/kube-controller-manager",
                "kube-scheduler": "k8s.io/kubernetes/cmd/kube-scheduler",
            },
            replace_version=versions.staging_version(kubernetes),
        ),
    ]


def ldflags(members: list) -> str:
    flags = ["-s", "-w"]
    kubernetes = next((c.version for c in members if c.name == "kubernetes"), None)
    if kubernetes:
        # what hack/lib/version.sh stamps, so /version reports the real release (the controllers of the
        # group get the same stamp in their copy of component-base; none of them reads it)
        k8s_minor = kubernetes.lstrip("v").split(".")[1]
        flags += [
            f"-X {K8S_VERSION_PKG}.gitVersion={kubernetes}",
            f"-X {K8S_VERSION_PKG}.gitMajor=1",
            f"-X {K8S_VERSION_PKG}.gitMinor={k8s_minor}",
            f"-X {K8S_VERSION_PKG}.gitTreeState=clean",
        ]
    return "-ldflags=" + " ".join(flags)


#: the compiler need not write the DWARF that the linker's -w drops (see the module docstring)
GCFLAGS = "-gcflags=all=-dwarf=false"


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


def _resolve(info: dict, root: Path) -> dict:
    """build-info.json names files relative to the cache root (so a built cache folder can be moved)."""
    info = dict(info)
    info["binaries"] = {name: str(root / path) for name, path in info["binaries"].items()}
    info["components"] = {
        name: dict(comp, module_dir=str(root / comp["module_dir"])) for name, comp in info["components"].items()
    }
    return info


def load_build_info() -> dict | None:
    """The completed build for the pinned versions, or None when it has not been built yet."""
    path = build_dir() / BUILD_INFO
    if not path.is_file():
        return None
    info = _resolve(json.loads(path.read_text()), cache_root())
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
        raise BuildUnavailable(
            f"`go {cmd[1]} ... {cmd[-1]}` failed (exit {proc.returncode}): {lines[-1].strip()} "
            f"(full output in {log.name})"
        )
    return proc.stdout


def download(component: Component, env: dict, cwd: Path, log) -> dict:
    out = _run(
        ["go", "mod", "download", "-json", f"{component.module}@{component.version}"], env, cwd, log, check=False
    )
    try:
        info = json.loads(out)
    except ValueError:
        info = {"Error": out.strip().splitlines()[-1] if out.strip() else "no output"}
    if info.get("Error"):
        raise BuildUnavailable(
            f"cannot download {component.module}@{component.version} from the Go module proxy "
            f"({env.get('GOPROXY')}): {info['Error']}"
        )
    return info


_LOCAL_REPLACE = re.compile(r"^\s*(?:replace\s+)?(\S+)(?:\s+v\S+)?\s+=>\s+(\.\.?/\S*)\s*$")


def generated_go_mod(group: str, upstream_go_mods: list) -> str:
    """A main module that requires the group's components and maps their local-path replaces to published modules.

    `upstream_go_mods` pairs each Component of the group with the text of its go.mod.
    """
    replaces = {}
    go_lines = []
    for component, go_mod in upstream_go_mods:
        for line in go_mod.splitlines():
            if line.startswith("go "):
                go_lines.append(line)
            m = _LOCAL_REPLACE.match(line)
            if not m or "FORBIDDEN" in m.group(2) or component.replace_version is None:
                continue
            replaces[m.group(1)] = f"\t{m.group(1)} => {m.group(1)} {component.replace_version}"
    go_line = max(go_lines or ["go 1.24.0"], key=lambda line: tuple(int(x) for x in line[3:].split(".")))
    names = ", ".join(f"{c.module}@{c.version}" for c, _ in upstream_go_mods)
    requires = "\n".join(f"\t{c.module} {c.version}" for c, _ in upstream_go_mods)
    return (
        "// Generated by nemo_kubeflow's test/controlplane/build.py: a throw-away module to build\n"
        f"// {names} with their local replaces mapped to published modules.\n"
        f"module nemo-kubeflow.test/controlplane/{group}\n\n{go_line}\n\n"
        f"require (\n{requires}\n)\n\nreplace (\n" + "\n".join(replaces[k] for k in sorted(replaces)) + "\n)\n"
    )


def merged_go_sum(module_dirs: list) -> str:
    """The upstream go.sum files, merged: their checksums verify the dependencies without asking the
    checksum database (which does not know every module the proxy serves, e.g. Kueue's
    sigs.k8s.io/scheduler-library); go adds what the merged graph needs beyond them."""
    lines = []
    for module_dir in module_dirs:
        lines += (Path(module_dir) / "go.sum").read_text().splitlines()
    return "\n".join(sorted(set(line for line in lines if line.strip()))) + "\n"


def exec_name(package: str) -> str:
    """The file name `go build -o dir/` gives a main package's binary (the major-version suffix skipped)."""
    parts = package.split("/")
    if len(parts) > 1 and re.fullmatch(r"v[2-9]\d*|v\d{2,}", parts[-1]):
        return parts[-2]
    return parts[-1]


def fetch_group(group: str, members: list, work: Path, env: dict, log) -> dict:
    """Write the group's main module and download what its packages import (network, little CPU)."""
    work.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    modules = [(c, download(c, env, work, log)) for c in members]
    (work / "go.mod").write_text(generated_go_mod(group, [(c, Path(m["GoMod"]).read_text()) for c, m in modules]))
    (work / "go.sum").write_text(merged_go_sum([m["Dir"] for _, m in modules]))
    packages = [pkg for c in members for pkg in c.binaries.values()]
    _run(["go", "list", "-deps", "-f", "", *packages], _module_env(env), work, log)
    return {
        "components": {c.name: {"module_dir": m["Dir"], "version": c.version, "module": c.module} for c, m in modules},
        "seconds": {"download": round(time.monotonic() - start, 1)},
    }


def compile_group(group: str, members: list, bin_dir: Path, work: Path, env: dict, log) -> float:
    """Build the group's binaries in one `go build` (shared packages compiled once, links in parallel)."""
    start = time.monotonic()
    out = work / "bin"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    packages = [pkg for c in members for pkg in c.binaries.values()]
    _run(
        [
            "go",
            "build",
            "-trimpath",
            GCFLAGS,
            ldflags(members),
            f"-debug-trace={work / 'trace.json'}",
            "-o",
            f"{out}/",
            *packages,
        ],
        _module_env(env),
        work,
        log,
    )
    for c in members:
        for name, package in c.binaries.items():
            os.replace(out / exec_name(package), bin_dir / name)
    return round(time.monotonic() - start, 1)


def _module_env(env: dict) -> dict:
    return dict(env, GOFLAGS=env["GOFLAGS"] + " -mod=mod")


def go_version(env: dict) -> str:
    if shutil.which("go") is None:
        raise BuildUnavailable("no Go toolchain on PATH (`go` not found); install Go >= 1.26 to build it")
    return subprocess.run(["go", "env", "GOVERSION"], env=env, capture_output=True, text=True).stdout.strip()


def groups(only: list | None = None) -> dict:
    """Build group name -> its Components (those named in `only`, when given), etcd first (the smaller)."""
    result = {}
    for component in sorted(components(), key=lambda c: c.group != "etcd"):
        if not only or component.name in only:
            result.setdefault(component.group, []).append(component)
    return result


def _relative(path: str, root: Path) -> str:
    return os.path.relpath(path, root)


def ensure_built(only: list | None = None, out=sys.stderr, kubernetes: str | None = None) -> dict:
    """Build what is missing for the pinned versions (under a lock) and return the build info.

    `only` (component names) builds just those, in a module of their own under `<versions-hash>/only/`
    (for measuring: the complete build's binaries stay as they are); the build info is then not written.
    `kubernetes` (default: versions.selected_kubernetes(), an entry of the matrix) other than
    versions.KUBERNETES builds that release's kube-apiserver, kube-controller-manager and kube-scheduler
    on top of the pinned build (see ensure_kubernetes) and returns the build info with those three swapped in.
    """
    kubernetes = kubernetes or versions.selected_kubernetes()
    if kubernetes != versions.KUBERNETES and not only:
        return ensure_kubernetes(kubernetes, ensure_built(out=out, kubernetes=versions.KUBERNETES), out)
    info = load_build_info()
    if info is not None and not only:
        return info
    root = cache_root()
    target = build_dir()
    base = target / "only" if only else target
    bin_dir = base / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    env = go_env(root)
    gover = go_version(env)
    with open(root / f"{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        info = load_build_info()
        if info is not None and not only:
            return info
        cpu_before = _children_cpu()
        started = time.monotonic()
        partial_path = target / "build-partial.json"
        partial = json.loads(partial_path.read_text()) if partial_path.is_file() and not only else {}
        todo = {
            group: members
            for group, members in groups(only).items()
            if not (partial.get(group) and all((bin_dir / b).is_file() for c in members for b in c.binaries))
        }
        logs = {group: open(base / f"build-{group}.log", "a") for group in todo}
        try:
            # every group's downloads start at once; each group compiles (one after the other: the compiler
            # already uses every core) as soon as its downloads are done
            with ThreadPoolExecutor(max_workers=max(1, len(todo))) as pool:
                fetches = {
                    group: pool.submit(fetch_group, group, members, base / "work" / group, env, logs[group])
                    for group, members in todo.items()
                }
                for group, members in todo.items():
                    names = ", ".join(f"{c.name} {c.version}" for c in members)
                    print(f"controlplane: building {group} ({names}) ...", file=out, flush=True)
                    result = fetches[group].result()
                    result["seconds"]["compile"] = compile_group(
                        group, members, bin_dir, base / "work" / group, env, logs[group]
                    )
                    for comp in result["components"].values():
                        comp["module_dir"] = _relative(comp["module_dir"], root)
                    partial[group] = result
                    if not only:
                        partial_path.write_text(json.dumps(partial, indent=2))
                    seconds = result["seconds"]
                    print(
                        f"controlplane: {group} built (download {seconds['download']} s, "
                        f"compile {seconds['compile']} s)",
                        file=out,
                        flush=True,
                    )
        finally:
            for log in logs.values():
                log.close()
        info = {
            "versions": versions.pins(),
            "go": gover,
            # this run's wall clock and the CPU time of every go command it ran: on a busy machine the
            # CPU seconds divided by the cores tell what an idle one would take
            "seconds": round(time.monotonic() - started, 1),
            "cpu_seconds": round(_children_cpu() - cpu_before, 1),
            "groups": {group: result["seconds"] for group, result in partial.items()},
            "components": {name: comp for result in partial.values() for name, comp in result["components"].items()},
            "binaries": {
                name: _relative(str(bin_dir / name), root)
                for members in groups(only).values()
                for c in members
                for name in c.binaries
            },
        }
        if not only:
            (target / BUILD_INFO).write_text(json.dumps(info, indent=2))
        return _resolve(info, root)


def kubernetes_dir(kubernetes: str) -> Path:
    return build_dir() / f"kubernetes-{kubernetes}"


def ensure_kubernetes(kubernetes: str, base: dict, out=sys.stderr) -> dict:
    """Build kube-apiserver, kube-controller-manager and kube-scheduler of another Kubernetes release of the
    matrix (only those: etcd and the Trainer, JobSet and Kueue controllers of `base`, the pinned build, are the
    same on every entry) in a module of its own, `<versions-hash>/kubernetes-<version>/`, and return `base`
    with those three binaries swapped in. Its build-info.json is written last, as the pinned build's."""
    target = kubernetes_dir(kubernetes)
    members = [c for c in components(kubernetes) if c.name == "kubernetes"]
    root = cache_root()
    done = target / BUILD_INFO

    def combined(extra: dict) -> dict:
        extra = _resolve(extra, root)
        info = dict(base, kubernetes=kubernetes)
        info["binaries"] = {**base["binaries"], **extra["binaries"]}
        info["components"] = {**base["components"], **extra["components"]}
        return info

    if done.is_file():
        return combined(json.loads(done.read_text()))
    (target / "bin").mkdir(parents=True, exist_ok=True)
    env = go_env(root)
    # a lock of its own: entries of the matrix build side by side (Go's build cache is safe for that)
    with open(target / "build.lock", "w") as lock, open(target / "build-kubernetes.log", "a") as log:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if done.is_file():
            return combined(json.loads(done.read_text()))
        cpu_before, started = _children_cpu(), time.monotonic()
        print(
            f"controlplane: building kubernetes {kubernetes} (kube-apiserver, kube-controller-manager, "
            "kube-scheduler) ...",
            file=out,
            flush=True,
        )
        result = fetch_group("kubernetes", members, target / "work", env, log)
        result["seconds"]["compile"] = compile_group("kubernetes", members, target / "bin", target / "work", env, log)
        print(
            f"controlplane: kubernetes {kubernetes} built (download {result['seconds']['download']} s, "
            f"compile {result['seconds']['compile']} s)",
            file=out,
            flush=True,
        )
        extra = {
            "kubernetes": kubernetes,
            "go": go_version(env),
            "seconds": round(time.monotonic() - started, 1),
            "cpu_seconds": round(_children_cpu() - cpu_before, 1),
            "groups": {"kubernetes": result["seconds"]},
            "components": {
                name: dict(comp, module_dir=_relative(comp["module_dir"], root))
                for name, comp in result["components"].items()
            },
            "binaries": {name: _relative(str(target / "bin" / name), root) for name in members[0].binaries},
        }
        done.write_text(json.dumps(extra, indent=2))
        return combined(extra)


def prune_other_builds() -> list[str]:
    """Remove the builds of other pinned versions (a version bump leaves the old one behind: about
    500 MiB each). The shared Go caches stay, so going back to those pins recompiles little."""
    root, keep = cache_root(), build_dir().name
    removed = []
    for path in root.glob("*"):
        name = path.name.removesuffix(".lock")
        if name != keep and re.fullmatch(r"[0-9a-f]{12}", name):
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
            removed.append(path.name)
    return removed


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--print", action="store_true", help="print the build folder and exit")
    parser.add_argument("--only", action="append", help="build only this component (repeatable)")
    parser.add_argument(
        "--kubernetes",
        choices=versions.KUBERNETES_MATRIX,
        help=f"the Kubernetes release of the matrix (default: ${versions.KUBERNETES_ENV} or "
        f"{versions.KUBERNETES}); another than {versions.KUBERNETES} adds its three binaries",
    )
    args = parser.parse_args(argv)
    if args.print:
        print(build_dir())
        return 0
    start = time.monotonic()
    try:
        info = ensure_built(args.only, kubernetes=args.kubernetes)
    except (BuildUnavailable, ValueError) as exc:
        print(f"controlplane: cannot build: {exc}", file=sys.stderr)
        return 1
    for name, comp in info["components"].items():
        print(f"{name:12} {comp['version']:10} {comp['module']}")
    for group, seconds in info.get("groups", {}).items():
        print(f"{group:12} download {seconds['download']} s, compile {seconds['compile']} s")
    if "cpu_seconds" in info:
        print(f"the build took {info['seconds']} s, {info['cpu_seconds']} s of CPU")
    if info.get("kubernetes"):
        print(f"kube-apiserver, kube-controller-manager, kube-scheduler: Kubernetes {info['kubernetes']}")
    if not args.only:
        for name in prune_other_builds():
            print(f"removed the build of other pinned versions: {cache_root() / name}")
    print(f"done in {time.monotonic() - start:.1f} s; binaries in {build_dir() / 'bin'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
