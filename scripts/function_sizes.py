#!/usr/bin/python3
"""Lists the longest function bodies in the project's C++ sources.

Reads clang-formatted sources (Google style: namespaces do not indent), so a
function defined at namespace scope opens with a line ending in "{" at column
0 (after its signature) and closes with "}" at column 0. Methods defined
inside a class body are not counted (they are short by convention). A
function's length is its lines from the signature's first line to the closing
brace, both included.

Usage: scripts/function_sizes.py [--over N] [--max-over-60 K] [--max-len M]
           [paths...]            (default paths: src tools; tests skipped)
Exits 1 when a limit given is broken, so CI can hold it.
"""
import argparse
import pathlib
import re
import sys

SKIP = re.compile(r"(_test\.cc|_fuzz\.cc|_contract\.h|/testing/)")
OPENERS = re.compile(r"^(namespace|class|struct|enum|union|extern|template\s*<[^>]*>\s*(class|struct))\b")


def functions(path):
    lines = path.read_text(errors="replace").splitlines()
    out, start = [], None
    for i, line in enumerate(lines):
        if start is None:
            if line.endswith("{"):
                # Walk back over the signature's continuation lines.
                s = i
                while s > 0 and lines[s][:1] == " " and not lines[s - 1].rstrip().endswith((";", "}", "{", ":")):
                    s -= 1
                head = lines[s]
                if head[:1] in ("", " ", "#", "/", "}") or OPENERS.match(head) or "=" in head.split("(")[0]:
                    continue
                if "(" not in " ".join(lines[s:i + 1]):
                    continue
                start = s
        elif line.startswith("}"):
            sig = lines[start].strip()
            out.append((i - start + 1, f"{path}:{start + 1}", sig[:90]))
            start = None
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("paths", nargs="*", default=["src", "tools"])
    ap.add_argument("--over", type=int, default=60, help="list functions longer than this")
    ap.add_argument("--max-len", type=int, help="fail if any function is longer")
    ap.add_argument("--max-over-60", type=int, help="fail if more functions exceed 60 lines")
    a = ap.parse_args()
    found = []
    for root in a.paths:
        for p in sorted(pathlib.Path(root).rglob("*")):
            if p.suffix in (".cc", ".h", ".cu") and not SKIP.search(str(p)):
                found += functions(p)
    found.sort(reverse=True)
    for n, where, sig in found:
        if n > a.over:
            print(f"{n:5d}  {where}  {sig}")
    over60 = sum(1 for n, _, _ in found if n > 60)
    longest = found[0][0] if found else 0
    print(f"{len(found)} functions; {over60} over 60 lines; longest {longest}")
    bad = (a.max_len is not None and longest > a.max_len) or (
        a.max_over_60 is not None and over60 > a.max_over_60)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
