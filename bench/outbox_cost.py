"""What the outbox's sends cost, through the release binary and the bundled `ledger` handler (each credit commits
one notice), on DynamoDB Local and the SQS server:

- the ordinary path: CREDITS credits in batches of BATCH, each batch through `sqs-once invoke` with every setting at
  its default, the notices' SQS requests counted by a proxy injecting nothing (the harness's `sqs-counter`);
- an operator's drain: ENTRIES outbox entries whose sends were refused (their queue did not exist; `claims outbox
  --send` tried them), the queue created, then `sqs-once claims outbox --send` at once, timed, beside a minimal
  client sending the same bodies with `SendMessageBatch` to the same server through the same proxy (the harness's
  `send-ceiling`, as many requests in flight as the outbox sends at once), RUNS times each;
- DynamoDB write units a message, through the harness's meter (single requests, which it can count: AWS charges a
  batched statement as the single request it stands for): the ordinary path with its notices beside the same
  credits without them, and the drain.

Writes "The outbox's price" section of bench/RESULTS.md. Started by bench/outbox-cost."""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import boto3

from cost import harness
from driver import BINARY, ROOT, create_table, fmt, record, revision, summary, write_section
from outbox import committed_model, drain, write_backlog

SECTION = "## The outbox's price: requests and write units a message"
DYNAMODB = boto3.client("dynamodb", endpoint_url=os.environ["AWS_ENDPOINT_URL_DYNAMODB"])
SQS = boto3.client("sqs", endpoint_url=os.environ["AWS_ENDPOINT_URL_SQS"])
SENDS = ("SendMessage", "SendMessageBatch")
# Sends in flight at once in a sweep (the engine's `SWEEP_CONCURRENCY`), each up to ten messages a request.
SWEEP_CONCURRENCY = 16


class Proxy:
    """A harness process serving `mode` (`sqs-counter`, `meter`, `delay-proxy`) in front of `upstream`: its URL, and
    a reading of what it counted at each `read()`."""

    def __init__(self, mode, upstream, *options):
        self.process = subprocess.Popen([harness(), mode, "--upstream", upstream, *options], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, text=True)
        self.url = json.loads(self.process.stdout.readline())["url"]

    def read(self):
        self.process.stdin.write("\n")
        self.process.stdin.flush()
        return json.loads(self.process.stdout.readline())


def sends(counter, before):
    """The SQS send requests `counter` saw since its reading `before`, and the reading now."""
    now = counter.read()
    return sum(now.get(op, 0) - before.get(op, 0) for op in SENDS), now


def write_units(meter):
    """The write units DynamoDB charged since the meter's last reading, its indexes' included."""
    units = meter.read()
    return units["table_writes"] + units["index_writes"]


def ledger_table():
    name = f"ledger-{uuid.uuid4().hex[:8]}"
    DYNAMODB.create_table(TableName=name, BillingMode="PAY_PER_REQUEST",
                          AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
                          KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}])
    return name


# Handlers at once in a process (`SQS_ONCE_CONCURRENCY`), set by `--concurrency`: DynamoDB Local runs transactions
# one at a time, and 64 at once (the default) leave some unanswered past the SDK's 2 s attempt.
CONCURRENCY = {}
# Where sqs-once and the ceiling reach SQS: the counter, or a network of `--sqs-round-trip-ms` in front of it.
SQS_ENDPOINT = {}


def settings(table, ledger, notify_url=None, dynamodb=None, sqs=None, single=False):
    env = dict(os.environ, SQS_ONCE_TABLE=table, SQS_ONCE_HANDLER="ledger", SQS_ONCE_LEDGER_TABLE=ledger,
               **CONCURRENCY)
    env.pop("SQS_ONCE_LEDGER_NOTIFY_URL", None)
    if notify_url:
        env["SQS_ONCE_LEDGER_NOTIFY_URL"] = notify_url
    if dynamodb:
        env["AWS_ENDPOINT_URL_DYNAMODB"] = dynamodb
    if sqs:
        env["AWS_ENDPOINT_URL_SQS"] = sqs
    if single:
        env["SQS_ONCE_DYNAMODB_BATCHING"] = "false"
    return env


def credit_batches(count, batch):
    """Events of `batch` credits each, `count` in all, fresh message ids, each credit of a batch to an account of its
    own: two transactions on one item at once conflict, and DynamoDB cancels one of them."""
    run = uuid.uuid4().hex[:8]
    paths = []
    for start in range(0, count, batch):
        path = Path(tempfile.gettempdir()) / f"outbox-cost-{run}-{start}.json"
        records = [record(f"{run}-{n}", {"account": f"acct-{n % batch}", "amount": 1})
                   for n in range(start, min(start + batch, count))]
        path.write_text(json.dumps({"Records": records}))
        paths.append(path)
    return paths


def invoke(env, path):
    run = subprocess.run([BINARY, "invoke", "--timeout", "900", str(path)], env=env, capture_output=True, text=True)
    if run.returncode != 0:
        sys.exit(f"sqs-once invoke failed: {run.stderr[-2000:]}")
    failed = json.loads(run.stdout)["batchItemFailures"]
    if failed:
        sys.exit(f"{len(failed)} records failed: {run.stderr[-2000:]}")


def send_all(env):
    """`sqs-once claims outbox --send`: its wall time."""
    started = time.perf_counter()
    run = subprocess.run([BINARY, "claims", "outbox", "--send"], env=env, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if run.returncode != 0:
        sys.exit(f"claims outbox --send failed ({run.returncode}): {run.stderr[-2000:]}")
    return wall


def outbox_left(table):
    pages = DYNAMODB.get_paginator("scan").paginate(TableName=table, FilterExpression="attribute_exists(outbox)",
                                                     Select="COUNT")
    return sum(page["Count"] for page in pages)


def new_queue(prefix):
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    return name, f"{os.environ['AWS_ENDPOINT_URL_SQS']}/123456789012/{name}"


def ordinary_requests(credits, batch, counter):
    """The ordinary path with the defaults: SQS send requests, and the notices that arrived once and twice, and
    the entries left."""
    table, ledger = create_table(), ledger_table()
    name, url = new_queue("notices")
    SQS.create_queue(QueueName=name)
    before = counter.read()
    for path in credit_batches(credits, batch):
        invoke(settings(table, ledger, url, sqs=SQS_ENDPOINT["url"]), path)
    requests, _ = sends(counter, before)
    received = drain(url)
    arrived = len({message["Body"] for message in received})
    return {"requests": requests, "arrived": arrived, "copies": len(received) - arrived, "left": outbox_left(table)}


def ordinary_units(credits, batch, meter):
    """Write units of the credits with their notices and without, through the meter (single requests)."""
    units = {}
    for notices in (True, False):
        table, ledger = create_table(), ledger_table()
        name, url = new_queue("metered")
        SQS.create_queue(QueueName=name)
        write_units(meter)
        for path in credit_batches(credits, batch):
            invoke(settings(table, ledger, url if notices else None, dynamodb=meter.url, single=True), path)
        units[notices] = write_units(meter)
        if notices and len(drain(url)) < credits:
            sys.exit("the metered notices did not all arrive")
    return units[True], units[False]


def refused_backlog(entries, size, counter, dynamodb=None, single=False):
    """ENTRIES entries whose sends `claims outbox --send` tried while their queue did not exist, the queue created
    since: the table, the queue's URL and the settings to drain it with."""
    table, ledger = create_table(), ledger_table()
    name, url = new_queue("refused")
    env = settings(table, ledger, url)
    write_backlog(table, committed_model(env, table), entries - 1, size)
    env = settings(table, ledger, url, dynamodb=dynamodb, sqs=SQS_ENDPOINT["url"], single=single)
    send_all(env)
    SQS.create_queue(QueueName=name)
    return table, url, env


def drained(entries, size, counter):
    """One operator's drain: wall time, SQS send requests, messages arrived once and twice, entries left; the
    bodies, for the ceiling."""
    table, url, env = refused_backlog(entries, size, counter)
    before = counter.read()
    wall = send_all(env)
    requests, _ = sends(counter, before)
    received = drain(url)
    bodies = sorted({message["Body"] for message in received})
    return {"wall": wall, "requests": requests, "arrived": len(bodies), "copies": len(received) - len(bodies),
            "left": outbox_left(table), "per_second": len(bodies) / wall}, bodies


def ceiling(bodies, counter):
    """The minimal client's rate of the same bodies, through the same proxy, to a queue of their own."""
    name, url = new_queue("ceiling")
    SQS.create_queue(QueueName=name)
    with tempfile.NamedTemporaryFile("w", suffix=".json") as file:
        json.dump(bodies, file)
        file.flush()
        env = dict(os.environ, AWS_ENDPOINT_URL_SQS=SQS_ENDPOINT["url"])
        run = subprocess.run([harness(), "send-ceiling", "--queue-url", url, "--bodies", file.name, "--concurrency",
                              str(SWEEP_CONCURRENCY)], env=env, capture_output=True, text=True, check=True)
    result = json.loads(run.stdout)
    if result["failed"] or len(drain(url)) != len(bodies):
        sys.exit(f"the ceiling's sends did not all arrive: {result}")
    return result["messages"] / result["seconds"]


def drain_units(entries, size, counter, meter):
    """Write units a message of a drain, through the meter (single requests)."""
    table, url, env = refused_backlog(entries, size, counter, dynamodb=meter.url, single=True)
    write_units(meter)
    send_all(env)
    units = write_units(meter)
    arrived = len({message["Body"] for message in drain(url)})
    left = outbox_left(table)
    print(f"== metered drain: {arrived} of {entries} arrived, {left} left, {units} write units", file=sys.stderr)
    if arrived + left < entries:
        sys.exit(f"the metered drain lost messages: {arrived} arrived and {left} left of {entries}")
    return units / arrived, left


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--credits", type=int, default=1000)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--entries", type=int, default=2000)
    parser.add_argument("--bytes", type=int, default=1024)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--concurrency", type=int, help="SQS_ONCE_CONCURRENCY (the default, 64, if not given)")
    parser.add_argument("--sqs-round-trips", default="0,20",
                        help="networks between the processes and SQS, ms of round trip (the harness's delay-proxy)")
    parser.add_argument("--output", default=str(ROOT / "bench" / "RESULTS.md"))
    args = parser.parse_args()
    if args.concurrency:
        CONCURRENCY["SQS_ONCE_CONCURRENCY"] = str(args.concurrency)
    counter = Proxy("sqs-counter", os.environ["AWS_ENDPOINT_URL_SQS"])
    meter = Proxy("meter", os.environ["AWS_ENDPOINT_URL_DYNAMODB"])
    with_notices, without = ordinary_units(args.credits, args.batch, meter)
    per_message = (with_notices - without) / args.credits
    print(f"== write units a credit: {with_notices / args.credits:.2f} with its notice, "
          f"{without / args.credits:.2f} without", file=sys.stderr)
    SQS_ENDPOINT["url"] = counter.url
    units, metered_left = drain_units(args.entries, args.bytes, counter, meter)
    rows = []
    for round_trip in [int(ms) for ms in args.sqs_round_trips.split(",")]:
        network = Proxy("delay-proxy", counter.url, "--round-trip-ms", str(round_trip)) if round_trip else None
        SQS_ENDPOINT["url"] = (network or counter).url
        where = f"SQS {round_trip} ms away" if round_trip else "SQS at once"
        path = ordinary_requests(args.credits, args.batch, counter)
        print(f"== ordinary path, {where}: {path}", file=sys.stderr)
        drains, ceilings = [], []
        for run in range(args.runs):
            result, bodies = drained(args.entries, args.bytes, counter)
            drains.append(result)
            ceilings.append(ceiling(bodies, counter))
            print(f"== drain {run + 1}, {where}: {result}, ceiling {ceilings[-1]:.0f} messages/s", file=sys.stderr)
        ratios = [d["per_second"] / c for d, c in zip(drains, ceilings)]
        rows += [
            f"| ordinary, {where}: a notice committed with each credit | {path['requests'] / args.credits:.3f} | – | "
            f"– | {path['arrived']:,} of {args.credits:,} · {path['copies']} · {path['left']} |",
            f"| drain, {where}: `claims outbox --send` | "
            f"{fmt(summary([d['requests'] / args.entries for d in drains]), 3)} | "
            f"{fmt(summary([d['per_second'] for d in drains]))} | {fmt(summary(ratios), 2)} | "
            f"{statistics.median(d['arrived'] for d in drains):,.0f} of {args.entries:,} · "
            f"{max(d['copies'] for d in drains)} · {max(d['left'] for d in drains)} |",
            f"| ceiling, {where}: `SendMessageBatch` of the same bodies | 0.100 | {fmt(summary(ceilings))} | 1 | – |",
        ]
        if network:
            network.process.stdin.close()
    options = f" --concurrency {args.concurrency}" if args.concurrency else ""
    lines = [
        SECTION,
        "",
        f"`bench/outbox-cost --credits {args.credits} --batch {args.batch} --entries {args.entries} --bytes "
        f"{args.bytes} --runs {args.runs}{options} --sqs-round-trips {args.sqs_round_trips}` at {revision()}: the "
        "release binary with the `ledger` handler (each credit commits one notice to an SQS queue), DynamoDB Local "
        "and the SQS server on the same 2 cores, the SQS requests counted by a proxy that injects nothing (the "
        "harness's `sqs-counter`), with the server at once or behind a network of the round trip shown (the "
        "harness's `delay-proxy`). *Ordinary*: "
        f"{args.credits:,} credits in batches of {args.batch}, each batch through `sqs-once invoke` with every setting "
        "at its default" + (f" but `SQS_ONCE_CONCURRENCY={args.concurrency}` (DynamoDB Local runs transactions one at "
                            "a time, and more at once leave some unanswered past the SDK's 2 s attempt)"
                            if args.concurrency else "") + ". *Drain*: "
        f"{args.entries:,} entries of {args.bytes:,} bytes whose sends were refused (their queue did not exist; "
        "`claims outbox --send` tried them), the queue created, then `sqs-once claims outbox --send` at once; its "
        "*ceiling* is a minimal client (the harness's `send-ceiling`) sending the same bodies, each with one "
        f"attribute, ten to a `SendMessageBatch` and {SWEEP_CONCURRENCY} requests in flight, by the same way to the "
        f"same server, right after each drain. Drains: median [min–max] of {args.runs}.",
        "",
        "| path | SQS requests a message | messages/s | vs the ceiling | sent · copies · left |",
        "|---|---:|---:|---:|---|",
        *rows,
        "",
        "DynamoDB write units a message, through the harness's meter (single requests, which it can count: AWS "
        "charges a batched statement as the single request it stands for; the indexes' writes included): "
        f"**{per_message:.2f} on the ordinary path** (a credit with its notice {with_notices / args.credits:.2f}, "
        f"without {without / args.credits:.2f}), **{units:.2f} in a drain**"
        + (f" ({metered_left} of its {args.entries:,} entries left after the command, with single requests)"
           if metered_left else "") + ".",
    ]
    write_section(args.output, SECTION, lines)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
