"""What the Python GPU suites (test_torch.py, test_process_gpu.py) share: checks that hold under
python -O, the arena mapping holding a pointer, child processes of the same file, a calibrated
spin for the stream tests, and the runner that prints a line per test and the summary that
tests/gpu/run tallies. Importing it does not initialize CUDA (install() must come first)."""

import json
import os
import subprocess
import sys
import time
import traceback

import torch

MiB = 1 << 20


def check(condition, message):
    """Raises AssertionError(message) when condition is false. Unlike assert, it stays under
    python -O."""
    if not condition:
        raise AssertionError(message)


def containing(snap, ptr):
    """The mapping of an arena snapshot (whole mapping or page) that holds `ptr`, or None."""
    for m in snap["mappings"]:
        base = int(m["base"], 16)
        if base <= ptr < base + m["extent"]:
            return m
    return None


# ---- Child processes: `script --child MODE ARGS...` prints one RESULT line of JSON ----------


def is_child():
    return len(sys.argv) >= 3 and sys.argv[1] == "--child"


def run_child(script, mode, *args, env=None):
    """Runs `script --child mode args...` with `env` added to this environment; returns its
    RESULT, or raises AssertionError with its output."""
    proc = subprocess.run([sys.executable, os.path.abspath(script), "--child", mode, *args],
                          env=dict(os.environ, **(env or {})), capture_output=True, text=True, timeout=180)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise AssertionError(f"child {mode} {args} {env or {}} failed (rc {proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return json.loads(lines[-1][len("RESULT "):])


def child_main(children):
    """In a child: runs children[mode](*args), prints its RESULT and exits."""
    print("RESULT " + json.dumps(children[sys.argv[2]](*sys.argv[3:])), flush=True)
    sys.exit(0)


# ---- Streams: a calibrated spin, and kernels loaded before the timed part ---------------------


def spin_cycles(ms):
    """torch.cuda._sleep cycles that keep a stream busy for about `ms` milliseconds, timed with
    CUDA events (the clock rate varies from card to card and with load)."""
    stream = torch.cuda.Stream()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    trial = 20_000_000
    with torch.cuda.stream(stream):
        torch.cuda._sleep(1000)  # the kernel's first launch, outside the timing
        start.record(stream)
        torch.cuda._sleep(trial)
        stop.record(stream)
    stop.synchronize()
    elapsed = start.elapsed_time(stop)
    check(elapsed > 0, f"a spin of {trial} cycles took {elapsed} ms")
    return int(trial * ms / elapsed)


def load_kernels(*streams):
    """Launches, once on each stream, every kernel the cross-stream tests queue behind a spin.
    The first launch of a kernel loads it (CUDA loads modules lazily), and loading can wait for
    the whole device: behind a spinning stream that wait would let the spin finish before the
    free and the reuse, and the test would prove nothing."""
    probe = torch.empty(MiB, dtype=torch.uint8, device="cuda")
    for stream in streams:
        with torch.cuda.stream(stream):
            torch.cuda._sleep(1000)
            probe.fill_(1)
            probe.fill_(2)
    torch.cuda.synchronize()
    check(bool((probe == 2).all()), "the kernel warm-up fill did not land")


# ---- The runner ------------------------------------------------------------------------------


def check_listed(tests, namespace):
    """Every test_ function of a suite's module is in its list of tests."""
    defined = sorted(name for name in namespace if name.startswith("test_"))
    listed = sorted(test.__name__ for test in tests)
    check(defined == listed, f"tests defined but not listed: {sorted(set(defined) - set(listed))}")


def run(suite, tests):
    """Runs each test, printing PASS or FAIL (with the traceback) and its time, then
    "SUITE: N passed, M failed"; returns the exit status."""
    passed = failed = 0
    for test in tests:
        t0 = time.time()
        try:
            test()
            passed += 1
            print(f"PASS {test.__name__} ({time.time() - t0:.1f} s)", flush=True)
        except Exception:
            failed += 1
            print(f"FAIL {test.__name__} ({time.time() - t0:.1f} s)\n{traceback.format_exc()}", flush=True)
    print(f"{suite}: {passed} passed, {failed} failed")
    return 1 if failed else 0
