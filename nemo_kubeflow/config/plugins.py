"""NeMo-Run plugins (``run.Plugin``) on a ``KubeflowExecutor``: each does here what it does on Slurm, or is refused
at ``exp.add``/``run.run``, before anything reaches the cluster, naming the plugin, what it needs and the fix.

NeMo-Run calls ``plugin.setup(task, executor)`` when a task is added, on the task's clone of the executor
(``Experiment._add_single_job``; registration.py's ``wrap_plugin_setup`` has ``apply`` do it for our executor).
Plugins written for Slurm (Megatron-Bridge's ``megatron.bridge.recipes.run_plugins``, NeMo's) do part of their work
only ``if isinstance(executor, SlurmExecutor)``: on any other executor that part does nothing, and says nothing.
``apply`` runs the plugin's own ``setup`` and then:

* maps a Slurm-only part that has a Kubernetes counterpart (``MAPPED``: Megatron-Bridge's ``PreemptionPlugin``);
* refuses a plugin whose effect would be lost here: an attribute set on the executor that ``KubeflowExecutor``
  does not have (a Slurm setting such as ``signal``), or an nsys profile (NeMo-Run's prefix writes it under the
  submitting machine's job directory, which the pods do not have);
* sends a credential that a plugin copied from the submitting environment into ``env_vars``
  (``WandbPlugin``'s ``WANDB_API_KEY``, ``CometPlugin``'s ``COMET_API_KEY``) as a Secret (``secret_env_vars``
  ``env:NAME``) instead of in the TrainJob's spec and NeMo-Run's saved executor.

Megatron-Bridge's ``FaultTolerancePlugin`` and ``PyTorchProfilerPlugin`` need none of it: the first sets
``launcher=run.FaultTolerance(...)`` and ``retries`` (ft_launcher in every pod, JobSet restarts), the second only
adds the task's arguments. docs/frameworks.md, "Megatron-Bridge", says what each does here.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
from typing import TYPE_CHECKING, Any, Callable, Optional

from nemo_kubeflow.errors import ConfigError

if TYPE_CHECKING:
    from nemo_kubeflow.config.executor import KubeflowExecutor

log = logging.getLogger(__name__)

#: Environment variable names that hold a credential: a plugin that copies one into ``env_vars`` has it sent
#: as a Secret instead.
CREDENTIAL_NAME = re.compile(r"(^|_)(API_?KEY|TOKEN|SECRET|PASSWORD|PASSWD)(_|$)", re.IGNORECASE)


def plugin_name(plugin: Any) -> str:
    """The plugin's class, as users import it (``megatron.bridge.recipes.run_plugins.PreemptionPlugin``)."""
    cls = type(plugin)
    return f"{cls.__module__}.{cls.__qualname__}"


def _preemption(plugin: Any, executor: KubeflowExecutor) -> Optional[str]:
    """Slurm: ``signal=TERM@preempt_time``, SIGTERM ``preempt_time`` s before the time limit. Kubernetes sends
    SIGTERM when it stops a pod (Kueue preemption, a node drain, an eviction, a cancel, ``active_deadline_seconds``)
    and SIGKILL ``terminationGracePeriodSeconds`` later: the grace period is the plugin's ``preempt_time``, at
    least. A refusal, or None."""
    wanted = plugin.preempt_time
    if not isinstance(wanted, int) or isinstance(wanted, bool) or wanted < 1:
        return f"preempt_time={wanted!r}: must be a whole number of seconds, at least 1, e.g. 60"
    grace = executor.termination_grace_period_seconds
    if grace is None:
        executor.termination_grace_period_seconds = wanted
        log.info(
            "%s: preempt_time=%d becomes termination_grace_period_seconds=%d: on preemption, a node drain or an "
            "eviction, the pods get SIGTERM and %d s before SIGKILL",
            type(plugin).__name__,
            wanted,
            wanted,
            wanted,
        )
        return None
    if grace < wanted:
        return (
            f"preempt_time={wanted} asks for {wanted} s between SIGTERM and the end, but the executor's "
            f"termination_grace_period_seconds={grace} kills the pods {grace} s after SIGTERM: set "
            f"termination_grace_period_seconds={wanted} (or more), or preempt_time={grace}"
        )
    return None  # the executor's own grace period gives at least preempt_time


#: Plugins whose Slurm-only part (``isinstance(executor, SlurmExecutor)``) has a counterpart here: their class
#: (``plugin_name``) -> what maps it onto the executor after their own ``setup`` ran (a refusal, or None).
MAPPED: dict[str, Callable[[Any, "KubeflowExecutor"], Optional[str]]] = {
    "megatron.bridge.recipes.run_plugins.PreemptionPlugin": _preemption,
}


def apply(plugin: Any, task: Any, executor: KubeflowExecutor) -> None:
    """Run ``plugin.setup(task, executor)`` as NeMo-Run would, then map or refuse what it did (this module's
    docstring). Raises ``ConfigError`` naming the plugin."""
    fields = {f.name for f in dataclasses.fields(executor)}
    env_before = dict(executor.env_vars)
    plugin.setup(task, executor)
    name = plugin_name(plugin)
    problems = [p for p in (_unknown_attributes(executor, fields), _nsys(executor)) if p]
    if not problems and (mapping := MAPPED.get(name)):
        problems = [p for p in [mapping(plugin, executor)] if p]
    if problems:
        listing = "\n".join(f"  - {p}" for p in problems)
        raise ConfigError(
            f"plugin {name} cannot do its part on KubeflowExecutor:\n{listing}\n"
            f"(or leave {type(plugin).__name__} out of plugins=[...] for this executor)"
        )
    _credentials_as_secrets(name, executor, env_before)


def _unknown_attributes(executor: KubeflowExecutor, fields: set[str]) -> Optional[str]:
    """Public attributes the plugin set that are not fields of ours (e.g. Slurm's ``signal``): they would do
    nothing."""
    unknown = sorted(a for a in vars(executor) if not a.startswith("_") and a not in fields)
    if not unknown:
        return None
    settings = ", ".join(f"executor.{a}={getattr(executor, a)!r}" for a in unknown)
    return (
        f"it set {settings}, which KubeflowExecutor does not have (a setting of another executor, e.g. "
        "SlurmExecutor's): it would do nothing here. Use the KubeflowExecutor field that does the same, if any "
        "(docs/executor.md)"
    )


def _nsys(executor: KubeflowExecutor) -> Optional[str]:
    launcher = executor.launcher
    if launcher is None or isinstance(launcher, str) or not getattr(launcher, "nsys_profile", False):
        return None
    return (
        "it turned on nsys profiling (launcher.nsys_profile), which KubeflowExecutor does not run: NeMo-Run's nsys "
        f"prefix writes the profile under the submitting machine's job directory ({executor.job_dir or 'unset'}), "
        "which the pods do not have, and CPU images have no nsys. Use PyTorchProfilerPlugin (torch's profiler), "
        "or run nsys in your run.Script's own command with -o under a pvc_mounts path"
    )


def _credentials_as_secrets(name: str, executor: KubeflowExecutor, env_before: dict[str, str]) -> None:
    """A credential the plugin copied from this process's environment into ``env_vars`` goes in a Secret
    (``secret_env_vars``, read at submission) instead: never in the TrainJob's spec, nor in the executor that
    NeMo-Run saves to disk."""
    for var, value in list(executor.env_vars.items()):
        copied = env_before.get(var) != value and os.environ.get(var) == value
        if not copied or not CREDENTIAL_NAME.search(var):
            continue
        del executor.env_vars[var]
        if var not in executor.secret_env_vars and var not in executor.secret_key_refs:
            executor.secret_env_vars[var] = f"env:{var}"
        log.info("%s set %s from this environment: it is sent to the pods as a Secret (secret_env_vars)", name, var)
