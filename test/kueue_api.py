"""The Kueue API version a test writes its queues in: the one the server serves, preferred first, as
the product picks it (a real Kueue v0.20 serves only v1beta2; Kueue before v0.15 only v1beta1)."""

from kubernetes import client

from nemo_kubeflow.constants import KUEUE_GROUP, KUEUE_VERSIONS, KUEUE_VISIBILITY_GROUP


def kueue_version(api_client) -> str:
    groups = client.ApisApi(api_client).get_api_versions().groups or []
    served = next(([v.version for v in g.versions] for g in groups if g.name == KUEUE_GROUP), [])
    found = next((v for v in KUEUE_VERSIONS if v in served), None)
    assert found, f"the server serves no Kueue version we read ({KUEUE_GROUP}: {served})"
    return found


def kueue_api_version(api_client) -> str:
    return f"{KUEUE_GROUP}/{kueue_version(api_client)}"


def serves_kueue_visibility(api_client) -> bool:
    """Whether the server's discovery lists Kueue's visibility API (an aggregated API server's group, there only
    while its APIService is available): where it does, a waiting task's status says its place in its LocalQueue."""
    groups = client.ApisApi(api_client).get_api_versions().groups or []
    return any(g.name == KUEUE_VISIBILITY_GROUP for g in groups)
