#!/usr/bin/env python3
"""Plots the physical memory a trace replay held after every operation, one line per policy.

Usage: plot_replay.py SERIES.csv OUT.png

SERIES.csv is what `vmmarena-replay --plot OUT.png` writes: a header `op,<policy>,...` and one
row per operation with the physical bytes each policy held after it. Exits 3 (and says so) when
matplotlib is not installed (Debian: python3-matplotlib), 2 on bad input.
"""
import csv
import sys

NO_MATPLOTLIB = 3
GIB = float(1 << 30)


def read_series(path):
    with open(path, newline="") as f:
        rows = csv.reader(f)
        header = next(rows, None)
        if not header or header[0] != "op" or len(header) < 2:
            raise ValueError(f"{path}: expected a header 'op,<policy>,...', got {header!r}")
        ops, columns = [], [[] for _ in header[1:]]
        for line_no, row in enumerate(rows, start=2):
            if len(row) != len(header):
                raise ValueError(f"{path}:{line_no}: {len(row)} fields, the header has {len(header)}")
            ops.append(int(row[0]))
            for column, value in zip(columns, row[1:]):
                column.append(int(value) / GIB)
    return ops, dict(zip(header[1:], columns))


def main(argv):
    if len(argv) != 3:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plot_replay.py: matplotlib is not installed (Debian: apt-get install python3-matplotlib)", file=sys.stderr)
        return NO_MATPLOTLIB
    try:
        ops, series = read_series(argv[1])
    except (OSError, ValueError) as e:
        print(f"plot_replay.py: {e}", file=sys.stderr)
        return 2
    fig, ax = plt.subplots(figsize=(11, 6))
    styles = ("-", "--", "-.", ":")  # policies that behave alike draw on top of each other
    for i, (name, gib) in enumerate(series.items()):
        label = f"{name} (peak {max(gib, default=0):.1f} GiB)"
        ax.plot(ops, gib, label=label, linewidth=1.4, linestyle=styles[i % len(styles)])
    ax.set_xlabel("operation (trace order)")
    ax.set_ylabel("physical memory held (GiB)")
    ax.set_title("vmmarena trace replay: physical memory by retention and reuse policy")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper left")
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    fig.tight_layout()
    fig.savefig(argv[2], dpi=120)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
