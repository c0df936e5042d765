"""Commit to send, through the release binary on wall clocks, with a destination
that answers at once and one that takes DELAY seconds a request (a proxy in
front of the SQS server that holds each request that long before it goes on).

- After the commit: BATCHES batches of 10 ledger credits, each through `sqs-once
  invoke` (a process per batch, as a cold Lambda environment), each credit
  committing one notice that its run sends at once. Per message, the commit (the
  credit's claim, as its transaction wrote it, `updated_at`) to its arrival in
  the notice queue (`SentTimestamp`); per batch, its wall time.
- After a cold start: ENTRIES credits committed while the notice queue does not
  exist (every send refused, the entries left in the outbox); once it exists and
  the leases have ended, one cold process sweeps, as the schedule invokes an idle
  environment (`sqs-once invoke events/outbox-sweep.json`): per message, the
  sweeper's start to its arrival; the messages it sent a second.

Every message is counted as it arrives, and copies (the same outbox id twice)
apart. Writes the "The outbox's latency" section of bench/RESULTS.md. Started by
bench/outbox-latency."""

import argparse
import asyncio
import json
import os
import sys
import tempfile
import threading
import time
from urllib.parse import urlparse

from driver import BINARY, ROOT, create_table, fmt, measured, record, revision, summary, write_section
from outbox import DYNAMODB, SQS, settings

SECTION = "## The outbox's latency"


class SlowDestination:
    """A TCP proxy in front of the SQS server that holds each request `delay` seconds before it goes on (its
    answer comes back at once): a destination that takes `delay` a request, where the message lands at its end."""

    def __init__(self, upstream, delay):
        self.upstream, self.delay = urlparse(upstream), delay
        self.loop = asyncio.new_event_loop()
        started = threading.Event()
        threading.Thread(target=self._serve, args=(started,), daemon=True).start()
        started.wait()
        self.url = f"http://127.0.0.1:{self.port}"

    def _serve(self, started):
        asyncio.set_event_loop(self.loop)
        server = self.loop.run_until_complete(asyncio.start_server(self._connection, "127.0.0.1", 0))
        self.port = server.sockets[0].getsockname()[1]
        started.set()
        self.loop.run_forever()

    async def _connection(self, client_reader, client_writer):
        upstream_reader, upstream_writer = await asyncio.open_connection(self.upstream.hostname, self.upstream.port)
        await asyncio.gather(self._pipe(client_reader, upstream_writer, self.delay),
                             self._pipe(upstream_reader, client_writer, 0), return_exceptions=True)

    async def _pipe(self, reader, writer, delay):
        """Copies `reader` to `writer`, each chunk `delay` after it arrived."""
        chunks = asyncio.Queue()

        async def forward():
            while True:
                due, chunk = await chunks.get()
                await asyncio.sleep(max(0.0, due - self.loop.time()))
                if chunk is None:
                    writer.close()
                    return
                writer.write(chunk)
                await writer.drain()

        forwarding = asyncio.create_task(forward())
        try:
            while chunk := await reader.read(65536):
                chunks.put_nowait((self.loop.time() + delay, chunk))
        finally:
            chunks.put_nowait((self.loop.time() + delay, None))
            await forwarding


def received(queue_url):
    """Every message in the queue, received and deleted: [(outbox id, body, SentTimestamp ms)]."""
    messages = []
    while True:
        batch = SQS.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10, AttributeNames=["SentTimestamp"],
                                    MessageAttributeNames=["All"]).get("Messages", [])
        if not batch:
            return messages
        for message in batch:
            outbox_id = message["MessageAttributes"]["SqsOnce.OutboxId"]["StringValue"]
            messages.append((outbox_id, json.loads(message["Body"]), int(message["Attributes"]["SentTimestamp"])))
        SQS.delete_message_batch(QueueUrl=queue_url, Entries=[
            {"Id": str(n), "ReceiptHandle": message["ReceiptHandle"]} for n, message in enumerate(batch)])


def committed_at(table):
    """Each credit's commit, epoch ms, by its message id: its claim's last write (the commit's completion)."""
    pages = DYNAMODB.get_paginator("scan").paginate(TableName=table, FilterExpression="attribute_exists(#s)",
                                                     ExpressionAttributeNames={"#s": "status"})
    return {item["message_id"]["S"]: int(item["updated_at"]["N"]) for page in pages for item in page["Items"]}


def ledger_table():
    name = f"ledger-{time.time_ns()}"
    DYNAMODB.create_table(TableName=name, BillingMode="PAY_PER_REQUEST",
                          AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
                          KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}])
    return name


def credits(first, count):
    """An event of `count` credits, message ids from `first`, each to an account of its own."""
    return {"Records": [record(f"m-{n}", {"account": f"a-{n}", "amount": 1}) for n in range(first, first + count)]}


def invoke(env, event, *args):
    with tempfile.NamedTemporaryFile("w", suffix=".json") as path:
        json.dump(event, path)
        path.flush()
        return measured([BINARY, "invoke", "--timeout", "30", *args, path.name], env)


def percentiles(values):
    """p50 and p99 of `values` (nearest rank)."""
    ordered = sorted(values)
    rank = lambda share: ordered[min(len(ordered) - 1, max(0, round(share * len(ordered)) - 1))]
    return rank(0.50), rank(0.99)


def copies(messages):
    """Messages that arrived more than once (the same outbox id)."""
    return len(messages) - len({outbox_id for outbox_id, _, _ in messages})


def after_commit(endpoint, batches):
    """The runs' own sends: per message, commit to arrival (s); per batch, wall (s); copies."""
    table, queue = create_table(), SQS.create_queue(QueueName=f"notices-{time.time_ns()}")["QueueUrl"]
    env = dict(settings(table, queue, ledger_table()), AWS_ENDPOINT_URL_SQS=endpoint)
    walls = [invoke(env, credits(batch * 10, 10))["wall"] for batch in range(batches)]
    time.sleep(2)
    messages, commits = received(queue), committed_at(table)
    first = {}
    for _, body, sent in messages:
        first[body["message_id"]] = min(sent, first.get(body["message_id"], sent))
    latencies = [(first[message_id] - commits[message_id]) / 1000 for message_id in first]
    return {"latencies": latencies, "walls": walls, "sent": len(first), "copies": copies(messages),
            "expected": batches * 10}


def after_cold_start(endpoint, entries, delay):
    """Entries left by refused sends, swept by one cold process once their queue exists: per message, the
    sweeper's start to arrival (s); the sweep's wall; messages a second; copies."""
    table, name = create_table(), f"notices-{time.time_ns()}"
    queue = f"{os.environ['AWS_ENDPOINT_URL_SQS']}/123456789012/{name}"
    env = dict(settings(table, queue, ledger_table()), AWS_ENDPOINT_URL_SQS=endpoint)
    for first in range(0, entries, 10):
        invoke(env, credits(first, min(10, entries - first)))
    time.sleep(delay + 1)  # no refused send is still on its way when the queue appears
    SQS.create_queue(QueueName=name)
    time.sleep(16)  # the committing runs' sending leases end
    started = time.time()
    sweep = invoke(env, json.loads((ROOT / "events" / "outbox-sweep.json").read_text()))
    sent = json.loads(sweep["stdout"])["outboxSent"]
    time.sleep(2)
    messages = received(queue)
    first = {}
    for _, body, at in messages:
        first[body["message_id"]] = min(at, first.get(body["message_id"], at))
    latencies = [at / 1000 - started for at in first.values()]
    span = max(latencies) if latencies else 0
    return {"latencies": latencies, "wall": sweep["wall"], "sent": len(first), "reported": sent,
            "copies": copies(messages), "expected": entries, "rate": len(first) / span if span else 0}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", type=int, default=20, help="batches of 10 credits after which runs send")
    parser.add_argument("--entries", type=int, default=100, help="entries a cold sweeper finds")
    parser.add_argument("--delay", type=float, default=3.0, help="seconds a request takes at the slow destination")
    parser.add_argument("--output", default=str(ROOT / "bench" / "RESULTS.md"))
    args = parser.parse_args()
    direct = os.environ["AWS_ENDPOINT_URL_SQS"]
    slow = SlowDestination(direct, args.delay)
    destinations = (("answers at once", direct, 0), (f"{args.delay:g} s a request", slow.url, args.delay))
    rows = []
    for name, endpoint, delay in destinations:
        warm = after_commit(endpoint, args.batches)
        cold = after_cold_start(endpoint, args.entries, delay)
        print(f"== {name}: after the commit {warm}, after a cold start {cold}", file=sys.stderr)
        rows.append((name, warm, cold))
    lines = [
        SECTION,
        "",
        f"`bench/outbox-latency --batches {args.batches} --entries {args.entries} --delay {args.delay:g}` at "
        f"{revision()}: the release binary with the `ledger` handler (each credit commits one notice), DynamoDB Local "
        "and the SQS server on the same 2 cores, on wall clocks. The slow destination is a proxy in front of the SQS "
        f"server holding each request {args.delay:g} s before it goes on, so that a message lands {args.delay:g} s "
        "after its send starts. *After the commit*: batches of 10 credits, each through `sqs-once invoke` (a process "
        "per batch), the commit (the claim's write) to the notice's arrival in its queue (`SentTimestamp`). *After a "
        f"cold start*: {args.entries} credits committed while their notice queue did not exist (every send refused); "
        "once it exists and the sending leases have ended, one new process sweeps (`invoke events/outbox-sweep.json`, "
        "as the schedule invokes an idle environment), its start to each notice's arrival.",
        "",
        "| destination | after the commit: p50 / p99 s | batch wall s | sent · copies | after a cold start: p50 / "
        "p99 s | sweep wall s | sent · copies | messages/s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, warm, cold in rows:
        warm_p = percentiles(warm["latencies"]) if warm["latencies"] else (0, 0)
        cold_p = percentiles(cold["latencies"]) if cold["latencies"] else (0, 0)
        lines.append(
            f"| {name} | {warm_p[0]:.3f} / {warm_p[1]:.3f} | {fmt(summary(warm['walls']), 2)} | "
            f"{warm['sent']} of {warm['expected']} · {warm['copies']} | {cold_p[0]:.2f} / {cold_p[1]:.2f} | "
            f"{cold['wall']:.2f} | {cold['sent']} of {cold['expected']} · {cold['copies']} | {cold['rate']:.1f} |")
    write_section(args.output, SECTION, lines)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
