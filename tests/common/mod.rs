//! Test support shared by the integration tests.

// Each test crate uses a part of this support, and reaches it through `mod
// common`, never as a public API.
#![allow(dead_code, unreachable_pub)]

pub mod faults;
pub mod rounds;
pub mod runtime_api;
pub mod sqs;

use async_trait::async_trait;
use sqs_once::store::{ClaimQuery, ClaimStore, Fenced, Finish, Listing, PutOutcome, StoreError, StoredClaim};

/// The `sqs-once` binary under test, as a command to add arguments to: the one
/// cargo built for the tests, or the artifact named by `SQS_ONCE_TEST_BINARY`
/// (what `sam build` deploys), started through `SQS_ONCE_TEST_RUNNER` when it
/// is set (`qemu-aarch64` for the arm64 build on another machine).
pub fn sqs_once_command() -> std::process::Command {
    let binary = std::env::var("SQS_ONCE_TEST_BINARY").unwrap_or_else(|_| env!("CARGO_BIN_EXE_sqs-once").to_owned());
    match std::env::var("SQS_ONCE_TEST_RUNNER") {
        Ok(runner) if !runner.is_empty() => {
            let mut command = std::process::Command::new(runner);
            command.arg(binary);
            command
        }
        _ => std::process::Command::new(binary),
    }
}

/// What `sqs-once invoke --metrics` answered: the message ids in its
/// `batchItemFailures`, and the metrics line it printed on standard error.
pub fn invoke_answer(output: &std::process::Output) -> (std::collections::HashSet<String>, serde_json::Value) {
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "invoke failed: {stderr}");
    let response: serde_json::Value =
        serde_json::from_slice(&output.stdout).unwrap_or_else(|_| panic!("stdout is not one JSON object: {stderr}"));
    let failures = failed_ids(&response).into_iter().collect();
    let metrics = stderr
        .lines()
        .find_map(|line| serde_json::from_str::<serde_json::Value>(line).ok().filter(|line| line.get("_aws").is_some()))
        .unwrap_or_else(|| panic!("no metrics line: {stderr}"));
    (failures, metrics)
}

/// The message ids a partial-batch response names in its `batchItemFailures`, in order.
pub fn failed_ids(response: &serde_json::Value) -> Vec<String> {
    response["batchItemFailures"]
        .as_array()
        .unwrap_or_else(|| panic!("no batchItemFailures list: {response}"))
        .iter()
        .map(|failure| failure["itemIdentifier"].as_str().unwrap().to_owned())
        .collect()
}

/// A store that is down: every request fails.
pub struct Down;

#[async_trait]
impl ClaimStore for Down {
    async fn put_if_free(&self, _: &StoredClaim, _: u64) -> Result<PutOutcome, StoreError> {
        Err(StoreError::unavailable("connection refused"))
    }
    async fn get(&self, _: &str) -> Result<Option<StoredClaim>, StoreError> {
        Err(StoreError::unavailable("connection refused"))
    }
    async fn finish(&self, _: &str, _: &str, _: &Finish) -> Result<Fenced, StoreError> {
        Err(StoreError::unavailable("connection refused"))
    }
    async fn release(&self, _: &str, _: &str) -> Result<Fenced, StoreError> {
        Err(StoreError::unavailable("connection refused"))
    }
    async fn list(&self, _: &ClaimQuery) -> Result<Listing, StoreError> {
        Err(StoreError::unavailable("connection refused"))
    }
    async fn replace_seen(&self, _: Option<&StoredClaim>, _: Option<&StoredClaim>) -> Result<Fenced, StoreError> {
        Err(StoreError::unavailable("connection refused"))
    }
}

/// DynamoDB Local, as `scripts/test` starts it.
pub mod dynamodb {
    use std::sync::Arc;

    use tokio::{
        io::{AsyncWriteExt, BufReader},
        net::{TcpListener, TcpStream},
    };

    use super::faults::read_message;

    use sqs_once::store::{
        DynamoDbStore,
        dynamodb::{self, RequestCounter, TableKey, TableLayout},
    };

    /// The endpoint `scripts/test` exported; these tests need the real server.
    pub fn endpoint() -> String {
        std::env::var("AWS_ENDPOINT_URL_DYNAMODB").expect(
            "AWS_ENDPOINT_URL_DYNAMODB is not set: run the tests with scripts/test, which starts DynamoDB Local",
        )
    }

    /// A fresh table with a unique name, created as `sqs-once create-table` creates it.
    pub async fn fresh_table(key: TableKey) -> (DynamoDbStore, Arc<RequestCounter>) {
        endpoint();
        let (client, requests) = dynamodb::client().await;
        let name = format!("claims-{}", uuid::Uuid::new_v4().simple());
        let store = DynamoDbStore::new(client, TableLayout { key, ..TableLayout::new(name) });
        assert!(store.create_table().await.expect("create table"), "table name collided");
        (store, requests)
    }

    /// What a [`proxy`] does with one request.
    pub enum Reply {
        /// Pass it on to the server behind and relay its answer.
        Forward,
        /// Answer it here with this HTTP status and JSON body.
        Answer(u16, String),
        /// Never answer, the connection kept open: a server that hangs.
        Hold,
    }

    impl Reply {
        /// An error answer as DynamoDB writes one: `400` with its `__type` and message.
        pub fn error(code: &str, message: &str) -> Self {
            let body =
                serde_json::json!({ "__type": format!("com.amazonaws.dynamodb.v20120810#{code}"), "message": message });
            Self::Answer(400, body.to_string())
        }
    }

    /// The URL of an endpoint in front of DynamoDB Local where `reply`
    /// decides, from each request's operation (`BatchExecuteStatement`) and
    /// JSON body, whether it goes on to DynamoDB Local or is answered by a
    /// reply made to measure.
    pub async fn proxy(reply: impl Fn(&str, &serde_json::Value) -> Reply + Send + Sync + 'static) -> String {
        proxy_to(&endpoint(), reply).await
    }

    /// [`proxy`], in front of another AWS JSON-protocol server at `upstream`
    /// (`http://host:port`), such as the SQS server.
    pub async fn proxy_to(
        upstream: &str,
        reply: impl Fn(&str, &serde_json::Value) -> Reply + Send + Sync + 'static,
    ) -> String {
        let upstream = upstream.trim_start_matches("http://").to_owned();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let reply = Arc::new(reply);
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                tokio::spawn(relay(client, upstream.clone(), reply.clone()));
            }
        });
        format!("http://{address}")
    }

    /// The URL of an endpoint that refuses every batched request
    /// (`BatchExecuteStatement`, `BatchGetItem`) with `code` and `message`, and
    /// passes every other request on to DynamoDB Local.
    pub async fn refusing_batches(code: &'static str, message: &'static str) -> String {
        proxy(move |operation, _| match operation {
            "BatchExecuteStatement" | "BatchGetItem" => Reply::error(code, message),
            _ => Reply::Forward,
        })
        .await
    }

    /// Serves one client connection: answers made here, or relayed one at a
    /// time over a connection of their own.
    async fn relay(
        client: TcpStream,
        upstream: String,
        reply: Arc<impl Fn(&str, &serde_json::Value) -> Reply + Send + Sync + 'static>,
    ) {
        let mut client = BufReader::new(client);
        let mut server = None;
        while let Some(message) = read_message(&mut client).await {
            let operation = message.target.rsplit('.').next().unwrap_or_default();
            let request = serde_json::from_slice(&message.body).unwrap_or(serde_json::Value::Null);
            let answer = match reply(operation, &request) {
                Reply::Hold => return std::future::pending().await,
                Reply::Answer(status, body) => {
                    let head = format!(
                        "HTTP/1.1 {status} Made To Measure\r\nContent-Type: application/x-amz-json-1.0\r\n\
                         Content-Length: {}\r\n\r\n",
                        body.len()
                    );
                    [head.as_bytes(), body.as_bytes()].concat()
                }
                Reply::Forward => {
                    if server.is_none() {
                        server = Some(BufReader::new(TcpStream::connect(&upstream).await.unwrap()));
                    }
                    let Some(server) = server.as_mut() else { return };
                    server.get_mut().write_all(&message.raw).await.unwrap();
                    let Some(answer) = read_message(server).await else { return };
                    answer.raw
                }
            };
            if client.get_mut().write_all(&answer).await.is_err() {
                return;
            }
        }
    }

    /// A store on `layout`'s table whose requests go through `endpoint` (a
    /// proxy in front of DynamoDB Local).
    pub async fn store_through(endpoint: &str, layout: TableLayout) -> DynamoDbStore {
        let config =
            aws_sdk_dynamodb::config::Builder::from(&sqs_once::aws::sdk_config().await).endpoint_url(endpoint).build();
        DynamoDbStore::new(aws_sdk_dynamodb::Client::from_conf(config), layout)
    }

    /// A fresh table for the items handlers write, keyed by the string `pk`,
    /// as a ledger's accounts are: its name.
    pub async fn items_table() -> String {
        use aws_sdk_dynamodb::types::{
            AttributeDefinition, BillingMode, KeySchemaElement, KeyType, ScalarAttributeType,
        };
        let (client, _) = dynamodb::client().await;
        let name = format!("items-{}", uuid::Uuid::new_v4().simple());
        client
            .create_table()
            .table_name(&name)
            .billing_mode(BillingMode::PayPerRequest)
            .attribute_definitions(
                AttributeDefinition::builder()
                    .attribute_name("pk")
                    .attribute_type(ScalarAttributeType::S)
                    .build()
                    .unwrap(),
            )
            .key_schema(KeySchemaElement::builder().attribute_name("pk").key_type(KeyType::Hash).build().unwrap())
            .send()
            .await
            .expect("create the items table");
        name
    }

    /// An item of `table` by its `pk`, as JSON (numbers as numbers).
    pub async fn item(table: &str, pk: &str) -> Option<serde_json::Value> {
        use aws_sdk_dynamodb::types::AttributeValue;
        let (client, _) = dynamodb::client().await;
        let output = client
            .get_item()
            .table_name(table)
            .key("pk", AttributeValue::S(pk.to_owned()))
            .consistent_read(true)
            .send()
            .await
            .expect("get item");
        output.item.map(|item| {
            item.into_iter().map(|(name, value)| (name, json_value(&value))).collect::<serde_json::Map<_, _>>().into()
        })
    }

    /// A DynamoDB value as JSON: strings, numbers, booleans, lists and maps.
    fn json_value(value: &aws_sdk_dynamodb::types::AttributeValue) -> serde_json::Value {
        use aws_sdk_dynamodb::types::AttributeValue;
        match value {
            AttributeValue::S(text) => text.clone().into(),
            AttributeValue::N(number) => serde_json::from_str(number).expect("a number"),
            AttributeValue::Bool(flag) => (*flag).into(),
            AttributeValue::L(values) => values.iter().map(json_value).collect(),
            AttributeValue::M(map) => map
                .iter()
                .map(|(name, value)| (name.clone(), json_value(value)))
                .collect::<serde_json::Map<_, _>>()
                .into(),
            _ => serde_json::Value::Null,
        }
    }

    /// A table keyed by a static partition value and a sort key, as Powertools lays it out.
    pub fn sorted() -> TableKey {
        TableKey::Sorted { partition_attribute: "pk".into(), partition_value: "idempotency#tests".into() }
    }
}
