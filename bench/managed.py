"""Many batches in one environment, as Lambda Managed Instances runs a
function (`AWS_LAMBDA_MAX_CONCURRENCY`), against the same batches one at a
time in one environment and against as many classic environments, each
through `throughput environments` (the release binary as Lambda runs it,
warmed by one invocation, then the batches sent together); DynamoDB Local 0,
5 and 20 ms away (`throughput delay-proxy`). Writes the "Many batches in one
environment" section of bench/RESULTS.md. Started by bench/managed."""

import argparse
import json
import os
import statistics
import subprocess
import sys

from driver import BINARY, ROOT, Network, create_table, event, fmt, revision, summary, write_section

SECTION = "## Many batches in one environment: Lambda Managed Instances"


def measure(endpoint, path, environments, at_once, invocations, threads=None):
    command = ["cargo", "bench", "-q", "--locked", "-p", "sqs-once-cli", "--bench", "throughput", "--",
               "environments", "--binary", str(BINARY), "--table", create_table(), "--event", str(path),
               "--environments", str(environments), "--at-once", str(at_once), "--invocations", str(invocations)]
    env = dict(os.environ, AWS_ENDPOINT_URL_DYNAMODB=endpoint)
    if threads:
        env["TOKIO_WORKER_THREADS"] = str(threads)
    output = subprocess.run(command, check=True, capture_output=True, text=True, cwd=ROOT, env=env).stdout
    result = json.loads(output.splitlines()[-1])
    if result["failed"]:
        sys.exit(f"records failed: {result}")
    return result


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--sizes", default="100,1000")
    parser.add_argument("--at-once", type=int, default=8)
    parser.add_argument("--round-trips", default="0,5,20")
    parser.add_argument("--output", default=str(ROOT / "bench" / "RESULTS.md"))
    args = parser.parse_args()
    n = args.at_once
    modes = {
        f"one environment, {n} at once": (1, n, None),
        f"one environment, {n} at once, one thread": (1, n, 1),
        "one environment, one at a time": (1, 1, None),
        f"{n} classic environments": (n, 1, None),
    }
    results = {}
    for round_trip in [int(value) for value in args.round_trips.split(",")]:
        for size in [int(value) for value in args.sizes.split(",")]:
            path = event("new", size)
            for run in range(args.runs):
                order = list(modes.items()) if run % 2 == 0 else list(modes.items())[::-1]
                for mode, (environments, at_once, threads) in order:
                    if round_trip:
                        with Network(round_trip) as network:
                            result = measure(network.url, path, environments, at_once, n, threads)
                    else:
                        result = measure(os.environ["AWS_ENDPOINT_URL_DYNAMODB"], path, environments, at_once, n,
                                         threads)
                    results.setdefault((round_trip, size, mode), []).append(result)
                    print(f"== {round_trip} ms, {size} records, {mode}: {result}", file=sys.stderr)

    lines = [
        SECTION,
        "",
        f"`bench/managed --runs {args.runs}` at {revision()}: {n} batches of new records (the `demo` handler) sent together, after "
        "one invocation per environment to open its connections, through `throughput environments`: the release "
        f"binary as Lambda runs it, one environment handed {n} invocations at once (`AWS_LAMBDA_MAX_CONCURRENCY`, "
        "as Lambda Managed Instances sets it; its batches on a runtime of a thread per CPU, 2 here, or of one "
        "thread with `TOKIO_WORKER_THREADS=1`), the same environment handed one at a time (classic Lambda), and "
        f"{n} classic environments. DynamoDB Local on the same 2 cores, 0, 5 or 20 ms away. Records/s: records "
        "over the time from the first delivery to the last answer; CPU and DynamoDB requests of the functions "
        f"(their metrics lines) per record; the largest peak RSS of one environment. Medians of {args.runs} "
        "[min–max].",
        "",
        "| round trip | records per batch | mode | records/s | vs one at a time | CPU ms per record | requests per "
        "record | peak RSS MiB |",
        "|---:|---:|---|---:|---:|---:|---:|---:|",
    ]
    for (round_trip, size, mode), runs in results.items():
        records = size * n
        rate = summary([records / (run["wall_ms"] / 1000) for run in runs])
        alone = statistics.median(records / (run["wall_ms"] / 1000)
                                  for run in results[(round_trip, size, "one environment, one at a time")])
        cpu = summary([run["cpu_s"] * 1000 / records for run in runs])
        requests = summary([run["dynamodb_requests"] / records for run in runs])
        rss = summary([run["peak_rss_kib"] / 1024 for run in runs])
        lines.append(f"| {round_trip} ms | {size:,} | {mode} | {fmt(rate)} | {rate['median'] / alone:.2f}× | "
                     f"{fmt(cpu, 3)} | {fmt(requests, 3)} | {fmt(rss, 1)} |")
    lines.append("")
    write_section(args.output, SECTION, lines)


if __name__ == "__main__":
    main()
