"""Log workload run inside the local cluster's pods: ``python log_emitter.py NODE PROC LINES RATE``.

Prints LINES lines at RATE lines/s, each ``LOG <node> <proc> <seq> <unix time>``, one
``write`` per line (atomic on a pipe shared by the processes of a container).
Also the small code file that "ours" ships in the other benchmarks.
"""

import os
import sys
import time


def main(node: str, proc: str, lines: int, rate: float) -> None:
    start = time.time()
    for seq in range(lines):
        due = start + seq / rate
        now = time.time()
        if due > now:
            time.sleep(due - now)
        os.write(1, f"LOG {node} {proc} {seq} {time.time():.6f}\n".encode())


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]))
