"""Large messages through the release binary, as a Lambda invocation runs
them (`sqs-once invoke`, a process per batch, claims on DynamoDB Local):
RECORDS records whose payloads of SIZE bytes the Amazon SQS Extended Client
kept in S3 (moto's, on the same machine), each a pointer marked
`ExtendedPayloadSize`, beside RECORDS records carrying the same payloads as
their bodies. Per batch: wall time, CPU per record, peak RSS; per pointer, the
time its S3 read took (the engine's debug line). Writes the "Large messages"
section of bench/RESULTS.md. Started by bench/payloads."""

import argparse
import json
import os
import re
import tempfile
import uuid
from pathlib import Path

import boto3

from driver import BINARY, ROOT, create_table, fmt, measured, record, revision, summary, write_section

SECTION = "## Large messages: a payload read from S3 beside one in the body"
S3 = boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL_SQS"])
BUCKET = f"bench-payloads-{uuid.uuid4().hex[:8]}"
READ = re.compile(r"payload read from S3.*?\bms\"?[=:]\s*(\d+)")


def payload(n, size):
    body = json.dumps({"n": n, "padding": ""})
    return body.replace('""', '"' + "x" * (size - len(body)) + '"')


def event(size, records, through_s3):
    """An event of `records` records with payloads of `size` bytes: in S3 behind pointers, or in their bodies."""
    run = uuid.uuid4().hex[:8]
    items = []
    for n in range(records):
        item = record(f"{run}-{n}", {})
        body = payload(n, size)
        if through_s3:
            key = f"{run}/{n}"
            S3.put_object(Bucket=BUCKET, Key=key, Body=body.encode())
            item["body"] = json.dumps(["software.amazon.payloadoffloading.PayloadS3Pointer",
                                       {"s3BucketName": BUCKET, "s3Key": key}])
            item["messageAttributes"] = {"ExtendedPayloadSize": {"stringValue": str(size), "dataType": "Number"}}
        else:
            item["body"] = body
        items.append(item)
    path = Path(tempfile.mkstemp(prefix="bench-payloads-", suffix=".json")[1])
    path.write_text(json.dumps({"Records": items}))
    return path


def invoke(table, path, records):
    env = dict(os.environ, SQS_ONCE_TABLE=table, SQS_ONCE_HANDLER="demo", SQS_ONCE_CONCURRENCY="64",
               AWS_ENDPOINT_URL_S3=os.environ["AWS_ENDPOINT_URL_SQS"], SQS_ONCE_LOG="info,sqs_once=debug",
               NO_COLOR="1")
    env.pop("SQS_ONCE_DEMO_LOG", None)
    with tempfile.NamedTemporaryFile(suffix=".log") as logs:
        run = measured([BINARY, "invoke", "--timeout", "120", str(path)], env, logs.name)
        reads = [int(match.group(1)) for match in READ.finditer(Path(logs.name).read_text())]
    failed = json.loads(run["stdout"])["batchItemFailures"]
    if failed:
        raise SystemExit(f"{len(failed)} records failed in {path}")
    return {"wall": run["wall"], "cpu_ms": run["cpu"] * 1000 / records, "rss_mib": run["rss_mib"], "reads": reads}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    # Ten records a batch, the SQS event source's default: Lambda's 6 MB invocation payload holds no more than
    # six bodies of 900 KiB, and any number of pointers.
    parser.add_argument("--records", type=int, default=10)
    parser.add_argument("--sizes", default="16384,262144,921600")
    parser.add_argument("--output", default=str(ROOT / "bench" / "RESULTS.md"))
    args = parser.parse_args()
    S3.create_bucket(Bucket=BUCKET)
    table = create_table()
    rows = []
    for size in [int(size) for size in args.sizes.split(",")]:
        results = {True: [], False: []}
        # A body past SQS's 1 MiB cannot be: such a payload goes through S3 only.
        ways = (False, True) if size < 1024 * 1024 else (True,)
        for _ in range(args.runs):
            for through_s3 in ways:
                results[through_s3].append(invoke(table, event(size, args.records, through_s3), args.records))
        plain, pointer = results[False] or None, results[True]
        reads = sorted(ms for result in pointer for ms in result["reads"])
        if len(reads) != args.runs * args.records:
            raise SystemExit(f"{len(reads)} reads logged, {args.runs * args.records} expected")
        def of(results, field, scale=1):
            return summary([result[field] * scale for result in results]) if results else None

        cpu = (of(plain, "cpu_ms"), of(pointer, "cpu_ms"))
        ratio = f"{cpu[1]['median'] / cpu[0]['median']:.2f}" if plain else "–"
        rows.append(
            f"| {size // 1024} KiB | {fmt(cpu[0], 3)} | {fmt(cpu[1], 3)} | {ratio} | "
            f"{reads[len(reads) // 2]} / {reads[len(reads) * 99 // 100]} | "
            f"{fmt(of(plain, 'wall', 1000))} | {fmt(of(pointer, 'wall', 1000))} | "
            f"{fmt(of(plain, 'rss_mib'), 1)} | {fmt(of(pointer, 'rss_mib'), 1)} |"
        )
    lines = [
        SECTION,
        "",
        f"`bench/payloads --runs {args.runs} --records {args.records} --sizes {args.sizes}` at {revision()}: batches "
        f"of {args.records} records through the release binary (`sqs-once invoke`, a process per batch, the demo "
        "handler, claims on DynamoDB Local), their payloads either in their bodies or in S3 (moto's server, on the "
        "same two cores) behind the Extended Client's pointers. Medians [min–max] of the runs; the S3 read time is "
        "each pointer's read as the engine logs it, over every run.",
        "",
        "| payload | CPU ms per record, in the body | CPU ms per record, through S3 | ratio | S3 read ms p50 / p99 | "
        "wall ms per batch, body | wall ms per batch, S3 | peak RSS MiB, body | peak RSS MiB, S3 |",
        "|---|---|---|---|---|---|---|---|---|",
        *rows,
    ]
    write_section(args.output, SECTION, lines)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
