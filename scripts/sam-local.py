#!/usr/bin/env python3
"""The sample events through `sam local invoke`, with the repository's
samconfig.toml and env.json, against the services scripts/local-services
started; then the sample event of a crate `sqs-once new` wrote, with its own
files. Checks each answer, what the function logged, and what the tables and
queues hold. Run by scripts/sam-local, which makes the image, builds the crate
(its directory in SQS_ONCE_SAM_CRATE) and starts the services (the image's name
in SQS_ONCE_SAM_IMAGE)."""

import json
import os
import subprocess
import sys
import tempfile
import time

import boto3

IMAGE = os.environ["SQS_ONCE_SAM_IMAGE"]
CRATE = os.environ["SQS_ONCE_SAM_CRATE"]
REGION = os.environ.get("AWS_REGION", "us-east-1")
DYNAMODB = boto3.client("dynamodb", region_name=REGION, endpoint_url=os.environ["AWS_ENDPOINT_URL_DYNAMODB"])
SQS = boto3.client("sqs", region_name=REGION, endpoint_url=os.environ["AWS_ENDPOINT_URL_SQS"])


def invoke(event, *overrides, env_vars=None, cwd=None):
    """`sam local invoke ConsumerFunction -e EVENT` in `cwd` (the repository by default): the answer, and the
    function's JSON log lines."""
    command = ["sam", "local", "invoke", "ConsumerFunction", "-e", event, "--invoke-image", IMAGE,
               "--skip-pull-image"]
    if overrides:
        command += ["--parameter-overrides", *overrides]
    if env_vars:
        command += ["--env-vars", env_vars]
    # As a user's shell: SAM gives a declared variable the shell's value where env.json gives none.
    env = {name: value for name, value in os.environ.items() if not name.startswith("AWS_ENDPOINT_URL")}
    for attempt in range(3):
        run = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env, cwd=cwd)
        # SAM's race with a slow emulator start (see scripts/sam-local): the event never reached the function.
        if "No response from invoke container" not in run.stderr or "START RequestId" in run.stderr:
            break
        print(f"{event}: the emulator was not listening yet, the event not delivered; again", file=sys.stderr)
    lines = [json.loads(line) for line in run.stderr.splitlines() + run.stdout.splitlines()
             if line.startswith("{") and line.endswith("}")]
    answers = [line for line in lines if "batchItemFailures" in line or "errorType" in line]
    if not answers:
        sys.exit(f"{' '.join(command)}: no answer\n{run.stdout}\n{run.stderr}")
    return answers[-1], [line for line in lines if "level" in line], run.stdout + run.stderr


def failures(answer):
    return sorted(failure["itemIdentifier"][-2:] for failure in answer["batchItemFailures"])


def outcomes(logs):
    return {line["message_id"][-2:]: line["outcome"] for line in logs if "outcome" in line}


def check(what, got, expected):
    if got != expected:
        sys.exit(f"{what}: got {got!r}, expected {expected!r}")
    print(f"ok: {what}: {got!r}", file=sys.stderr)


def drain(queue):
    url = SQS.get_queue_url(QueueName=queue)["QueueUrl"]
    bodies = []
    while True:
        received = SQS.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1)
        messages = received.get("Messages", [])
        if not messages:
            return bodies
        for message in messages:
            bodies.append(message["Body"])
            SQS.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])


def balance(account):
    item = DYNAMODB.get_item(TableName="ledger", Key={"pk": {"S": account}}, ConsistentRead=True).get("Item")
    return int(item["balance"]["N"]) if item else None


# The bundled demo handler, keyed by message id: a retryable failure and a panic come back, the permanent
# failure goes to the dead-letter queue; every other record runs.
answer, logs, _ = invoke("events/batch.json")
check("batch.json: failed records", failures(answer), ["05", "07"])
check("batch.json: outcomes", outcomes(logs), {
    "01": "processed", "02": "processed", "03": "processed", "04": "processed", "05": "retryable",
    "06": "permanent", "07": "panicked", "08": "processed", "09": "processed", "10": "processed"})
check("batch.json: dead-lettered", len(drain("sqs-once-dead-letters")), 1)
answer, logs, _ = invoke("events/batch.json")
check("batch.json again: failed records", failures(answer), ["05", "07"])
check("batch.json again: duplicates", sorted(key for key, outcome in outcomes(logs).items() if outcome == "duplicate"),
      ["01", "02", "03", "04", "08", "09", "10"])
check("batch.json again: dead-lettered (failed before)", len(drain("sqs-once-dead-letters")), 1)

# The same batch keyed by order, as the README's example: records of one order run once (the first processed, its
# copies duplicates); the body that is not JSON has no key, and fails for good (to the dead-letter queue).
answer, logs, _ = invoke("events/batch.json", "IdempotencyKey=body.order_id")
check("batch.json by order: failed records", failures(answer), ["05", "07"])
check("batch.json by order: outcomes", {n: outcomes(logs)[n] for n in ("01", "03", "08", "09")},
      {"01": "processed", "03": "duplicate", "08": "missing_key", "09": "duplicate"})
check("batch.json by order: dead-lettered", len(drain("sqs-once-dead-letters")), 2)

# A FIFO batch: its failed group stops, the other groups run.
answer, _, _ = invoke("events/fifo.json")
check("fifo.json: failed records", failures(answer), ["03", "05"])

# Large messages: a pointer the Extended Client sent is read from S3 (the bucket scripts/local-services filled)
# before anything else, so the order inside keys it; a pointer to an object never written fails alone.
answer, logs, _ = invoke("events/large-payloads.json", "IdempotencyKey=body.order_id")
check("large-payloads.json: failed records", failures(answer), ["03"])
check("large-payloads.json: outcomes", outcomes(logs),
      {"01": "processed", "02": "processed", "03": "payload_unavailable"})

# The ledger: credits staged and committed with their claims, a notice each through the outbox, the overdraft
# refused by its condition and dead-lettered; a second invocation changes nothing.
for round in ("", " again"):
    answer, _, _ = invoke("events/ledger.json", "HandlerName=ledger")
    check(f"ledger.json{round}: failed records", failures(answer), [])
    check(f"ledger.json{round}: balances", [balance(account) for account in ("acct-1", "acct-2", "acct-3")],
          [60, 20, None])
    notices = sorted(json.loads(body)["message_id"][-2:] for body in drain("ledger-notices"))
    check(f"ledger.json{round}: notices", notices, ["01", "02", "04"] if not round else [])
    check(f"ledger.json{round}: dead-lettered (the overdraft)", len(drain("sqs-once-dead-letters")), 1)

# The outbox swept as the template's schedule asks (events/outbox-sweep.json): a credit committed while its notice
# queue did not exist waits in the outbox; once the queue exists and the entry's sending lease (15 s) has ended, the
# sweep event sends it, whether or not a message comes.
later = "ledger-notices-later"
with open("env.json") as shipped, tempfile.NamedTemporaryFile("w", suffix=".json") as quiet, \
        tempfile.NamedTemporaryFile("w", suffix=".json") as credit:
    settings = json.load(shipped)
    notices = settings["ConsumerFunction"]["SQS_ONCE_LEDGER_NOTIFY_URL"]
    settings["ConsumerFunction"]["SQS_ONCE_LEDGER_NOTIFY_URL"] = notices.rsplit("/", 1)[0] + "/" + later
    json.dump(settings, quiet)
    quiet.flush()
    with open("events/ledger.json") as ledger:
        record = json.load(ledger)["Records"][0]
    record.update(messageId="sweep-01", body=json.dumps({"account": "acct-quiet", "amount": 7}))
    json.dump({"Records": [record]}, credit)
    credit.flush()
    answer, _, _ = invoke(credit.name, "HandlerName=ledger", env_vars=quiet.name)
    check("a notice to a queue not there yet: failed records", failures(answer), [])
    check("a notice to a queue not there yet: the credit", balance("acct-quiet"), 7)
    SQS.create_queue(QueueName=later)
    time.sleep(16)
    answer, logs, _ = invoke("events/outbox-sweep.json", "HandlerName=ledger", env_vars=quiet.name)
    check("a sweep after the sending lease: answered", failures(answer), [])
    sent = [json.loads(body)["message_id"] for body in drain(later)]
    check("a sweep after the sending lease: the notice sent", sent, ["sweep-01"])
    check("a sweep after the sending lease: logged", [line.get("sent") for line in logs if "sent" in line], [1])

# A claim table that does not exist stops the start with the table and endpoint named, instead of failing every
# record `store_error`.
with open("env.json") as shipped, tempfile.NamedTemporaryFile("w", suffix=".json") as no_table:
    settings = json.load(shipped)
    settings["ConsumerFunction"]["SQS_ONCE_TABLE"] = "no-such-table"
    json.dump(settings, no_table)
    no_table.flush()
    answer, _, _ = invoke("events/single.json", env_vars=no_table.name)
check("a missing table: the error", answer.get("errorType"), "Runtime.ConfigError")
check("a missing table: the reason", answer.get("errorMessage", "").split(":")[0],
      "the claim table `no-such-table` does not exist at http")

# A crate `sqs-once new` wrote, with its own template, samconfig.toml and env.json: each order charged once (its one
# key, set in its code, the order id: o-1001's second message is a duplicate of the first's run), the empty order
# dead-lettered.
for round in ("", " again"):
    answer, logs, _ = invoke("events/batch.json", cwd=CRATE)
    check(f"payments{round}: failed records", failures(answer), [])
    check(f"payments{round}: outcomes", outcomes(logs),
          {"01": "processed", "02": "processed", "03": "permanent", "04": "duplicate"} if not round else
          {"01": "duplicate", "02": "duplicate", "03": "failed_before", "04": "duplicate"})
    keys = {line["message_id"][-2:]: line["key"] for line in logs if "key" in line}
    check(f"payments{round}: o-1001's two messages share a key, o-1002's is another",
          (keys["01"] == keys["04"], keys["01"] == keys["02"]), (True, False))
    check(f"payments{round}: dead-lettered", len(drain("sqs-once-dead-letters")), 1)

# Without the local endpoints (env.json not given) the function refuses to start, rather than reach whichever
# account the caller's credentials name.
with tempfile.NamedTemporaryFile("w", suffix=".json") as empty:
    empty.write("{}")
    empty.flush()
    answer, _, _ = invoke("events/single.json", env_vars=empty.name)
check("without env.json: the error", answer.get("errorType"), "Runtime.ConfigError")
check("without env.json: the reason", answer.get("errorMessage", "").split(":")[0], "AWS_ENDPOINT_URL_DYNAMODB is not set")
