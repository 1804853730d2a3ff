#!/usr/bin/env python3
"""GPU benchmark: the warmup catalogs of torch_workload.py (a bf16 decoder; each step an eager
forward, a side-stream forward and a captured CUDA graph) under four allocators, each in its
own process with the same seed:

  native       PyTorch's caching allocator
  expandable   the same with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
  vmm-off      vmmarena through the vmmarena package, VMMARENA_RETAIN=off
  vmm-on       vmmarena, VMMARENA_RETAIN=on, the default reuse policy

For each catalog and mode it reports the peak memory held (torch.cuda.max_memory_reserved for
the native modes; for vmmarena its physical_peak_bytes plus whatever PyTorch took outside it,
which should be nothing), the warmup's wall time, both as ratios to native, whether the final
logits equal native's, and the memory held after each step as a series (a PNG per catalog
where matplotlib is installed). Targets: vmmarena's peak <= native (stretch: <= expandable)
and its warmup time below native; logits equal. Prints markdown tables and PASS/MISS lines.

Every worker process starts at once (imports, CUDA, the model); the timed parts then run one
at a time while the others wait idle, so the timings do not overlap.

Usage:
  bench_torch.py OUT.json [--catalog default,ascending,shuffled110|all] [--modes native,...]
                 [--library PATH] [--seed N] [--plot-dir DIR] [--variant NAME=DIR]
                 [--breakdown]
  bench_torch.py --plot OUT.json [--plot-dir DIR]     (redraw the plots from a result)

--variant NAME=DIR adds modes vmm-off@NAME and vmm-on@NAME that import the vmmarena package
from DIR (a folder holding vmmarena/), to compare another version of the package.
--breakdown records, for every step, where PyTorch's segments are at each phase of the step
(by pool and by stream, from torch.cuda.memory._snapshot()) and which blocks outlive it;
its timings are not comparable and are not checked.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cpu_placement  # noqa: E402  (a timed worker's CPUs)
import record_trace  # noqa: E402  (library and package lookup)
import torch_breakdown  # noqa: E402  (the per-phase probe)
import torch_workload  # noqa: E402  (the catalogs)

GIB = float(1 << 30)
MODES = {
    "native": {},
    "expandable": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
    "vmm-off": {"VMMARENA_RETAIN": "off"},
    "vmm-on": {"VMMARENA_RETAIN": "on"},
}
WORKER_TIMEOUT_S = 600
START_TIMEOUT_S = 300  # a worker's imports, CUDA start and model build


# ---- Worker: one catalog under one mode ------------------------------------------------


def base_mode(mode):
    return mode.split("@", 1)[0]


class StepSeries:
    """Observer of the workload: the memory held after each step, and the time from each
    phase of a step to the next (entering the step, the eager forward, the side forward, the
    capture, the replay, leaving the step), summed over the steps. Its own time is counted
    so it can be taken out of the warmup time."""

    def __init__(self, torch, storage):
        self.torch, self.storage = torch, storage
        self.rows = []
        self.own_s = 0.0
        self.phase_s = {}
        self.outside_peak = 0
        self._t = {}

    def outside_vmmarena(self):
        """Bytes PyTorch holds from its own cudaMalloc (its default pool) in a vmmarena run."""
        found = torch_breakdown.default_pool_bytes(self.torch)
        if found is not None:
            self.outside_peak = max(self.outside_peak, found)
        return found

    def held(self):
        if self.storage is None:
            return {"held": self.torch.cuda.memory_reserved(0), "peak": self.torch.cuda.max_memory_reserved(0)}
        totals = self.storage.snapshot()["totals"]
        outside = self.outside_vmmarena() or 0
        return {
            "held": totals["physical_bytes"] + outside,
            "peak": totals["physical_peak_bytes"] + self.outside_peak,
            "outside_vmmarena": outside,
        }

    def __call__(self, step, phase, **info):
        t0 = time.perf_counter()
        if phase != "start":  # the time since the previous phase, per phase, over all steps
            previous = torch_workload.PHASES[torch_workload.PHASES.index(phase) - 1]
            self.phase_s[phase] = self.phase_s.get(phase, 0.0) + t0 - self._t[previous]
        self._t[phase] = t0
        if phase == "end":
            self.rows.append(dict(step=step, **self.held()))
        self.own_s += time.perf_counter() - t0
        self._t[phase] += time.perf_counter() - t0  # the next phase's time leaves this call out


def wait_for_turn(ready, go, timeout, cpus=None):
    """Says this worker is ready, waits for its turn, then moves it onto `cpus` (None: stays)."""
    ready.write_text(str(os.getpid()))
    deadline = time.monotonic() + timeout
    while not go.exists():
        if time.monotonic() > deadline:
            sys.exit(f"worker {os.getpid()}: no turn within {timeout} s")
        time.sleep(0.02)
    cpu_placement.pin(cpus)


def worker(job):
    import torch

    mode, catalog = job["mode"], torch_workload.get(job["catalog"])
    storage = None
    if base_mode(mode).startswith("vmm"):
        storage = record_trace.import_vmmarena(job.get("package")).Storage(0)
    seed = job["seed"]
    model = torch_workload.build_model(torch, storage, seed, catalog)
    torch.cuda.synchronize()
    series = StepSeries(torch, storage)
    if storage is not None:
        series.outside_vmmarena()
    observer = series
    probe = None
    if job.get("breakdown"):
        probe = torch_breakdown.Probe(torch, storage)
        observer = torch_breakdown.both(series, probe)
    wait_for_turn(Path(job["ready"]), Path(job["go"]), WORKER_TIMEOUT_S)

    warmup_s, operands = torch_workload.timed_warmup(torch, model, storage, seed, catalog, observer)
    own_s = series.own_s + (probe.own_s if probe else 0.0)
    if probe:
        probe.finish()
    logits = torch_workload.final_logits(torch, model, storage, seed, catalog)
    end = series.held()
    result = {
        "mode": mode,
        "catalog": catalog.name,
        "warmup_s": warmup_s - own_s,
        "observer_s": own_s,
        "phase_s": series.phase_s,
        "torch_reserved_peak_bytes": torch.cuda.max_memory_reserved(0),
        "graph_operands": len(operands),
        "steps": series.rows,
        "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
    }
    if storage is None:
        result["peak_bytes"] = torch.cuda.max_memory_reserved(0)
    else:
        snap = storage.snapshot()
        result["peak_bytes"] = end["peak"]
        result["vmm_physical_peak_bytes"] = snap["totals"]["physical_peak_bytes"]
        result["outside_vmmarena_peak_bytes"] = series.outside_peak
        result["pool"] = {k: snap["pool"].get(k) for k in ("hits", "misses", "fallbacks", "assemblies", "pooled_taken_apart")}
        result["stray_transient_bytes"] = snap["stray_transient"]["bytes"]
    if probe:
        result["breakdown"] = probe.report()
    import transformers

    result["transformers"] = transformers.__version__
    torch.save(logits, job["logits"])
    Path(job["result"]).write_text(json.dumps(result))


# ---- Parent: start every worker, then give each its turn -------------------------------


def parse_list(text, known, what):
    names = [n for n in text.split(",") if n]
    for n in names:
        if n not in known:
            raise SystemExit(f"unknown {what} {n!r}: choose from {', '.join(known)}")
    return names


def job_env(mode, library):
    env = {k: v for k, v in os.environ.items() if not k.startswith("VMMARENA_") and k != "PYTORCH_CUDA_ALLOC_CONF"}
    env.update(MODES[base_mode(mode)], VMMARENA_LIBRARY=library, PYTHONUNBUFFERED="1")
    return env


def run_jobs(jobs, library, tmp):
    procs = {}
    for i, job in enumerate(jobs):
        job.update({k: str(Path(tmp) / f"{i}.{k}") for k in ("ready", "go", "result", "logits")})
        spec = Path(tmp) / f"{i}.job.json"
        spec.write_text(json.dumps(job))
        procs[i] = subprocess.Popen([sys.executable, __file__, "--worker", str(spec)], env=job_env(job["mode"], library))
    deadline = time.monotonic() + START_TIMEOUT_S
    for i, job in enumerate(jobs):  # every worker ready (idle) before the first turn
        while not Path(job["ready"]).exists() and procs[i].poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
    results = {}
    for i, job in enumerate(jobs):
        name = f"{job['catalog']}/{job['mode']}"
        if not Path(job["ready"]).exists():
            procs[i].kill()
            status = procs[i].wait()
            print(f"== {name}: FAILED before its turn (exit status {status})", flush=True)
            continue
        print(f"== {name}", flush=True)
        start = time.perf_counter()
        Path(job["go"]).write_text("")
        try:
            status = procs[i].wait(timeout=WORKER_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            procs[i].kill()
            status = procs[i].wait()
        if status != 0 or not Path(job["result"]).exists():
            print(f"== {name}: FAILED (exit status {status})", flush=True)
            continue
        result = json.loads(Path(job["result"]).read_text())
        result["turn_s"] = time.perf_counter() - start
        results[(job["catalog"], job["mode"])] = (result, job["logits"])
    return results


def compare_logits(results):
    import torch

    by_catalog = {}
    for (catalog, mode), (result, path) in results.items():
        by_catalog.setdefault(catalog, {})[mode] = (result, torch.load(path))
    out = {}
    for catalog, runs in by_catalog.items():
        native = runs.get("native")
        for mode, (result, logits) in runs.items():
            if native is not None:
                result["max_abs_diff_vs_native"] = float((logits - native[1]).abs().max())
            out.setdefault(catalog, {})[mode] = result
    return out


def machine():
    info = {"date": time.strftime("%Y-%m-%d", time.gmtime())}
    try:
        line = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout.strip()
        info["nvidia_smi"] = line.splitlines()[0] if line else "unavailable"
    except (OSError, subprocess.TimeoutExpired) as e:
        info["nvidia_smi"] = f"unavailable: {e}"
    return info


# ---- Report ------------------------------------------------------------------------------


def ratio(a, b):
    return f"{a / b:.2f}x" if a is not None and b else "-"


def report(runs):
    """Markdown tables and PASS/MISS lines; returns the checks."""
    checks = []
    for catalog, modes in runs.items():
        native, expandable = modes.get("native"), modes.get("expandable")
        print(f"\n### {catalog}: {torch_workload.get(catalog).describe()}\n")
        print("| mode | peak held | vs native | vs expandable | warmup | vs native | logits max abs diff |")
        print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
        for mode, r in modes.items():
            outside = r.get("outside_vmmarena_peak_bytes")
            note = f" (+{outside / GIB:.2f} GiB outside)" if outside else ""
            print(
                f"| {mode} | {r['peak_bytes'] / GIB:.2f} GiB{note} | "
                f"{ratio(r['peak_bytes'], native and native['peak_bytes'])} | "
                f"{ratio(r['peak_bytes'], expandable and expandable['peak_bytes'])} | {r['warmup_s']:.2f} s | "
                f"{ratio(r['warmup_s'], native and native['warmup_s'])} | {r.get('max_abs_diff_vs_native', float('nan')):.3g} |"
            )
        phases = torch_workload.PHASES[1:]
        print(f"\nseconds from the previous phase, summed over the steps: {', '.join(phases)}")
        for mode, r in modes.items():
            got = r.get("phase_s", {})
            print(f"  {mode}: " + " ".join(f"{got.get(p, 0.0):.2f}" for p in phases))
        if native is None:
            continue
        for mode, r in modes.items():
            if not base_mode(mode).startswith("vmm") or r.get("breakdown"):
                continue
            c = {
                "catalog": catalog,
                "mode": mode,
                "peak_le_native": r["peak_bytes"] <= native["peak_bytes"],
                "peak_le_expandable": expandable is not None and r["peak_bytes"] <= expandable["peak_bytes"],
                "time_below_native": r["warmup_s"] < native["warmup_s"],
                "logits_equal": r.get("max_abs_diff_vs_native") == 0.0,
            }
            checks.append(c)
            for key, text in (
                ("peak_le_native", f"peak {r['peak_bytes'] / GIB:.2f} GiB <= native {native['peak_bytes'] / GIB:.2f} GiB"),
                ("time_below_native", f"warmup {r['warmup_s']:.2f} s < native {native['warmup_s']:.2f} s"),
                ("logits_equal", "final logits equal to native"),
            ):
                print(f"{'PASS' if c[key] else 'MISS'} {catalog} {mode}: {text}")
            if expandable is not None:
                text = f"peak <= expandable {expandable['peak_bytes'] / GIB:.2f} GiB (stretch)"
                print(f"{'PASS' if c['peak_le_expandable'] else 'MISS'} {catalog} {mode}: {text}")
    return checks


def plot(data, plot_dir):
    """One PNG per catalog: the memory held after each step and the peak so far, one colour
    per mode."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plots (bench_torch.py --plot OUT.json draws them later)")
        return []
    written = []
    Path(plot_dir).mkdir(parents=True, exist_ok=True)
    for catalog, modes in data["runs"].items():
        fig, ax = plt.subplots(figsize=(9, 4.8))
        for mode, r in modes.items():
            if r.get("breakdown"):
                continue
            steps = [row["step"] for row in r["steps"]]
            held = [row["held"] / GIB for row in r["steps"]]
            line = ax.plot(steps, held, marker=".", label=f"{mode} (peak {r['peak_bytes'] / GIB:.2f} GiB)")[0]
            peak = [row["peak"] / GIB for row in r["steps"]]
            ax.plot(steps, peak, linestyle="--", linewidth=0.8, color=line.get_color())
        ax.set_xlabel("warmup step")
        ax.set_ylabel("GiB held after the step (dashed: peak so far)")
        ax.set_title(f"{catalog}: {data.get('machine', {}).get('nvidia_smi', '')}", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = Path(plot_dir) / f"bench-torch-{catalog}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(str(path))
        print(f"wrote {path}")
    return written


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", nargs="?", help="where to write the JSON results")
    parser.add_argument("--catalog", default="default", help="comma-separated catalog names, or all")
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated modes")
    parser.add_argument("--library", help="path of libvmmarena_torch.so")
    parser.add_argument("--seed", type=int, default=torch_workload.DEFAULT_SEED)
    parser.add_argument("--plot-dir", help="where the PNGs go (default: beside OUT)")
    parser.add_argument("--variant", action="append", default=[], help="NAME=DIR: vmmarena package to compare")
    parser.add_argument("--breakdown", action="store_true", help="record the per-phase breakdown of every step")
    parser.add_argument("--plot", action="store_true", help="only redraw the plots of OUT")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(json.loads(Path(args.worker).read_text()))
        return
    if not args.out:
        parser.error("the output path is required")
    plot_dir = args.plot_dir or str(Path(args.out).resolve().parent)
    if args.plot:
        plot(json.loads(Path(args.out).read_text()), plot_dir)
        return
    catalogs = list(torch_workload.CATALOGS) if args.catalog == "all" else args.catalog.split(",")
    for name in catalogs:
        torch_workload.get(name)
    variants = dict(v.split("=", 1) for v in args.variant)
    known = list(MODES) + [f"{m}@{v}" for v in variants for m in ("vmm-off", "vmm-on")]
    modes = parse_list(args.modes, known, "mode")
    jobs = []
    for catalog in catalogs:
        for mode in modes:
            variant = mode.split("@", 1)[1] if "@" in mode else None
            package = str(Path(variants[variant]).resolve()) if variant else None
            jobs.append({"catalog": catalog, "mode": mode, "seed": args.seed, "package": package, "breakdown": args.breakdown})
    library = record_trace.find_library(args.library)
    with tempfile.TemporaryDirectory() as tmp:
        results = run_jobs(jobs, library, tmp)
        runs = compare_logits(results)
    checks = report(runs)
    data = {"machine": machine(), "seed": args.seed, "runs": runs, "checks": checks}
    first = next((r for modes_ in runs.values() for r in modes_.values()), None)
    if first:
        print(f"\n{first['device']}, torch {first['torch']} (CUDA {first['cuda']}), transformers {first['transformers']}")
    Path(args.out).write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {args.out}")
    if not args.breakdown:
        plot(data, plot_dir)
    if args.breakdown:
        torch_breakdown.print_summary(runs)
    missing = len(jobs) - len(results)
    if missing:
        sys.exit(f"{missing} of {len(jobs)} runs failed")


if __name__ == "__main__":
    main()
