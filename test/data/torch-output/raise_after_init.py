"""Rank FAIL_RANK (1 unless set) raises ValueError after dist.init_process_group("gloo"); the others wait in a
barrier."""

import os

import torch.distributed as dist

dist.init_process_group("gloo")
if dist.get_rank() == int(os.environ.get("FAIL_RANK", "1")):
    raise ValueError(f"S3BOOM: rank {dist.get_rank()} got a bad batch")
dist.barrier()
