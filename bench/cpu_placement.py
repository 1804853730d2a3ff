"""Where the benchmark's worker processes run on the host.

Timed runs of one mode differ from run to run by far more than the allocators do. In execution
order, slow and fast runs mostly alternate from one worker process to the next (lag-1
autocorrelation of the runs' times -0.24 to 0.30 in 11 of 13 time steps on an H200 and an H100,
2026-12-05; two drifted, 0.58 and 0.72), as if each process drew its host speed when it started:
which cores, which memory node. So every worker is kept on the CPUs next to the GPU (its NUMA
node, from sysfs) while it loads, and each timed run on the same few of them, so that the modes
compared draw alike (--no-pin runs without it).

It does not narrow the spread (one H100 whose 16 CPUs are all local to the GPU, 2026-12-05,
commit d442cfd; docs/benchmarks.md, "Alternatives measured"): six rounds of smallpool each way
in one call varied by 13.3% (native), 13.8% and 13.2% placed against 12.8%, 14.7% and 14.7%
unplaced (coefficient of variation), with a lag-1 autocorrelation of 0.16 placed and 0.45
unplaced (-0.06 to 0.27 in the other time steps of that day's calls, all placed). Whatever a
process draws, it is not which of these CPUs it runs on. The placement stays because it costs
nothing and the JSON then says where every timed run ran.
"""
import glob
import os

TURN_CPUS = 4  # a timed run's main thread, the driver's threads and vmmarena's unmapping thread


def parse_cpulist(text):
    """The CPUs of a kernel CPU list ("0-7,16-23"), sorted; ValueError for anything else."""
    cpus = set()
    for part in text.strip().split(","):
        if not part:
            raise ValueError(f"empty item in CPU list {text!r}")
        first, _, last = part.partition("-")
        lo, hi = int(first), int(last or first)
        if lo < 0 or hi < lo:
            raise ValueError(f"bad range {part!r} in CPU list {text!r}")
        cpus.update(range(lo, hi + 1))
    return sorted(cpus)


def gpu_local_cpus(sysfs="/sys/bus/pci/drivers/nvidia"):
    """The CPUs local to the machine's one NVIDIA GPU, or None (none, several, or unreadable)."""
    lists = glob.glob(os.path.join(sysfs, "*:*", "local_cpulist"))
    if len(lists) != 1:
        return None
    try:
        with open(lists[0]) as f:
            return parse_cpulist(f.read())
    except (OSError, ValueError):
        return None


def core_of(cpu, sysfs="/sys/devices/system/cpu"):
    """The lowest CPU sharing `cpu`'s core (its hyperthread siblings), or `cpu` where unknown."""
    try:
        with open(os.path.join(sysfs, f"cpu{cpu}", "topology", "thread_siblings_list")) as f:
            return min(parse_cpulist(f.read()))
    except (OSError, ValueError):
        return cpu


def plan(allowed, local, core=core_of):
    """(CPUs to load on, CPUs for each timed run, what was chosen) from the CPUs this process may
    use and the GPU's local ones (None: unknown). A timed run gets one CPU of each of the last
    cores (CPU 0 and its neighbours take most interrupts), so that vmmarena's unmapping thread
    need not share a core with the thread it works beside."""
    allowed = sorted(allowed)
    usable = set(allowed)
    near = [c for c in (local or []) if c in usable]
    load = near or allowed
    turn, cores = [], set()
    for cpu in reversed(load):
        c = core(cpu)
        if len(turn) < TURN_CPUS and c not in cores:
            turn.append(cpu)
            cores.add(c)
    turn.sort()
    where = "the GPU's local CPUs" if near else "every CPU allowed (the GPU's local CPUs unknown)"
    return load, turn, f"workers load on {len(load)} CPUs ({where}); each timed run on CPUs {turn}, one a core"


def pin(cpus):
    """Every thread of this process onto `cpus` (threads made later inherit it); None: no change."""
    if not cpus:
        return
    for task in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(task), cpus)
        except (ProcessLookupError, PermissionError):
            pass  # a thread that ended meanwhile, or one the kernel keeps (nothing to do for it)
