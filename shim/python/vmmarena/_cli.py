"""The `vmmarena` command (also `python3 -m vmmarena`).

    vmmarena stat [FILE]                       a snapshot's JSON as tables (FILE or stdin)
    vmmarena memviz TRACE -o OUT.pickle        an operation trace for PyTorch's memory_viz
    vmmarena library                           the path of libvmmarena_torch.so in use

Exit status: 0 done, 1 an internal failure, 2 bad usage or bad input (with one line on
stderr naming the file and what is wrong), or a library that cannot be loaded (memviz reads
traces with it).
"""

import argparse
import sys

from . import _lib, _memviz, _stat


def _stat_command(args):
    name = args.file
    try:
        if name in (None, "-"):
            text, name = sys.stdin.buffer.read(), "standard input"
        else:
            with open(name, "rb") as f:
                text = f.read()
    except OSError as e:
        print(f"vmmarena stat: cannot open {name}: {e.strerror}", file=sys.stderr)
        return 2
    try:
        shown = _stat.render(_stat.parse(text))
    except _stat.SnapshotError as e:
        print(f"vmmarena stat: {name}: {e}", file=sys.stderr)
        return 2
    sys.stdout.write(shown)
    return 0


def _memviz_command(args):
    try:
        snapshot, conv = _memviz.convert(args.trace, device=args.device, retention=args.retention == "on")
    except (_memviz.TraceError, _lib.VmmarenaError) as e:
        print(f"vmmarena memviz: {e}", file=sys.stderr)
        return 2
    try:
        _memviz.write(snapshot, args.output)
    except OSError as e:
        print(f"vmmarena memviz: cannot write {args.output}: {e.strerror}", file=sys.stderr)
        return 2
    for w in conv.warnings[:10]:
        print(f"vmmarena memviz: warning: {w}", file=sys.stderr)
    if len(conv.warnings) > 10:
        print(f"vmmarena memviz: {len(conv.warnings) - 10} more warnings", file=sys.stderr)
    c = conv.counts
    live = sum(1 for s in snapshot["segments"] if s["blocks"][0]["state"] == "active_allocated")
    print(
        f"{args.output}: {len(conv.entries)} trace entries from {c['records']} records, "
        f"{len(snapshot['segments'])} segments at the end ({live} allocated); "
        f"{c['pool_hits']} pool hits, {c['ooms']} out-of-memory, {c['skipped_failures']} other failures skipped, "
        f"{c['frees_before_trace']} frees of allocations made before the trace"
        + (f"; {c['process_calls']} whole-process calls (captures, graph pools, empty-cache, record-stream)"
           if c["process_calls"] else "")
        + (f"; {c['limits']} set-limit" if c["limits"] else "")
    )
    return 0


def _library_command(args):
    try:
        print(_lib.library_path())
    except _lib.VmmarenaError as e:
        print(f"vmmarena library: {e}", file=sys.stderr)
        return 2
    return 0


def parser():
    p = argparse.ArgumentParser(prog="vmmarena", description="vmmarena command-line tools")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    s = sub.add_parser("stat", help="show a snapshot (vmm_arena_snapshot_json) as tables")
    s.add_argument("file", nargs="?", metavar="FILE", help='the JSON document; standard input when absent or "-"')
    s.set_defaults(run=_stat_command)
    m = sub.add_parser("memviz", help="convert an operation trace for PyTorch's memory_viz (docs/memviz.md)")
    m.add_argument("trace", metavar="TRACE", help="an operation trace (VMMARENA_TRACE), plain or gzip")
    m.add_argument("-o", "--output", required=True, metavar="OUT.pickle", help="where to write the snapshot pickle")
    m.add_argument("--device", type=int, default=0, help="device ordinal the trace belongs to (default 0)")
    m.add_argument("--retention", choices=("on", "off"), default="on",
                   help="whether the traced arena retained (pooled) transient frees inside a scope (default on)")
    m.set_defaults(run=_memviz_command)
    lib = sub.add_parser("library", help="print the path of libvmmarena_torch.so that `import vmmarena` loads")
    lib.set_defaults(run=_library_command)
    return p


def main(argv=None):
    args = parser().parse_args(argv)
    if getattr(args, "device", 0) < 0:
        print("vmmarena memviz: --device must be 0 or more", file=sys.stderr)
        return 2
    return args.run(args)
