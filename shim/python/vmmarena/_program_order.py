"""The program's own stream order, heard for whole-process mode (vmmarena.install()).

Memory freed on one stream serves a request on another once the free is known complete, or
once the program itself ordered the second stream after the free. PyTorch's allocator
interface never hears of that order, so install() listens where Python code makes it:
torch.cuda.Event.record (which Stream.record_event and Stream.wait_stream call) takes the
arena's mark of the stream just before the event is recorded, and torch.cuda.Event.wait (which
Stream.wait_event and Stream.wait_stream call) tells the arena, once the wait is queued, that
the waiting stream now comes after that mark (vmm_arena_stream_mark, vmm_arena_stream_waited).

Only streams PyTorch made are heard: torch.cuda.ExternalStream wraps a handle the program may
destroy and make again. An event recorded or waited for from C++ teaches nothing; reuse then
waits for the free to be known complete, as it always may.
"""

from . import _lib

_MARK = "_vmmarena_mark"  # on an event: (device, stream handle, mark) of its last record


def _heard(torch, stream):
    """`stream` when it is a stream PyTorch made, else None."""
    if isinstance(stream, torch.cuda.Stream) and not isinstance(stream, torch.cuda.ExternalStream):
        return stream
    return None


def learn(torch):
    """Makes torch.cuda.Event.record and .wait tell vmmarena the order they make. Once."""
    event = torch.cuda.Event
    if getattr(event.record, "_vmmarena_learns_order", False):
        return
    record, wait = event.record, event.wait
    handle = _lib.lib()
    mark_of, waited = handle.vmm_torch_stream_mark, handle.vmm_torch_stream_waited

    def record_and_mark(self, stream=None):
        stream = torch.cuda.current_stream() if stream is None else stream
        heard = _heard(torch, stream)
        mark = None
        if heard is not None:
            device = heard.device.index
            mark = (device, heard.cuda_stream, mark_of(device, heard.cuda_stream))
        record(self, stream)
        setattr(self, _MARK, mark)

    def wait_and_tell(self, stream=None):
        stream = torch.cuda.current_stream() if stream is None else stream
        wait(self, stream)
        mark, heard = getattr(self, _MARK, None), _heard(torch, stream)
        if mark and mark[2] and heard is not None and heard.device.index == mark[0]:
            waited(mark[0], heard.cuda_stream, mark[1], mark[2])

    for new, old in ((record_and_mark, record), (wait_and_tell, wait)):
        new._vmmarena_learns_order = True
        new.__wrapped__ = old
        new.__doc__ = old.__doc__
    event.record, event.wait = record_and_mark, wait_and_tell
