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

from . import _process, _storage
from ._lib import (
    VmmarenaConfigError,
    VmmarenaError,
    library_path,
)
from ._lib import config_check as _config_check
from ._lib import last_error as _last_error
from ._lib import snapshot_json as _snapshot_json
from ._process import installed
from ._storage import KINDS, allocator

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


# ---- The public boundary of a bad VMMARENA_* value ---------------------------------------
# The entry points that check the environment raise VmmarenaConfigError from here, the function
# the user called: its traceback starts at that call and runs through no private module
# (vmmarena._lib, where the library's answer is read), and its last line names the public
# class (vmmarena.VmmarenaConfigError) with the library's message: the variable, the value and
# the rule the value broke.


def _from_here(error):
    """error with its traceback dropped, to be raised again from the public function."""
    return error.with_traceback(None)


def config_check():
    """Parses the VMMARENA_* environment as the allocator will; raises VmmarenaConfigError (a
    ValueError) naming the variable, the value and the rule if one is bad."""
    try:
        return _config_check()
    except VmmarenaConfigError as e:
        error = e
    raise _from_here(error)


def install():
    try:
        return _process.install()
    except VmmarenaConfigError as e:
        error = e
    raise _from_here(error)


def use_as_default(kind="package"):
    try:
        return _storage.use_as_default(kind)
    except VmmarenaConfigError as e:
        error = e
    raise _from_here(error)


install.__doc__ = _process.install.__doc__
use_as_default.__doc__ = _storage.use_as_default.__doc__


class Storage(_storage.Storage):
    __doc__ = _storage.Storage.__doc__

    def __init__(self, device=None):
        try:
            super().__init__(device)
            return
        except VmmarenaConfigError as e:
            error = e
        raise _from_here(error)
