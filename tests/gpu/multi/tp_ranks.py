"""A tensor-parallel rank: weights in the package pool, warmup steps in transient pools under a
retention scope, NCCL all_reduce and all_gather on tensors of both pools. Writes the rank's
snapshot to OUT/rank<N>.json."""
import json
import os
import sys

import torch
import torch.distributed as dist
import vmmarena

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
torch.cuda.set_device(rank)
vmmarena.use_as_default("package")
storage = vmmarena.Storage(rank)
dist.init_process_group("nccl", device_id=torch.device("cuda", rank))

with storage.package(), storage.tag("weights"):
    weight = torch.full((1024, 1024), float(rank + 1), device="cuda")
dist.all_reduce(weight)
expected = float(sum(range(1, world + 1)))
assert torch.all(weight == expected), f"rank {rank}: all_reduce of package tensor wrong"

with storage.retain_transient_backing():
    for step in range(8):
        with storage.transient(), storage.tag("warmup"):
            x = torch.full((256 * (step % 4 + 1), 1024), float(rank), device="cuda")
            parts = [torch.empty_like(x) for _ in range(world)]
            dist.all_gather(parts, x)
            for r, p in enumerate(parts):
                assert torch.all(p == float(r)), f"rank {rank}: all_gather part {r} wrong"
            y = x @ weight
            dist.all_reduce(y)
            torch.cuda.synchronize()

snap = storage.snapshot()
with open(os.path.join(sys.argv[1], f"rank{rank}.json"), "w") as f:
    json.dump(snap, f)
dist.destroy_process_group()
print(f"rank {rank}: all_reduce and all_gather correct; pool hits {snap['pool']['hits']}")
