#!/usr/bin/env python3
"""Compares the functions declared in the installed headers with the functions that the
installed libvmmarena.so exports: every declared function must be exported, and nothing else.

    check-symbols.py [--cxx] INCLUDE_DIR LIBRARY [CC_FLAGS...]

The headers are run through the C preprocessor (so macros and comments are gone), then every
top-level declaration of a `vmm_` function is collected; `nm -D --defined-only` lists what the
library defines. Exit status 0 when the two sets are equal, 1 otherwise (both differences named).
With --cxx the headers are also read as C++ ($CXX, default c++), for the functions declared
only there (the shim's C++ hooks, shim/vmmarena_torch_process.h), inside `extern "C" { }` or
at the top level: check-symbols.py --cxx shim build/shim/libvmmarena_torch.so -I<cuda include>.
"""

import os
import re
import subprocess
import sys


def function_names(text):
    """Functions `vmm_*` declared at the top level of preprocessed text; the braces of
    `extern "C" {` do not count as a level."""
    names, statement, depth, opened = set(), [], 0, []
    for ch in text:  # top-level statements: ';' at depth 0, or the '}' that closes a body
        if ch == "{" and re.search(r'extern\s*"C"\s*$', "".join(statement)):
            opened.append(depth)
            statement = []
            continue
        if ch == "}" and opened and opened[-1] == depth:
            opened.pop()
            statement = []
            continue
        statement.append(ch)
        if ch in "({":
            depth += 1
        elif ch in ")}":
            depth -= 1
        if depth == 0 and (ch == ";" or ch == "}"):
            s = " ".join("".join(statement).split())
            statement = []
            if s.startswith(("typedef", "using", "template")) or re.search(r"\bstatic\b", s):
                continue
            m = re.match(r"[^(]*?\b(vmm_\w+)\s*\(", s)
            if m and "=" not in s[: m.start(1)]:
                names.add(m.group(1))
    return names


def declared(include_dir, flags, cxx=False):
    headers = []
    for here, _, files in os.walk(include_dir):
        headers += [os.path.join(here, f) for f in files if f.endswith(".h")]
    headers = sorted(h for h in headers if "vmmarena" in os.path.relpath(h, include_dir))
    source = "".join(f'#include "{h}"\n' for h in headers)
    passes = [(os.environ.get("CC", "cc"), "c")] + ([(os.environ.get("CXX", "c++"), "c++")] if cxx else [])
    names = set()
    for compiler, language in passes:
        text = subprocess.run([compiler, "-E", "-P", "-x", language, "-", *flags], input=source, capture_output=True,
                              text=True, check=True).stdout
        names |= function_names(text)
    return headers, names


def exported(library):
    out = subprocess.run(["nm", "-D", "--defined-only", library], capture_output=True, text=True, check=True).stdout
    functions, other = set(), set()
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 3:
            (functions if parts[1] in "TtWi" else other).add(parts[2])
    return functions, other


def main(argv):
    cxx = len(argv) > 1 and argv[1] == "--cxx"
    if cxx:
        argv = argv[:1] + argv[2:]
    if len(argv) < 3:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    headers, decl = declared(argv[1], argv[3:], cxx)
    funcs, other = exported(argv[2])
    missing, extra = sorted(decl - funcs), sorted(funcs - decl)
    print(f"{len(decl)} functions declared in {len(headers)} installed headers, {len(funcs)} exported by {argv[2]}")
    for name in missing:
        print(f"declared but not exported: {name}")
    for name in extra:
        print(f"exported but not declared in an installed header: {name}")
    for name in sorted(other):
        print(f"exported data symbol: {name}")
    if not decl:
        print("no declarations found: the header parse is broken")
    return 1 if missing or extra or other or not decl else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
