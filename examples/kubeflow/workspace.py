"""Read by the `nemo` CLI when it runs from this directory (or below): makes the examples'
entrypoints available as `nemo kubeflow <name>`, e.g.

    cd examples/kubeflow
    nemo kubeflow train run.executor=kubeflow_gpu run.executor.nodes=2 --dryrun

nemo_run loads this file by path, so this directory must be put on sys.path to import
the example modules by name (which is also how the pods import them).
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import train_entrypoint  # noqa: E402,F401  registers `train` under the `kubeflow` namespace
