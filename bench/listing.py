"""Fills a claim table with N claims and times `sqs-once claims list --stale`
and `--status failed` on it, with the read units DynamoDB reports; writes the
"Listing claims" section of bench/RESULTS.md. Started by bench/listing, which
starts DynamoDB Local and builds the release binary."""

import argparse
import concurrent.futures
import os
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path

import boto3

from driver import write_section

ROOT = Path(__file__).resolve().parent.parent
BINARY = ROOT / "target" / "release" / "sqs-once"
SECTION = "## Listing claims: a parallel scan instead of an index entry per record"
# On-demand price of a million read request units (us-east-1), as AWS publishes it.
USD_PER_MILLION_READS = 0.125


def claim(n, now_ms, stale_every, failed_every):
    """A claim as the DynamoDB store writes it, attribute for attribute."""
    item = {
        "id": {"S": f"bench#{n:064x}"[-72:]},
        "expiration": {"N": str(now_ms // 1000 + 3600)},
        "token": {"S": uuid.uuid4().hex},
        "holder": {"S": "0c1e5a0e-3b8f-4f5c-9d51-9a4e6e2f0b7a"},
        "attempt": {"N": "1"},
        "message_id": {"S": str(uuid.UUID(int=n))},
        "claimed_at": {"N": str(now_ms - 60_000)},
        "updated_at": {"N": str(now_ms - 59_000)},
    }
    if n % stale_every == 0:
        item["status"] = {"S": "INPROGRESS"}
        item["in_progress_expiration"] = {"N": str(now_ms - 30_000)}
    elif n % failed_every == 1:
        item["status"] = {"S": "FAILED"}
        item["error"] = {"S": "demo: asked to fail (permanent)"}
        item["open_status"] = {"S": f"FAILED#{n % 16}"}
    else:
        item["status"] = {"S": "COMPLETED"}
    return item


def fill(client, table, count):
    now_ms = int(time.time() * 1000)

    def write(start):
        items = [claim(n, now_ms, 10_000, 10_000) for n in range(start, min(start + 25, count))]
        requests = {table: [{"PutRequest": {"Item": item}} for item in items]}
        while requests:
            requests = client.batch_write_item(RequestItems=requests).get("UnprocessedItems") or None

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(write, range(0, count, 25)))


def listing(table, *args):
    environment = dict(os.environ, SQS_ONCE_TABLE=table, SQS_ONCE_LOG="info")
    started = time.monotonic()
    run = subprocess.run([BINARY, "claims", "list", "--json", "--limit", "1000", *args], capture_output=True,
                         text=True, env=environment)
    elapsed = time.monotonic() - started
    if run.returncode not in (0, 1):
        sys.exit(f"claims list {' '.join(args)} failed: {run.stderr}")
    units = re.search(r"read_units=([0-9.]+)", run.stderr)
    scanned = re.search(r"scanned_items=([0-9]+)", run.stderr)
    found = run.stdout.count('"id"')
    return {"seconds": elapsed, "read_units": float(units.group(1)) if units else None,
            "scanned": int(scanned.group(1)) if scanned else None, "found": found}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--claims", type=int, default=1_000_000)
    parser.add_argument("--output", default=str(ROOT / "bench" / "RESULTS.md"))
    args = parser.parse_args()
    client = boto3.client("dynamodb", endpoint_url=os.environ["AWS_ENDPOINT_URL_DYNAMODB"])
    table = f"listing-{uuid.uuid4().hex[:8]}"
    subprocess.run([BINARY, "create-table", "--table", table], check=True, capture_output=True)
    started = time.monotonic()
    fill(client, table, args.claims)
    print(f"== {args.claims:,} claims written in {time.monotonic() - started:.0f} s", file=sys.stderr)
    stale = listing(table, "--stale")
    failed = listing(table, "--status", "failed")
    print(f"== --stale: {stale}; --status failed: {failed}", file=sys.stderr)
    usd = stale["read_units"] * USD_PER_MILLION_READS / 1e6
    lines = [
        SECTION,
        "",
        f"`bench/listing --claims {args.claims}`: a table of {args.claims:,} claims as the DynamoDB store writes them "
        f"(about {stale['read_units'] * 8192 / stale['scanned']:.0f} bytes each, as the read units price them; one in "
        "10,000 in progress with its lease ended, one in 10,000 failed, the rest completed), on DynamoDB Local; the "
        "read units are DynamoDB's own consumed-capacity answers.",
        "",
        "| listing | how | items read | read units | USD at on-demand prices | time (DynamoDB Local) | claims found |",
        "|---|---|---|---|---|---|---|",
        f"| `claims list --stale` | parallel scan, 8 segments of 1,000-item pages, filtered by status | {stale['scanned']:,} | "
        f"{stale['read_units']:,.1f} | {usd:.4f} | {stale['seconds']:.1f} s | {stale['found']} |",
        f"| `claims list --status failed` | the open-claims index, 17 queries | – | – | – | "
        f"{failed['seconds']:.1f} s | {failed['found']} |",
        "",
        "A listing of claims in progress reads every item once: its price is the table's size (half a read unit per "
        "4 KB, eventually consistent), paid when an operator asks. The index entry it replaces cost every record two "
        "write units, one to enter the index and one to leave it: at the same prices a million records paid "
        f"{2 * 0.625:.2f} USD for it.",
        "",
    ]
    write_section(args.output, SECTION, lines)


if __name__ == "__main__":
    main()
