"""The user-facing packager: which files of a task go to the training pods, read from disk.

:class:`ConfigMapPackager` is a NeMo-Run ``Packager``: its fields say what to ship, and its
:meth:`~ConfigMapPackager.collect` is the only code that reads the task's files from disk: the
``job_dir`` files (serialized configs, with their ``env_vars`` redacted; inline scripts) plus the user
code it selects, as :class:`BundleFile` s. ``nemo_kubeflow.build.packaging`` turns them into ConfigMaps.

No ``from __future__ import annotations``: NeMo-Run's CLI reads ``ConfigMapPackager``'s field annotations
at run time to parse ``run.executor.packager.<field>=`` overrides.
"""

import fnmatch
import functools
import logging
import os
import re
import stat
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Optional, Sequence, Union

import yaml
from nemo_run.core.packaging.base import Packager

from nemo_kubeflow.errors import ConfigError, PackagingError
from nemo_kubeflow.parts import yamlio

logger = logging.getLogger(__name__)


MODES = ("auto", "plain", "sharded")
DEFAULT_EXCLUDE = (
    ".git",
    ".venv",
    "venv",
    "__pycache__",
    "*.pyc",
    ".mypy_cache",
    ".pytest_cache",
    ".ipynb_checkpoints",
    "node_modules",
    ".DS_Store",
)
REDACTED = "<redacted>"


@dataclass(frozen=True)
class BundleFile:
    """One file of the package, at its path relative to the pod workspace."""

    #: POSIX path relative to the workspace: no leading '/', no '.' or '..' components.
    path: str
    data: bytes
    #: 0o644, or 0o755 for executables.
    mode: int = 0o644

    def __post_init__(self) -> None:
        _check_bundle_path(self.path)
        _check_file_mode(self.path, self.mode)


def _check_bundle_path(path: str) -> None:
    # An empty path, or one starting with '/', has an empty first component.
    if any(p in ("", ".", "..") for p in path.split("/")):
        raise PackagingError(
            f"invalid bundle path {path!r}: it must be relative, without '.', '..' or empty components"
        )
    if "\0" in path:
        raise PackagingError(f"invalid bundle path {path!r}: it contains a NUL byte")


def _check_file_mode(path: str, mode: int) -> None:
    if not isinstance(mode, int) or not 0 <= mode <= 0o777:
        raise PackagingError(f"{path}: mode must be a file mode 0o000..0o777, not {mode!r}")


#: Every mention of ``env_vars`` as a word (``secret_env_vars`` is another key: references, not values).
_ENV_VARS = re.compile(r"(?<!\w)env_vars")
#: ``env_vars: {}`` on a line of its own: an empty environment, nothing to redact.
_EMPTY_ENV_VARS = re.compile(r"^[ \t]*env_vars: \{\}[ \t]*$", re.MULTILINE)


def redact_executor_yaml(text: str) -> str:
    """Replace every value of every ``env_vars`` mapping in a serialized executor by "<redacted>".

    Raises ``yaml.YAMLError`` when ``text`` has a non-empty ``env_vars`` and does not parse.
    """
    if len(_ENV_VARS.findall(text)) == len(_EMPTY_ENV_VARS.findall(text)):
        # Every mention is an empty mapping (the usual case): skip the YAML round trip, a few ms a task.
        return text
    return yaml.dump(_redact(yamlio.load(text)), Dumper=yamlio.FastSafeDumper, sort_keys=False)


def _redact(node: object) -> object:
    if isinstance(node, dict):
        return {key: _redact_entry(key, value) for key, value in node.items()}
    if isinstance(node, list):
        return [_redact(v) for v in node]
    return node


def _redact_entry(key: object, value: object) -> object:
    """The value under ``key`` of a mapping, redacted when it is an environment."""
    if key != "env_vars" or not value:
        return _redact(value)
    if isinstance(value, dict):
        return dict.fromkeys(value, REDACTED)
    # Not a mapping, but still the environment: a list of KEY=VALUE or a string.
    return REDACTED


def human_bytes(n: int) -> str:
    if n < 1024:
        return f"{n} B"
    if n < 1024 * 1024:
        return f"{n / 1024:.1f} KiB"
    return f"{n / (1024 * 1024):.1f} MiB"


@dataclass(kw_only=True)
class ConfigMapPackager(Packager):
    """Ships the task's files, and optionally user code, to the pods as ConfigMaps.

    The task's serialized configs (``<task>/configs/``), inline scripts (``scripts/``) and the
    experiment's ``__main__.py`` always go; user code goes under ``code/`` when
    ``include_pattern`` or ``use_git`` selects some. See ``docs/packaging.md``.
    """

    #: Glob patterns of user code to ship under ``code/``, relative to their base path
    #: (``relative_path``); ``**`` matches any number of directories, and a pattern that matches
    #: a directory ships everything below it. Empty: no user code (unless ``use_git``).
    include_pattern: Union[str, list[str]] = field(default_factory=list)

    #: Base path(s) of the patterns, relative to the git toplevel (or the current directory when
    #: not in git). One string applies to every pattern; a list pairs with ``include_pattern``.
    #: Files land at ``code/<path relative to their base path>``.
    relative_path: Union[str, list[str]] = ""

    #: Select the files with ``git ls-files --cached --others --exclude-standard`` under the base
    #: path (working-tree contents, untracked-but-not-ignored files included), then filter them by
    #: ``include_pattern`` when it is set.
    use_git: bool = False

    #: Never shipped: each pattern is matched against every path component (``*.pyc``,
    #: ``node_modules``); a pattern containing ``/`` is matched against the whole relative path.
    exclude: list[str] = field(default_factory=lambda: list(DEFAULT_EXCLUDE))

    #: "plain" (one ConfigMap, files as keys), "sharded" (a tar.gz split across ConfigMaps and
    #: unpacked in the pod) or "auto" (plain when it fits in one ConfigMap, else sharded).
    mode: str = "auto"

    #: The most ConfigMaps a sharded package may use (each holds just under 1 MiB compressed).
    max_shards: int = 16

    #: Refuse any single file larger than this many bytes (None: no limit), so a stray checkpoint
    #: matched by a pattern fails fast instead of being read into memory.
    max_file_bytes: Optional[int] = 16 * 1024 * 1024

    def __post_init__(self) -> None:
        # Checks only: fdl.build re-runs this on every clone, so no I/O here.
        if self.mode not in MODES:
            raise ConfigError(f"ConfigMapPackager.mode must be one of {', '.join(MODES)}, not {self.mode!r}")
        if not _is_positive_int(self.max_shards):
            raise ConfigError(f"ConfigMapPackager.max_shards must be an integer of at least 1, not {self.max_shards!r}")
        if self.max_file_bytes is not None and not _is_positive_int(self.max_file_bytes):
            raise ConfigError(
                f"ConfigMapPackager.max_file_bytes must be a positive integer or None, not {self.max_file_bytes!r}"
            )
        self._check_relative_paths()

    def _check_relative_paths(self) -> None:
        patterns = self._pattern_list()
        if isinstance(self.relative_path, list) and patterns and len(self.relative_path) != len(patterns):
            raise ConfigError(
                "ConfigMapPackager.relative_path, when a list, needs one entry per include_pattern "
                f"({len(self.relative_path)} vs {len(patterns)})"
            )

    def package(self, path: Path, job_dir: str, name: str) -> str:
        # nemo_run only calls Packager.package from its own executors (and HybridPackager), which
        # then expect a tarball; failing loudly beats handing them None.
        raise NotImplementedError(
            "ConfigMapPackager does not build tarballs: the kubeflow_trainer scheduler ships its "
            "files as ConfigMaps (see ConfigMapPackager.collect). Use it only with "
            "KubeflowExecutor."
        )

    def collect(self, *, job_dir: str, base_path: str | None = None) -> list[BundleFile]:
        """Read every file the task needs from disk, sorted by pod path.

        ``base_path`` anchors ``relative_path`` (default: the git toplevel of the current
        directory, else the current directory).

        Raises:
            PackagingError: job_dir missing, a file unreadable or over ``max_file_bytes``, a
                pattern matching nothing, a symlink pointing outside its base path.
        """
        job_dir = os.path.abspath(job_dir)
        if not os.path.isdir(job_dir):
            raise PackagingError(f"job_dir {job_dir} does not exist or is not a directory")
        configs = f"{os.path.basename(job_dir)}/configs/"
        files: dict[str, BundleFile] = {}
        for pod_path, source in self._sources(job_dir, configs, base_path):
            if pod_path in files:
                raise PackagingError(f"two sources for {pod_path}; the second is {source}")
            content, mode = self._read(source)
            data = _as_shipped(content, pod_path, configs, source)
            if data is not None:
                files[pod_path] = BundleFile(path=pod_path, data=data, mode=mode)
        return [files[p] for p in sorted(files)]

    def _sources(self, job_dir: str, configs: str, base_path: str | None) -> Iterator[tuple[str, str]]:
        """(pod path, source file) for each file the task ships, read lazily."""
        main = os.path.join(os.path.dirname(job_dir), "__main__.py")
        if os.path.isfile(main):
            yield "__main__.py", main
        yield from _walk_plain(os.path.join(job_dir, "configs"), configs)
        yield from _walk_plain(os.path.join(job_dir, "scripts"), "scripts/")
        if self.use_git or self._pattern_list():
            base = _code_base(base_path)
            yield from ((f"code/{rel}", source) for rel, source in self._select_code(base))

    def _pattern_list(self) -> list[str]:
        if isinstance(self.include_pattern, str):
            return [self.include_pattern] if self.include_pattern else []
        return list(self.include_pattern)

    def _roots(self, base: str) -> dict[str, list[str]]:
        """Base path -> its patterns (none: everything git lists there)."""
        patterns = self._pattern_list()
        roots: dict[str, list[str]] = {}
        for i, rel in enumerate(self._relative_paths(len(patterns))):
            patterns_here = roots.setdefault(os.path.normpath(os.path.join(base, rel)), [])
            # Empty patterns are placeholders in nemo_run's paired lists: skip, keep the pairing.
            if i < len(patterns) and patterns[i]:
                patterns_here.append(patterns[i])
        return {root: pats for root, pats in roots.items() if pats or self.use_git}

    def _relative_paths(self, pattern_count: int) -> list[str]:
        """The base path of each pattern (at least one): the list given, or the one string repeated."""
        if isinstance(self.relative_path, list):
            return list(self.relative_path)
        return [self.relative_path] * max(1, pattern_count)

    def _select_code(self, base: str) -> list[tuple[str, str]]:
        """(path under code/, source file) for every selected file, across all base paths."""
        selected: dict[str, str] = {}
        for root, patterns in self._roots(base).items():
            for rel, source in self._select_under(root, patterns).items():
                if selected.setdefault(rel, source) != source:
                    raise PackagingError(
                        f"code/{rel} would come from both {selected[rel]} and {source}; "
                        "narrow include_pattern or relative_path"
                    )
        return sorted(selected.items())

    def _select_under(self, root: str, patterns: list[str]) -> dict[str, str]:
        """Path under ``root`` -> source file, for the files ``patterns`` select there (all: none given)."""
        if not os.path.isdir(root):
            raise PackagingError(f"base path {root} does not exist or is not a directory")
        globs = [_Glob(_pattern_under(p, root)) for p in patterns] or [_Glob("**")]
        selector = _Selector(root, globs, self.exclude)
        found = selector.from_git() if self.use_git else selector.from_walk()
        self._check_matched(globs, patterns, root)
        if not found:
            raise PackagingError(f"use_git=True found no files to ship under {root}")
        return found

    def _check_matched(self, globs: list["_Glob"], patterns: list[str], root: str) -> None:
        """Each pattern must have selected a file: one that matches none is a typo or a stale path."""
        for glob, pattern in zip(globs, patterns):
            if not glob.used:
                raise PackagingError(
                    f"include_pattern {pattern!r} matched no files under {root} "
                    f"(use_git={self.use_git}, exclude={self.exclude})"
                )

    def _read(self, source: str) -> tuple[bytes, int]:
        try:
            st = os.stat(source)
            self._check_size(source, st.st_size)
            with open(source, "rb") as fh:
                data = fh.read()
        except OSError as e:
            raise PackagingError(f"cannot read {source}: {e.strerror or e}") from e
        # The file's own permission bits (a 0600 key stays private, a script stays executable): a ConfigMap
        # volume item carries them as its `mode`, the sharded package's tar entry as its mode.
        return data, stat.S_IMODE(st.st_mode) & 0o777

    def _check_size(self, source: str, size: int) -> None:
        if self.max_file_bytes is not None and size > self.max_file_bytes:
            raise PackagingError(
                f"{source} is {human_bytes(size)}, over max_file_bytes "
                f"({human_bytes(self.max_file_bytes)}); exclude it, or put it on a PVC or in the "
                "image"
            )


def _is_positive_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _walk_plain(top: str, prefix: str) -> Iterator[tuple[str, str]]:
    """(``prefix`` + POSIX path relative to ``top``, file) for each file below ``top``; none if it is absent."""
    if not os.path.isdir(top):
        return
    for dirpath, dirnames, filenames in os.walk(top, onerror=_raise_unreadable):
        dirnames.sort()
        rel_dir = os.path.relpath(dirpath, top)
        for name in sorted(filenames):
            rel = name if rel_dir == "." else f"{rel_dir}/{name}"
            yield prefix + rel.replace(os.sep, "/"), os.path.join(dirpath, name)


def _as_shipped(data: bytes, pod_path: str, configs: str, source: str) -> bytes | None:
    """The file's content as shipped: a serialized executor (under ``configs``) with its env_vars redacted,
    or None (not shipped) when it does not parse."""
    if not (pod_path.endswith("_executor.yaml") and pod_path.startswith(configs)):
        return data
    try:
        return redact_executor_yaml(data.decode("utf-8")).encode("utf-8")
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        # It may hold env_vars we cannot find, so it stays home.
        logger.warning(
            "not shipping %s: it does not parse as YAML, so its env_vars cannot be redacted (%s)",
            source,
            e,
        )
        return None


def _raise_unreadable(error: OSError) -> None:
    raise PackagingError(f"cannot list {error.filename}: {error.strerror or error}") from error


def _code_base(base_path: str | None) -> str:
    """What relative_path is relative to: ``base_path``, else the git toplevel of the current directory
    (the current directory outside git)."""
    return os.path.abspath(base_path) if base_path else _git_toplevel(os.getcwd())


@functools.lru_cache(maxsize=64)
def _git_toplevel(cwd: str) -> str:
    """The git toplevel of ``cwd`` (``cwd`` outside git); cached: one subprocess per directory."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--show-toplevel"],
            cwd=cwd,
            capture_output=True,
            text=True,
            check=False,
        )
    except FileNotFoundError:
        return cwd
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else cwd


def _pattern_under(pattern: str, root: str) -> str:
    """``pattern`` relative to ``root``; absolute ones (nemo_run users write those) are rebased."""
    if not os.path.isabs(pattern):
        return pattern
    rel = os.path.relpath(pattern, root)
    if rel == ".." or rel.startswith("../"):
        raise PackagingError(f"include_pattern {pattern!r} is outside its base path {root}")
    return rel


_SELECTED = 1  # the path, or one of its directories, matches the whole pattern
_BELOW = 2  # the path is a directory the pattern may still match something inside


def _glob_parts(pattern: str) -> tuple[str, ...]:
    """The pattern's components, without empty or '.' ones, and a run of '**' as one (it matches the same)."""
    parts: list[str] = []
    for part in pattern.replace(os.sep, "/").split("/"):
        if part in ("", ".") or (part == "**" and parts and parts[-1] == "**"):
            continue
        parts.append(part)
    return tuple(parts)


class _Glob:
    """A glob matched component by component, so whole directories can be pruned while walking."""

    def __init__(self, pattern: str):
        self.parts = _glob_parts(pattern)
        self.used = False

    def match(self, path: tuple[str, ...]) -> int:
        return self._match(0, path, 0)

    def _match(self, pi: int, path: tuple[str, ...], i: int) -> int:
        if pi == len(self.parts):
            return _SELECTED
        if i == len(path):
            return _BELOW
        head = self.parts[pi]
        if head == "**":
            return self._match(pi + 1, path, i) | self._match(pi, path, i + 1)
        if fnmatch.fnmatchcase(path[i], head):
            return self._match(pi + 1, path, i + 1)
        return 0


class _Selector:
    """Finds the files under one base path that the globs select and the excludes allow."""

    def __init__(self, root: str, globs: list[_Glob], exclude: Sequence[str]):
        self.root = root
        self.root_real = os.path.realpath(root)
        self.globs = globs
        self.name_excludes = [e for e in exclude if "/" not in e]
        self.path_excludes = [e.strip("/") for e in exclude if "/" in e]

    def from_walk(self) -> dict[str, str]:
        found: dict[str, str] = {}
        self._walk(self.root, (), set(), found)
        return found

    def from_git(self) -> dict[str, str]:
        found: dict[str, str] = {}
        for rel in _git_ls_files(self.root):
            parts = tuple(rel.split("/"))
            source = os.path.join(self.root, *parts)
            if self._excluded_at_or_above(parts):
                continue
            if os.path.lexists(source):  # else deleted in the working tree, still in the index
                self._visit(source, parts, {self.root_real}, found)
        return found

    def _walk(self, directory: str, parts: tuple[str, ...], ancestors: set[str], found: dict[str, str]) -> None:
        real = os.path.realpath(directory)
        if real in ancestors:  # a link back to an ancestor would loop forever
            return
        for entry in _entries(directory):
            rel = parts + (entry.name,)
            if not self._excluded(rel):
                self._visit(entry.path, rel, ancestors | {real}, found)

    def _visit(self, source: str, rel: tuple[str, ...], ancestors: set[str], found: dict[str, str]) -> None:
        """Walk into ``source`` or select it, as far as the globs want it."""
        flags = self._flags(rel)
        if not flags:
            return
        is_dir = os.path.isdir(source)
        if os.path.islink(source):
            self._check_link(source, flags if is_dir else flags & _SELECTED)
        if is_dir:
            self._walk(source, rel, ancestors, found)
        elif flags & _SELECTED and os.path.isfile(source):
            self._select(source, rel, found)

    def _check_link(self, source: str, wanted: int) -> None:
        """A symlink the globs want must point to something that exists inside the base path."""
        if not wanted:
            return
        target = os.path.realpath(source)
        if not _within(target, self.root_real):
            raise PackagingError(
                f"symlink {source} -> {os.readlink(source)} points outside the base path "
                f"{self.root} (to {target}); exclude it, or copy what it points to into the "
                "base path"
            )
        if not os.path.exists(source):
            raise PackagingError(f"symlink {source} -> {os.readlink(source)} is broken")

    def _select(self, source: str, rel: tuple[str, ...], found: dict[str, str]) -> None:
        """Ship ``source`` at ``rel``, and note each glob that selects it as used."""
        for glob in self.globs:
            if not glob.used and glob.match(rel) & _SELECTED:
                glob.used = True
        found["/".join(rel)] = source

    def _flags(self, rel: tuple[str, ...]) -> int:
        flags = 0
        for glob in self.globs:
            flags |= glob.match(rel)
        return flags

    def _excluded_at_or_above(self, parts: tuple[str, ...]) -> bool:
        """Whether an exclude pattern matches the path or one of its directories."""
        return any(self._excluded(parts[: i + 1]) for i in range(len(parts)))

    def _excluded(self, rel: tuple[str, ...]) -> bool:
        name = rel[-1]
        if any(fnmatch.fnmatchcase(name, e) for e in self.name_excludes):
            return True
        joined = "/".join(rel)
        return any(fnmatch.fnmatchcase(joined, e) for e in self.path_excludes)


def _entries(directory: str) -> list[os.DirEntry]:
    """The directory's entries, by name."""
    try:
        return sorted(os.scandir(directory), key=lambda e: e.name)
    except OSError as e:
        raise PackagingError(f"cannot list {directory}: {e.strerror or e}") from e


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _git_ls_files(directory: str) -> list[str]:
    """Working-tree files under ``directory`` that git does not ignore, submodules included."""
    files: list[str] = []
    for rel in sorted(set(_git_listed(directory))):
        rel = rel.rstrip("/")
        if not rel:
            continue
        full = os.path.join(directory, rel)
        # Submodules and nested repositories are listed as one entry: list their own files.
        if os.path.isdir(full) and not os.path.islink(full):
            files += [f"{rel}/{sub}" for sub in _git_ls_files(full)]
        else:
            files.append(rel)
    return files


def _git_listed(directory: str) -> list[str]:
    """What ``git ls-files`` lists in ``directory`` (a submodule as one entry), unsorted, empty names included."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=directory,
            capture_output=True,
            check=False,
        )
    except FileNotFoundError as e:
        raise PackagingError("use_git=True needs the git executable on PATH") from e
    if out.returncode != 0:
        raise PackagingError(
            f"use_git=True but git ls-files failed in {directory}: " + out.stderr.decode(errors="replace").strip()
        )
    return out.stdout.decode("utf-8", errors="surrogateescape").split("\0")


__all__ = ["BundleFile", "ConfigMapPackager", "human_bytes", "redact_executor_yaml"]
