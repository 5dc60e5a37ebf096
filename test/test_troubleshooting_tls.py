"""docs/troubleshooting.md's kubectl table quotes what our client says where kubectl says "certificate signed by
unknown authority": checked here against the client's own error, for a kubeconfig without the CA and for one
with another CA (the local cluster's kubeconfig from another start)."""

import base64
import re

import pytest
import yaml

from nemo_kubeflow.cluster.client import KubernetesCluster
from nemo_kubeflow.errors import ClusterError
from nemo_kubeflow_local.apiserver.tls import make_credentials

ROW = "`Unable to connect to the server: tls: failed to verify certificate: x509: certificate signed by unknown authority`"


def quoted_client_message() -> re.Pattern:
    """The row's "Our client says, ..., `<message>`" as a pattern: `...` any text, `<verb>`/`<kind>` a word."""
    from test_docs import DOCS

    [row] = [line for line in (DOCS / "troubleshooting.md").read_text().splitlines() if line.startswith(f"| {ROW}")]
    quoted = re.search(r"Our client says, for the same cause, `([^`]+)`", row)
    assert quoted, row
    pattern = re.escape(quoted.group(1)).replace(re.escape("..."), ".*")
    pattern = pattern.replace(re.escape("<verb>"), r"\w+").replace(re.escape("<kind>"), r"\w+")
    return re.compile(pattern)


@pytest.mark.parametrize("ca", ["none", "another"])
def test_the_troubleshooting_page_quotes_what_the_client_says_of_an_unknown_ca(local, tmp_path, ca):
    config = yaml.safe_load(local.kubeconfig_path.read_text())
    cluster_entry = config["clusters"][0]["cluster"]
    if ca == "none":
        del cluster_entry["certificate-authority-data"]
    else:
        cluster_entry["certificate-authority-data"] = base64.b64encode(make_credentials().ca_pem).decode()
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump(config))
    with pytest.raises(ClusterError) as error:
        KubernetesCluster(str(kubeconfig), max_attempts=1, backoff=0.01).list("Namespace", None)
    said = str(error.value)
    assert "\n" not in said, said  # one line, as the table quotes it
    assert quoted_client_message().fullmatch(said), said
