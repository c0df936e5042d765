"""What each record path costs in DynamoDB capacity units: sqs-once (`invoke`,
single requests, since DynamoDB Local reports no capacity for batched
statements, which AWS charges as the single requests they stand for) and
Powertools for AWS Lambda (Python), through one meter of DynamoDB's own
consumed-capacity answers (`throughput meter`). Writes the "Cost per message"
section of bench/RESULTS.md. Started by bench/units, which starts DynamoDB
Local and builds the release binary and the harness."""

import argparse
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import boto3

from driver import BINARY, PEER, PYTHON, create_table, record, write_section
from cost import harness

ROOT = Path(__file__).resolve().parent.parent
SECTION = "## Cost per message: DynamoDB capacity units by record path"
# On-demand prices (us-east-1), as AWS publishes them: USD per million write and read request units.
USD_PER_MILLION_WRITES = 0.625
USD_PER_MILLION_READS = 0.125


class Meter:
    """The harness's meter in front of DynamoDB Local: its URL, and the units charged since the last reading."""

    def __init__(self):
        self.process = subprocess.Popen([harness(), "meter", "--upstream", os.environ["AWS_ENDPOINT_URL_DYNAMODB"]],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.url = json.loads(self.process.stdout.readline())["url"]

    def read(self):
        self.process.stdin.write("\n")
        self.process.stdin.flush()
        return json.loads(self.process.stdout.readline())


def event_file(bodies):
    run = uuid.uuid4().hex[:8]
    path = Path(f"/tmp/units-{run}.json")
    path.write_text(json.dumps({"Records": [record(f"{run}-{n}", body) for n, body in enumerate(bodies)]}))
    return path


def sqs_once(meter, table, event, handler="demo", extra=None):
    env = dict(os.environ, AWS_ENDPOINT_URL_DYNAMODB=meter.url, SQS_ONCE_TABLE=table, SQS_ONCE_HANDLER=handler,
               SQS_ONCE_DYNAMODB_BATCHING="false", SQS_ONCE_OUTBOX_SWEEP_SECS="0", **(extra or {}))
    env.pop("SQS_ONCE_DEMO_LOG", None)
    run = subprocess.run([BINARY, "invoke", "--timeout", "900", str(event)], env=env, capture_output=True, text=True)
    if run.returncode != 0:
        sys.exit(f"sqs-once invoke failed: {run.stderr[-2000:]}")
    return len(json.loads(run.stdout)["batchItemFailures"])


def powertools(meter, table, event):
    env = dict(os.environ, AWS_ENDPOINT_URL_DYNAMODB=meter.url)
    run = subprocess.run([PYTHON, PEER, table, str(event)], env=env, capture_output=True, text=True)
    if run.returncode != 0:
        sys.exit(f"Powertools failed: {run.stderr[-2000:]}")
    return len(json.loads(run.stdout)["response"]["batchItemFailures"])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=1000)
    parser.add_argument("--output", default=str(ROOT / "bench" / "RESULTS.md"))
    args = parser.parse_args()
    count = args.records
    meter = Meter()
    new = event_file([{"n": n} for n in range(count)])
    failing = event_file([{"n": n, "fail": "permanent"} for n in range(count)])
    credits = event_file([{"account": f"acct-{n % 50}", "amount": 1} for n in range(count)])
    balances = f"balances-{uuid.uuid4().hex[:8]}"
    boto3.client("dynamodb").create_table(
        TableName=balances, BillingMode="PAY_PER_REQUEST",
        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}])

    rows = []
    for consumer in ("sqs-once", "Powertools"):
        table = create_table()
        run = (lambda event: sqs_once(meter, table, event)) if consumer == "sqs-once" else \
            (lambda event: powertools(meter, table, event))
        meter.read()
        for path, event, expected_failures in (("new record", new, 0), ("duplicate of a completed record", new, 0),
                                                ("handler fails for good", failing, count)):
            failures = run(event)
            if failures != expected_failures:
                sys.exit(f"{consumer}, {path}: {failures} failed, expected {expected_failures}")
            rows.append((consumer, path, meter.read()))
        if consumer == "sqs-once":
            failures = sqs_once(meter, table, credits, "ledger", {"SQS_ONCE_LEDGER_TABLE": balances})
            if failures:
                sys.exit(f"staged credits: {failures} failed")
            rows.append((consumer, "ledger credit staged with its claim (exactly once)", meter.read()))
    meter.process.stdin.close()
    for consumer, path, units in rows:
        print(f"== {consumer}, {path}: {units}", file=sys.stderr)

    def per_record(units, name):
        return units[name] / count

    def usd(units):
        return (units["table_writes"] + units["index_writes"]) / count * USD_PER_MILLION_WRITES + \
            units["reads"] / count * USD_PER_MILLION_READS

    by_path = {}
    for consumer, path, units in rows:
        by_path.setdefault(path, {})[consumer] = units
    lines = [
        SECTION,
        "",
        f"`bench/units --records {count}`: {count:,} records per path through `sqs-once invoke` (the `demo` handler; "
        "the `ledger` handler for credits) and through Powertools for AWS Lambda (Python) 3.37.0 "
        "(`idempotent_function` keyed on `messageId`), on DynamoDB Local, each request metered by "
        "`throughput meter` (testkit's meter: every request asks for `ReturnConsumedCapacity: INDEXES`, and the "
        "answers are added up, table and indexes apart). sqs-once runs with single requests: DynamoDB Local reports "
        "no capacity for batched statements, and AWS charges each statement as the single request it stands for. A "
        "write refused by its condition is charged 1 unit, as AWS documents and Local does not report, and a "
        "transactional write 2 units per action (AWS's rate for items of up to 1 KB), where Local reports 4 for any "
        "transaction. USD per "
        f"million messages at on-demand prices ({USD_PER_MILLION_WRITES} per million write units, "
        f"{USD_PER_MILLION_READS} per million read units), DynamoDB alone.",
        "",
        "| record path | sqs-once write units (of them index) | Powertools write units (of them index) | ratio | "
        "sqs-once USD per million | Powertools USD per million |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for path, consumers in by_path.items():
        ours, theirs = consumers.get("sqs-once"), consumers.get("Powertools")

        def cell(units):
            if units is None:
                return "not offered"
            writes = per_record(units, "table_writes") + per_record(units, "index_writes")
            return f"{writes:.2f} ({per_record(units, 'index_writes'):.2f})"

        ratio = "–"
        if ours and theirs:
            theirs_writes = per_record(theirs, "table_writes") + per_record(theirs, "index_writes")
            ours_writes = per_record(ours, "table_writes") + per_record(ours, "index_writes")
            ratio = f"{ours_writes / theirs_writes:.2f}×" if theirs_writes else "–"
        lines.append(f"| {path} | {cell(ours)} | {cell(theirs)} | {ratio} | "
                     f"{usd(ours):.3f} | {usd(theirs):.3f} |" if ours and theirs else
                     f"| {path} | {cell(ours)} | {cell(theirs)} | {ratio} | {usd(ours):.3f} | – |")
    lines += [
        "",
        "Reads: a claim never reads on these paths (a refused claim returns the item that holds the key), so "
        "neither consumer pays read units here. A permanent failure costs sqs-once one unit more than Powertools: "
        "it keeps the failure (with its reason, in the open-claims index) where Powertools deletes the record and "
        "lets the next delivery run the handler again.",
        "",
    ]
    write_section(args.output, SECTION, lines)


if __name__ == "__main__":
    main()
