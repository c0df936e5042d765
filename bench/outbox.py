"""The outbox with a backlog, through the release binary as a scheduled
invocation runs it: `sqs-once invoke events/outbox-sweep.json`, a process per
sweep. A ledger credit commits one notice to a queue that does not exist yet;
its outbox item is the model of ENTRIES more, each with a body of BYTES, one
run each, their leases ended. Sweeps while the queue is missing (every send
refused), then, once it exists, sweeps until the outbox is empty. Per sweep:
wall time, peak RSS, messages sent; the backlog's drain rate. Writes the "The
outbox's backlog" section of bench/RESULTS.md. Started by bench/outbox."""

import argparse
import copy
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time

import boto3

from driver import BINARY, ROOT, create_table, fmt, measured, record, revision, summary, write_section

SECTION = "## The outbox's backlog"
DYNAMODB = boto3.client("dynamodb", endpoint_url=os.environ["AWS_ENDPOINT_URL_DYNAMODB"])
SQS = boto3.client("sqs", endpoint_url=os.environ["AWS_ENDPOINT_URL_SQS"])
SHARDS = 16


def shard(run):
    """The outbox shard of a run's entries: FNV-1a of the run's id prefix, as the store shards them."""
    hash = 0x811C9DC5
    for byte in run.encode():
        hash = ((hash ^ byte) * 0x01000193) & 0xFFFFFFFF
    return f"OUTBOX#{hash % SHARDS}"


def settings(table, queue_url, ledger):
    return dict(os.environ, SQS_ONCE_TABLE=table, SQS_ONCE_HANDLER="ledger", SQS_ONCE_LEDGER_TABLE=ledger,
                SQS_ONCE_LEDGER_NOTIFY_URL=queue_url)


def sweep(env):
    """One sweep, as a scheduled invocation: its wall time, peak RSS and the messages it sent."""
    path = ROOT / "events" / "outbox-sweep.json"
    run = measured([BINARY, "invoke", "--timeout", "30", str(path)], env)
    return {"wall": run["wall"], "rss_mib": run["rss_mib"], "sent": json.loads(run["stdout"])["outboxSent"]}


def committed_model(env, table):
    """The outbox item of one ledger credit's notice, committed by the release binary with `env`."""
    with tempfile.NamedTemporaryFile("w", suffix=".json") as credit:
        json.dump({"Records": [record("model-1", {"account": "a", "amount": 1})]}, credit)
        credit.flush()
        subprocess.run([BINARY, "invoke", credit.name], env=env, check=True, capture_output=True)
    (model,) = DYNAMODB.scan(TableName=table, FilterExpression="attribute_exists(outbox)")["Items"]
    return model


def write_backlog(table, model, count, size, prefix="bench", to=None):
    """`count` copies of the outbox item `model`, one run each, their leases ended, each body `size` bytes; ids
    as the store writes them (a hashed key, a random token), after `prefix`; `to` = (old, new) moves their
    destination."""
    for start in range(0, count, 25):
        requests = []
        for n in range(start, min(start + 25, count)):
            item = copy.deepcopy(model)
            claim, token = f"{prefix}#{hashlib.sha256(str(n).encode()).hexdigest()}", os.urandom(16).hex()
            run = f"{claim}#outbox#{token}#"
            entry = json.loads(item["outbox"]["S"].replace(*to) if to else item["outbox"]["S"])
            entry.update(id=run + "000", claim_id=claim, token=token, lease_until_ms=0)
            item.update(id={"S": run + "000"}, open_status={"S": shard(run)}, token={"S": token},
                        in_progress_expiration={"N": "0"}, outbox={"S": json.dumps(entry)},
                        body={"S": json.dumps({"n": n, "padding": "x" * size})})
            requests.append({"PutRequest": {"Item": item}})
        DYNAMODB.batch_write_item(RequestItems={table: requests})


def drain(queue_url):
    """The messages waiting in the queue, received and deleted."""
    received = []
    while True:
        messages = SQS.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10).get("Messages", [])
        if not messages:
            return received
        received += messages
        SQS.delete_message_batch(QueueUrl=queue_url, Entries=[
            {"Id": str(n), "ReceiptHandle": message["ReceiptHandle"]} for n, message in enumerate(messages)])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--entries", type=int, default=3000)
    parser.add_argument("--bytes", type=int, default=100 * 1024)
    parser.add_argument("--behind", type=int, default=40,
                        help="entries to a queue that exists, behind the refused backlog in their shards")
    parser.add_argument("--output", default=str(ROOT / "bench" / "RESULTS.md"))
    args = parser.parse_args()
    table, ledger = create_table(), f"ledger-{time.time_ns()}"
    DYNAMODB.create_table(TableName=ledger, BillingMode="PAY_PER_REQUEST",
                          AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
                          KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}])
    name = f"notices-{time.time_ns()}"
    queue_url = f"{os.environ['AWS_ENDPOINT_URL_SQS']}/123456789012/{name}"
    env = settings(table, queue_url, ledger)
    # The model: one credit's notice, committed while its queue does not exist.
    model = committed_model(env, table)
    written = time.perf_counter()
    other = f"behind-{time.time_ns()}"
    other_url = SQS.create_queue(QueueName=other)["QueueUrl"]
    write_backlog(table, model, args.entries, args.bytes)
    write_backlog(table, model, args.behind, args.bytes, prefix="zz-behind", to=(queue_url, other_url))
    print(f"== {args.entries + args.behind} entries written in {time.perf_counter() - written:.0f} s",
          file=sys.stderr)
    # Every send of the backlog refused: its queue does not exist; those behind it go to a queue that does, each
    # sweep a new process, as the schedule invokes a cold environment.
    refused, behind, reached_at = [], [], None
    while len(refused) < 3 or (len(behind) < args.behind and len(refused) < 10):
        refused.append(sweep(env))
        behind += drain(other_url)
        if reached_at is None and len(behind) >= args.behind:
            reached_at = len(refused)
        print(f"== refused sweep {len(refused)}: {refused[-1]}, {len(behind)} of {args.behind} behind sent",
              file=sys.stderr)
    reached = f"{len(behind)} of the {args.behind} behind it sent, " + (
        f"every one by sweep {reached_at}" if reached_at else f"after {len(refused)} sweeps")
    SQS.create_queue(QueueName=name)
    time.sleep(16)  # the refused entries' sending leases end
    drained, received, bodies = [], 0, set()
    while True:
        result = sweep(env)
        drained.append(result)
        messages = drain(queue_url)
        received += len(messages)
        bodies.update(message["Body"] for message in messages)
        pages = DYNAMODB.get_paginator("scan").paginate(TableName=table, FilterExpression="attribute_exists(outbox)",
                                                         Select="COUNT")
        left = sum(page["Count"] for page in pages)
        print(f"== sweep {len(drained)}: {result}, {left} left", file=sys.stderr)
        if left == 0 or len(drained) > 200:
            break
    sweeping = sum(result["wall"] for result in drained)
    per_page = min(100, 2**20 // max(args.bytes, 1))
    total = args.entries + 1
    lines = [
        SECTION,
        "",
        f"`bench/outbox --entries {args.entries} --bytes {args.bytes} --behind {args.behind}` at {revision()}: "
        f"{args.entries:,} outbox entries of {args.bytes // 1024} KB (one run each, about "
        f"{args.entries * args.bytes / 2**20:,.0f} MB) and one committed by the ledger, their queue missing, and "
        f"{args.behind} behind them in their shards to a queue that exists, on DynamoDB Local and the SQS server on "
        "the same 2 cores; each sweep a process of the release binary, `sqs-once invoke events/outbox-sweep.json` "
        "(30 s timeout), as the template's schedule invokes a cold environment. Medians [min–max].",
        "",
        "| sweeps | what | wall s per sweep | peak RSS MiB | messages sent per sweep (a page of each shard) |",
        "|---|---|---|---|---|",
        f"| {len(refused)} | the backlog's sends refused (no such queue) | {fmt(summary([r['wall'] for r in refused]), 2)} | "
        f"{fmt(summary([r['rss_mib'] for r in refused]), 1)} | {fmt(summary([r['sent'] for r in refused]))} |",
        f"| {len(drained)} | the queue exists: until the outbox is empty | "
        f"{fmt(summary([r['wall'] for r in drained]), 2)} | {fmt(summary([r['rss_mib'] for r in drained]), 1)} | "
        f"{fmt(summary([r['sent'] for r in drained]))} |",
        "",
        f"Behind the refused backlog, each sweep a new process: {reached} (a cold process goes on where the last "
        "sweep left off).",
        "",
        f"Drained: {len(bodies):,} of {total:,} messages received after {len(drained)} sweeps taking {sweeping:.0f} s "
        f"in all, {len(bodies) / sweeping:,.0f} messages a second of sweeping, {received - len(bodies)} of them twice "
        "(a send or its deletion cut at the invocation's end, sent again with the same outbox id); every sweep ended "
        "within its 30 s, its peak "
        "RSS the same whatever the backlog. A sweep reads a page of each of the 16 shards (100 entries or a megabyte, "
        f"{per_page} of these), so that with the template's schedule (every 5 minutes) and no traffic such a backlog "
        f"drains at about {16 * per_page:,} entries a period, and, while traffic flows, beside each batch for as long as its own work lasts (a "
        "sweep beside a batch takes no entry after it).",
    ]
    write_section(args.output, SECTION, lines)
    print("\n".join(lines))
    if len(bodies) != total:
        sys.exit(f"received {len(bodies)} of {total}")


if __name__ == "__main__":
    main()
