"""The peer: Powertools for AWS Lambda (Python) consuming one SQS event, as its
documentation recommends for SQS: BatchProcessor (SqsFifoPartialProcessor for
FIFO) with process_partial_response, and idempotent_function keyed on
messageId with DynamoDBPersistenceLayer and the Lambda context registered.
With PEER_BALANCES set, each record credits the account its body names in
that table with its own UpdateItem (ADD balance amount) inside the idempotent
function, as a handler writes its effect.

    python peer_powertools.py TABLE EVENT_FILE [fifo]

Prints one JSON object: the partial batch response, the DynamoDB requests
sent (counted by a botocore hook), and the handler's own time. With
PEER_WARMUP_EVENT set, that event is handled first, untimed and uncounted,
as the invocation before a warm function's (its connections open).
"""

import json
import os
import sys
import time

import boto3
from aws_lambda_powertools.utilities.batch import (
    BatchProcessor,
    EventType,
    SqsFifoPartialProcessor,
    process_partial_response,
)
from aws_lambda_powertools.utilities.batch.exceptions import BatchProcessingError
from aws_lambda_powertools.utilities.idempotency import (
    DynamoDBPersistenceLayer,
    IdempotencyConfig,
    idempotent_function,
)

table, event_file = sys.argv[1], sys.argv[2]
fifo = len(sys.argv) > 3 and sys.argv[3] == "fifo"
balances = os.environ.get("PEER_BALANCES")

client = boto3.client("dynamodb")  # AWS_ENDPOINT_URL_DYNAMODB points it at DynamoDB Local
requests = 0


def count(**_):
    global requests
    requests += 1


client.meta.events.register("before-send.dynamodb.*", count)
persistence = DynamoDBPersistenceLayer(table_name=table, boto3_client=client)
config = IdempotencyConfig(event_key_jmespath="messageId")
processor = SqsFifoPartialProcessor() if fifo else BatchProcessor(event_type=EventType.SQS)


@idempotent_function(data_keyword_argument="record", config=config, persistence_store=persistence)
def record_handler(record):
    # The same work as sqs-once's handlers: nothing (the demo's), or, for a body
    # that asks (`{"fail": "permanent"}`), an error, as the demo fails; or the
    # ledger's credit, written by the handler itself.
    body = json.loads(record["body"])
    if "fail" in body:
        raise ValueError("asked to fail")
    if balances:
        client.update_item(TableName=balances, Key={"pk": {"S": body["account"]}},
                           UpdateExpression="ADD balance :amount",
                           ExpressionAttributeValues={":amount": {"N": str(body["amount"])}})
    return None


class Context:
    """The parts of the Lambda context Powertools reads."""

    function_name = "powertools-peer"
    memory_limit_in_mb = 256
    invoked_function_arn = "arn:aws:lambda:us-east-1:123456789012:function:powertools-peer"
    aws_request_id = "bench"

    def __init__(self, timeout_s):
        self.deadline = time.time() + timeout_s

    def get_remaining_time_in_millis(self):
        return int(max(0.0, self.deadline - time.time()) * 1000)


def lambda_handler(event, context):
    config.register_lambda_context(context)
    return process_partial_response(event=event, record_handler=record_handler, processor=processor, context=context)


def invoke(event):
    try:
        return lambda_handler(event, Context(900))
    except BatchProcessingError:
        # Every record failed: Powertools fails the whole invocation, and Lambda delivers the batch again.
        return {"batchItemFailures": [{"itemIdentifier": record["messageId"]} for record in event["Records"]]}


if os.environ.get("PEER_WARMUP_EVENT"):
    with open(os.environ["PEER_WARMUP_EVENT"]) as f:
        invoke(json.load(f))
    requests = 0
with open(event_file) as f:
    event = json.load(f)
started = time.perf_counter()
response = invoke(event)
seconds = time.perf_counter() - started
print(json.dumps({"response": response, "requests": requests, "seconds": seconds}))
