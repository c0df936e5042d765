#!/usr/bin/env python3
"""Two sqs-once release binaries side by side on the ordinary path: `invoke` on
new records, then the same event again (duplicates), each on a fresh table of
the DynamoDB Local the environment names, the binaries alternating who goes
first. Prints one JSON line per binary, size and kind: CPU per record, DynamoDB
requests per record and records/s, each a median with its min and max.

    bench/compare.py BEFORE AFTER [RUNS] [SIZES]     e.g. bench/compare.py /tmp/old target/release/sqs-once 8 1000,10000

With `--round-trip-ms MS` (first), the same binaries on new records through
`throughput delay-proxy` (DynamoDB Local MS away, as bench/run's latency-bound
runs put it) as well as without it, and each run's batched ceiling: what the
binary reaches of that ceiling (records/s without the proxy, over the ceiling)
and of the latency floor (two round trips and the batch at the ceiling), and
its wall time and CPU per record through the proxy.

    bench/compare.py --round-trip-ms 5 /tmp/old target/release/sqs-once 6 10,1000

Build the earlier binary from a worktree of its commit (`git worktree add`,
`cargo build --release --bin sqs-once` with this checkout's CARGO_TARGET_DIR),
copy it aside, then build this checkout's. Run a round first to warm DynamoDB
Local up, and extra settings (SQS_ONCE_OUTBOX_SWEEP_SECS=0...) apply to both.
The latency-bound runs need the harness built (`cargo bench -p sqs-once-cli
--bench throughput --no-run`)."""

import json
import statistics
import sys
from pathlib import Path

import driver

arguments = sys.argv[1:]
round_trip_ms = None
if arguments[:1] == ["--round-trip-ms"]:
    round_trip_ms, arguments = int(arguments[1]), arguments[2:]
binaries = {"before": Path(arguments[0]), "after": Path(arguments[1])}
runs = int(arguments[2]) if len(arguments) > 2 else 8
sizes = [int(size) for size in (arguments[3] if len(arguments) > 3 else "1000,10000").split(",")]
results = {}
for run in range(runs):
    order = list(binaries.items()) if run % 2 == 0 else list(reversed(binaries.items()))
    ceiling = driver.batched_ceiling(2_000) if round_trip_ms else None
    for size in sizes:
        path = driver.event("new", size)
        for name, binary in order:
            driver.BINARY = binary
            table = driver.create_table()
            for kind in ("new", "duplicates"):
                sample = driver.sqs_once(table, path, size)
                if ceiling and kind == "new":
                    sample["of_ceiling"] = sample["records_per_s"] / ceiling
                results.setdefault((name, size, kind), []).append(sample)
        if round_trip_ms:
            floor_ms = 2 * round_trip_ms + size / ceiling * 1000
            with driver.Network(round_trip_ms) as proxy:
                for name, binary in order:
                    driver.BINARY = binary
                    sample = driver.sqs_once(driver.create_table(), path, size, endpoint=proxy.url)
                    sample["wall_ms"] = sample["wall_s"] * 1000
                    sample["of_floor"] = sample["wall_ms"] / floor_ms
                    results.setdefault((name, size, f"new, {round_trip_ms} ms away"), []).append(sample)
        path.unlink()


def spread(samples, field, digits):
    values = [sample[field] for sample in samples]
    return [round(statistics.median(values), digits), round(min(values), digits), round(max(values), digits)]


for (name, size, kind), samples in sorted(results.items(), key=lambda item: (item[0][1], item[0][2], item[0][0])):
    line = {
        "binary": name, "records": size, "kind": kind, "runs": len(samples),
        "cpu_ms_per_record": spread(samples, "cpu_ms_per_record", 4),
        "requests_per_record": spread(samples, "requests_per_record", 4),
        "records_per_s": spread(samples, "records_per_s", 0),
    }
    for field, digits in (("of_ceiling", 3), ("wall_ms", 1), ("of_floor", 3)):
        if field in samples[0]:
            line[field] = spread(samples, field, digits)
    print(json.dumps(line))
