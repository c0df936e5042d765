//! DynamoDB Local, as the test command starts it, and proxies in front of
//! it that answer chosen requests to measure.

use std::sync::Arc;

use tokio::{
    io::{AsyncWriteExt, BufReader},
    net::{TcpListener, TcpStream},
};

use crate::faults::read_message;

/// The endpoint `scripts/test` exported; these tests need the real server.
pub fn endpoint() -> String {
    std::env::var("AWS_ENDPOINT_URL_DYNAMODB")
        .expect("AWS_ENDPOINT_URL_DYNAMODB is not set: run the tests with scripts/test, which starts DynamoDB Local")
}

/// A client of DynamoDB Local, patient with a server busy serving tests.
pub async fn client() -> aws_sdk_dynamodb::Client {
    client_at(&endpoint()).await
}

/// A client whose requests go to `endpoint` (a proxy in front of DynamoDB Local).
pub async fn client_at(endpoint: &str) -> aws_sdk_dynamodb::Client {
    let config = aws_sdk_dynamodb::config::Builder::from(&crate::aws_config().await).endpoint_url(endpoint);
    aws_sdk_dynamodb::Client::from_conf(config.build())
}

/// A table name no other test uses, starting with `prefix`.
pub fn unique_name(prefix: &str) -> String {
    format!("{prefix}-{}", uuid::Uuid::new_v4().simple())
}

/// What a [`proxy`] does with one request.
#[derive(Debug)]
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
                let Some(connection) = server.as_mut() else { return };
                connection.get_mut().write_all(&message.raw).await.unwrap();
                let Some(answer) = read_message(connection).await else { return };
                if answer.closed {
                    server = None;
                }
                answer.raw
            }
        };
        if client.get_mut().write_all(&answer).await.is_err() {
            return;
        }
    }
}

/// A fresh table for the items handlers write, keyed by the string `pk`,
/// as a ledger's accounts are: its name.
pub async fn items_table() -> String {
    plain_table("items", "pk").await
}

/// A fresh on-demand table named after `prefix`, keyed by the string
/// attribute `key` alone, with no index: its name.
pub async fn plain_table(prefix: &str, key: &str) -> String {
    table_keyed(prefix, key, aws_sdk_dynamodb::types::ScalarAttributeType::S).await
}

/// [`items_table`] keyed by a number: `pk`, `N`.
pub async fn numbered_table() -> String {
    table_keyed("numbered", "pk", aws_sdk_dynamodb::types::ScalarAttributeType::N).await
}

/// A fresh on-demand table named after `prefix`, keyed by the attribute
/// `key` of type `kind` alone, with no index: its name.
async fn table_keyed(prefix: &str, key: &str, kind: aws_sdk_dynamodb::types::ScalarAttributeType) -> String {
    use aws_sdk_dynamodb::types::{AttributeDefinition, BillingMode, KeySchemaElement, KeyType};
    let name = unique_name(prefix);
    client()
        .await
        .create_table()
        .table_name(&name)
        .billing_mode(BillingMode::PayPerRequest)
        .attribute_definitions(AttributeDefinition::builder().attribute_name(key).attribute_type(kind).build().unwrap())
        .key_schema(KeySchemaElement::builder().attribute_name(key).key_type(KeyType::Hash).build().unwrap())
        .send()
        .await
        .unwrap_or_else(|error| panic!("create the table {name}: {error}"));
    name
}

/// Sends a fresh DynamoDB Local a few hundred conditional writes: it
/// answers its first few thousand requests several times slower, which a
/// test that counts in hundreds of milliseconds would take for a fault.
pub async fn warm_up() {
    use aws_sdk_dynamodb::types::AttributeValue;
    let (client, table) = (client().await, items_table().await);
    let put = |n: usize| {
        let request = client
            .put_item()
            .table_name(&table)
            .item("pk", AttributeValue::S(format!("warm-{n}")))
            .condition_expression("attribute_not_exists(pk)");
        async move { request.send().await.map(drop) }
    };
    let answers = futures::future::join_all((0..400).map(put)).await;
    assert!(answers.iter().all(Result::is_ok), "DynamoDB Local refused a warm-up write");
}

/// An item of `table` by its `pk`, as JSON (numbers as numbers).
pub async fn item(table: &str, pk: &str) -> Option<serde_json::Value> {
    item_at(table, aws_sdk_dynamodb::types::AttributeValue::S(pk.to_owned())).await
}

/// An item of `table` by its `pk`, of any type, as JSON.
pub async fn item_at(table: &str, pk: aws_sdk_dynamodb::types::AttributeValue) -> Option<serde_json::Value> {
    let output =
        client().await.get_item().table_name(table).key("pk", pk).consistent_read(true).send().await.expect("get item");
    output.item.map(|item| {
        item.into_iter().map(|(name, value)| (name, json_value(&value))).collect::<serde_json::Map<_, _>>().into()
    })
}

/// A DynamoDB value as JSON: strings, numbers, booleans, lists and maps;
/// a string set as a list of its strings.
fn json_value(value: &aws_sdk_dynamodb::types::AttributeValue) -> serde_json::Value {
    use aws_sdk_dynamodb::types::AttributeValue;
    match value {
        AttributeValue::S(text) => text.clone().into(),
        AttributeValue::N(number) => serde_json::from_str(number).expect("a number"),
        AttributeValue::Bool(flag) => (*flag).into(),
        AttributeValue::L(values) => values.iter().map(json_value).collect(),
        AttributeValue::Ss(values) => values.iter().cloned().collect(),
        AttributeValue::M(map) => {
            map.iter().map(|(name, value)| (name.clone(), json_value(value))).collect::<serde_json::Map<_, _>>().into()
        }
        _ => serde_json::Value::Null,
    }
}
