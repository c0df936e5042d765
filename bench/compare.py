#!/usr/bin/env python3
"""Two sqs-once release binaries side by side on the ordinary path: `invoke` on
new records, then the same event again (duplicates), each on a fresh table of
the DynamoDB Local the environment names, the binaries alternating who goes
first. Prints one JSON line per binary, size and kind: CPU per record, DynamoDB
requests per record and records/s, each a median with its min and max.

    bench/compare.py BEFORE AFTER [RUNS] [SIZES]     e.g. bench/compare.py /tmp/old target/release/sqs-once 8 1000,10000

Build the earlier binary from a worktree of its commit (`git worktree add`,
`cargo build --release --bin sqs-once` with this checkout's CARGO_TARGET_DIR),
copy it aside, then build this checkout's. Run a round first to warm DynamoDB
Local up, and extra settings (SQS_ONCE_OUTBOX_SWEEP_SECS=0...) apply to both."""

import json
import statistics
import sys
from pathlib import Path

import driver

binaries = {"before": Path(sys.argv[1]), "after": Path(sys.argv[2])}
runs = int(sys.argv[3]) if len(sys.argv) > 3 else 8
sizes = [int(size) for size in (sys.argv[4] if len(sys.argv) > 4 else "1000,10000").split(",")]
results = {}
for run in range(runs):
    order = list(binaries.items()) if run % 2 == 0 else list(reversed(binaries.items()))
    for size in sizes:
        for name, binary in order:
            driver.BINARY = binary
            table = driver.create_table()
            path = driver.event("new", size)
            for kind in ("new", "duplicates"):
                results.setdefault((name, size, kind), []).append(driver.sqs_once(table, path, size))
            path.unlink()


def spread(samples, field, digits):
    values = [sample[field] for sample in samples]
    return [round(statistics.median(values), digits), round(min(values), digits), round(max(values), digits)]


for (name, size, kind), samples in sorted(results.items(), key=lambda item: (item[0][1], item[0][2], item[0][0])):
    print(json.dumps({
        "binary": name, "records": size, "kind": kind, "runs": len(samples),
        "cpu_ms_per_record": spread(samples, "cpu_ms_per_record", 4),
        "requests_per_record": spread(samples, "requests_per_record", 4),
        "records_per_s": spread(samples, "records_per_s", 0),
    }))
