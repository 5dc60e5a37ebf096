"""User code of the time-to-first-step benchmark: prints when it started, then ends.

``FIRST <node> <rank> <unix time>``: the node from torchrun's ``GROUP_RANK`` (or Trainer's
``PET_NODE_RANK`` without torchrun), the global rank from ``RANK`` (0 without torchrun). Imports
nothing beyond what Python starts with, so its own start is the interpreter's.
"""

import os
import sys
import time

now = time.time()
node = os.environ.get("GROUP_RANK") or os.environ.get("PET_NODE_RANK") or "0"
sys.stdout.write(f"FIRST {node} {os.environ.get('RANK', '0')} {now:.6f}\n")
sys.stdout.flush()
