"""vmmarena for PyTorch: package and transient CUDA memory from the vmmarena allocator.

    import torch, vmmarena
    storage = vmmarena.Storage(0)
    with storage.package():
        model = build_model().cuda()          # weights: persistent memory
    with storage.retain_transient_backing():  # the warmup catalog
        for shape in shapes:
            with storage.transient():         # one step: temporaries
                model(torch.randn(shape, device="cuda"))

For the lowest peak, vmmarena can serve every tensor of the process instead (whole-process
mode; docs/torch.md): call `vmmarena.install()` right after `import torch`, before CUDA is
initialized; the same Storage contexts then set the kind and tag of this thread's tensors.

Pure Python over ctypes; libvmmarena_torch.so is found through $VMMARENA_LIBRARY, inside
this package (where `pip install` puts it), or on the loader's path. Importing vmmarena does
not import torch. See docs/torch.md; the command line (`python3 -m vmmarena stat|memviz`) is
in docs/python.md.
"""

from ._lib import (
    VmmarenaConfigError,
    VmmarenaError,
    config_check,
    library_path,
)
from ._lib import last_error as _last_error
from ._lib import snapshot_json as _snapshot_json
from ._process import install, installed
from ._storage import KINDS, Storage, allocator, use_as_default

__all__ = [
    "KINDS",
    "Storage",
    "VmmarenaConfigError",
    "VmmarenaError",
    "allocator",
    "config_check",
    "format_snapshot",
    "install",
    "installed",
    "last_error",
    "library_path",
    "snapshot",
    "use_as_default",
]

__version__ = "0.1.0"


def last_error(device=0):
    """The allocator's message for the latest failure on `device` ("" if none)."""
    return _last_error(device)


def snapshot(device=0):
    """The arena snapshot of `device` as a dict (docs/snapshot.md)."""
    import json

    return json.loads(_snapshot_json(device))


def format_snapshot(snapshot):
    """A snapshot dict (snapshot()) as the tables that `python3 -m vmmarena stat` prints."""
    from ._stat import render

    return render(snapshot)
