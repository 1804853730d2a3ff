"""bench/paired_stats.py, the statistics of the GPU benchmarks' paired rounds, where no GPU is:
Student's t quantile against the tables, the geometric mean's interval and its verdict, and
the pooling of several result files, each round paired only within its own file.

Environment: PYTHONPATH = bench.
"""

import contextlib
import io
import json
import math
import os
import tempfile
import unittest

import paired_stats


def result(device, catalog, native_times, modes):
    """A bench_process.py-shaped document: native's rounds and other modes' rounds by number."""
    def rounds(times):
        return {str(i): {"warmup_s": t, "cpu_s": t / 2} for i, t in enumerate(times) if t is not None}
    runs = {"native": {"device": device, "by_round": rounds(native_times)}} if native_times else {}
    runs.update({m: {"device": device, "by_round": rounds(t)} for m, t in modes.items()})
    return {"runs": {catalog: runs}}


class TQuantile(unittest.TestCase):
    def test_matches_the_tables(self):
        table = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 7: 2.365, 10: 2.228, 20: 2.086,
                 30: 2.042, 120: 1.980}
        for df, t in table.items():
            with self.subTest(df=df):
                self.assertAlmostEqual(paired_stats.t975(df) / t, 1.0, delta=0.003)

    def test_no_degrees_of_freedom_is_refused(self):
        with self.assertRaisesRegex(ValueError, "at least 1, got 0"):
            paired_stats.t975(0)


class Interval(unittest.TestCase):
    def test_too_few_rounds(self):
        self.assertIsNone(paired_stats.interval([0.9, 1.1]))
        self.assertEqual(paired_stats.verdict(None), "too few rounds")

    def test_equal_ratios_have_no_width(self):
        mean, low, high = paired_stats.interval([0.8, 0.8, 0.8])
        self.assertAlmostEqual(mean, 0.8)
        self.assertAlmostEqual(low, 0.8)
        self.assertAlmostEqual(high, 0.8)
        self.assertEqual(paired_stats.verdict((mean, low, high)), "faster")

    def test_by_hand(self):
        # logs -0.1, 0, 0.1: mean 0, standard deviation 0.1, half width 4.303 * 0.1 / sqrt(3)
        got = paired_stats.interval([math.exp(-0.1), 1.0, math.exp(0.1)])
        half = 4.303 * 0.1 / math.sqrt(3)
        for value, want in zip(got, (1.0, math.exp(-half), math.exp(half))):
            self.assertAlmostEqual(value, want, places=9)
        self.assertEqual(paired_stats.verdict(got), "not told apart")

    def test_slower_and_faster(self):
        self.assertEqual(paired_stats.verdict(paired_stats.interval([1.10, 1.12, 1.11, 1.09])), "slower")
        self.assertEqual(paired_stats.verdict(paired_stats.interval([0.90, 0.92, 0.91, 0.89])), "faster")

    def test_non_positive_ratio_is_refused(self):
        with self.assertRaisesRegex(ValueError, "positive, got 0"):
            paired_stats.interval([1.0, 0.0, 1.0])

    def test_text(self):
        self.assertIn("too few", paired_stats.interval_text([1.0]))
        text = paired_stats.interval_text([1.10, 1.12, 1.11, 1.09])
        self.assertRegex(text, r"^geometric mean 1\.105x, 95% interval 1\.0\d\d-1\.1\d\dx over 4 rounds: slower$")


class Pool(unittest.TestCase):
    def test_rounds_pair_within_their_own_file(self):
        a = result("H100", "ascending", [2.0, 4.0], {"process": [2.2, 4.4]})
        b = result("H100", "ascending", [3.0, None], {"process": [2.7, 9.9]})  # round 1 has no native
        pooled = paired_stats.pool([a, b])
        self.assertEqual(list(pooled), [("H100", "ascending", "process")])
        self.assertEqual([round(x, 6) for x in pooled[("H100", "ascending", "process")]], [1.1, 1.1, 0.9])

    def test_devices_and_catalogs_stay_apart_and_modes_without_native_are_left_out(self):
        a = result("H100", "default", [1.0], {"process": [1.0]})
        b = result("H200", "default", [1.0], {"process": [2.0]})
        c = result("H200", "smallpool", None, {"process": [5.0]})
        pooled = paired_stats.pool([a, b, c])
        self.assertEqual(sorted(pooled), [("H100", "default", "process"), ("H200", "default", "process")])
        self.assertEqual(pooled[("H200", "default", "process")], [2.0])

    def test_cpu_key(self):
        a = result("H100", "default", [2.0], {"process": [3.0]})
        a["runs"]["default"]["process"]["by_round"]["0"]["cpu_s"] = 2.0
        self.assertEqual(paired_stats.pool([a], paired_stats.KEYS["cpu"])[("H100", "default", "process")], [2.0])


class Script(unittest.TestCase):
    def write(self, doc):
        fd, path = tempfile.mkstemp(suffix=".json")
        with os.fdopen(fd, "w") as f:
            f.write(doc if isinstance(doc, str) else json.dumps(doc))
        self.addCleanup(os.unlink, path)
        return path

    def test_table(self):
        path = self.write(result("H100", "default", [1.0, 1.0, 1.0, 1.0], {"process": [0.90, 0.92, 0.91, 0.89]}))
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            paired_stats.main([path])
        self.assertIn("| H100 | default | process | 4 | 0.91x (0.89-0.92) | 0.905x |", out.getvalue())
        self.assertIn("| faster |", out.getvalue())

    def test_a_list_of_results_pools_like_separate_files(self):
        a = result("H100", "default", [1.0, 1.0], {"process": [0.9, 1.1]})
        b = result("H100", "default", [2.0], {"process": [1.0]})
        together, apart = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(together):
            paired_stats.main([self.write([a, b])])
        with contextlib.redirect_stdout(apart):
            paired_stats.main([self.write(a), self.write(b)])
        self.assertIn("| H100 | default | process | 3 | 0.90x (0.50-1.10) |", together.getvalue())
        self.assertEqual(together.getvalue().splitlines()[2:], apart.getvalue().splitlines()[2:])

    def test_rounds_without_the_key_are_left_out(self):
        a = result("H100", "default", [1.0, 1.0], {"process": [0.9, 1.1]})
        del a["runs"]["default"]["process"]["by_round"]["1"]["cpu_s"]
        self.assertEqual(paired_stats.pool([a], paired_stats.KEYS["cpu"])[("H100", "default", "process")], [0.9])

    def test_the_kept_rounds_of_the_h100_sessions(self):
        archive = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "gpu-runs", "2026-12-05-h100-rounds.json")
        pooled = paired_stats.pool(paired_stats.load(archive))
        counts = {(c, m): len(v) for (_, c, m), v in pooled.items() if m in ("process", "process-retain")}
        self.assertEqual(counts, {("ascending", "process"): 21, ("ascending", "process-retain"): 21,
                                  ("default", "process"): 16, ("default", "process-retain"): 16,
                                  ("shuffled110", "process"): 10, ("shuffled110", "process-retain"): 8,
                                  ("smallpool", "process"): 34, ("smallpool", "process-retain"): 34})
        self.assertEqual({d for d, _, _ in pooled}, {"NVIDIA H100 80GB HBM3"})

    def test_bad_files_are_refused_with_their_name(self):
        for doc, why in (("{", "not a readable benchmark result"), ("[1]", "(item 0): no 'runs' object"),
                         ("3", "no 'runs' object"),
                         (json.dumps({"runs": {}}), "no mode ran beside native")):
            path = self.write(doc)
            with self.subTest(why=why), self.assertRaises(SystemExit) as caught:
                paired_stats.main([path])
            self.assertIn(why, str(caught.exception))
        with self.assertRaisesRegex(SystemExit, "missing.json: not a readable"):
            paired_stats.main(["missing.json"])


if __name__ == "__main__":
    unittest.main()
