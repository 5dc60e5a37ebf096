"""Capture what transformers' own ``KubeflowCallback`` sends to Trainer's status server, for
test/unit/test_progress_view.py.

Runs transformers' ``Trainer`` (test/framework_workloads.py's ``hf_trainer``: a tiny GPT-2, 12 steps, one
process on the CPU) with the status server's environment set as Trainer's TrainJobStatus plugin sets it in a
pod (``KUBEFLOW_TRAINER_SERVER_URL``, ``..._TOKEN``): transformers then adds its ``KubeflowCallback`` by
itself. The URL is a plain HTTP server in this process that records each request's JSON body (the status
server would apply its ``trainerStatus`` to the TrainJob as is). Run from the repository root, with torch and
the test extra's transformers installed:

    python test/data/transformers-status/capture.py

Writes ``trainer-status.json``: the transformers version, the date, and the bodies in the order sent.
"""

from __future__ import annotations

import datetime
import http.server
import json
import os
import sys
import tempfile
import threading
from pathlib import Path

HERE = Path(__file__).parent
STEPS = 12
#: The callback sends at most every 5 s (its ``_MIN_UPDATE_INTERVAL``): steps this long give a few reports.
STEP_SECONDS = 1.2


def main() -> None:
    bodies: list[dict] = []

    class Recorder(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            bodies.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    with tempfile.TemporaryDirectory() as tmp:
        token = Path(tmp, "token")
        token.write_text("captured")
        os.environ["KUBEFLOW_TRAINER_SERVER_URL"] = f"http://127.0.0.1:{server.server_port}/status"
        os.environ["KUBEFLOW_TRAINER_SERVER_TOKEN"] = str(token)
        sys.path.insert(0, str(HERE.parent.parent))
        import framework_workloads
        import transformers

        framework_workloads.hf_trainer(STEPS, str(Path(tmp, "out")), step_seconds=STEP_SECONDS)
    server.shutdown()
    out = {
        "captured": f"{datetime.date.today()}, transformers {transformers.__version__}, {STEPS} steps of about "
        f"{STEP_SECONDS} s, one process",
        "bodies": bodies,
    }
    Path(HERE, "trainer-status.json").write_text(json.dumps(out, indent=1) + "\n")
    print(f"{len(bodies)} bodies written to {HERE / 'trainer-status.json'}")


if __name__ == "__main__":
    main()
