"""`nemo-kubeflow doctor` when things are broken: a Secret it may not create."""

import subprocess
import sys

CPU = ["--factory", "kubeflow_cpu", "--set", "shm_size=None"]


def run_doctor(kubeconfig, *argv):
    """Doctor in its own process (bounded: a hang fails the test); its exit code and stdout lines."""
    done = subprocess.run(
        [sys.executable, "-m", "nemo_kubeflow.cli.main", "doctor", *CPU, "--kubeconfig", str(kubeconfig), *argv],
        capture_output=True,
        text=True,
        timeout=120,
    )
    return done.returncode, done.stdout.splitlines()


def test_secret_env_vars_without_create_secrets_fails_with_its_fix(local):
    local.deny("create", "secrets", "default")
    try:
        code, lines = run_doctor(local.kubeconfig_path, "--set", 'secret_env_vars={"HF_TOKEN": "env:HOME"}')
    finally:
        local.allow_all()
    assert code == 1, "\n".join(lines)
    assert (
        "FAIL  may not create secrets in default: no secret_env_vars (their values are sent as a Secret); "
        "fix: ask an admin for RBAC: create secrets in default, or drop secret_env_vars"
    ) in "\n".join(lines)
    assert "check(s) failed" in lines[-1]
