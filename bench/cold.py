"""Times a cold first invocation: the release binary run as Lambda runs it, a
new process per sample, against DynamoDB Local behind a delaying proxy, with
TLS terminated behind it or not; writes the "A cold first invocation" section
of bench/RESULTS.md. Started by bench/cold, which starts DynamoDB Local."""

import argparse
import json
import os
import subprocess
import sys
import time

from driver import (BINARY, ROOT, ROUND_TRIPS_MS, Network, create_table, described_commit, event, fmt, summary,
                    write_section)

SECTION = "## A cold first invocation"
# Records of each event.
RECORDS = 10


# `AWS_LAMBDA_INITIALIZATION_TYPE`: on demand an invocation waits for the init
# phase; with provisioned concurrency the init phase runs ahead, and opens the
# connections the first batch needs.
INITIALIZATIONS = ("on-demand", "provisioned-concurrency")


def sample(round_trip, tls, initialization, path):
    """One new function process: its init time, its first batch, its second (every connection open)."""
    with Network(round_trip, tls) as network:
        env = dict(os.environ, AWS_ENDPOINT_URL_DYNAMODB=network.url, AWS_LAMBDA_INITIALIZATION_TYPE=initialization)
        if network.certificate:
            env["SSL_CERT_FILE"] = network.certificate
        command = ["cargo", "bench", "-q", "--locked", "-p", "sqs-once-cli", "--bench", "throughput", "--", "lambda",
                   "--binary", str(BINARY), "--table", create_table(), "--event", str(path), "--invocations", "2"]
        output = subprocess.run(command, check=True, capture_output=True, text=True, cwd=ROOT, env=env)
    found = json.loads(output.stdout.splitlines()[-1])
    return {"init": found["init_ms"], "cold": found["batches_ms"][0], "warm": found["batches_ms"][1]}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--output", default=str(ROOT / "bench" / "RESULTS.md"))
    args = parser.parse_args()

    path = event("new", RECORDS)
    sample(0, True, INITIALIZATIONS[0], path)  # a fresh JVM is slow at first
    results = {}  # (round trip, scheme, initialization) -> list of samples
    for run in range(args.runs):
        for round_trip in ROUND_TRIPS_MS:
            for tls in ((True, False) if run % 2 == 0 else (False, True)):
                for initialization in INITIALIZATIONS[::1 if run % 2 == 0 else -1]:
                    found = sample(round_trip, tls, initialization, path)
                    scheme = "https" if tls else "http"
                    results.setdefault((round_trip, scheme, initialization), []).append(found)
                    print(f"== {round_trip} ms, {scheme}, {initialization}: {found}", file=sys.stderr)
    path.unlink()

    commit = described_commit()
    lines = [SECTION, "",
             f"Written by `{' '.join(['bench/cold'] + sys.argv[1:])}` on "
             f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} at commit {commit}. The release binary run as "
             "Lambda runs it (`throughput lambda`: testkit's Runtime API, the `demo` handler), a new process per "
             f"sample, an event of {RECORDS} new records twice; DynamoDB Local behind the delaying proxy "
             "(`throughput delay-proxy --tls`), with TLS terminated behind it (`https`, a certificate made at start and "
             "trusted through `SSL_CERT_FILE`) or not (`http`), and `AWS_LAMBDA_INITIALIZATION_TYPE` either "
             "`on-demand` (the first batch opens every connection it needs: a TCP handshake, then TLS) or "
             "`provisioned-concurrency` (the init phase opens them). *Init* is process start to the function's first "
             "request for an event; the second batch finds every connection open. *Init + first* is what an "
             "invocation waiting for a cold start meets, as on demand; with provisioned concurrency the init phase "
             f"runs ahead of it. Medians of {args.runs} with [min–max], in milliseconds.", "",
             "| round trip | endpoint | initialization | init | first batch (cold) | second batch (warm) | "
             "cold − warm | init + first |",
             "|---:|---|---|---:|---:|---:|---:|---:|"]
    for round_trip in ROUND_TRIPS_MS:
        for scheme in ("https", "http"):
            for initialization in INITIALIZATIONS:
                found = results[(round_trip, scheme, initialization)]
                stats = {part: summary([one[part] for one in found]) for part in ("init", "cold", "warm")}
                total = summary([one["init"] + one["cold"] for one in found])
                lines.append(f"| {round_trip} ms | {scheme} | {initialization} | {fmt(stats['init'], 1)} | "
                             f"{fmt(stats['cold'], 1)} | {fmt(stats['warm'], 1)} | "
                             f"{stats['cold']['median'] - stats['warm']['median']:.1f} | {fmt(total, 1)} |")
    lines.append("")
    write_section(args.output, SECTION, lines)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
