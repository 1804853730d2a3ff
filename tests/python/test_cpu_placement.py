"""bench/cpu_placement.py, the GPU benchmarks' worker placement, where no GPU is: the kernel's
CPU lists read or refused, the GPU's local CPUs found in a sysfs-like folder (one GPU only),
the plan of load and turn CPUs, and every thread of a process moved by `pin`.

Environment: PYTHONPATH = bench.
"""

import os
import subprocess
import sys
import tempfile
import unittest

import cpu_placement


class ParseCpulist(unittest.TestCase):
    def test_ranges_and_single_cpus(self):
        self.assertEqual(cpu_placement.parse_cpulist("0-3,8,10-11\n"), [0, 1, 2, 3, 8, 10, 11])
        self.assertEqual(cpu_placement.parse_cpulist("5"), [5])

    def test_bad_lists_are_refused(self):
        for text in ("", "1,,2", "3-1", "a", "0-b", "-1"):
            with self.subTest(text=text), self.assertRaises(ValueError):
                cpu_placement.parse_cpulist(text)


class GpuLocalCpus(unittest.TestCase):
    def sysfs(self, lists):
        root = tempfile.mkdtemp()
        for i, text in enumerate(lists):
            os.makedirs(os.path.join(root, f"0000:0{i}:00.0"))
            with open(os.path.join(root, f"0000:0{i}:00.0", "local_cpulist"), "w") as f:
                f.write(text)
        return root

    def test_one_gpu(self):
        self.assertEqual(cpu_placement.gpu_local_cpus(self.sysfs(["8-11\n"])), [8, 9, 10, 11])

    def test_none_several_or_unreadable(self):
        self.assertIsNone(cpu_placement.gpu_local_cpus(self.sysfs([])))
        self.assertIsNone(cpu_placement.gpu_local_cpus(self.sysfs(["0-3", "4-7"])))
        self.assertIsNone(cpu_placement.gpu_local_cpus(self.sysfs(["garbage"])))
        self.assertIsNone(cpu_placement.gpu_local_cpus("/nonexistent/sysfs"))


class Plan(unittest.TestCase):
    def test_the_gpus_node_and_its_last_four(self):
        load, turn, said = cpu_placement.plan(set(range(16)), list(range(8, 16)))
        self.assertEqual(load, list(range(8, 16)))
        self.assertEqual(turn, [12, 13, 14, 15])
        self.assertIn("the GPU's local CPUs", said)

    def test_unknown_or_unusable_local_cpus_fall_back_to_every_allowed_one(self):
        for local in (None, [], [32, 33]):
            with self.subTest(local=local):
                load, turn, said = cpu_placement.plan({0, 1, 2, 3, 4, 5}, local)
                self.assertEqual(load, [0, 1, 2, 3, 4, 5])
                self.assertEqual(turn, [2, 3, 4, 5])
                self.assertIn("unknown", said)

    def test_only_the_allowed_local_cpus(self):
        load, turn, _ = cpu_placement.plan({0, 1, 8, 9}, [8, 9, 10, 11])
        self.assertEqual((load, turn), ([8, 9], [8, 9]))

    def test_one_cpu_a_core(self):
        def apart(cpu):  # CPUs n and n + 8 are one core's two threads
            return cpu % 8

        def neighbours(cpu):  # CPUs 2n and 2n + 1 share a core
            return cpu - cpu % 2

        load, turn, _ = cpu_placement.plan(set(range(16)), None, apart)
        self.assertEqual(turn, [12, 13, 14, 15])
        load, turn, _ = cpu_placement.plan(set(range(16)), None, neighbours)
        self.assertEqual(turn, [9, 11, 13, 15])
        load, turn, _ = cpu_placement.plan({6, 7}, None, neighbours)
        self.assertEqual(turn, [7])


class CoreOf(unittest.TestCase):
    def test_siblings_from_sysfs_or_the_cpu_itself(self):
        root = tempfile.mkdtemp()
        for cpu, siblings in ((3, "2-3\n"), (5, "bad")):
            os.makedirs(os.path.join(root, f"cpu{cpu}", "topology"))
            with open(os.path.join(root, f"cpu{cpu}", "topology", "thread_siblings_list"), "w") as f:
                f.write(siblings)
        self.assertEqual(cpu_placement.core_of(3, root), 2)
        self.assertEqual(cpu_placement.core_of(5, root), 5)
        self.assertEqual(cpu_placement.core_of(7, root), 7)


PIN_CHILD = """
import os, sys, threading
import cpu_placement
def affinities():
    return {tid: os.sched_getaffinity(int(tid)) for tid in os.listdir("/proc/self/task")}
stop = threading.Event()
t = threading.Thread(target=stop.wait)
t.start()
before = affinities()
cpu_placement.pin(None)
print("unchanged", affinities() == before)
cpu_placement.pin([int(sys.argv[1])])
after = affinities()
later = threading.Thread(target=lambda: print("later", sorted(os.sched_getaffinity(0))))
later.start(); later.join()
stop.set(); t.join()
print("tasks", len(after))
print("after", sorted(set().union(*after.values())))
"""


@unittest.skipUnless(hasattr(os, "sched_setaffinity"), "needs sched_setaffinity")
class Pin(unittest.TestCase):
    def test_every_thread_and_later_ones(self):
        cpu = max(os.sched_getaffinity(0))
        r = subprocess.run([sys.executable, "-c", PIN_CHILD, str(cpu)], capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        lines = dict(line.split(" ", 1) for line in r.stdout.splitlines())
        self.assertEqual(lines["tasks"], "2", r.stdout)  # the main thread and the waiting one
        self.assertEqual(lines["unchanged"], "True")
        self.assertEqual(lines["after"], f"[{cpu}]")
        self.assertEqual(lines["later"], f"[{cpu}]")


if __name__ == "__main__":
    unittest.main()
