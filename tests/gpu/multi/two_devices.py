"""One process, two devices: an arena per device, peer access granted by VMMARENA_PEER_ACCESS,
copies between the two arenas give the right data."""
import torch
import vmmarena

s0, s1 = vmmarena.Storage(0), vmmarena.Storage(1)
vmmarena.use_as_default("package")
with s0.package():
    a = torch.arange(1 << 22, dtype=torch.float32, device="cuda:0")
with s1.package():
    b = torch.empty(1 << 22, dtype=torch.float32, device="cuda:1")
b.copy_(a)                              # peer copy between the two arenas
assert torch.equal(b.cpu(), a.cpu()), "peer copy mismatch"
c = a.to("cuda:1")
assert torch.equal(c.cpu(), a.cpu()), ".to('cuda:1') mismatch"
snap0, snap1 = s0.snapshot(), s1.snapshot()
assert snap0["device"] == 0 and snap1["device"] == 1
assert snap0["kinds"]["package"]["live_bytes"] >= a.numel() * 4
print("two devices: peer copy and .to() correct;",
      "device 0 holds", snap0["totals"]["physical_bytes"], "bytes, device 1", snap1["totals"]["physical_bytes"])
