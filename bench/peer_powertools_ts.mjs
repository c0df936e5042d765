// The peer in TypeScript's runtime: Powertools for AWS Lambda (TypeScript)
// consuming one SQS event, as its documentation recommends for SQS:
// BatchProcessor (SqsFifoPartialProcessor for FIFO) with processPartialResponse,
// and makeIdempotent keyed on messageId with DynamoDBPersistenceLayer and the
// Lambda context registered. With PEER_BALANCES set, each record credits the
// account its body names in that table with its own UpdateItem (ADD balance
// amount) inside the idempotent function, as a handler writes its effect.
//
//     node peer_powertools_ts.mjs TABLE EVENT_FILE [fifo]
//
// Prints one JSON object: the partial batch response, the DynamoDB requests
// sent (counted by a middleware), and the handler's own time. With
// PEER_WARMUP_EVENT set, that event is handled first, untimed and uncounted,
// as the invocation before a warm function's. AWS_ENDPOINT_URL_DYNAMODB points
// the client at DynamoDB Local, as the SDK defines it.

import { readFileSync } from "node:fs";
import { performance } from "node:perf_hooks";

import { DynamoDBClient, UpdateItemCommand } from "@aws-sdk/client-dynamodb";
import {
  BatchProcessor,
  EventType,
  FullBatchFailureError,
  processPartialResponse,
  SqsFifoPartialProcessor,
} from "@aws-lambda-powertools/batch";
import { IdempotencyConfig, makeIdempotent } from "@aws-lambda-powertools/idempotency";
import { DynamoDBPersistenceLayer } from "@aws-lambda-powertools/idempotency/dynamodb";

const [table, eventFile, mode] = process.argv.slice(2);
const fifo = mode === "fifo";
const balances = process.env.PEER_BALANCES;

const client = new DynamoDBClient({});
let requests = 0;
client.middlewareStack.add(
  (next) => async (args) => {
    requests += 1;
    return next(args);
  },
  { step: "finalizeRequest", name: "countRequests" },
);

const persistenceStore = new DynamoDBPersistenceLayer({ tableName: table, awsSdkV3Client: client });
const config = new IdempotencyConfig({ eventKeyJmesPath: "messageId" });
const processor = fifo ? new SqsFifoPartialProcessor() : new BatchProcessor(EventType.SQS);

// The same work as sqs-once's handlers: nothing (the demo's), an error for a
// body that asks, or the ledger's credit, written by the handler itself.
const recordHandler = async (record) => {
  const body = JSON.parse(record.body);
  if ("fail" in body) {
    throw new Error("asked to fail");
  }
  if (balances) {
    await client.send(
      new UpdateItemCommand({
        TableName: balances,
        Key: { pk: { S: body.account } },
        UpdateExpression: "ADD balance :amount",
        ExpressionAttributeValues: { ":amount": { N: String(body.amount) } },
      }),
    );
  }
  return null;
};

const idempotentRecord = makeIdempotent(recordHandler, { persistenceStore, config });

const context = (timeoutSeconds) => {
  const deadline = Date.now() + timeoutSeconds * 1000;
  return {
    functionName: "powertools-peer",
    memoryLimitInMB: "256",
    invokedFunctionArn: "arn:aws:lambda:us-east-1:123456789012:function:powertools-peer",
    awsRequestId: "bench",
    getRemainingTimeInMillis: () => Math.max(0, deadline - Date.now()),
  };
};

const invoke = async (event) => {
  const lambdaContext = context(900);
  config.registerLambdaContext(lambdaContext);
  try {
    return await processPartialResponse(event, idempotentRecord, processor, { context: lambdaContext });
  } catch (error) {
    if (!(error instanceof FullBatchFailureError)) {
      throw error;
    }
    // Every record failed: Powertools fails the whole invocation, and Lambda delivers the batch again.
    return { batchItemFailures: event.Records.map((record) => ({ itemIdentifier: record.messageId })) };
  }
};

if (process.env.PEER_WARMUP_EVENT) {
  await invoke(JSON.parse(readFileSync(process.env.PEER_WARMUP_EVENT, "utf8")));
  requests = 0;
}
const event = JSON.parse(readFileSync(eventFile, "utf8"));
const started = performance.now();
const response = await invoke(event);
const seconds = (performance.now() - started) / 1000;
console.log(JSON.stringify({ response, requests, seconds }));
