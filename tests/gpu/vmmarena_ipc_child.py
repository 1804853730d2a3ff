"""The receiving process of test_native_allocator.py's CUDA IPC tests (torch.multiprocessing,
spawn): installs vmmarena first, then reads every tensor it is sent and answers its checksum,
the allocator backend it ran under and its own descriptor count."""
import os


def fds():
    return len(os.listdir("/proc/self/fd"))


def receive(inbox, outbox):
    import torch

    import vmmarena

    vmmarena.install()  # before CUDA is initialized here: the tensors arrive only through inbox
    outbox.put(("ready", torch.cuda.get_allocator_backend(), vmmarena.installed(), fds()))
    while True:
        item = inbox.get()  # a CUDA tensor is opened here: vmmarena's getIpcDevPtr
        if item is None:
            break
        try:
            tag, t = item
            total = float(t.double().sum())
            del t, item
            outbox.put((tag, total, fds(), None))
        except Exception as e:  # noqa: BLE001  (the sender reports it)
            outbox.put(("error", 0.0, fds(), f"{type(e).__name__}: {e}"))
    torch.cuda.synchronize()
    outbox.put(("done", 0.0, fds(), None))
