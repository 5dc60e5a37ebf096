"""The warm-start settings of ft_launcher (``worker_preload``, ``rendezvous_poll_seconds``): refused when
wrong or without ft_launcher (test/test_warm_start.py runs them on the local cluster)."""

import re

import nemo_run as run
import pytest

from nemo_kubeflow import KubeflowExecutor
from nemo_kubeflow.errors import ConfigError

FT = run.FaultTolerance(max_restarts=3, initial_rank_heartbeat_timeout=120, rank_heartbeat_timeout=60)


@pytest.mark.parametrize(
    "settings, expected",
    [
        (
            {"launcher": "ft", "worker_preload": ["torch", "my module"]},
            "worker_preload=['torch', 'my module']: must be a list of module names to import, e.g. ['torch']",
        ),
        ({"launcher": "ft", "worker_preload": "torch"}, "worker_preload='torch': must be a list"),
        (
            {"launcher": "ft", "rendezvous_poll_seconds": 0},
            "rendezvous_poll_seconds=0: must be a number of seconds "
            "from 0.05 to 1, e.g. 0.1; None keeps ft_launcher's 1 s",
        ),
        ({"launcher": "ft", "rendezvous_poll_seconds": 5.0}, "rendezvous_poll_seconds=5.0: must be a number"),
        (
            {"worker_preload": ["torch"]},
            "worker_preload tunes how ft_launcher starts and restarts ranks, but "
            "launcher=None is not ft_launcher: set launcher='ft' (or run.FaultTolerance(...)), or leave it unset",
        ),
        (
            {"launcher": "torchrun", "worker_preload": ["torch"], "rendezvous_poll_seconds": 0.1},
            "worker_preload and rendezvous_poll_seconds tune how ft_launcher starts and restarts ranks, but "
            "launcher='torchrun' is not ft_launcher",
        ),
    ],
)
def test_bad_warm_start_settings_are_refused_before_anything_is_sent(settings, expected):
    with pytest.raises(ConfigError, match=re.escape(expected)):
        KubeflowExecutor(container_image="img", nodes=2, **settings).validate()


def test_warm_start_settings_with_the_ft_launcher_pass():
    KubeflowExecutor(
        container_image="img",
        nodes=2,
        launcher=FT,
        worker_preload=["torch", "megatron.core"],
        rendezvous_poll_seconds=0.1,
    ).validate()
