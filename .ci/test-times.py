#!/usr/bin/env python3
"""Passes `cargo test` output through unchanged and times each test binary in it.

.ci/run pipes the test command through this. `cargo test` runs one binary at a time, announcing
each with a `Running <target> (<path>)` or `Doc-tests <crate>` line and ending it with a
`test result:` line; the time between two announcements is that binary's (its doc tests
included in their own row). Written at the end (docs/development.md, "CI's time"):

    target/ci/test-binaries.tsv   binary, start s, seconds, passed, failed, ignored
    (start: seconds since CI began, from CI_EPOCH, the epoch second .ci/run began at)

and a summary line on stdout: the binaries run, tests passed, and the ten slowest.
"""

import os
import re
import sys
import time

RUNNING = re.compile(rb"^\s+Running (.+?) \((?:[^)]*/)?([^/)]+)\)\s*$")
DOC_TESTS = re.compile(rb"^\s+Doc-tests (\S+)\s*$")
RESULT = re.compile(
    rb"test result: \w+\. (\d+) passed; (\d+) failed; (\d+) ignored"
)
HASH_SUFFIX = re.compile(r"-[0-9a-f]{16}$")


def binary_name(target: bytes, path: bytes) -> str:
    """`authz` for tests/node/authz.rs; `athenz_core (src/lib.rs)` for a crate's unit tests."""
    name = HASH_SUFFIX.sub("", path.decode(errors="replace"))
    target_s = target.decode(errors="replace")
    if target_s.startswith("unittests"):
        return f"{name} ({target_s.removeprefix('unittests').strip()})"
    return name


def main() -> int:
    epoch = int(os.environ.get("CI_EPOCH", int(time.time())))
    out_path = sys.argv[1] if len(sys.argv) > 1 else "target/ci/test-binaries.tsv"
    rows = []  # [name, start, seconds, passed, failed, ignored]
    current = None
    started = time.time()

    def close(now: float) -> None:
        if current is not None:
            current[2] = round(now - current[1] - epoch)
            current[1] = round(current[1])
            rows.append(current)

    stdout = sys.stdout.buffer
    for line in sys.stdin.buffer:
        stdout.write(line)
        stdout.flush()
        now = time.time()
        running = RUNNING.match(line)
        doc = DOC_TESTS.match(line)
        if running or doc:
            close(now)
            name = binary_name(*running.groups()) if running else f"{doc.group(1).decode()} (doc tests)"
            current = [name, now - epoch, 0, 0, 0, 0]
            continue
        result = RESULT.search(line)
        if result and current is not None:
            for i, value in enumerate(result.groups()):
                current[3 + i] += int(value)
    close(time.time())

    os.makedirs(os.path.dirname(out_path) or ".", exist_ok=True)
    with open(out_path, "w") as out:
        out.write("binary\tstart_s\tseconds\tpassed\tfailed\tignored\n")
        for row in rows:
            out.write("\t".join(str(v) for v in row) + "\n")
    binaries = [r for r in rows if not r[0].endswith("(doc tests)")]
    passed = sum(r[3] for r in rows)
    print(
        f"\n==> test binaries: {len(rows)} run ({len(binaries)} unit and integration, "
        f"{len(rows) - len(binaries)} doc-test), {passed} tests passed, "
        f"{sum(r[4] for r in rows)} failed, {sum(r[5] for r in rows)} ignored; "
        f"{round(time.time() - started)} s in all"
    )
    print("slowest ten (target/ci/test-binaries.tsv):")
    for row in sorted(rows, key=lambda r: -r[2])[:10]:
        print(f"  {row[2]:5d} s  {row[0]} ({row[3]} passed)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
