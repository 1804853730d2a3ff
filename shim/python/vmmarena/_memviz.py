"""`vmmarena memviz`: an operation trace (docs/trace.md) as the snapshot that PyTorch's memory
tools read (the dict torch.cuda.memory._snapshot() returns), so that a vmmarena run opens in
memory_viz. docs/memviz.md gives the mapping field by field and what has no equivalent.

Each vmmarena mapping is one segment holding one block. No torch import is needed. The trace
is read by the library's own reader (vmm_trace_reader_open, through the shim), the one the
replay tool uses, so both accept and refuse the same files with the same message.
"""

import bisect
import os
import pickle

from . import _lib

# The pickle protocol that memory_viz's own unpickler (MemoryViz.js) reads: 2 to 4.
PICKLE_PROTOCOL = 4

# vmm_kind, in enum order (include/vmmarena.h).
KINDS = ("package", "transient")
NO_TAG = "(no tag)"


class TraceError(ValueError):
    """The trace cannot be read or is inconsistent; the message names the file and the line."""


# ---- Reading ------------------------------------------------------------------------------


def _record(r, status_names):
    """A TraceRecord as the dict the converter reads; status_names maps vmm_status values to
    their names."""
    return {
        "t_ns": r.t_ns,
        "op": _lib.trace_op_name(r.op),
        "kind": KINDS[r.kind] if r.kind >= 0 else None,
        "requested": r.requested,
        "rounded": r.rounded,
        "ptr": r.ptr,
        "stream": r.stream,
        "tag": r.tag.decode("utf-8", errors="replace"),
        "result": status_names[r.result],
        "pool": r.pool,
    }


# What a file that is no trace is told: its first line is not the header.
NO_HEADER = 'no vmmtrace header (a trace begins with the line "vmmtrace 2")'


def escaped_name(path):
    """The path as the library's reader writes it in its messages: printable ASCII as it is,
    '\\' and '"' escaped, every other byte \\xNN (escape_name, src/trace_read.c)."""
    out = []
    for b in os.fsencode(path):
        if b in b'\\"':
            out.append("\\" + chr(b))
        elif 0x20 <= b <= 0x7E:
            out.append(chr(b))
        else:
            out.append(f"\\x{b:02x}")
    return "".join(out)


def lacks_header(path):
    """Whether path is a plain file, not empty, whose first line does not begin with
    "vmmtrace": a text file that is no trace, which the library's reader would answer with
    what is wrong in its first line as a record ("5 fields, expected 10"). Gzip data, an
    empty file and one that cannot be read are left to the reader, whose messages say so.
    vmmarena-replay makes the same check (bench/replay.c), so both tools still agree."""
    try:
        with open(path, "rb") as f:
            head = f.read(len(b"vmmtrace"))
    except OSError:
        return False
    return bool(head) and not head.startswith(b"\x1f\x8b") and head != b"vmmtrace"


def open_trace(path):
    """The library's reader on a plain or gzip trace (the file read and checked whole).
    Raises TraceError with the reader's one-line message, or "NAME: no vmmtrace header (...)"
    for a text file that is no trace."""
    if lacks_header(path):
        raise TraceError(f"{escaped_name(path)}: {NO_HEADER}")
    try:
        return _lib.TraceReader(path)
    except _lib.TraceFileError as e:
        raise TraceError(e.message) from None


# ---- Converting ---------------------------------------------------------------------------


class _Mapping:
    """A vmmarena mapping: one memory_viz segment with one block."""

    __slots__ = ("addr", "size", "stream", "kind", "tag", "requested", "frames", "state", "line")

    def __init__(self, addr, size, stream, kind, tag, requested, frames, line):
        self.addr, self.size, self.stream, self.kind, self.tag = addr, size, stream, kind, tag
        self.requested, self.frames, self.line = requested, frames, line
        self.state = "live"  # live | pooled | abandoned | paused


class Converter:
    """Feeds trace records (in order) into segments and trace entries.

    retention: whether transient frees inside a scope were pooled (the arena's
    retention was enabled); the trace does not record it.
    """

    def __init__(self, device=0, retention=True, source="trace"):
        self.device, self.retention, self.source = device, retention, source
        self.entries = []
        self.mapped = {}  # addr -> _Mapping, every mapping with a VA range mapped
        self.addrs = []  # sorted keys of mapped, for overlap checks
        self.paused = {}  # addr -> _Mapping whose memory a pause took
        self.scope = False
        self.counts = {"records": 0, "skipped_failures": 0, "ooms": 0, "frees_before_trace": 0,
                       "pool_hits": 0, "pooled_dropped": 0, "paused": 0, "resumed": 0, "process_calls": 0,
                       "limits": 0}
        self.warnings = []

    # -- helpers

    def _where(self, line):
        return f"{self.source}: line {line}"

    def _frames(self, kind, tag, line):
        return [{"filename": kind or "vmmarena", "line": line, "name": tag or NO_TAG}]

    def _entry(self, action, addr, size, stream, frames, t_ns):
        self.entries.append({"action": action, "addr": addr, "size": size, "stream": stream,
                             "time_us": t_ns // 1000, "frames": frames})

    def _add(self, m):
        self.mapped[m.addr] = m
        bisect.insort(self.addrs, m.addr)

    def _remove(self, m):
        del self.mapped[m.addr]
        self.addrs.pop(bisect.bisect_left(self.addrs, m.addr))

    def _overlapping(self, addr, size):
        """Mapped mappings that overlap [addr, addr + size)."""
        found = []
        i = bisect.bisect_right(self.addrs, addr) - 1
        if i >= 0 and self.mapped[self.addrs[i]].addr + self.mapped[self.addrs[i]].size > addr:
            found.append(self.mapped[self.addrs[i]])
        j = i + 1
        while j < len(self.addrs) and self.addrs[j] < addr + size:
            found.append(self.mapped[self.addrs[j]])
            j += 1
        return found

    def _release_block(self, m, t_ns):
        self._entry("free_requested", m.addr, m.requested, m.stream, m.frames, t_ns)
        self._entry("free_completed", m.addr, m.requested, m.stream, m.frames, t_ns)

    def _segment_free(self, m, t_ns):
        self._entry("segment_free", m.addr, m.size, m.stream, m.frames, t_ns)
        self._remove(m)

    def _map(self, m, line, t_ns):
        """A new VA range: pooled mappings it overlaps were taken apart (assembly) first."""
        for other in self._overlapping(m.addr, m.size):
            if other.state != "pooled":
                raise TraceError(
                    f"{self._where(line)}: 0x{m.addr:x} (+{m.size}) overlaps the {other.state} mapping at "
                    f"0x{other.addr:x} (+{other.size}) from line {other.line}"
                )
            self._segment_free(other, t_ns)
            self.counts["pooled_dropped"] += 1
        self._add(m)
        self._entry("segment_alloc", m.addr, m.size, m.stream, m.frames, t_ns)

    # -- operations

    def feed(self, line, r):
        self.counts["records"] += 1
        op, t = r["op"], r["t_ns"]
        if r["result"] != "VMM_OK":
            if op == "alloc" and r["result"] == "VMM_ERR_OUT_OF_MEMORY":
                self.counts["ooms"] += 1
                self.entries.append({"action": "oom", "device_free": 0, "size": r["requested"],
                                     "stream": r["stream"], "time_us": t // 1000,
                                     "frames": self._frames(r["kind"], r["tag"], line)})
            else:
                self.counts["skipped_failures"] += 1
            return
        getattr(self, "_" + op.replace("-", "_"))(line, r)

    def _alloc(self, line, r):
        ptr, t = r["ptr"], r["t_ns"]
        frames = self._frames(r["kind"], r["tag"], line)
        m = self.mapped.get(ptr)
        if m is not None and m.state == "pooled" and m.size >= r["rounded"]:
            self.counts["pool_hits"] += 1
            m.state, m.requested, m.frames, m.tag, m.stream, m.line = "live", r["requested"], frames, r["tag"], r["stream"], line
            self._entry("alloc", ptr, m.requested, m.stream, frames, t)
            return
        if m is not None and m.state != "pooled":  # a smaller pooled one was taken apart: _map drops it
            raise TraceError(f"{self._where(line)}: alloc returned 0x{ptr:x}, {m.state} since line {m.line}")
        if ptr in self.paused:
            raise TraceError(f"{self._where(line)}: alloc returned 0x{ptr:x}, paused since line {self.paused[ptr].line}")
        m = _Mapping(ptr, r["rounded"], r["stream"], r["kind"], r["tag"], r["requested"], frames, line)
        self._map(m, line, t)
        self._entry("alloc", ptr, m.requested, m.stream, frames, t)

    def _free(self, line, r):
        ptr, t = r["ptr"], r["t_ns"]
        if ptr in self.paused:  # its memory already went at the pause
            del self.paused[ptr]
            return
        m = self.mapped.get(ptr)
        if m is None or m.state != "live":
            if m is None:
                self.counts["frees_before_trace"] += 1
                return
            raise TraceError(f"{self._where(line)}: free of 0x{ptr:x}, {m.state} since line {m.line}")
        if r["rounded"] != m.size:
            self.warnings.append(f"{self._where(line)}: free of 0x{ptr:x} reports {r['rounded']} B, the alloc {m.size} B")
        self._release_block(m, t)
        if self.scope and self.retention and m.kind == "transient":
            m.state, m.line = "pooled", line
        else:
            self._segment_free(m, t)

    def _begin(self, line, r):
        self.scope = True

    def _finish(self, line, r):
        for m in [m for m in self.mapped.values() if m.state == "pooled"]:
            self._segment_free(m, r["t_ns"])
        self.scope = False

    def _abort(self, line, r):
        for m in self.mapped.values():
            if m.state == "pooled":
                m.state, m.line = "abandoned", line
        self.scope = False

    def _pause(self, line, r):
        taken = [m for m in self.mapped.values() if m.state == "live" and m.tag == r["tag"]]
        for m in taken:
            self._release_block(m, r["t_ns"])
            self._segment_free(m, r["t_ns"])
            m.state, m.line = "paused", line
            self.paused[m.addr] = m
        self.counts["paused"] += len(taken)
        self._check_bytes(line, r, "pause", taken)

    _pause_discard = _pause
    _pause_backup = _pause

    def _resume(self, line, r):
        back = [m for m in self.paused.values() if m.tag == r["tag"]]
        for m in back:
            del self.paused[m.addr]
            m.state = "live"
            self._map(m, line, r["t_ns"])
            self._entry("alloc", m.addr, m.requested, m.stream, m.frames, r["t_ns"])
        self.counts["resumed"] += len(back)
        self._check_bytes(line, r, "resume", back)

    # The calls of whole-process mode (trace version 2) change no allocation: they are counted
    # and make no entry. Graph pools have no equivalent here (segment_pool_id stays (0, 0)), nor
    # has record-stream. The cache of whole-process mode is not modelled (a free outside a scope
    # frees its segment at once), so empty-cache has nothing to drop: the only pooled segments
    # are a scope's, which empty-cache keeps, as the arena does.
    def _process_call(self, line, r):
        self.counts["process_calls"] += 1

    _capture_begin = _process_call
    _capture_end = _process_call
    _release_pool = _process_call
    _empty_cache = _process_call
    _record_stream = _process_call

    # A limit changes no allocation either: counted, no entry (memory_viz has no limit to show).
    def _set_limit(self, line, r):
        self.counts["limits"] += 1

    def _check_bytes(self, line, r, what, mappings):
        total = sum(m.size for m in mappings)
        if total != r["rounded"]:
            tag = r["tag"] or NO_TAG
            self.warnings.append(
                f"{self._where(line)}: {what} of tag {tag!a} reports {r['rounded']} B; the trace's mappings "
                f"of that tag hold {total} B"
            )

    # -- result

    def snapshot(self):
        """The dict of torch.cuda.memory._snapshot() for the state at the end of the trace."""
        segments = []
        for addr in self.addrs:
            m = self.mapped[addr]
            live = m.state == "live"
            block = {"address": addr, "size": m.size, "requested_size": m.requested if live else 0,
                     "state": "active_allocated" if live else "inactive", "frames": m.frames if live else []}
            segments.append({
                "device": self.device, "address": addr, "total_size": m.size,
                "allocated_size": m.size if live else 0, "active_size": m.size if live else 0,
                "requested_size": m.requested if live else 0, "stream": m.stream,
                "segment_type": "large", "segment_pool_id": (0, 0), "is_expandable": False,
                "frames": m.frames, "blocks": [block],
            })
        traces = [[] for _ in range(self.device)] + [self.entries]
        return {"segments": segments, "device_traces": traces, "external_annotations": []}


def convert(path, device=0, retention=True):
    """(snapshot dict, Converter) for the trace at path."""
    with open_trace(path) as reader:
        c = Converter(device=device, retention=retention, source=reader.name)
        status_names = {value: name for name, value in _lib.status_codes().items()}
        for line, record in reader:
            c.feed(line, _record(record, status_names))
    return c.snapshot(), c


def write(snapshot, out):
    """Pickles snapshot to the path `out`."""
    with open(out, "wb") as f:
        pickle.dump(snapshot, f, protocol=PICKLE_PROTOCOL)
