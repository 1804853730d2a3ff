"""The `vmmarena` command (also `python3 -m vmmarena`).

    vmmarena stat [FILE]                       a snapshot's JSON as tables (FILE or stdin)
    vmmarena memviz TRACE -o OUT.pickle        an operation trace for PyTorch's memory_viz
    vmmarena library                           the path of libvmmarena_torch.so in use
    vmmarena build-allocator [--verbose]       build install()'s native PyTorch allocator ahead
                                               of time (cached); print the built module's path
    vmmarena --version                         the package's version; --help on each command

Exit status: 0 done, 1 an internal failure, 2 bad usage or bad input (with one line on
stderr naming the file and what is wrong), or a library that cannot be loaded (memviz reads
traces with it).
"""

import argparse
import sys

from . import _lib, _memviz, _stat

# `vmmarena stat` with no FILE reads standard input; on a terminal it would wait for a snapshot
# typed in, silently, so it refuses at once.
STDIN_IS_A_TERMINAL = ("vmmarena stat: no FILE and standard input is a terminal; "
                       "give a snapshot file or pipe one in")


def _stat_command(args):
    name = args.file
    if name is None and sys.stdin is not None and sys.stdin.isatty():
        print(STDIN_IS_A_TERMINAL, file=sys.stderr)
        return 2
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


def _build_allocator_command(args):
    from . import _process

    try:
        module = _process.build_native(verbose=args.verbose)
    except _lib.VmmarenaError as e:
        print(f"vmmarena build-allocator: {e}", file=sys.stderr)
        return 2
    print(module.__file__)
    return 0


class _Parser(argparse.ArgumentParser):
    """argparse with its usage errors on one line, naming the command and where help is."""

    def error(self, message):
        self.exit(2, f"{self.prog}: {message} ({self.prog} --help)\n")


def _version():
    from . import __version__

    return __version__


def parser():
    p = _Parser(prog="vmmarena", description="vmmarena command-line tools")
    p.add_argument("--version", action="version", version=f"vmmarena {_version()}",
                   help="print the package's version and exit")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    s = sub.add_parser("stat", help="show a snapshot (vmm_arena_snapshot_json) as tables",
                       description="Show a snapshot (vmmarena.snapshot(), vmm_arena_snapshot_json) as tables.")
    s.add_argument("file", nargs="?", metavar="FILE",
                   help='the JSON document; standard input when absent (and not a terminal) or "-"')
    s.set_defaults(run=_stat_command)
    m = sub.add_parser("memviz", help="convert an operation trace for PyTorch's memory_viz (docs/memviz.md)",
                       description="Convert an operation trace (VMMARENA_TRACE) into the snapshot pickle that "
                       "PyTorch's memory_viz reads (docs/memviz.md).")
    m.add_argument("trace", metavar="TRACE", help="an operation trace (VMMARENA_TRACE), plain or gzip")
    m.add_argument("-o", "--output", required=True, metavar="OUT.pickle", help="where to write the snapshot pickle")
    m.add_argument("--device", type=int, default=0, help="device ordinal the trace belongs to (default 0)")
    m.add_argument("--retention", choices=("on", "off"), default="on",
                   help="whether the traced arena retained (pooled) transient frees inside a scope (default on)")
    m.set_defaults(run=_memviz_command)
    lib = sub.add_parser("library", help="print the path of libvmmarena_torch.so that `import vmmarena` loads",
                         description="Print the path of libvmmarena_torch.so that `import vmmarena` loads.")
    lib.set_defaults(run=_library_command)
    b = sub.add_parser("build-allocator", help="build install()'s native PyTorch allocator ahead of time",
                       description="Build (or find in the cache) the native PyTorch allocator class that "
                       "vmmarena.install() loads, for the installed PyTorch, and print the built module's path. "
                       "The cache is $VMMARENA_NATIVE_CACHE, else $XDG_CACHE_HOME/vmmarena/native, else "
                       "~/.cache/vmmarena/native; a later install() with the same PyTorch and vmmarena needs "
                       "no compiler.")
    b.add_argument("--verbose", action="store_true", help="show the compiler's output")
    b.set_defaults(run=_build_allocator_command)
    return p


def _refuse(prog, message):
    print(f"{prog}: {message} ({prog} --help)", file=sys.stderr)
    return 2


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    args, extra = parser().parse_known_args(argv)
    prog = "vmmarena" + (f" {args.command}" if args.command else "")
    if extra:
        first = extra[0]
        if args.command and argv.index(first) < argv.index(args.command):
            prog = "vmmarena"  # an option before the command is the top level's
        return _refuse(prog, f"unknown option {first}" if first.startswith("-") and first != "-"
                       else f"unexpected argument {first}")
    if args.command is None:
        return _refuse(prog, "no COMMAND given: stat, memviz, library or build-allocator")
    if getattr(args, "device", 0) < 0:
        return _refuse(prog, "--device must be 0 or more")
    return args.run(args)
