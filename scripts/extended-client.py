"""The Amazon SQS Extended Client for Python (amazon-sqs-extended-client, as
its users run it) against the SQS and S3 servers the tests use: the producer
and consumer on the other side of sqs-once's large messages.

    extended-client.py send QUEUE_URL BUCKET < bodies
        sends each line of standard input as a message through the client:
        those over its threshold (256 KiB) go to S3 as the bucket's objects,
        the rest as they are; creates the bucket if it is missing
    extended-client.py receive QUEUE_URL COUNT
        receives COUNT messages through the client, which reads the payloads
        their pointers name from S3, and prints each body on a line of its
        own, deleting the messages
    extended-client.py delete BUCKET
        deletes every object of the bucket

Endpoints and credentials come from the environment (AWS_ENDPOINT_URL_SQS,
AWS_ENDPOINT_URL_S3, AWS_REGION, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY).
"""

import os
import sys

import boto3
from sqs_extended_client import SQSExtendedClientSession


def bucket_of(name):
    s3 = boto3.resource("s3")
    bucket = s3.Bucket(name)
    if bucket.creation_date is None:
        bucket.create()
    return bucket


def send(queue_url, bucket):
    bucket_of(bucket)
    sqs = SQSExtendedClientSession().client("sqs")
    sqs.large_payload_support = bucket
    for line in sys.stdin:
        body = line.rstrip("\n")
        if body:
            sqs.send_message(QueueUrl=queue_url, MessageBody=body)


def receive(queue_url, count):
    # The client reads the payload of every message marked ExtendedPayloadSize from the bucket its pointer names.
    sqs = SQSExtendedClientSession().client("sqs")
    received = 0
    for _ in range(60):
        if received >= count:
            return
        answer = sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=min(10, count - received),
                                     WaitTimeSeconds=1, MessageAttributeNames=["All"])
        for message in answer.get("Messages", []):
            print(message["Body"])
            sqs.delete_message(QueueUrl=queue_url, ReceiptHandle=message["ReceiptHandle"])
            received += 1
    sys.exit(f"received {received} of {count} messages")


def delete(bucket):
    bucket_of(bucket).objects.all().delete()


def main(args):
    # boto3 reads the Region from AWS_DEFAULT_REGION; the AWS SDK for Rust, and the tests, set AWS_REGION.
    os.environ.setdefault("AWS_DEFAULT_REGION", os.environ.get("AWS_REGION", "us-east-1"))
    if args[:1] == ["send"] and len(args) == 3:
        send(args[1], args[2])
    elif args[:1] == ["receive"] and len(args) == 3:
        receive(args[1], int(args[2]))
    elif args[:1] == ["delete"] and len(args) == 2:
        delete(args[1])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
