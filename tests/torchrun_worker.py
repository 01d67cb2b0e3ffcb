"""Launched by ``torchrun --standalone --nproc-per-node 2`` (tests/test_ranks.py): each rank plans a
small GPT under remat and prints its saved set as one JSON line."""

from __future__ import annotations

import json
import os

import torch.distributed as dist

import remat
from tests.conftest import build


def main() -> None:
    dist.init_process_group("gloo")  # torchrun's environment: rank, world size, rendezvous
    model, inputs = build("gpt", layers=1)
    report = remat.plan(model, *inputs, compiler="eager", plan_cache=False)
    print(json.dumps({"rank": int(os.environ["RANK"]), "saved": sorted(report.saved),
                      "recomputed": sorted(report.recomputed), "plan_cache": report.plan_cache}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
