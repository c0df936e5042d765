"""A batch beside the outbox's backlog: how long one warm Lambda environment
takes to answer batches that stage nothing while its sweeps find a backlog
of refused notices, against the same batches with an empty outbox, with a
destination that answers at once and one that takes DELAY seconds a request.

Each row: ENTRIES ledger credits committed while their notice queue did not
exist (every send refused, the entries left in the outbox; none for the rows
without a backlog); the queue created and the sending leases ended; then the
release binary as Lambda runs it (`throughput lambda`: testkit's Runtime API,
the `demo` handler, `SQS_ONCE_OUTBOX_SWEEP_SECS=1`), INVOCATIONS batches of 5
records, PAUSE seconds apart so that a sweep is due beside each. Per batch,
delivery to answer; the backlog's messages that reached the queue meanwhile,
and copies (the same outbox id twice). Writes the "A batch beside the outbox's
backlog" section of bench/RESULTS.md. Started by bench/outbox-answer."""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from driver import BINARY, ROOT, create_table, fmt, record, revision, summary, write_section
from outbox import SQS, settings
from outbox_latency import SlowDestination, copies, credits, invoke, ledger_table, received

SECTION = "## A batch beside the outbox's backlog"


def backlog(endpoint, entries, delay):
    """A claim table whose outbox holds `entries` refused notices to a queue that now exists, their leases
    ended, sent through `endpoint`: the table and the queue's URL."""
    table, name = create_table(), f"notices-{time.time_ns()}"
    queue = f"{os.environ['AWS_ENDPOINT_URL_SQS']}/123456789012/{name}"
    env = dict(settings(table, queue, ledger_table()), AWS_ENDPOINT_URL_SQS=endpoint)
    for first in range(0, entries, 10):
        invoke(env, credits(first, min(10, entries - first)))
    if entries:
        time.sleep(delay + 1)  # no refused send is still on its way when the queue appears
    SQS.create_queue(QueueName=name)
    if entries:
        time.sleep(16)  # the sending leases end
    return table, queue


def batches(binary, endpoint, table, invocations, pause):
    """`invocations` batches of 5 records staging nothing through one warm environment: each answer, ms."""
    env = dict(os.environ, SQS_ONCE_TABLE=table, SQS_ONCE_HANDLER="demo", SQS_ONCE_OUTBOX_SWEEP_SECS="1",
               AWS_ENDPOINT_URL_SQS=endpoint)
    with tempfile.NamedTemporaryFile("w", suffix=".json") as path:
        json.dump({"Records": [record(f"r-{n}", {}) for n in range(5)]}, path)
        path.flush()
        command = ["cargo", "bench", "-q", "--locked", "-p", "sqs-once-cli", "--bench", "throughput", "--", "lambda",
                   "--binary", str(binary), "--table", table, "--event", path.name, "--invocations",
                   str(invocations), "--pause-ms", str(int(pause * 1000))]
        output = subprocess.run(command, check=True, capture_output=True, text=True, cwd=ROOT, env=env).stdout
    result = json.loads(output.splitlines()[-1])
    assert not any(result["failed"]), f"records failed: {result['failed']}"
    return result["batches_ms"]


def row(binary, endpoint, entries, delay, invocations, pause):
    table, queue = backlog(endpoint, entries, delay)
    answers = batches(binary, endpoint, table, invocations, pause)
    time.sleep(delay + 2)  # requests the batches' sweeps started have landed
    messages = received(queue)
    return {"answers": answers, "arrived": len({outbox_id for outbox_id, _, _ in messages}),
            "copies": copies(messages), "entries": entries}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--entries", type=int, default=100, help="refused notices in the backlog")
    parser.add_argument("--invocations", type=int, default=8, help="batches in the warm environment")
    parser.add_argument("--pause", type=float, default=1.5, help="seconds between a batch's answer and the next")
    parser.add_argument("--delay", type=float, default=3.0, help="seconds a request takes at the slow destination")
    parser.add_argument("--binary", default=str(BINARY), help="the function binary (another build to compare)")
    parser.add_argument("--label", default=None, help="names the build in the section (default: this revision)")
    parser.add_argument("--output", default=str(ROOT / "bench" / "RESULTS.md"))
    args = parser.parse_args()
    direct = os.environ["AWS_ENDPOINT_URL_SQS"]
    slow = SlowDestination(direct, args.delay)
    # Unreported: DynamoDB Local's JIT warms up on the first batches a run sends, whichever row they belong to.
    row(args.binary, direct, 0, 0, args.invocations, 0.2)
    rows = []
    for name, endpoint, delay in (("answers at once", direct, 0), (f"{args.delay:g} s a request", slow.url,
                                                                     args.delay)):
        for entries in (0, args.entries):
            measured = row(args.binary, endpoint, entries, delay, args.invocations, args.pause)
            print(f"== {name}, backlog {entries}: {measured}", file=sys.stderr)
            rows.append((name, measured))
    label = args.label or revision()
    lines = [
        SECTION,
        "",
        f"`bench/outbox-answer --entries {args.entries} --invocations {args.invocations} --pause {args.pause:g} "
        f"--delay {args.delay:g}` at {label}: one warm environment (the release binary as Lambda runs it, through "
        f"testkit's Runtime API, `throughput lambda`), {args.invocations} batches of 5 records that stage nothing "
        f"(the `demo` handler), {args.pause:g} s apart with `SQS_ONCE_OUTBOX_SWEEP_SECS=1`, so that a sweep is due "
        f"beside each; its outbox empty, or holding {args.entries} ledger notices whose sends were refused (their "
        "queue created since, their leases ended). DynamoDB Local and the SQS server on the same 2 cores; the slow "
        f"destination a proxy holding each request {args.delay:g} s. Each batch's delivery to answer, ms: median "
        "[min–max]; the ratio is the median beside the backlog over the median without it. The harness first runs an "
        "unreported row, as DynamoDB Local's JIT warms up.",
        "",
        "| destination | backlog | answer ms | ratio | backlog's messages arrived meanwhile · copies |",
        "|---|---|---|---|---|",
    ]
    baseline = None
    for name, measured in rows:
        median = statistics.median(measured["answers"])
        if not measured["entries"]:
            baseline = median
            ratio, arrived = "1", "–"
        else:
            ratio = f"{median / baseline:.2f}"
            arrived = f"{measured['arrived']} of {measured['entries']} · {measured['copies']}"
        lines.append(f"| {name} | {measured['entries']} | {fmt(summary(measured['answers']), 0)} | {ratio} | "
                     f"{arrived} |")
    write_section(args.output, SECTION, lines)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
