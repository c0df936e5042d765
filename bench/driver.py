#!/usr/bin/env python3
"""Runs sqs-once and Powertools for AWS Lambda (Python) side by side on the same
DynamoDB Local and writes bench/RESULTS.md. Started by bench/run, which installs
and starts what it needs and exports the DynamoDB endpoint."""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BINARY = ROOT / "target" / "release" / "sqs-once"
PYTHON = sys.executable
PEER = ROOT / "bench" / "peer_powertools.py"
CONCURRENCY = 64
NOTES = "## Profile and changes"
SINGLE = "sqs-once invoke, single requests"


# GNU time, whose own child is the command measured: the peak RSS a process
# reports to its parent (`ru_maxrss`) is kept across `exec`, so a command
# started straight from this harness reports at least the harness's own
# resident set at the fork (about 46 MiB with boto3 loaded), whatever it used.
TIME = "/usr/bin/time"


def peak_rss_measured(command, output):
    """`command` under GNU time, which writes its peak RSS (KiB) to `output`."""
    if not os.access(TIME, os.X_OK):
        sys.exit(f"{TIME} is needed to measure peak RSS: apt-get install -y time")
    return [TIME, "--format", "%M", "--output", output, *map(str, command)]


def read_peak_rss_mib(output):
    """The peak RSS GNU time wrote to `output`, MiB."""
    with open(output) as written:
        return int(written.read().split()[-1]) / 1024


def measured(command, env=None, stderr_to=None):
    """Runs `command`; returns its stdout and its wall time, CPU time and peak RSS."""
    started = time.perf_counter()
    stderr = open(stderr_to, "wb") if stderr_to else subprocess.DEVNULL
    with tempfile.NamedTemporaryFile("r", suffix=".rss") as rss:
        process = subprocess.Popen(peak_rss_measured(command, rss.name), stdout=subprocess.PIPE, stderr=stderr,
                                   env=env)
        stdout = process.stdout.read()
        # GNU time's usage includes the command's, which it waited for.
        _, status, usage = os.wait4(process.pid, 0)
        wall = time.perf_counter() - started
        process.returncode = os.waitstatus_to_exitcode(status)
        if stderr_to:
            stderr.close()
        if process.returncode != 0:
            raise SystemExit(f"{command} failed with {process.returncode}")
        peak = read_peak_rss_mib(rss.name)
    return {
        "stdout": stdout.decode(),
        "wall": wall,
        "cpu": usage.ru_utime + usage.ru_stime,
        "rss_mib": peak,
    }


def create_table():
    name = f"bench-{uuid.uuid4().hex[:12]}"
    subprocess.run([BINARY, "create-table", "--table", name], check=True, stdout=subprocess.DEVNULL)
    return name


def record(message_id, body, fifo_group=None, sequence=0):
    attributes = {"ApproximateReceiveCount": "1", "SentTimestamp": "1763780000000", "SenderId": "AIDAEXAMPLE",
                  "ApproximateFirstReceiveTimestamp": "1763780000100"}
    arn = "arn:aws:sqs:us-east-1:123456789012:work"
    if fifo_group is not None:
        arn += ".fifo"
        attributes.update(MessageGroupId=fifo_group, MessageDeduplicationId=message_id,
                          SequenceNumber=f"{sequence:020d}")
    return {"messageId": message_id, "receiptHandle": f"AQEB{message_id}", "body": json.dumps(body),
            "attributes": attributes, "messageAttributes": {}, "md5OfBody": "0" * 32, "eventSource": "aws:sqs",
            "eventSourceARN": arn, "awsRegion": "us-east-1"}


def event(kind, size):
    """One SQS event of `size` records, with fresh message ids."""
    run = uuid.uuid4().hex[:8]
    if kind == "fifo":
        groups, per_group = 100, size // 100
        records = [record(f"{run}-g{g}-{n}", {"g": g, "n": n}, f"group-{g}", g * per_group + n)
                   for n in range(per_group) for g in range(groups)]
    elif kind == "in-batch":
        # Every message delivered twice in the same batch: 50% of the records are duplicates.
        records = [record(f"{run}-{n % (size // 2)}", {"n": n % (size // 2)}) for n in range(size)]
    else:
        records = [record(f"{run}-{n}", {"n": n}) for n in range(size)]
    path = Path(tempfile.mkstemp(prefix=f"bench-{kind}-{size}-", suffix=".json")[1])
    path.write_text(json.dumps({"Records": records}))
    return path


def sqs_once(table, event_path, size, batching=True, endpoint=None):
    env = dict(os.environ, SQS_ONCE_TABLE=table, SQS_ONCE_HANDLER="demo", SQS_ONCE_CONCURRENCY=str(CONCURRENCY),
               SQS_ONCE_DYNAMODB_BATCHING=str(batching).lower())
    if endpoint:
        env["AWS_ENDPOINT_URL_DYNAMODB"] = endpoint
    env.pop("SQS_ONCE_DEMO_LOG", None)
    with tempfile.NamedTemporaryFile(suffix=".log") as logs:
        run = measured([BINARY, "invoke", "--timeout", "900", "--metrics", event_path], env, logs.name)
        metrics = [json.loads(line) for line in Path(logs.name).read_text().splitlines() if line.startswith("{")]
    response = json.loads(run["stdout"])
    return sample(run, size, len(response["batchItemFailures"]), metrics[-1]["DynamoDbRequests"], None)


def powertools(table, event_path, size, fifo):
    command = [PYTHON, PEER, table, str(event_path)] + (["fifo"] if fifo else [])
    run = measured(command)
    result = json.loads(run["stdout"])
    failed = len(result["response"]["batchItemFailures"])
    return sample(run, size, failed, result["requests"], result["seconds"])


def in_process(table, event_path, size, passes, endpoint=None):
    """The engine inside the harness: `passes` runs of one event through one engine."""
    command = ["cargo", "bench", "-q", "--locked", "-p", "sqs-once-cli", "--bench", "throughput", "--", "engine", "--table", table,
               "--event", str(event_path), "--concurrency", str(CONCURRENCY), "--passes", str(passes)]
    env = dict(os.environ, AWS_ENDPOINT_URL_DYNAMODB=endpoint) if endpoint else None
    lines = subprocess.run(command, check=True, capture_output=True, text=True, cwd=ROOT, env=env).stdout.splitlines()
    results = [json.loads(line) for line in lines if line.startswith("{")]
    return [{"records_per_s": r["per_second"], "handler_s": r["seconds"], "requests_per_record": r["requests"] / size,
             "failed": r["failed"]} for r in results]


def sample(run, size, failed, requests, handler_seconds):
    return {
        "wall_s": run["wall"],
        "handler_s": handler_seconds if handler_seconds is not None else run["wall"],
        "records_per_s": size / (handler_seconds if handler_seconds is not None else run["wall"]),
        "cpu_ms_per_record": run["cpu"] * 1000 / size,
        "rss_mib": run["rss_mib"],
        "requests_per_record": requests / size,
        "failed": failed,
    }


def ceiling(requests):
    command = ["cargo", "bench", "-q", "--locked", "-p", "sqs-once-cli", "--bench", "throughput", "--", "ceiling", "--table",
               create_table(), "--requests", str(requests), "--concurrency", str(CONCURRENCY)]
    output = subprocess.run(command, check=True, capture_output=True, text=True, cwd=ROOT).stdout
    result = json.loads(output.splitlines()[-1])
    if result["failed"]:
        print(f"ceiling: {result['failed']} of {requests} claim writes failed; they are not counted", file=sys.stderr)
    return result["per_second"]


# Requests a minimal client keeps in flight for the batched ceiling.
BATCHED_IN_FLIGHT = 8


def batched_ceiling(records):
    """Records/s DynamoDB Local takes in batched statements: conditional INSERTs, then conditional UPDATEs."""
    command = ["cargo", "bench", "-q", "--locked", "-p", "sqs-once-cli", "--bench", "throughput", "--",
               "batched-ceiling", "--table", create_table(), "--records", str(records),
               "--concurrency", str(BATCHED_IN_FLIGHT)]
    output = subprocess.run(command, check=True, capture_output=True, text=True, cwd=ROOT).stdout
    result = json.loads(output.splitlines()[-1])
    if result["inserted"] < records or result["completed"] < records:
        print(f"batched ceiling: {records - min(result['inserted'], result['completed'])} of {records} records "
              "did not apply; they are not counted", file=sys.stderr)
    return result["per_second"]


# Round trips to DynamoDB (a delaying proxy in front of DynamoDB Local) and
# batch sizes of the latency-bound runs.
ROUND_TRIPS_MS = (5, 20)
LATENCY_SIZES = (100, 1000)


class Network:
    """`throughput delay-proxy`: DynamoDB Local `round_trip_ms` away, behind TLS if `tls`."""

    def __init__(self, round_trip_ms, tls=False):
        command = ["cargo", "bench", "-q", "--locked", "-p", "sqs-once-cli", "--bench", "throughput", "--",
                   "delay-proxy", "--upstream", os.environ["AWS_ENDPOINT_URL_DYNAMODB"],
                   "--round-trip-ms", str(round_trip_ms)] + (["--tls"] if tls else [])
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT)
        started = json.loads(self.process.stdout.readline())
        self.url, self.certificate = started["url"], started["certificate"]

    def __enter__(self):
        return self

    def __exit__(self, *_):
        self.process.stdin.close()
        self.process.wait(timeout=30)


def warm_lambda_batch(table, event_path, endpoint):
    """Milliseconds from delivery to answer of a running function's second event (new message ids, every
    connection open), the release binary run as Lambda runs it (`throughput lambda`)."""
    command = ["cargo", "bench", "-q", "--locked", "-p", "sqs-once-cli", "--bench", "throughput", "--", "lambda",
               "--binary", str(BINARY), "--table", table, "--event", str(event_path), "--invocations", "2"]
    output = subprocess.run(command, check=True, capture_output=True, text=True, cwd=ROOT,
                            env=dict(os.environ, AWS_ENDPOINT_URL_DYNAMODB=endpoint)).stdout
    result = json.loads(output.splitlines()[-1])
    if any(result["failed"]):
        sys.exit(f"the function failed records of new messages: {result}")
    return result["batches_ms"][1]


# The latency-bound runs' consumers, in the order of their columns.
LATENCY_CONSUMERS = ("invoke", "single", "in process", "warm function")


def latency_bound(results, run):
    """New records through a network of each round trip: process start to answer (`invoke`, batched and
    single requests), batch start to answer (the engine in process, its connections new) and a running
    function's second batch (its connections open)."""
    for round_trip in ROUND_TRIPS_MS:
        with Network(round_trip) as proxy:
            for size in LATENCY_SIZES:
                path = event("new", size)
                for consumer in (LATENCY_CONSUMERS if run % 2 == 0 else LATENCY_CONSUMERS[::-1]):
                    table = create_table()
                    if consumer == "in process":
                        ms = in_process(table, path, size, 1, proxy.url)[0]["handler_s"] * 1000
                    elif consumer == "warm function":
                        ms = warm_lambda_batch(table, path, proxy.url)
                    else:
                        ms = sqs_once(table, path, size, consumer == "invoke", proxy.url)["wall_s"] * 1000
                    results.setdefault((round_trip, size, consumer), []).append(ms)
                path.unlink()


def described_commit():
    """The commit the tree is at, with `-dirty` when it has changes: what a written section says it measured."""
    return subprocess.run(["git", "describe", "--always", "--dirty", "--abbrev=7"],
                          capture_output=True, text=True, cwd=ROOT).stdout.strip() or "?"


def revision():
    """The commit measured, marked when the tree differs from it."""
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT)
    dirty = subprocess.run(["git", "diff", "--quiet", "HEAD"], cwd=ROOT).returncode != 0
    return commit.stdout.strip() + (" (with uncommitted changes)" if dirty else "")


def write_section(path, section, lines):
    """Replaces `section` (a `## ` heading to the next) of the Markdown file at `path` with `lines`, or adds it."""
    output = Path(path)
    text = output.read_text() if output.exists() else ""
    start = text.find(section)
    if start >= 0:
        end = text.find("\n## ", start + len(section))
        text = text[:start] + text[end + 1:] if end >= 0 else text[:start]
    output.write_text(text.rstrip("\n") + "\n\n" + "\n".join(lines))


def summary(values):
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def fmt(stat, digits=0):
    if stat is None:
        return "–"
    return f"{stat['median']:,.{digits}f} [{stat['min']:,.{digits}f}–{stat['max']:,.{digits}f}]"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--sizes", default="10,1000,10000")
    parser.add_argument("--output", default=str(ROOT / "bench" / "RESULTS.md"))
    args = parser.parse_args()
    sizes = [int(size) for size in args.sizes.split(",")]

    # A fresh JVM is several times slower until its JIT has compiled the paths
    # the consumers take: claims, completions, and claims that fail.
    print("warming DynamoDB Local up (20,000 claim writes, 2 × 10,000 records through the engine)", file=sys.stderr)
    ceiling(20_000)
    warm_event = event("new", 10_000)
    in_process(create_table(), warm_event, 10_000, 2)
    warm_event.unlink()

    scenarios = []
    for size in sizes:
        scenarios += [("new", size), ("duplicate", size)]
        if size >= 100:
            scenarios.append(("in-batch", size))
    if 1000 in sizes:
        scenarios.append(("fifo", 1000))
    results = {}  # (consumer, scenario, size) -> list of samples
    ceilings = []
    batched_ceilings = []
    latencies = {}  # (round trip ms, records, consumer) -> list of ms
    floors = {}  # (round trip ms, records) -> list of ms
    for run in range(args.runs):
        print(f"run {run + 1} of {args.runs}", file=sys.stderr)
        ceilings.append(ceiling(5_000))
        batched_ceilings.append(batched_ceiling(2_000))
        for round_trip in ROUND_TRIPS_MS:
            for size in LATENCY_SIZES:
                floor_ms = 2 * round_trip + size / batched_ceilings[-1] * 1000
                floors.setdefault((round_trip, size), []).append(floor_ms)
        latency_bound(latencies, run)
        for kind, size in scenarios:
            if kind == "duplicate":
                continue  # measured right after "new", on the same table
            path = event(kind, size)
            consumers = [("Powertools (Python)", "pt"), ("sqs-once invoke", "cli"), ("sqs-once in process", "lib")]
            if size == 1000:
                consumers.append((SINGLE, "single"))
            if run % 2:
                consumers.reverse()  # alternate who goes first
            for name, consumer in consumers:
                table = create_table()
                if consumer == "lib":
                    passes = in_process(table, path, size, 2 if kind == "new" else 1)
                    results.setdefault((name, kind, size), []).append(passes[0])
                    if kind == "new":
                        results.setdefault((name + ", warm cache", "duplicate", size), []).append(passes[1])
                    continue
                for pass_kind in (["new", "duplicate"] if kind == "new" else [kind]):
                    if consumer == "pt":
                        measured_sample = powertools(table, path, size, kind == "fifo")
                    else:
                        measured_sample = sqs_once(table, path, size, batching=consumer != "single")
                    results.setdefault((name, pass_kind, size), []).append(measured_sample)
            path.unlink()
        print(f"  ceiling {ceilings[-1]:.0f} puts/s, batched {batched_ceilings[-1]:.0f} records/s", file=sys.stderr)

    # A one-record event, process start to answer.
    single = {"pt": [], "cli": []}
    for run in range(max(args.runs, 5)):
        path = event("new", 1)
        for consumer in (["pt", "cli"] if run % 2 == 0 else ["cli", "pt"]):
            table = create_table()
            sample_ = powertools(table, path, 1, False) if consumer == "pt" else sqs_once(table, path, 1)
            single[consumer].append(sample_["wall_s"] * 1000)
        path.unlink()

    write_report(args, results, summary(ceilings), summary(batched_ceilings),
                 {k: summary(v) for k, v in single.items()},
                 {k: summary(v) for k, v in latencies.items()}, {k: summary(v) for k, v in floors.items()})


def stat(results, key, field):
    samples = results.get(key)
    return summary([s[field] for s in samples]) if samples and field in samples[0] else None


def write_report(args, results, ceiling_stat, batched_stat, single, latencies, latency_floors):
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?")
    memory = next(line.split(":", 1)[1].strip() for line in open("/proc/meminfo") if line.startswith("MemTotal"))
    powertools_version = subprocess.run([PYTHON, "-c", "import aws_lambda_powertools, boto3; "
                                         "print(aws_lambda_powertools.__version__, boto3.__version__)"],
                                        capture_output=True, text=True).stdout.split()
    rustc = subprocess.run(["rustc", "--version"], capture_output=True, text=True, cwd=ROOT).stdout.strip()
    commit = described_commit()
    command_line = " ".join(["bench/run"] + sys.argv[1:])
    binary_mib = BINARY.stat().st_size / 2**20
    lines = [
        "# Benchmark: sqs-once vs Powertools for AWS Lambda (Python)",
        "",
        f"Written by `{command_line}` on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} at commit "
        f"{commit}. "
        f"Machine: {os.cpu_count()} cores ({cpu}), {memory} memory, {platform.system()} {platform.release()}. "
        f"DynamoDB Local 1.25.1 on the same machine, in memory. {rustc}; Powertools "
        f"{powertools_version[0] if powertools_version else '?'} with boto3 "
        f"{powertools_version[1] if len(powertools_version) > 1 else '?'}, Python {platform.python_version()}.",
        "",
        f"Each figure is the median of {args.runs} runs, with [min–max]; the consumers alternate who goes first; every "
        "run uses fresh tables, and DynamoDB Local is warmed up first (20,000 claim writes, then 10,000 records through "
        "the engine twice). Both handlers do no work of "
        "their own, so what is measured is the consumer. Requests are counted by each client (an SDK interceptor, "
        "a botocore hook). CPU is the consumer process's user + system time (the server excluded), per record. "
        "`records/s` is records over the handler's own time for Powertools and the in-process engine, over the "
        "whole process for `sqs-once invoke`.",
        "",
        "`sqs-once` batches its DynamoDB writes by default (`SQS_ONCE_DYNAMODB_BATCHING`); the rows \"single "
        "requests\" turn that off, one request per claim and per completion as before.",
        "",
        f"**Ceiling:** DynamoDB Local sustained **{fmt(ceiling_stat)}** single conditional `PutItem`/s from the Rust "
        f"SDK at {CONCURRENCY} in flight; at 2 requests per new record that allows "
        f"{ceiling_stat['median'] / 2:,.0f} new records/s.",
        "",
        f"**Batched ceiling:** a minimal Rust SDK client claiming 2,000 new keys with conditional PartiQL `INSERT`s, "
        f"then completing them with conditional `UPDATE`s (the store's statements, 25 a request, "
        f"{BATCHED_IN_FLIGHT} requests in flight) got **{fmt(batched_stat)}** records/s through DynamoDB Local.",
        "",
        "| scenario | records | consumer | records/s | wall ms | CPU ms/record | requests/record | peak RSS MiB | failed |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    order = ["new", "duplicate", "in-batch", "fifo"]
    keys = sorted(results, key=lambda k: (k[2], order.index(k[1]), k[0]))
    labels = {"new": "all new", "duplicate": "all duplicates (2nd pass)", "in-batch": "50% duplicates in batch",
              "fifo": "FIFO 100 groups × 10"}
    for key in keys:
        name, kind, size = key
        wall = stat(results, key, "wall_s")
        lines.append(
            f"| {labels[kind]} | {size:,} | {name} | {fmt(stat(results, key, 'records_per_s'))} | "
            f"{fmt({k: v * 1000 for k, v in wall.items()}) if wall else '–'} | "
            f"{fmt(stat(results, key, 'cpu_ms_per_record'), 3)} | {fmt(stat(results, key, 'requests_per_record'), 2)} | "
            f"{fmt(stat(results, key, 'rss_mib'), 1)} | {fmt(stat(results, key, 'failed'))} |")

    def median(key, field):
        found = stat(results, key, field)
        return found["median"] if found else float("nan")

    targets = []
    for size in (1000, 10000):
        for name in ("sqs-once in process", "sqs-once invoke"):
            ours = median((name, "new", size), "records_per_s")
            if ours == ours:
                fraction = ours / batched_stat["median"]
                targets.append((f"{size:,} new records ({name}): ≥ 90% of the batched ceiling",
                                f"{fraction:.0%} ({ours:,.0f} of {batched_stat['median']:,.0f} records/s)",
                                fraction >= 0.9))
        ours = median(("sqs-once invoke", "duplicate", size), "records_per_s")
        if ours == ours:
            fraction = ours / batched_stat["median"]
            targets.append((f"{size:,} duplicates (sqs-once invoke): ≥ 90% of the batched ceiling",
                            f"{fraction:.0%} ({ours:,.0f} of {batched_stat['median']:,.0f} records/s)",
                            fraction >= 0.9))
    if 1000 in [k[2] for k in results]:
        ours = median(("sqs-once in process", "new", 1000), "records_per_s")
        theirs = median(("Powertools (Python)", "new", 1000), "records_per_s")
        fraction = ours / (ceiling_stat["median"] / 2)
        targets.append(("1,000 new records: throughput ≥ 70% of the ceiling ÷ 2", f"{fraction:.0%} "
                        f"({ours:,.0f} of {ceiling_stat['median'] / 2:,.0f} records/s); "
                        f"{ours / theirs:.1f}× Powertools' {theirs:,.0f}", fraction >= 0.7))
        for size in (1000, 10000):
            ours_cpu = median(("sqs-once invoke", "new", size), "cpu_ms_per_record")
            theirs_cpu = median(("Powertools (Python)", "new", size), "cpu_ms_per_record")
            if ours_cpu == ours_cpu and theirs_cpu == theirs_cpu:
                targets.append((f"CPU per new record at {size:,} records ≤ 1/30 of Powertools'",
                                f"1/{theirs_cpu / ours_cpu:.0f} ({ours_cpu:.3f} vs {theirs_cpu:.3f} ms)",
                                ours_cpu * 30 <= theirs_cpu))
        floors = [(("sqs-once invoke", "new", 1000), 2), (("sqs-once invoke", "duplicate", 1000), 1),
                  (("sqs-once in process, warm cache", "duplicate", 1000), 0), (("sqs-once invoke", "in-batch", 1000), 1)]
        batched = [median(key, "requests_per_record") for key, _ in floors]
        singles = [median((SINGLE, kind, size), "requests_per_record") for (_, kind, size), _ in floors[:2] + floors[3:]]
        single_floors = [2, 1, 1]
        targets.append(("requests per record: new 2, duplicate 1, warm-cache duplicate 0, 50% in-batch 1 (0 extra)",
                        "batched " + ", ".join(f"{value:.2f}" for value in batched) + "; single requests "
                        + ", ".join(f"{value:.2f}" for value in singles),
                        all(value <= floor + 1e-9 for value, (_, floor) in zip(batched, floors))
                        and all(abs(value - floor) < 1e-9 for value, floor in zip(singles, single_floors))))
    targets.append(("1-record invoke, process start to answer ≤ 0.2× the Python process",
                    f"{single['cli']['median']:.0f} ms vs {single['pt']['median']:.0f} ms = "
                    f"{single['cli']['median'] / single['pt']['median']:.2f}×",
                    single["cli"]["median"] <= 0.2 * single["pt"]["median"]))
    rss = median(("sqs-once invoke", "new", 10000), "rss_mib")
    if rss == rss:
        targets.append(("10,000-record batch: peak RSS ≤ 64 MiB", f"{rss:.1f} MiB", rss <= 64))
    targets.append(("release binary, stripped, ≤ 15 MiB", f"{binary_mib:.1f} MiB (x86_64)", binary_mib <= 15))

    lines += ["", "## Latency-bound batches", "",
              "DynamoDB Local behind a proxy that delays every byte by half the round trip each way, and a new "
              "connection by one round trip (`throughput delay-proxy`). The floor is what no client can beat: two "
              "round trips (a claim, then its completion) plus the server's time for the batch at the batched "
              "ceiling of the same run. `invoke` and single requests are timed from process start to answer, the "
              "engine in process from batch start to answer (its connections new), a warm function from an "
              "event's delivery to its answer: the release binary run as Lambda runs it (`throughput lambda`), its "
              "second event of new records, every connection open since its first.", "",
              "| round trip | records | floor ms | sqs-once invoke | invoke, single requests | in process | "
              "warm function |",
              "|---:|---:|---:|---|---|---|---|"]
    for round_trip in ROUND_TRIPS_MS:
        for size in LATENCY_SIZES:
            floor_ms = latency_floors[(round_trip, size)]["median"]
            cells = []
            for consumer in LATENCY_CONSUMERS:
                found = latencies[(round_trip, size, consumer)]
                cells.append(f"{found['median'] / floor_ms:.2f}× floor: {fmt(found)} ms")
            lines.append(f"| {round_trip} ms | {size:,} | {fmt(latency_floors[(round_trip, size)])} | " + " | ".join(cells) + " |")
    for round_trip in ROUND_TRIPS_MS:
        for size in LATENCY_SIZES:
            floor_ms = latency_floors[(round_trip, size)]["median"]
            ours = latencies[(round_trip, size, "invoke")]["median"]
            single_ms = latencies[(round_trip, size, "single")]["median"]
            targets.append((f"{size:,} new records at a {round_trip} ms round trip: invoke within 1.3× the floor, "
                            "batched no slower than single requests",
                            f"{ours / floor_ms:.2f}× ({ours:,.0f} vs {floor_ms:,.0f} ms); single requests "
                            f"{single_ms:,.0f} ms", ours <= 1.3 * floor_ms and ours <= single_ms))
            warm = latencies[(round_trip, size, "warm function")]["median"]
            targets.append((f"{size:,} new records at a {round_trip} ms round trip: a warm function's batch within "
                            "1.3× the floor", f"{warm / floor_ms:.2f}× ({warm:,.0f} vs {floor_ms:,.0f} ms)",
                            warm <= 1.3 * floor_ms))

    lines += ["", "## Targets", "", "| target | measured | met |", "|---|---|---|"]
    lines += [f"| {name} | {value} | {'yes' if met else '**no**'} |" for name, value, met in targets]
    lines += ["", f"1-record event, process start to answer: sqs-once {fmt(single['cli'])} ms, "
                  f"Powertools (`python` importing it and handling one event) {fmt(single['pt'])} ms.", ""]
    # The hand-written analysis below the generated tables survives a rerun.
    output = Path(args.output)
    previous = output.read_text() if output.exists() else ""
    notes = previous[previous.find(NOTES):] if NOTES in previous else ""
    output.write_text("\n".join(lines) + ("\n" + notes if notes else ""))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
