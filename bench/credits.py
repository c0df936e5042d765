"""A ledger credit, each way of committing it: sqs-once's `ledger` handler
through `sqs-once invoke` (its key kept in the account's item, claiming first or
not; in a transaction, with its claim or without), and Powertools for AWS
Lambda (Python and TypeScript), whose handler writes the same credit itself
with an `UpdateItem` inside its idempotent function (effectively once).

Per credit: DynamoDB write units as DynamoDB reports them (through `throughput
meter`, single requests), requests, the consumer's CPU, and records/s of the
process on DynamoDB Local directly (sqs-once with its default batching), beside
the batched ceiling of the same run. CREDITS credits to 50 accounts each (the
accounts' items under 1 KB), then the same event again (copies). Medians of
RUNS. Writes the "A credit, each way of committing" section of
bench/RESULTS.md. Started by bench/credits."""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import boto3

from driver import BINARY, PEER, PYTHON, batched_ceiling, create_table, fmt, measured, record, revision, summary, \
    write_section
from units import Meter

ROOT = Path(__file__).resolve().parent.parent
SECTION = "## A credit, each way of committing"
NODE_PEER = ROOT / ".tools" / "node-bench" / "peer_powertools_ts.mjs"
ACCOUNTS = 50

# sqs-once's ways: SQS_ONCE_LEDGER_KEYS_IN_ACCOUNTS, SQS_ONCE_CLAIM, the row's name.
WAYS = (
    ("true", "auto", "sqs-once: the key kept in the account (exactly once)"),
    ("true", "always", "sqs-once: the key kept in the account, claimed first (exactly once)"),
    ("false", "auto", "sqs-once: one transaction without a claim (exactly once)"),
    ("false", "always", "sqs-once: a claim, then the transaction (exactly once)"),
)
PEERS = (
    ("python", "Powertools (Python) 3.37.0: its record, then the handler's own write (effectively once)"),
    ("node", "Powertools (TypeScript) 2.35.0: its record, then the handler's own write (effectively once)"),
)


def balances_table():
    name = f"balances-{uuid.uuid4().hex[:8]}"
    boto3.client("dynamodb").create_table(
        TableName=name, BillingMode="PAY_PER_REQUEST",
        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}])
    return name


def credits(count):
    """An event of `count` credits of 1 to ACCOUNTS accounts, fresh message ids."""
    run = uuid.uuid4().hex[:8]
    path = Path(tempfile.gettempdir()) / f"credits-{run}.json"
    records = [record(f"{run}-{n}", {"account": f"acct-{n % ACCOUNTS}", "amount": 1}) for n in range(count)]
    path.write_text(json.dumps({"Records": records}))
    return path


def consumer(way, endpoint, table, balances):
    """The command and environment of one consumer of the credits at `endpoint`."""
    env = dict(os.environ, AWS_ENDPOINT_URL_DYNAMODB=endpoint)
    env.pop("SQS_ONCE_DEMO_LOG", None)
    if way in ("python", "node"):
        env["PEER_BALANCES"] = balances
        command = [PYTHON, str(PEER), table] if way == "python" else \
            ["node", "--preserve-symlinks", "--preserve-symlinks-main", str(NODE_PEER), table]
        return command, env
    kept, claim = way
    env.update(SQS_ONCE_TABLE=table, SQS_ONCE_HANDLER="ledger", SQS_ONCE_LEDGER_TABLE=balances,
               SQS_ONCE_LEDGER_KEYS_IN_ACCOUNTS=kept, SQS_ONCE_CLAIM=claim, SQS_ONCE_OUTBOX_SWEEP_SECS="0",
               SQS_ONCE_LOCAL_CACHE="0")
    return [str(BINARY), "invoke", "--timeout", "900"], env


def run(way, endpoint, table, balances, event, batching=True):
    """One consumer's process over `event`: its measured run and how many records it failed."""
    command, env = consumer(way, endpoint, table, balances)
    if not batching:
        env["SQS_ONCE_DYNAMODB_BATCHING"] = "false"
    result = measured(command + [str(event)], env)
    answer = json.loads(result["stdout"].splitlines()[-1])
    failures = (answer.get("response") or answer)["batchItemFailures"]
    return result, len(failures)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--credits", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--output", default=str(ROOT / "bench" / "RESULTS.md"))
    args = parser.parse_args()
    count = args.credits
    ways = [((kept, claim), name) for kept, claim, name in WAYS] + list(PEERS)
    metered, timed, ceilings = {}, {}, []
    meter = Meter()
    for attempt in range(args.runs):
        for way, name in (ways if attempt % 2 == 0 else ways[::-1]):
            # Capacity, through the meter, single requests: DynamoDB Local reports none for batched statements.
            table, balances, event = create_table(), balances_table(), credits(count)
            meter.read()
            for what in ("new", "copy"):
                _, failed = run(way, meter.url, table, balances, event, batching=False)
                if failed:
                    sys.exit(f"{name}, {what}: {failed} of {count} failed")
                metered.setdefault((name, what), []).append(meter.read())
            # Time and CPU on DynamoDB Local itself.
            table, balances, event = create_table(), balances_table(), credits(count)
            result, failed = run(way, os.environ["AWS_ENDPOINT_URL_DYNAMODB"], table, balances, event)
            if failed:
                sys.exit(f"{name}: {failed} of {count} failed on DynamoDB Local")
            timed.setdefault(name, []).append(result)
            event.unlink()
        ceilings.append(batched_ceiling(2000))
        print(f"== run {attempt + 1} done; batched ceiling {ceilings[-1]:.0f} records/s", file=sys.stderr)
    meter.process.stdin.close()

    def per_credit(name, what, field):
        return summary([units[field] / count for units in metered[(name, what)]])

    def write_units(name, what):
        return summary([(units["table_writes"] + units["index_writes"]) / count for units in metered[(name, what)]])

    def requests(name, what):
        return summary([sum(units["requests"].values()) / count for units in metered[(name, what)]])

    ceiling = summary(ceilings)
    lines = [
        SECTION,
        "",
        f"`bench/credits --credits {count} --runs {args.runs}` at {revision()}: {count:,} credits of 1 to "
        f"{ACCOUNTS} accounts (items under 1 KB), then the same event again (copies, receive count 1), through "
        "each consumer's process on DynamoDB Local: sqs-once's `ledger` (`sqs-once invoke`, the local cache off), "
        "and Powertools for AWS Lambda, whose record handler writes the same credit with its own `UpdateItem` "
        "inside its idempotent function (`idempotent_function` in Python, `makeIdempotent` in TypeScript, keyed on "
        "`messageId`, with the batch utility). Write units and requests as DynamoDB reports them (testkit's meter, "
        "single requests: Local reports no capacity for batched statements, which AWS charges as the single requests "
        "they stand for; a write refused by its condition 1 unit, a transaction 2 units an action); CPU and records/s "
        f"of the process on DynamoDB Local directly, sqs-once with its default batching, beside the batched ceiling "
        f"of the same runs ({fmt(ceiling)} records/s: conditional PartiQL INSERTs then UPDATEs, 25 a request). "
        f"Medians of {args.runs} [min–max].",
        "",
        "| way | write units per credit | requests per credit | a copy: write units · read units | CPU ms per "
        "credit | credits/s | vs the batched ceiling |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for _, name in ways:
        results = timed[name]
        cpu = summary([result["cpu"] * 1000 / count for result in results])
        rate = summary([count / result["wall"] for result in results])
        copy = f"{fmt(write_units(name, 'copy'), 2)} · {fmt(per_credit(name, 'copy', 'reads'), 2)}"
        lines.append(f"| {name} | {fmt(write_units(name, 'new'), 2)} | {fmt(requests(name, 'new'), 2)} | {copy} | "
                     f"{fmt(cpu, 3)} | {fmt(rate)} | {rate['median'] / ceiling['median']:.0%} |")
    write_section(args.output, SECTION, lines)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
