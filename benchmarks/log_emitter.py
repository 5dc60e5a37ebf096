"""Log workload run inside the local cluster's pods: ``python log_emitter.py NODE PROC LINES RATE [BATCH]``.

Prints LINES lines at RATE lines/s, each ``LOG <node> <proc> <seq> <unix time>``, one
``write`` per line (atomic on a pipe shared by the processes of a container), or with BATCH
(seconds), every line due in one ``write`` each BATCH seconds, so that 128 pods of it stay cheap
(a bash loop of builtins printing the same lines measured about 1.4% of a core per pod).
Also the small code file that "ours" ships in the other benchmarks.
"""

import os
import sys
import time


def main(node: str, proc: str, lines: int, rate: float, batch: float = 0.0) -> None:
    start = time.time()
    seq = 0
    while seq < lines:
        now = time.time()
        due = min(lines, int((now - start) * rate) + 1) if batch else seq + 1
        if not batch and start + seq / rate > now:
            time.sleep(start + seq / rate - now)
        stamp = f"{time.time():.6f}"
        os.write(1, "".join(f"LOG {node} {proc} {n} {stamp}\n" for n in range(seq, due)).encode())
        seq = due
        if batch and seq < lines:
            time.sleep(batch)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5]) if sys.argv[5:] else 0.0)
