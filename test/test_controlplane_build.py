"""The control plane's build cache keeps one build: the one of the pinned versions."""

from controlplane import build


def test_prune_other_builds_keeps_the_pinned_build_and_the_go_caches(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    cache.mkdir()
    monkeypatch.setenv(build.CACHE_ENV, str(cache))
    current = build.build_dir()
    (current / "bin").mkdir(parents=True)
    (cache / f"{current.name}.lock").touch()
    (cache / "go" / "pkg").mkdir(parents=True)
    old = cache / "a13ef174cc95"
    (old / "bin").mkdir(parents=True)
    (old / "bin" / "kube-apiserver").write_bytes(b"\0" * 16)
    (cache / "a13ef174cc95.lock").touch()
    (cache / "notes-by-hand").mkdir()

    removed = build.prune_other_builds()

    assert sorted(removed) == ["a13ef174cc95", "a13ef174cc95.lock"]
    assert sorted(p.name for p in cache.iterdir()) == sorted(
        [current.name, f"{current.name}.lock", "go", "notes-by-hand"]
    )
    assert (current / "bin").is_dir()
