#!/usr/bin/env python3
"""GPU benchmark of whole-process mode (vmmarena.install()): the warmup catalogs of
torch_workload.py run as plain PyTorch code in these modes, each catalog and mode in a
process of its own with the same seed:

  native          PyTorch's caching allocator
  expandable      the same with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
  mempool         vmmarena in MemPool mode through the Storage contexts (VMMARENA_RETAIN=off),
                  as bench_torch.py's vmm-off
  process         vmmarena.install(), then the plain code (VMMARENA_RETAIN=off)
  process-retain  the same inside one retention scope around the catalog (VMMARENA_RETAIN=on)
  process-refill  process with VMMARENA_REFILL=below-peak: a miss below 0.9 of the high-water
                  mark gets one new handle instead of several cached ones (fewer driver calls)
  process-bounded process with VMMARENA_REUSE=bounded:1.25: a pooled mapping up to 1.25x the
                  request is a hit (fewer driver calls, more memory); only when --modes asks
  process-nogrow  process with VMMARENA_GROW=off: no pooled mapping grows in place, each miss
                  is mapped whole in a fresh range (side by side with process); only when
                  --modes asks

For each it reports the physical peak as the allocator's reserved peak (the same measure for
all: torch.cuda.max_memory_reserved for native, expandable and both process modes, where it
answers from vmmarena; vmmarena's physical peak plus what PyTorch took outside it for
mempool), that peak over the live tensor bytes (native's torch.cuda.max_memory_allocated),
the warmup's wall time (and its host time per phase of a step, summed over the steps), the
process's CPU time over the warmup (user + system, every thread: a second measure, which a
busy host's stolen time does not inflate) with the times the kernel took the CPU away, the
driver calls made during the warmup (the arena's per entry point; PyTorch's own cudaMalloc and
cudaFree for native and expandable), and whether the final logits equal native's. Targets (docs/torch.md):
process and process-retain at most 1.10x the live bytes (goal 1.05x), below expandable, and no
slower than native. Prints markdown tables and PASS/MISS lines.

The hot path: pairs of torch._C._cuda_cudaCachingAllocator_raw_alloc / raw_delete (the
binding torch.cuda.caching_allocator_alloc uses) of one size on one stream, after a warm-up,
so every allocation is an exact-size hit, under native and under process; size 0 is the floor
(the binding and PyTorch's wrapper, no allocator work). vmmarena's driver calls during the
timed pairs are counted.

Every worker starts at once (imports, CUDA, the model); the timed parts run one at a time.
The workers load on the CPUs local to the GPU (from sysfs; every CPU allowed where that is
unknown) and each timed part runs on the same four of them, one a core (cpu_placement.py says
why; --no-pin leaves the placement to the kernel).

With --repeat N every catalog runs N rounds, each mode in a process of its own per round, the
modes' order reversed in every other round (so no mode is always first): a mode's warmup is
its fastest round and its peak its highest, and the table lists every round's time, the
median's ratio to native's median and the paired ratio: the median over rounds of the mode's
time over native's in the same round (a slow stretch of the machine weighs on both), with the
range of the rounds' ratios, also per phase of a step; from three rounds the check lines add
the ratios' geometric mean and its 95% interval, which says whether the rounds tell the mode
from native at all (paired_stats.py, which also pools the rounds of several calls' JSON files).
Where expandable did not run, "below expandable" is a SKIP line. The JSON keeps every round's time,
phases and driver calls. The first timed run of a call is the slowest (the device and the host
warm up), so a call begins with one untimed native run of the first catalog (--no-burn-in
leaves it out).

A mode may carry settings of its own: `process:VMMARENA_HANDLE_BOUND=64M` is process with that
variable set (several: `process:A=1:B=2`; a value may hold ':', as in
`process:VMMARENA_REFILL=within-live:1.03`; `{catalog}` in a value becomes the catalog's name), so
that variants run side by side in one call; each is reported under its full name.

Usage: bench_process.py OUT.json [--catalog default,ascending,shuffled110,smallpool|all]
                        [--modes native,...] [--library PATH] [--seed N] [--pairs N] [--no-hotpath]
                        [--repeat N] [--no-burn-in] [--no-pin]
"""
import argparse
import contextlib
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_torch  # noqa: E402  (StepSeries, wait_for_turn, machine)
import cpu_placement  # noqa: E402  (the workers' CPUs)
from paired_stats import KEYS, interval, interval_text, paired, paired_text, round_ratios  # noqa: E402
import record_trace  # noqa: E402  (library and package lookup)
import torch_workload  # noqa: E402  (the catalogs)

GIB = float(1 << 30)
MODES = {
    "native": {},
    "expandable": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
    "mempool": {"VMMARENA_RETAIN": "off"},
    "process": {"VMMARENA_RETAIN": "off"},
    "process-retain": {"VMMARENA_RETAIN": "on"},
    "process-refill": {"VMMARENA_RETAIN": "off", "VMMARENA_REFILL": "below-peak"},
    "process-bounded": {"VMMARENA_RETAIN": "off", "VMMARENA_REUSE": "bounded:1.25"},
    "process-nogrow": {"VMMARENA_RETAIN": "off", "VMMARENA_GROW": "off"},
}
PROCESS_MODES = ("process", "process-retain", "process-refill", "process-bounded", "process-nogrow")
ASKED_ONLY = ("process-bounded", "process-nogrow")  # run only when --modes names them
HOT_MODES = ("native", "process")
HOT_SIZES = (0, 512, 4096, 65536, 1 << 20, 2 << 20, 64 << 20)
TARGET, GOAL = 1.10, 1.05
WORKER_TIMEOUT_S = 600
START_TIMEOUT_S = 300


# ---- Workers --------------------------------------------------------------------------------


def split_mode(mode):
    """A mode's base name and its own settings: "process:A=1:B=x:2" -> ("process", {"A": "1", "B": "x:2"}).
    A setting starts at a ':' followed by NAME=, so a value may hold ':' (VMMARENA_REFILL=within-live:1.03)."""
    base, *settings = re.split(r":(?=[A-Za-z_][A-Za-z0-9_]*=)", mode)
    if ":" in base:
        raise SystemExit(f"mode {mode!r}: expected NAME=VALUE after ':', found {base.partition(':')[2]!r}")
    env = {}
    for s in settings:
        name, eq, value = s.partition("=")
        if not eq or not name:
            raise SystemExit(f"mode {mode!r}: expected NAME=VALUE after ':', found {s!r}")
        env[name] = value
    return base, env


def base_mode(mode):
    return split_mode(mode)[0]


def start_mode(mode):
    """Imports torch for `mode` (installing vmmarena first in the process modes); returns
    (torch, vmmarena or None)."""
    vmm = None
    mode = base_mode(mode)
    if mode in PROCESS_MODES or mode == "mempool":
        vmm = record_trace.import_vmmarena()
    if mode in PROCESS_MODES:
        vmm.install()
    import torch

    return torch, vmm


def catalog_worker(job):
    catalog, seed = torch_workload.get(job["catalog"]), job["seed"]
    torch, vmm = start_mode(job["mode"])
    mode = base_mode(job["mode"])
    storage = vmm.Storage(0) if mode == "mempool" else None
    model = torch_workload.build_model(torch, storage, seed, catalog)
    torch.cuda.synchronize()
    series = bench_torch.StepSeries(torch, storage)
    scope = vmm.Storage(0).retain_transient_backing() if mode == "process-retain" else contextlib.nullcontext()
    bench_torch.wait_for_turn(Path(job["ready"]), Path(job["go"]), WORKER_TIMEOUT_S, job.get("turn_cpus"))

    torch.cuda.synchronize()
    driver_before = vmm.snapshot(0)["driver"] if mode in PROCESS_MODES else None
    own_calls = ("num_device_alloc", "num_device_free")  # PyTorch's own cudaMalloc and cudaFree
    own_before = torch.cuda.memory_stats(0) if mode in ("native", "expandable") else {}
    usage_before = resource.getrusage(resource.RUSAGE_SELF)
    start = time.perf_counter()
    with scope:
        torch_workload.warmup(torch, model, storage, seed, catalog, series)
    torch.cuda.synchronize()
    warmup_s = time.perf_counter() - start - series.own_s
    usage = resource.getrusage(resource.RUSAGE_SELF)
    logits = torch_workload.final_logits(torch, model, storage, seed, catalog)
    result = {
        "mode": job["mode"], "catalog": catalog.name, "round": job["round"], "warmup_s": warmup_s, "observer_s": series.own_s,
        "live_peak_bytes": torch.cuda.max_memory_allocated(0) if mode != "mempool" else None,
        "steps": series.rows, "device": torch.cuda.get_device_name(0), "torch": torch.__version__,
        "phase_s": series.phase_s,  # host time from each phase of a step to the next, summed over the steps
        # the process's CPU time (every thread, the observer's included) and the times the kernel took the CPU away
        "cpu_s": usage.ru_utime + usage.ru_stime - usage_before.ru_utime - usage_before.ru_stime,
        "system_s": usage.ru_stime - usage_before.ru_stime,
        "preempted": usage.ru_nivcsw - usage_before.ru_nivcsw,
    }
    if mode == "mempool":
        result["peak_bytes"] = series.held()["peak"]
    else:
        result["peak_bytes"] = torch.cuda.max_memory_reserved(0)
    if mode in ("native", "expandable"):  # during the warmup, like the arena's driver calls
        stats = torch.cuda.memory_stats(0)
        result["device_calls"] = {k: stats[k] - own_before[k] if k in stats else None for k in own_calls}
    if mode in PROCESS_MODES:
        snap = vmm.snapshot(0)
        result["vmm_physical_peak_bytes"] = snap["totals"]["physical_peak_bytes"]
        result["usage"] = vmm._lib.usage(0)
        # calls and time per entry point during the warmup (the model's loading left out), to see where the time goes
        result["driver"] = {name: {k: e[k] - driver_before.get(name, {}).get(k, 0) for k in ("calls", "failures", "ns")}
                            for name, e in snap["driver"].items()}
        result["pool"] = {k: v for k, v in snap["pool"].items() if k != "buckets"}
    torch.save(logits, job["logits"])
    Path(job["result"]).write_text(json.dumps(result))


def driver_calls(vmm):
    return sum(entry["calls"] for entry in vmm.snapshot(0)["driver"].values()) if vmm else None


def hotpath_worker(job):
    """ns per raw_alloc/raw_delete pair by size, after a warm-up of the same size."""
    torch, vmm = start_mode(job["mode"])
    alloc = torch._C._cuda_cudaCachingAllocator_raw_alloc
    delete = torch._C._cuda_cudaCachingAllocator_raw_delete
    torch.cuda.init()
    stream = torch.cuda.current_stream().cuda_stream
    bench_torch.wait_for_turn(Path(job["ready"]), Path(job["go"]), WORKER_TIMEOUT_S, job.get("turn_cpus"))
    rows = []
    for size in HOT_SIZES:
        for _ in range(200):
            delete(alloc(size, stream))
        calls = driver_calls(vmm)
        start = time.perf_counter_ns()
        for _ in range(job["pairs"]):
            delete(alloc(size, stream))
        ns = (time.perf_counter_ns() - start) / job["pairs"]
        made = driver_calls(vmm) - calls if vmm else None
        rows.append({"size": size, "ns_per_pair": ns, "driver_calls": made})
    Path(job["result"]).write_text(json.dumps({"mode": job["mode"], "rows": rows, "pairs": job["pairs"]}))


# ---- Parent ---------------------------------------------------------------------------------


def job_env(job, library):
    env = {k: v for k, v in os.environ.items() if not k.startswith("VMMARENA_") and k != "PYTORCH_CUDA_ALLOC_CONF"}
    base, own = split_mode(job["mode"])
    env.update(MODES[base], VMMARENA_LIBRARY=library, PYTHONUNBUFFERED="1")
    env.update({k: v.replace("{catalog}", job.get("catalog", "hotpath")) for k, v in own.items()})
    return env


def run_jobs(jobs, library, tmp):
    """Starts every worker, waits until all are ready, then gives each its turn in order;
    returns {job index: result dict} for those that finished."""
    procs = {}
    for i, job in enumerate(jobs):
        job.update({k: str(Path(tmp) / f"{i}.{k}") for k in ("ready", "go", "result", "logits")})
        spec = Path(tmp) / f"{i}.job.json"
        spec.write_text(json.dumps(job))
        procs[i] = subprocess.Popen([sys.executable, __file__, "--worker", str(spec)], env=job_env(job, library))
    deadline = time.monotonic() + START_TIMEOUT_S
    for i, job in enumerate(jobs):
        while not Path(job["ready"]).exists() and procs[i].poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
    results = {}
    for i, job in enumerate(jobs):
        name = f"{job.get('catalog', 'hotpath')}/{job['mode']}"
        if not Path(job["ready"]).exists():
            procs[i].kill()
            print(f"== {name}: FAILED before its turn (exit status {procs[i].wait()})", flush=True)
            continue
        print(f"== {name}", flush=True)
        Path(job["go"]).write_text("")
        try:
            status = procs[i].wait(timeout=WORKER_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            procs[i].kill()
            status = procs[i].wait()
        if status != 0 or not Path(job["result"]).exists():
            print(f"== {name}: FAILED (exit status {status})", flush=True)
            continue
        results[i] = json.loads(Path(job["result"]).read_text())
        print(f"   {summary(results[i])}", flush=True)  # in the log even if a later run is cut short
    return results


def driver_summary(r):
    """The arena's driver time and the entries that took at least 2% of it, if it counted them."""
    drv = r.get("driver")
    if not drv:
        return ""
    total = sum(e["ns"] for e in drv.values()) / 1e9
    top = [kv for kv in sorted(drv.items(), key=lambda kv: -kv[1]["ns"]) if kv[1]["ns"] >= 0.02 * total * 1e9]
    parts = ", ".join(f"{name} {e['calls']} x {e['ns'] / max(e['calls'], 1) / 1e3:.0f} us" for name, e in top)
    refills = (r.get("pool") or {}).get("refills")
    return f"; driver {total:.2f} s ({parts})" + (f", {refills} refills" if refills else "")


def summary(r):
    if "rows" in r:
        return "ns/pair by size: " + ", ".join(f"{row['size']}: {row['ns_per_pair']:.0f}" for row in r["rows"])
    live = r.get("live_peak_bytes")
    held = f"peak {r['peak_bytes'] / GIB:.3f} GiB"
    if live is not None:
        held += f", max_memory_allocated {live / GIB:.3f} GiB"
    phases = r.get("phase_s") or {}
    split = " (" + ", ".join(f"{k} {v:.2f}" for k, v in phases.items()) + ")" if phases else ""
    calls = r.get("device_calls") or {}
    made = f"; cudaMalloc {calls['num_device_alloc']}, cudaFree {calls['num_device_free']}" if calls.get("num_device_alloc") is not None else ""
    return f"{held}, warmup {r['warmup_s']:.2f} s{split}{driver_summary(r)}{made}"


def merge_round(by_mode, r):
    """Folds one round's result into its mode's: the fastest warmup, the median, the highest
    peak, the largest logits difference, every round's time and phases by round."""
    r = dict(r, warmup_rounds=[r["warmup_s"]], warmup_median_s=r["warmup_s"],
             by_round={r["round"]: {k: r[k] for k in ("warmup_s", "phase_s", "cpu_s", "system_s", "preempted", "driver",
                                                        "pool") if k in r}})
    old = by_mode.get(r["mode"])
    if old is None:
        by_mode[r["mode"]] = r
        return
    old["warmup_rounds"] += r["warmup_rounds"]
    old["by_round"].update(r["by_round"])
    old["warmup_s"] = min(old["warmup_s"], r["warmup_s"])
    old["warmup_median_s"] = statistics.median(old["warmup_rounds"])
    for key in ("peak_bytes", "live_peak_bytes", "vmm_physical_peak_bytes", "max_abs_diff_vs_native"):
        if old.get(key) is not None and r.get(key) is not None:
            old[key] = max(old[key], r[key])


def attach_logit_diffs(jobs, results):
    import torch

    native = {jobs[i]["catalog"]: torch.load(jobs[i]["logits"]) for i, r in results.items()
              if "catalog" in jobs[i] and jobs[i]["mode"] == "native" and jobs[i]["round"] == 0}
    for i, r in results.items():
        ref = native.get(jobs[i].get("catalog"))
        if ref is not None:
            r["max_abs_diff_vs_native"] = float((torch.load(jobs[i]["logits"]) - ref).abs().max())


# ---- Report ---------------------------------------------------------------------------------


def ratio(a, b):
    return f"{a / b:.2f}x" if a is not None and b else "-"


def report_catalog(name, modes):
    """The table of one catalog and its PASS/MISS lines; returns the checks."""
    native, expandable = modes.get("native"), modes.get("expandable")
    live = native and native["live_peak_bytes"]
    print(f"\n### {name}: {torch_workload.get(name).describe()}\n")
    print(f"live tensor bytes at peak under native (max_memory_allocated): {live / GIB:.2f} GiB\n" if live else "")
    print("| mode | physical peak | / live bytes | vs expandable | warmup | vs native | median vs native | "
          "paired vs native | rounds | logits max abs diff |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: |")
    for mode, r in modes.items():
        rounds = " ".join(f"{t:.2f}" for t in r.get("warmup_rounds", [r["warmup_s"]]))
        median = r.get("warmup_median_s", r["warmup_s"])
        print(f"| {mode} | {r['peak_bytes'] / GIB:.2f} GiB | {ratio(r['peak_bytes'], live)} | "
              f"{ratio(r['peak_bytes'], expandable and expandable['peak_bytes'])} | {r['warmup_s']:.2f} s | "
              f"{ratio(r['warmup_s'], native and native['warmup_s'])} | "
              f"{ratio(median, native and native.get('warmup_median_s', native['warmup_s']))} | "
              f"{paired_text(r, native)} | {rounds} | "
              f"{r.get('max_abs_diff_vs_native', float('nan')):.3g} |")
    phases = [p for p in torch_workload.PHASES if any(p in x["phase_s"] for r in modes.values()
                                                       for x in r.get("by_round", {}).values())]
    if native and phases:
        print("\nhost time per phase, the median over rounds of the mode's over native's in the same round: "
              + ", ".join(phases))
        for mode, r in modes.items():
            got = [paired(r, native, lambda x, p=p: x["phase_s"].get(p, 0.0)) for p in phases]
            print(f"  {mode}: " + " ".join("-" if g is None else f"{g:.2f}x" for g in got))
    if native and all("cpu_s" in x for r in modes.values() for x in r.get("by_round", {}).values()):
        print("\nCPU time of the process during the warmup (user + system, every thread), paired with native's "
              "rounds; system time and the times the kernel took the CPU away, median over rounds:")
        for mode, r in modes.items():
            rounds = list(r["by_round"].values())
            print(f"  {mode}: {paired_text(r, native, KEYS['cpu'])}; system "
                  f"{statistics.median(x['system_s'] for x in rounds):.2f} s; "
                  f"preempted {statistics.median(x['preempted'] for x in rounds):.0f}")
    checks = []
    for mode, r in modes.items():
        if base_mode(mode) not in PROCESS_MODES or not live:
            continue
        c = {"catalog": name, "mode": mode, "ratio": r["peak_bytes"] / live,
             "below_expandable": None if expandable is None else r["peak_bytes"] < expandable["peak_bytes"],
             "paired_vs_native": paired(r, native)}
        # the paired ratio where rounds were paired, else the fastest round against native's
        c["time_le_native"] = native is not None and (c["paired_vs_native"] <= 1.0 if c["paired_vs_native"] is not None
                                                      else r["warmup_s"] <= native["warmup_s"])
        checks.append(c)
        print(f"{'PASS' if c['ratio'] <= TARGET else 'MISS'} {name} {mode}: peak {c['ratio']:.3f}x the live bytes "
              f"<= {TARGET}x (goal {GOAL}x: {'met' if c['ratio'] <= GOAL else 'not met'})")
        if expandable is None:
            print(f"SKIP {name} {mode}: peak below expandable (expandable not run)")
        else:
            print(f"{'PASS' if c['below_expandable'] else 'MISS'} {name} {mode}: peak below expandable")
        c["round_ratios"] = round_ratios(r, native)
        c["paired_interval"] = interval(c["round_ratios"])
        pairing = "" if c["paired_vs_native"] is None else f", paired with native's rounds {paired_text(r, native)}"
        if c["paired_interval"] is not None:
            pairing += f"; {interval_text(c['round_ratios'])}"
        print(f"{'PASS' if c['time_le_native'] else 'MISS'} {name} {mode}: warmup no slower than native "
              f"(fastest {r['warmup_s']:.2f} s{pairing})")
    return checks


def report_hotpath(hot):
    if not hot:
        return
    print("\n### Hot path: raw_alloc/raw_delete pairs, one size, one stream (exact-size hits)\n")
    print("| size | native ns/pair | vmmarena ns/pair | native over the floor | vmmarena over the floor | "
          "vmmarena driver calls |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: |")
    native, process = (hot.get(m, {"rows": []})["rows"] for m in HOT_MODES)
    by_size = {r["size"]: r for r in process}
    floor_n = next((r["ns_per_pair"] for r in native if r["size"] == 0), 0)
    floor_p = by_size.get(0, {}).get("ns_per_pair", 0)
    for r in native:
        p = by_size.get(r["size"])
        if p is None:
            continue
        print(f"| {r['size']} | {r['ns_per_pair']:.0f} | {p['ns_per_pair']:.0f} | {r['ns_per_pair'] - floor_n:.0f} | "
              f"{p['ns_per_pair'] - floor_p:.0f} | {p['driver_calls']} |")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", nargs="?", help="where to write the JSON results")
    parser.add_argument("--catalog", default="default,ascending,shuffled110,smallpool", help="names, or all")
    parser.add_argument("--modes", default=",".join(m for m in MODES if m not in ASKED_ONLY))
    parser.add_argument("--library", help="path of libvmmarena_torch.so")
    parser.add_argument("--seed", type=int, default=torch_workload.DEFAULT_SEED)
    parser.add_argument("--pairs", type=int, default=20000, help="timed pairs per size on the hot path")
    parser.add_argument("--no-hotpath", action="store_true")
    parser.add_argument("--repeat", type=int, default=1, help="rounds of each catalog (fastest time, highest peak)")
    parser.add_argument("--no-burn-in", action="store_true", help="no untimed native run first")
    parser.add_argument("--no-pin", action="store_true",
                        help="leave the workers where the kernel puts them (by default they load on the GPU's "
                             "local CPUs and each timed run is on the same four of them)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        job = json.loads(Path(args.worker).read_text())
        cpu_placement.pin(job.get("load_cpus"))  # before torch and CUDA start their threads
        (hotpath_worker if job.get("hotpath") else catalog_worker)(job)
        return
    if not args.out:
        parser.error("the output path is required")
    catalogs = list(torch_workload.CATALOGS) if args.catalog == "all" else args.catalog.split(",")
    for name in catalogs:
        torch_workload.get(name)
    modes = [m for m in args.modes.split(",") if m]
    unknown = [m for m in modes if base_mode(m) not in MODES]
    if unknown:
        raise SystemExit(f"unknown mode(s) {', '.join(unknown)}: choose from {', '.join(MODES)}")
    jobs = [] if args.no_hotpath else [{"hotpath": True, "mode": m, "pairs": args.pairs} for m in HOT_MODES]
    if args.repeat < 1:
        parser.error("--repeat takes a positive count")
    if not args.no_burn_in:
        jobs.append({"catalog": catalogs[0], "mode": "native", "seed": args.seed, "round": -1, "burn_in": True})
    jobs += [{"catalog": c, "mode": m, "seed": args.seed, "round": k} for k in range(args.repeat) for c in catalogs
             for m in (modes if k % 2 == 0 else modes[::-1])]
    if not args.no_pin:
        load, turn, placed = cpu_placement.plan(os.sched_getaffinity(0), cpu_placement.gpu_local_cpus())
        for job in jobs:
            job.update(load_cpus=load, turn_cpus=turn)
        print(placed, flush=True)
    library = record_trace.find_library(args.library)
    with tempfile.TemporaryDirectory() as tmp:
        results = run_jobs(jobs, library, tmp)
        attach_logit_diffs(jobs, results)
    runs, hot = {}, {}
    for i, r in sorted(results.items()):
        if jobs[i].get("burn_in"):
            continue
        if jobs[i].get("hotpath"):
            hot[r["mode"]] = r
        else:
            merge_round(runs.setdefault(r["catalog"], {}), r)
    checks = [c for name, by_mode in runs.items() for c in report_catalog(name, by_mode)]
    report_hotpath(hot)
    first = next((r for by_mode in runs.values() for r in by_mode.values()), None)
    if first:
        print(f"\n{first['device']}, torch {first['torch']}")
    data = {"machine": bench_torch.machine(), "seed": args.seed, "runs": runs, "hotpath": hot, "checks": checks,
            "cpus": None if args.no_pin else {"load": jobs[0]["load_cpus"], "turn": jobs[0]["turn_cpus"]}}
    Path(args.out).write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {args.out}")
    if len(results) < len(jobs):
        sys.exit(f"{len(jobs) - len(results)} of {len(jobs)} runs failed")


if __name__ == "__main__":
    main()
