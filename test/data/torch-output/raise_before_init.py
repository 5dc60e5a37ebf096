"""Rank 1 raises ValueError before any process group exists; the other ranks wait to be stopped."""

import os
import time

if os.environ["RANK"] == "1":
    raise ValueError("S3BOOM: rank 1 got a bad batch")
time.sleep(60)
