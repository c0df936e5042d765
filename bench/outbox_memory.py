"""The outbox's memory with a refused backlog, with and without the open-claims
index: a warm process (`sqs-once poll`, sweeping every second for WARM
seconds, each sweep reading the next bounded part) and cold ones (`sqs-once
invoke events/outbox-sweep.json`, a process per sweep), their peak RSS, for
backlogs of BACKLOGS (entries x bytes) whose queue does not exist. Writes the
"The outbox's memory" section of bench/RESULTS.md. Started by
bench/outbox-memory."""

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

from driver import (BINARY, ROOT, create_table, fmt, peak_rss_measured, read_peak_rss_mib, revision, summary,
                    write_section)
from outbox import DYNAMODB, SQS, committed_model, settings, sweep, write_backlog

SECTION = "## The outbox's memory"


def bare_table():
    """A claim table without the open-claims index (made by hand, as the docs allow)."""
    name = f"bare-{time.time_ns()}"
    DYNAMODB.create_table(TableName=name, BillingMode="PAY_PER_REQUEST",
                          AttributeDefinitions=[{"AttributeName": "id", "AttributeType": "S"}],
                          KeySchema=[{"AttributeName": "id", "KeyType": "HASH"}])
    return name


def warm(env, seconds):
    """`sqs-once poll` of an empty queue, sweeping every second, for `seconds`: its peak RSS and sweeps."""
    source = SQS.create_queue(QueueName=f"work-{time.time_ns()}")["QueueUrl"]
    env = dict(env, SQS_ONCE_OUTBOX_SWEEP_SECS="1")
    with tempfile.NamedTemporaryFile("r", suffix=".rss") as rss:
        command = peak_rss_measured([BINARY, "poll", "--queue-url", source, "--wait-secs", "1"], rss.name)
        process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        time.sleep(seconds)
        # The signal goes to poll itself, GNU time's child.
        with open(f"/proc/{process.pid}/task/{process.pid}/children") as children:
            os.kill(int(children.read().split()[0]), signal.SIGTERM)
        stderr = process.stderr.read().decode()
        if process.wait() != 0:
            sys.exit(f"poll failed: {stderr[-2000:]}")
        peak = read_peak_rss_mib(rss.name)
    sweeps = len(re.findall(r"outbox: sending entries left unsent", stderr))
    return peak, sweeps


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--backlogs", default="2000x2048,8000x2048,2000x102400",
                        help="comma-separated ENTRIESxBYTES")
    parser.add_argument("--warm", type=int, default=40, help="seconds the warm process sweeps")
    parser.add_argument("--output", default=str(ROOT / "bench" / "RESULTS.md"))
    args = parser.parse_args()
    rows = []
    for backlog in args.backlogs.split(","):
        entries, size = (int(part) for part in backlog.split("x"))
        for indexed in (True, False):
            table = create_table() if indexed else bare_table()
            ledger = f"ledger-{time.time_ns()}"
            DYNAMODB.create_table(TableName=ledger, BillingMode="PAY_PER_REQUEST",
                                  AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
                                  KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}])
            missing = f"{os.environ['AWS_ENDPOINT_URL_SQS']}/123456789012/missing-{time.time_ns()}"
            env = settings(table, missing, ledger)
            write_backlog(table, committed_model(env, table), entries, size)
            cold = [sweep(env) for _ in range(3)]
            rss, sweeps = warm(env, args.warm)
            row = (entries, size, indexed, rss, sweeps, summary([run["rss_mib"] for run in cold]))
            print(f"== {entries} x {size} B, index {indexed}: warm {rss:.1f} MiB over {sweeps} sweeps, "
                  f"cold {fmt(row[5], 1)} MiB", file=sys.stderr)
            rows.append(row)
    lines = [
        SECTION,
        "",
        f"`bench/outbox-memory --backlogs {args.backlogs} --warm {args.warm}` at {revision()}: a refused backlog "
        "(its queue does not exist, so every sweep finds it all due again once its leases end) on DynamoDB Local, "
        "with the open-claims index (`create-table`'s table) and without it (a table of the key alone); the release "
        f"binary as a warm process (`sqs-once poll` of an empty queue, sweeping every second for {args.warm} s, each "
        "sweep the next bounded part) and as cold ones (`invoke events/outbox-sweep.json`, three, a process each). "
        "Peak RSS, MiB; cold: median [min–max].",
        "",
        "| backlog | index | warm process | its sweeps that found entries due | cold sweep |",
        "|---|---|---|---|---|",
    ]
    for entries, size, indexed, rss, sweeps, cold in rows:
        lines.append(f"| {entries:,} × {size // 1024} KB | {'yes' if indexed else 'no'} | {rss:.1f} | {sweeps} | "
                     f"{fmt(cold, 1)} |")
    write_section(args.output, SECTION, lines)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
