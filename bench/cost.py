"""Runs bench/throughput.rs's `ledger` mode for staged and direct credits,
alternating, and writes the "Exactly once: what a staged write costs" section
of bench/RESULTS.md. Started by bench/cost, which starts DynamoDB Local."""

import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

from driver import described_commit, write_section

ROOT = Path(__file__).resolve().parent.parent
SECTION = "## Exactly once: what a staged write costs"
FIGURES = ["per_second", "cpu_ms_per_record", "requests_per_record", "write_units_per_record"]


def harness():
    """The benchmark harness cargo built (the newest, if several)."""
    built = [path for path in glob.glob(str(ROOT / "target" / "release" / "deps" / "throughput-*"))
             if os.access(path, os.X_OK) and not path.endswith(".d")]
    return max(built, key=os.path.getmtime)


def run(writes, records, concurrency):
    table = f"cost-{uuid.uuid4().hex[:12]}"
    command = [harness(), "ledger", "--table", table, "--records", str(records), "--concurrency", str(concurrency),
               "--writes", writes]
    result = json.loads(subprocess.run(command, check=True, capture_output=True, text=True).stdout)
    if result["failed"] or result["balances_total"] != records:
        raise SystemExit(f"{writes}: {result}")
    return result


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--records", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--output", default=str(ROOT / "bench" / "RESULTS.md"))
    args = parser.parse_args()

    run("staged", 2000, args.concurrency)  # a fresh JVM is slow at first
    results = {"staged": [], "direct": []}
    for n in range(args.runs):
        order = ["staged", "direct"] if n % 2 == 0 else ["direct", "staged"]
        for writes in order:
            results[writes].append(run(writes, args.records, args.concurrency))
            print(f"== {writes}: {results[writes][-1]}", file=sys.stderr)

    def cell(writes, figure, digits):
        values = [result[figure] for result in results[writes]]
        fmt = f"{{:,.{digits}f}}"
        return f"{fmt.format(statistics.median(values))} [{fmt.format(min(values))}–{fmt.format(max(values))}]"

    commit = described_commit()
    command_line = " ".join(["bench/cost"] + sys.argv[1:])
    staged = {figure: statistics.median(r[figure] for r in results["staged"]) for figure in FIGURES}
    direct = {figure: statistics.median(r[figure] for r in results["direct"]) for figure in FIGURES}
    lines = [SECTION, "",
             f"Written by `{command_line}` on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} at commit {commit}. "
             f"{args.records} new ledger credits (one each, over 50 accounts) through the engine in process "
             f"(`bench/throughput.rs ledger`), {args.concurrency} at once, claims batched (the default), against "
             "DynamoDB Local; medians of "
             f"{args.runs} runs with [min–max], the two ways alternating. **Staged**: the `ledger` handler stages the "
             "credit, which commits with the claim's completion in one `TransactWriteItems`. **Direct**: the handler "
             "writes the same credit itself with an `UpdateItem` (`ADD balance :amount`), and the completion follows "
             "as usual (effectively once: a process stopped between the two runs the credit again). Requests and "
             "write actions are counted as both clients send them; write units follow DynamoDB's rules for items "
             "under 1 KB (one per write, two per action of a transaction: DynamoDB Local reports 2 per action for "
             "`TransactWriteItems` too). CPU is the whole process's, per record. Every run's balances add up to the "
             "credits.", "",
             "| | staged (exactly once) | direct (effectively once) | staged ÷ direct |",
             "|---|---:|---:|---:|",
             f"| records/s | {cell('staged', 'per_second', 0)} | {cell('direct', 'per_second', 0)} | "
             f"{staged['per_second'] / direct['per_second']:.2f} |",
             f"| CPU ms per record | {cell('staged', 'cpu_ms_per_record', 3)} | {cell('direct', 'cpu_ms_per_record', 3)} | "
             f"{staged['cpu_ms_per_record'] / direct['cpu_ms_per_record']:.2f} |",
             f"| DynamoDB requests per record | {cell('staged', 'requests_per_record', 2)} | "
             f"{cell('direct', 'requests_per_record', 2)} | "
             f"{staged['requests_per_record'] / direct['requests_per_record']:.2f} |",
             f"| write units per record | {cell('staged', 'write_units_per_record', 2)} | "
             f"{cell('direct', 'write_units_per_record', 2)} | "
             f"{staged['write_units_per_record'] / direct['write_units_per_record']:.2f} |",
             ""]
    write_actions = {writes: results[writes][0]["write_actions"] for writes in results}
    lines.append(f"Write actions of the first run: staged {json.dumps(write_actions['staged'])}, direct "
                 f"{json.dumps(write_actions['direct'])}.")
    lines.append("")
    write_section(args.output, SECTION, lines)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
