"""The local kubelet's and controllers' back-off: doubling from its start to its cap, and still capped after
more restarts than a float's exponent holds (a pod restarting once a second for 17 minutes crashed the
container thread with OverflowError before)."""

from __future__ import annotations

from nemo_kubeflow_local.constants import BACKOFF_MAX, BACKOFF_START, backoff_delay


def test_back_off_doubles_from_its_start_to_its_cap():
    assert [backoff_delay(1.0, 10.0, n) for n in range(1, 7)] == [1.0, 2.0, 4.0, 8.0, 10.0, 10.0]


def test_back_off_after_thousands_of_restarts_is_the_cap():
    assert backoff_delay(BACKOFF_START, BACKOFF_MAX, 1025) == BACKOFF_MAX
    assert backoff_delay(BACKOFF_START, BACKOFF_MAX, 10**6) == BACKOFF_MAX
