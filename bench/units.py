"""What each record path costs: in DynamoDB capacity units, sqs-once (`invoke`,
single requests, since DynamoDB Local reports no capacity for batched
statements, which AWS charges as the single requests they stand for) and
Powertools for AWS Lambda (Python), through one meter of DynamoDB's own
consumed-capacity answers (`throughput meter`); and in Lambda time, each
consumer's warm invocation of a batch of 10 timed with DynamoDB Local 5 ms
away and the consumer held to the CPU Lambda gives 256 MB. Writes the "Cost
per message" section of bench/RESULTS.md. Started by bench/units, which starts
DynamoDB Local and builds the release binary and the harness."""

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import uuid
from pathlib import Path

import boto3

from driver import BINARY, PEER, PYTHON, Network, create_table, record, revision, write_section
from cost import harness

ROOT = Path(__file__).resolve().parent.parent
SECTION = "## Cost per message: DynamoDB capacity units and Lambda time by record path"
# On-demand prices (us-east-1), as AWS publishes them: USD per million write and read request units.
USD_PER_MILLION_WRITES = 0.625
USD_PER_MILLION_READS = 0.125
# Lambda on arm64 (us-east-1, the first tier): USD per GB-second of duration, billed by the millisecond, and per
# million requests; the function at 256 MB.
USD_PER_GB_SECOND = 0.0000133334
USD_PER_MILLION_INVOCATIONS = 0.20
MEMORY_GB = 0.25
# Lambda gives a function CPU in proportion to its memory, one vCPU at 1,769 MB: 256 MB gets 14.5% of one.
CPU_SHARE = 256 / 1769
# Records per invocation (the SQS event source's default batch size), DynamoDB's distance, and the warm
# invocations timed per path.
BATCH = 10
ROUND_TRIP_MS = 5
TIMED = 7
# The ways a ledger credit commits: SQS_ONCE_LEDGER_KEYS_IN_ACCOUNTS, SQS_ONCE_CLAIM, and what the rows say.
LEDGER_WAYS = (("true", "auto", "its key kept in the account"),
               ("true", "always", "its key kept in the account, claimed first"),
               ("false", "auto", "in a transaction without a claim"),
               ("false", "always", "in a transaction with its claim"))


def credit_path(label):
    """The name of the record path of a ledger credit committed as `label` says."""
    return f"ledger credit staged, {label} (exactly once)"


class LambdaCpu:
    """A CPU cgroup holding its processes to Lambda's share at 256 MB (`CPU_SHARE` of a core per 100 ms period),
    and a launcher that runs a command inside it. Needs root and the cgroup v1 `cpu` controller or cgroup v2."""

    def __init__(self):
        name = f"sqs-once-bench-{uuid.uuid4().hex[:8]}"
        quota_us = int(CPU_SHARE * 100_000)
        if Path("/sys/fs/cgroup/cpu/cgroup.procs").exists():
            self.path = Path("/sys/fs/cgroup/cpu") / name
            self.path.mkdir()
            (self.path / "cpu.cfs_period_us").write_text("100000")
            (self.path / "cpu.cfs_quota_us").write_text(str(quota_us))
        elif "cpu" in Path("/sys/fs/cgroup/cgroup.controllers").read_text().split():
            self.path = Path("/sys/fs/cgroup") / name
            self.path.mkdir()
            (self.path / "cpu.max").write_text(f"{quota_us} 100000")
        else:
            sys.exit("no CPU cgroup to hold the consumers to Lambda's share: run as root on cgroup v1 or v2")
        self.launcher = Path(f"/tmp/{name}.sh")
        self.launcher.write_text(f'#!/bin/sh\necho $$ > {self.path}/cgroup.procs\nexec "$@"\n')
        self.launcher.chmod(0o755)
        self.function = Path(f"/tmp/{name}-function.sh")
        self.function.write_text(f'#!/bin/sh\nexec {self.launcher} {BINARY} "$@"\n')
        self.function.chmod(0o755)

    def close(self):
        self.launcher.unlink()
        self.function.unlink()
        self.path.rmdir()


def lambda_usd_per_million(batch_ms):
    """USD per million messages of the invocations that take `batch_ms` each for `BATCH` records."""
    per_invocation = math.ceil(batch_ms) / 1000 * MEMORY_GB * USD_PER_GB_SECOND + USD_PER_MILLION_INVOCATIONS / 1e6
    return per_invocation / BATCH * 1e6


def batch_event(bodies, prefix):
    path = Path(f"/tmp/units-{prefix}-{uuid.uuid4().hex[:8]}.json")
    path.write_text(json.dumps({"Records": [record(f"{prefix}-{n}", body) for n, body in enumerate(bodies)]}))
    return path


def warm_function_ms(cpu, network, table, bodies, same_ids=False, env=None):
    """A warm function's invocation of a batch of `bodies`, in ms: the release binary as Lambda runs it
    (`throughput lambda`), held to Lambda's CPU, its second invocation (fresh message ids, or with `same_ids`
    the first's again: duplicates) timed from delivery to answer."""
    path = batch_event(bodies, "fn")
    command = ["cargo", "bench", "-q", "--locked", "-p", "sqs-once-cli", "--bench", "throughput", "--", "lambda",
               "--binary", str(cpu.function), "--table", table, "--event", str(path), "--invocations", "2"]
    command += ["--same-ids"] if same_ids else []
    output = subprocess.run(command, check=True, capture_output=True, text=True, cwd=ROOT,
                            env=dict(os.environ, AWS_ENDPOINT_URL_DYNAMODB=network.url, **(env or {}))).stdout
    result = json.loads(output.splitlines()[-1])
    return result["batches_ms"][1], result["failed"][1]


def warm_powertools_ms(cpu, network, table, bodies, same_ids=False):
    """Powertools' handler on a batch of `bodies`, in ms, after one invocation before it in the same process
    (fresh message ids, or with `same_ids` the same batch: then duplicates), held to Lambda's CPU."""
    path = batch_event(bodies, "pt")
    warmup = path if same_ids else batch_event(bodies, "pt-warm")
    env = dict(os.environ, AWS_ENDPOINT_URL_DYNAMODB=network.url, PEER_WARMUP_EVENT=str(warmup))
    run = subprocess.run([cpu.launcher, PYTHON, PEER, table, str(path)], env=env, capture_output=True, text=True)
    if run.returncode != 0:
        sys.exit(f"Powertools failed: {run.stderr[-2000:]}")
    answer = json.loads(run.stdout)
    return answer["seconds"] * 1000, len(answer["response"]["batchItemFailures"])


def lambda_durations(balances):
    """The median warm invocation, in ms, of each record path and consumer."""
    paths = [
        ("new record", [{"n": n} for n in range(BATCH)], False, {}, 0),
        ("duplicate of a completed record", [{"n": n} for n in range(BATCH)], True, {"SQS_ONCE_LOCAL_CACHE": "0"}, 0),
        ("handler fails for good", [{"n": n, "fail": "permanent"} for n in range(BATCH)], False, {}, BATCH),
    ]
    credits = [{"account": f"acct-{n}", "amount": 1} for n in range(BATCH)]
    ledger = {"SQS_ONCE_HANDLER": "ledger", "SQS_ONCE_LEDGER_TABLE": balances, "SQS_ONCE_OUTBOX_SWEEP_SECS": "0"}
    staged = [
        (credit_path(label), credits, False, dict(ledger, SQS_ONCE_CLAIM=claim, SQS_ONCE_LEDGER_KEYS_IN_ACCOUNTS=kept), 0)
        for kept, claim, label in LEDGER_WAYS
    ]
    durations = {}
    cpu = LambdaCpu()
    try:
        with Network(ROUND_TRIP_MS) as network:
            for path, bodies, same_ids, env, expected in paths + staged:
                timed = {"sqs-once": [], "Powertools": []}
                for _ in range(TIMED):
                    ms, failed = warm_function_ms(cpu, network, create_table(), bodies, same_ids, env)
                    if failed != expected:
                        sys.exit(f"sqs-once, {path}: {failed} failed, expected {expected}")
                    timed["sqs-once"].append(ms)
                    if (path, bodies, same_ids, env, expected) in paths:
                        ms, failed = warm_powertools_ms(cpu, network, create_table(), bodies, same_ids)
                        if failed != expected:
                            sys.exit(f"Powertools, {path}: {failed} failed, expected {expected}")
                        timed["Powertools"].append(ms)
                for consumer, times in timed.items():
                    if times:
                        durations[(path, consumer)] = statistics.median(times)
                        print(f"== {consumer}, {path}: {sorted(round(t, 1) for t in times)} ms", file=sys.stderr)
    finally:
        cpu.close()
    return durations


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


def redelivered(path):
    """The event at `path` as SQS delivers it a second time: `ApproximateReceiveCount` 2."""
    event = json.loads(path.read_text())
    for delivered in event["Records"]:
        delivered["attributes"]["ApproximateReceiveCount"] = "2"
    again = path.with_name(path.stem + "-again.json")
    again.write_text(json.dumps(event))
    return again


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=1000)
    parser.add_argument("--output", default=str(ROOT / "bench" / "RESULTS.md"))
    args = parser.parse_args()
    count = args.records
    meter = Meter()
    new = event_file([{"n": n} for n in range(count)])
    failing = event_file([{"n": n, "fail": "permanent"} for n in range(count)])
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
            for kept, claim, label in LEDGER_WAYS:
                credits = event_file([{"account": f"acct-{n % 50}", "amount": 1} for n in range(count)])
                env = {"SQS_ONCE_LEDGER_TABLE": balances, "SQS_ONCE_CLAIM": claim,
                       "SQS_ONCE_LEDGER_KEYS_IN_ACCOUNTS": kept}
                for path, event in ((credit_path(label), credits),
                                    (f"the same credit again, {label}: a copy (receive count 1)", credits),
                                    (f"the same credit again, {label}: redelivered (receive count 2)",
                                     redelivered(credits))):
                    failures = sqs_once(meter, table, event, "ledger", env)
                    if failures:
                        sys.exit(f"{path}: {failures} failed")
                    rows.append((consumer, path, meter.read()))
    meter.process.stdin.close()
    for consumer, path, units in rows:
        print(f"== {consumer}, {path}: {units}", file=sys.stderr)
    durations = lambda_durations(balances)

    def writes(units):
        return (units["table_writes"] + units["index_writes"]) / count

    def dynamodb_usd(units):
        return writes(units) * USD_PER_MILLION_WRITES + units["reads"] / count * USD_PER_MILLION_READS

    by_path = {}
    for consumer, path, units in rows:
        by_path.setdefault(path, {})[consumer] = units

    def ratio(ours, theirs):
        return f"{ours / theirs:.2f}×" if theirs else "–"

    lines = [
        SECTION,
        "",
        f"`bench/units --records {count}` at {revision()}: {count:,} records per path through `sqs-once invoke` (the `demo` handler; "
        "the `ledger` handler for credits, claiming first with `SQS_ONCE_CLAIM=always` and without a claim as it "
        "stages every effect) and through Powertools for AWS Lambda (Python) 3.37.0 "
        "(`idempotent_function` keyed on `messageId`), on DynamoDB Local, each request metered by "
        "`throughput meter` (testkit's meter: every request asks for `ReturnConsumedCapacity: INDEXES`, and the "
        "answers are added up, table and indexes apart). sqs-once runs with single requests: DynamoDB Local reports "
        "no capacity for batched statements, and AWS charges each statement as the single request it stands for. A "
        "write refused by its condition is charged 1 unit, as AWS documents and Local does not report, and a "
        "transactional write 2 units per action (AWS's rate for items of up to 1 KB), where Local reports 4 for any "
        "transaction; a transaction cancelled by a condition is charged as if it had applied, an upper bound (AWS "
        "documents the cost of a transaction that applies, not of one cancelled). USD per "
        f"million messages at on-demand prices ({USD_PER_MILLION_WRITES} per million write units, "
        f"{USD_PER_MILLION_READS} per million read units), DynamoDB alone.",
        "",
        "| record path | sqs-once write units (of them index) · read units | Powertools write units (of them index) · "
        "read units | ratio | sqs-once USD per million | Powertools USD per million |",
        "|---|---:|---:|---:|---:|---:|",
    ]

    def cell(units):
        if units is None:
            return "not offered"
        return f"{writes(units):.2f} ({units['index_writes'] / count:.2f}) · {units['reads'] / count:.2f}"

    for path, consumers in by_path.items():
        ours, theirs = consumers.get("sqs-once"), consumers.get("Powertools")
        theirs_usd = f"{dynamodb_usd(theirs):.3f}" if theirs else "–"
        lines.append(f"| {path} | {cell(ours)} | {cell(theirs)} | "
                     f"{ratio(writes(ours), writes(theirs)) if theirs else '–'} | {dynamodb_usd(ours):.3f} | "
                     f"{theirs_usd} |")
    lines += [
        "",
        "Reads: a claim never reads on these paths (a refused claim returns the item that holds the key); a handler "
        "that stages every effect reads a redelivered key first (one strongly consistent `GetItem`). A permanent "
        "failure costs sqs-once one unit more than Powertools: it keeps the failure (with its reason, in the "
        "open-claims index) where Powertools deletes the record and lets the next delivery run the handler again. A "
        "copy of a credit that arrives with receive count 1 costs a handler without a claim its refused "
        "transaction (or its refused update, its key kept in the account); one SQS delivers again after a failure "
        "or a timeout (receive count above 1) costs it a read, and a key kept in the account its refused update too "
        "(the read finds no claim).",
        "",
        f"**Lambda.** Each consumer's warm invocation of a batch of {BATCH} records (the SQS event source's default "
        f"batch size), DynamoDB Local {ROUND_TRIP_MS} ms away (`throughput delay-proxy`), the consumer held to the "
        f"CPU Lambda gives 256 MB ({CPU_SHARE:.1%} of a core per 100 ms, by a CPU cgroup: Lambda allocates CPU in "
        "proportion to memory, one vCPU at 1,769 MB): sqs-once as Lambda runs it (`throughput lambda`, its second "
        "invocation, every connection open), Powertools' handler on its second event in one Python process; "
        f"duplicates met in an environment that has not seen them (sqs-once's local cache off). Medians of {TIMED}. "
        f"USD per million messages at arm64 prices ({USD_PER_GB_SECOND:.10f} per GB-second, billed by the millisecond, "
        f"{USD_PER_MILLION_INVOCATIONS} per million requests), init left out.",
        "",
        "| record path | sqs-once ms per batch | Powertools ms per batch | ratio | sqs-once Lambda USD per million | "
        "Powertools Lambda USD per million |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    timed_paths = list(dict.fromkeys(path for path, _ in durations))
    for path in timed_paths:
        ours, theirs = durations[(path, "sqs-once")], durations.get((path, "Powertools"))
        theirs_cells = (f"{theirs:.1f} | {ratio(ours, theirs)}", f"{lambda_usd_per_million(theirs):.3f}") \
            if theirs else ("not offered | –", "–")
        lines.append(f"| {path} | {ours:.1f} | {theirs_cells[0]} | {lambda_usd_per_million(ours):.3f} | "
                     f"{theirs_cells[1]} |")
    lines += [
        "",
        "**Per million messages, DynamoDB and Lambda together:**",
        "",
        "| record path | sqs-once USD | Powertools USD | ratio |",
        "|---|---:|---:|---:|",
    ]
    for path in timed_paths:
        ours = dynamodb_usd(by_path[path]["sqs-once"]) + lambda_usd_per_million(durations[(path, "sqs-once")])
        theirs_units, theirs_ms = by_path[path].get("Powertools"), durations.get((path, "Powertools"))
        if theirs_units and theirs_ms:
            theirs = dynamodb_usd(theirs_units) + lambda_usd_per_million(theirs_ms)
            lines.append(f"| {path} | {ours:.3f} | {theirs:.3f} | {ratio(ours, theirs)} |")
        else:
            lines.append(f"| {path} | {ours:.3f} | not offered | – |")
    lines.append("")
    write_section(args.output, SECTION, lines)


if __name__ == "__main__":
    main()
