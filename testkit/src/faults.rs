//! An AWS endpoint that misbehaves as a real network and a real service do:
//! a proxy in front of DynamoDB Local (or the SQS server) that, per request
//! and at random from a seed, loses the answer after the request applied,
//! resets the connection before forwarding it, answers `500` or a throttling
//! `400` without forwarding it, holds the answer back past the client's
//! attempt timeout, or refuses single statements of a
//! `BatchExecuteStatement` with the transient codes DynamoDB uses, or
//! single entries of an SQS, SNS or EventBridge batch call as those services
//! fail them.
//! `SQS_ONCE_FAULTS_TRACE` prints each request's operation and fault.
//!
//! In front of DynamoDB Local it also answers as DynamoDB does where the
//! emulator does not: a refused statement of a `BatchExecuteStatement` comes
//! back with the item its condition failed on (the tables here are keyed by
//! `id`), as `ReturnValuesOnConditionCheckFailure = ALL_OLD` asks.

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use serde_json::{Value, json};
use tokio::{
    io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader},
    net::{TcpListener, TcpStream},
    sync::watch,
};

/// What can go wrong, each as a share of requests (of statements, for
/// `statement_error`).
#[derive(Debug, Clone, Copy, Default)]
pub struct FaultMix {
    /// Forwarded and applied; the answer is lost (the connection closes).
    pub lost_answer: f64,
    /// The connection resets before the request is forwarded.
    pub reset: f64,
    /// `500 InternalServerError`, not forwarded.
    pub server_error: f64,
    /// `400` throttling, not forwarded.
    pub throttled: f64,
    /// Forwarded and applied; the answer comes 2.6 s late, past the 2 s
    /// attempt timeout.
    pub slow: f64,
    /// A statement of a `BatchExecuteStatement` refused on its own with a
    /// transient code, not forwarded; the other statements are.
    pub statement_error: f64,
}

impl FaultMix {
    fn request_faults(&self) -> [(Fault, f64); 5] {
        [
            (Fault::LostAnswer, self.lost_answer),
            (Fault::Reset, self.reset),
            (Fault::ServerError, self.server_error),
            (Fault::Throttled, self.throttled),
            (Fault::Slow, self.slow),
        ]
    }

    /// The share of requests it makes faulty.
    pub fn rate(&self) -> f64 {
        self.request_faults().iter().map(|(_, share)| share).sum()
    }

    /// `rate` of the requests faulty, spread evenly over the five
    /// request-level faults, and `rate` / 5 of batched statements refused.
    pub fn spread(rate: f64) -> Self {
        let each = rate / 5.0;
        Self { lost_answer: each, reset: each, server_error: each, throttled: each, slow: each, statement_error: each }
    }
}

/// How the service answers: its errors' `__type` prefix and throttling code,
/// and whether refused batch statements carry their item.
#[derive(Debug, Clone, Copy)]
pub struct Service {
    error_prefix: &'static str,
    throttling: &'static str,
    returns_refused_items: bool,
    /// Requests are forms and answers XML (AWS's query protocol), not JSON.
    query: bool,
}

/// DynamoDB.
pub const DYNAMODB: Service = Service {
    error_prefix: "com.amazonaws.dynamodb.v20120810#",
    throttling: "ProvisionedThroughputExceededException",
    returns_refused_items: true,
    query: false,
};

/// SQS (JSON protocol).
pub const SQS: Service = Service {
    error_prefix: "com.amazonaws.sqs#",
    throttling: "ThrottlingException",
    returns_refused_items: false,
    query: false,
};

/// SNS (query protocol).
pub const SNS: Service =
    Service { error_prefix: "", throttling: "Throttled", returns_refused_items: false, query: true };

/// EventBridge (JSON protocol).
pub const EVENTBRIDGE: Service =
    Service { error_prefix: "", throttling: "ThrottlingException", returns_refused_items: false, query: false };

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    None,
    LostAnswer,
    Reset,
    ServerError,
    Throttled,
    Slow,
}

/// Faults injected so far, by kind.
#[derive(Debug, Default)]
pub struct Injected {
    /// Requests that reached the proxy.
    pub requests: AtomicU64,
    /// Requests applied whose answer was lost.
    pub lost_answer: AtomicU64,
    /// Connections reset before the request was forwarded.
    pub reset: AtomicU64,
    /// Requests answered `500` without being forwarded.
    pub server_error: AtomicU64,
    /// Requests answered with a throttling `400` without being forwarded.
    pub throttled: AtomicU64,
    /// Answers held back past the client's attempt timeout.
    pub slow: AtomicU64,
    /// Statements of a `BatchExecuteStatement`, or entries of an SQS batch
    /// call, refused on their own.
    pub statement_error: AtomicU64,
    /// Requests by operation, faulty or not.
    pub operations: Mutex<std::collections::BTreeMap<String, u64>>,
}

impl Injected {
    /// The counts as JSON, for reports.
    pub fn report(&self) -> Value {
        let get = |counter: &AtomicU64| counter.load(Ordering::SeqCst);
        json!({
            "requests": get(&self.requests), "lost_answer": get(&self.lost_answer), "reset": get(&self.reset),
            "server_error": get(&self.server_error), "throttled": get(&self.throttled), "slow": get(&self.slow),
            "statement_error": get(&self.statement_error), "operations": *self.operations.lock().unwrap(),
        })
    }

    /// How many requests of `operation` came.
    pub fn of(&self, operation: &str) -> u64 {
        self.operations.lock().unwrap().get(operation).copied().unwrap_or(0)
    }

    /// The fault kinds of `mix` that were never injected (statement errors
    /// only where batch calls came, the only requests they apply to).
    pub fn missing(&self, mix: &FaultMix) -> Vec<&'static str> {
        let batches = [BATCH_STATEMENTS, SQS_BATCHES, &[PUBLISH_BATCH, PUT_EVENTS]]
            .iter()
            .flat_map(|ops| ops.iter())
            .any(|op| self.of(op) > 0);
        [
            ("lost_answer", mix.lost_answer, &self.lost_answer),
            ("reset", mix.reset, &self.reset),
            ("server_error", mix.server_error, &self.server_error),
            ("throttled", mix.throttled, &self.throttled),
            ("slow", mix.slow, &self.slow),
            ("statement_error", if batches { mix.statement_error } else { 0.0 }, &self.statement_error),
        ]
        .into_iter()
        .filter(|(_, share, counter)| *share > 0.0 && counter.load(Ordering::SeqCst) == 0)
        .map(|(name, _, _)| name)
        .collect()
    }

    /// Faults of every kind.
    pub fn total(&self) -> u64 {
        [&self.lost_answer, &self.reset, &self.server_error, &self.throttled, &self.slow, &self.statement_error]
            .iter()
            .map(|counter| counter.load(Ordering::SeqCst))
            .sum()
    }

    fn count(&self, fault: Fault) {
        let counter = match fault {
            Fault::None => return,
            Fault::LostAnswer => &self.lost_answer,
            Fault::Reset => &self.reset,
            Fault::ServerError => &self.server_error,
            Fault::Throttled => &self.throttled,
            Fault::Slow => &self.slow,
        };
        counter.fetch_add(1, Ordering::SeqCst);
    }
}

struct State {
    upstream: String,
    service: Service,
    mix: FaultMix,
    /// Only these operations are made faulty (all, when empty).
    operations: &'static [&'static str],
    random: Mutex<fastrand::Rng>,
    /// Each request-level fault of the mix, injected once on the first
    /// requests, so that every kind is met in every run however few requests
    /// it makes; then faults are drawn at random.
    first: Mutex<Vec<Fault>>,
    /// Whether a statement or batch entry has been refused yet.
    refused_first: std::sync::atomic::AtomicBool,
    injected: Arc<Injected>,
    /// How long finishing writes (completions, failure records, releases)
    /// are held before they are forwarded, in milliseconds.
    hold_finishing_ms: AtomicU64,
    /// Bumped by a freeze: held requests are dropped, their connections closed.
    freezes: watch::Sender<u64>,
}

impl State {
    fn draw(&self, operation: &str) -> Fault {
        if !self.operations.is_empty() && !self.operations.contains(&operation) {
            return Fault::None;
        }
        if let Some(fault) = self.first.lock().unwrap().pop() {
            return fault;
        }
        let draw = self.random();
        let mut bound = 0.0;
        for (fault, share) in self.mix.request_faults() {
            bound += share;
            if draw < bound {
                return fault;
            }
        }
        Fault::None
    }

    fn random(&self) -> f64 {
        self.random.lock().unwrap().f64()
    }

    fn error(&self, status: u16, code: &str, message: &str) -> Vec<u8> {
        if self.service.query {
            let body = format!(
                "<ErrorResponse><Error><Type>Receiver</Type><Code>{code}</Code><Message>{message}</Message></Error>\
                 <RequestId>injected</RequestId></ErrorResponse>"
            );
            return http_response(status, &body);
        }
        let body = json!({ "__type": format!("{}{code}", self.service.error_prefix), "message": message });
        http_response(status, &body.to_string())
    }
}

/// A running faulty endpoint.
#[allow(missing_debug_implementations)]
pub struct FaultProxy {
    /// Where clients reach it.
    pub url: String,
    /// What it has done so far.
    pub injected: Arc<Injected>,
    state: Arc<State>,
}

impl FaultProxy {
    /// A proxy in front of `upstream` (`http://host:port`) injecting `mix`
    /// into `operations` (all, when empty), drawn from `seed`.
    pub async fn start(
        upstream: &str,
        service: Service,
        mix: FaultMix,
        operations: &'static [&'static str],
        seed: u64,
    ) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let injected = Arc::new(Injected::default());
        let state = Arc::new(State {
            upstream: upstream.trim_start_matches("http://").to_owned(),
            service,
            mix,
            operations,
            random: Mutex::new(fastrand::Rng::with_seed(seed)),
            first: Mutex::new(
                mix.request_faults().into_iter().filter(|(_, share)| *share > 0.0).map(|(f, _)| f).collect(),
            ),
            refused_first: std::sync::atomic::AtomicBool::new(false),
            injected: Arc::clone(&injected),
            hold_finishing_ms: AtomicU64::new(0),
            freezes: watch::Sender::new(0),
        });
        let serving = Arc::clone(&state);
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                tokio::spawn(serve(client, Arc::clone(&serving)));
            }
        });
        Self { url, injected, state }
    }

    /// A proxy in front of DynamoDB that injects no fault and holds each
    /// finishing write `hold` before forwarding it, as a slow or throttled
    /// DynamoDB does at the end of an invocation.
    pub async fn holding_finishing_writes(hold: Duration) -> Self {
        let upstream = std::env::var("AWS_ENDPOINT_URL_DYNAMODB").expect("AWS_ENDPOINT_URL_DYNAMODB: run scripts/test");
        let proxy = Self::start(&upstream, DYNAMODB, FaultMix::default(), &[], 0).await;
        proxy.hold_finishing(hold);
        proxy
    }

    /// Holds each finishing write `hold` from now on.
    pub fn hold_finishing(&self, hold: Duration) {
        self.state.hold_finishing_ms.store(u64::try_from(hold.as_millis()).unwrap(), Ordering::SeqCst);
    }

    /// The client process is frozen: what the proxy holds and has not
    /// forwarded is dropped, and those connections close, as the sockets of
    /// a frozen Lambda environment deliver nothing.
    pub fn freeze(&self) {
        (self.freezer())();
    }

    /// [`freeze`](Self::freeze), as a function to call from elsewhere.
    pub fn freezer(&self) -> impl FnOnce() + Send + 'static {
        let state = Arc::clone(&self.state);
        move || state.freezes.send_modify(|freezes| *freezes += 1)
    }
}

/// Whether `request` finishes claims: `UpdateItem`, `DeleteItem`, a
/// handler's transaction, or a batch holding an `UPDATE` or `DELETE`
/// statement.
fn finishes(operation: &str, request: &Message) -> bool {
    let body = String::from_utf8_lossy(&request.body);
    match operation {
        "UpdateItem" | "DeleteItem" | "TransactWriteItems" => true,
        "BatchExecuteStatement" => body.contains("UPDATE ") || body.contains("DELETE FROM"),
        _ => false,
    }
}

/// Serves one client connection, request by request.
async fn serve(client: TcpStream, state: Arc<State>) {
    let mut client = BufReader::new(client);
    let mut server: Option<BufReader<TcpStream>> = None;
    while let Some(request) = read_message(&mut client).await {
        state.injected.requests.fetch_add(1, Ordering::SeqCst);
        let operation = request.operation();
        *state.injected.operations.lock().unwrap().entry(operation.clone()).or_default() += 1;
        let hold = state.hold_finishing_ms.load(Ordering::SeqCst);
        if hold > 0 && finishes(&operation, &request) {
            let mut freezes = state.freezes.subscribe();
            tokio::select! {
                () = tokio::time::sleep(Duration::from_millis(hold)) => {}
                _ = freezes.changed() => {
                    let _ = client.get_ref().set_zero_linger();
                    return;
                }
            }
        }
        let fault = state.draw(&operation);
        state.injected.count(fault);
        if std::env::var_os("SQS_ONCE_FAULTS_TRACE").is_some() {
            let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
            eprintln!("fault-proxy {} {operation} {fault:?} {} bytes", now.as_millis() % 100_000, request.body.len());
        }
        let answer = match fault {
            Fault::Reset => {
                let _ = client.get_ref().set_zero_linger();
                return;
            }
            Fault::ServerError => state.error(500, "InternalServerError", "injected: internal server error"),
            Fault::Throttled => state.error(400, state.service.throttling, "injected: throughput exceeded"),
            Fault::None if operation == "BatchExecuteStatement" && state.service.returns_refused_items => {
                match statements(&state, &request, &mut server).await {
                    Some(answer) => answer,
                    None => return,
                }
            }
            Fault::None if SQS_BATCHES.contains(&operation.as_str()) => {
                match entries(&state, &request, &mut server).await {
                    Some(answer) => answer,
                    None => return,
                }
            }
            Fault::None if operation == PUBLISH_BATCH => match publishes(&state, &request, &mut server).await {
                Some(answer) => answer,
                None => return,
            },
            Fault::None if operation == PUT_EVENTS => match events(&state, &request, &mut server).await {
                Some(answer) => answer,
                None => return,
            },
            Fault::None | Fault::LostAnswer | Fault::Slow => {
                let Some(answer) = forward(&state, &request.raw, &mut server).await else { return };
                match fault {
                    Fault::LostAnswer => return,
                    Fault::Slow => tokio::time::sleep(Duration::from_millis(2_600)).await,
                    _ => {}
                }
                answer.raw
            }
        };
        if client.get_mut().write_all(&answer).await.is_err() {
            return;
        }
    }
}

/// Forwards the statements not drawn to fail, answers the others with a
/// transient code, each in its place, and adds to every statement refused by
/// its condition the item it met.
async fn statements(state: &State, request: &Message, server: &mut Option<BufReader<TcpStream>>) -> Option<Vec<u8>> {
    const CODES: [&str; 5] = [
        "ThrottlingError",
        "ProvisionedThroughputExceeded",
        "RequestLimitExceeded",
        "InternalServerError",
        "TransactionConflict",
    ];
    let mut body: Value = serde_json::from_slice(&request.body).ok()?;
    let statements = body["Statements"].as_array()?.clone();
    let refused: Vec<Option<&str>> =
        statements.iter().map(|_| refuse_one(state).then(|| CODES[(state.random() * 5.0) as usize % 5])).collect();
    let kept: Vec<Value> =
        statements.iter().zip(&refused).filter(|(_, code)| code.is_none()).map(|(s, _)| s.clone()).collect();
    let mut answers = if kept.is_empty() {
        Vec::new().into_iter()
    } else {
        body["Statements"] = Value::Array(kept.clone());
        let answer = forward(state, &request.with_body(&body.to_string()), server).await?;
        if !answer.head.starts_with("HTTP/1.1 200") {
            return Some(answer.raw);
        }
        let answered: Value = serde_json::from_slice(&answer.body).ok()?;
        let mut responses = answered["Responses"].as_array()?.clone();
        for (response, statement) in responses.iter_mut().zip(&kept) {
            let code = response["Error"]["Code"].as_str().unwrap_or_default();
            if ["ConditionalCheckFailed", "DuplicateItem"].contains(&code)
                && response["Error"].get("Item").is_none()
                && let Some(item) = refused_item(state, statement).await
            {
                response["Error"]["Item"] = item;
            }
        }
        responses.into_iter()
    };
    let responses: Vec<Value> = refused
        .iter()
        .map(|code| match code {
            Some(code) => {
                state.injected.statement_error.fetch_add(1, Ordering::SeqCst);
                json!({ "Error": { "Code": code, "Message": "injected: statement refused" } })
            }
            None => answers.next().unwrap_or(Value::Null),
        })
        .collect();
    Some(http_response(200, &json!({ "Responses": responses }).to_string()))
}

/// DynamoDB's batch of statements.
const BATCH_STATEMENTS: &[&str] = &["BatchExecuteStatement"];

/// The SQS batch calls whose entries succeed or fail one by one.
const SQS_BATCHES: &[&str] = &["DeleteMessageBatch", "ChangeMessageVisibilityBatch", "SendMessageBatch"];

/// Whether this statement or entry is refused on its own: drawn, or the
/// first of a run (so every run meets the fault).
fn refuse_one(state: &State) -> bool {
    let share = state.mix.statement_error;
    share > 0.0 && (!state.refused_first.swap(true, Ordering::SeqCst) || state.random() < share)
}

/// An SQS batch call (`DeleteMessageBatch`, `ChangeMessageVisibilityBatch`)
/// with entries failed on their own, as SQS answers with a 200 and a
/// `Failed` list (here `InternalError`, not the sender's fault, which no SDK
/// retries): the other entries are forwarded, and both lists merged.
async fn entries(state: &State, request: &Message, server: &mut Option<BufReader<TcpStream>>) -> Option<Vec<u8>> {
    let mut body: Value = serde_json::from_slice(&request.body).ok()?;
    let entries = body["Entries"].as_array()?.clone();
    let (refused, kept): (Vec<Value>, Vec<Value>) = entries.into_iter().partition(|_| refuse_one(state));
    let mut answer = json!({ "Successful": [], "Failed": [] });
    if !kept.is_empty() {
        body["Entries"] = Value::Array(kept);
        let forwarded = forward(state, &request.with_body(&body.to_string()), server).await?;
        if !forwarded.head.starts_with("HTTP/1.1 200") {
            return Some(forwarded.raw);
        }
        answer = serde_json::from_slice(&forwarded.body).ok()?;
    }
    for entry in refused {
        state.injected.statement_error.fetch_add(1, Ordering::SeqCst);
        let failed = json!({ "Id": entry["Id"], "SenderFault": false, "Code": "InternalError",
                             "Message": "injected: entry failed" });
        answer["Failed"].as_array_mut()?.push(failed);
    }
    Some(http_response(200, &answer.to_string()))
}

/// SNS's batch call, whose entries succeed or fail one by one.
const PUBLISH_BATCH: &str = "PublishBatch";

/// An SNS `PublishBatch` with entries failed on their own, as SNS answers
/// with a 200 and a `Failed` list (here `InternalError`, not the sender's
/// fault): the other entries are forwarded, renumbered (their ids kept), and
/// both lists merged.
async fn publishes(state: &State, request: &Message, server: &mut Option<BufReader<TcpStream>>) -> Option<Vec<u8>> {
    const MEMBER: &str = "PublishBatchRequestEntries.member.";
    let body = std::str::from_utf8(&request.body).ok()?;
    let fields: Vec<(&str, &str)> = body.split('&').map(|field| field.split_once('=').unwrap_or((field, ""))).collect();
    fn member(name: &str) -> Option<(&str, &str)> {
        name.strip_prefix(MEMBER).and_then(|rest| rest.split_once('.'))
    }
    let mut members: Vec<&str> = Vec::new();
    for (number, _) in fields.iter().filter_map(|(name, _)| member(name)) {
        if !members.contains(&number) {
            members.push(number);
        }
    }
    let (refused, kept): (Vec<&str>, Vec<&str>) = members.into_iter().partition(|_| refuse_one(state));
    let renumbered = |number: &str| kept.iter().position(|kept| *kept == number).map(|at| at + 1);
    let forwarded: Vec<String> = fields
        .iter()
        .filter_map(|(name, value)| match member(name) {
            Some((number, field)) => renumbered(number).map(|number| format!("{MEMBER}{number}.{field}={value}")),
            None => Some(format!("{name}={value}")),
        })
        .collect();
    let (mut successful, mut failed) = (String::new(), String::new());
    if !kept.is_empty() {
        let answer = forward(state, &request.with_body(&forwarded.join("&")), server).await?;
        if !answer.head.starts_with("HTTP/1.1 200") {
            return Some(answer.raw);
        }
        let answer = String::from_utf8_lossy(&answer.body);
        (successful, failed) = (inner(&answer, "Successful").to_owned(), inner(&answer, "Failed").to_owned());
    }
    for number in refused {
        state.injected.statement_error.fetch_add(1, Ordering::SeqCst);
        let id = fields.iter().find(|(name, _)| *name == format!("{MEMBER}{number}.Id")).map_or("", |(_, id)| id);
        failed += &format!(
            "<member><Id>{id}</Id><Code>InternalError</Code><Message>injected: entry failed</Message>\
             <SenderFault>false</SenderFault></member>"
        );
    }
    let answer = format!(
        "<PublishBatchResponse xmlns=\"http://sns.amazonaws.com/doc/2010-03-31/\"><PublishBatchResult>\
         <Successful>{successful}</Successful><Failed>{failed}</Failed></PublishBatchResult>\
         <ResponseMetadata><RequestId>injected</RequestId></ResponseMetadata></PublishBatchResponse>"
    );
    Some(http_response(200, &answer))
}

/// What `xml` holds between the first `<element>` and its end; nothing if
/// it has no such element (or an empty one, `<element/>`).
fn inner<'x>(xml: &'x str, element: &str) -> &'x str {
    let (open, close) = (format!("<{element}>"), format!("</{element}>"));
    let Some(start) = xml.find(&open).map(|at| at + open.len()) else { return "" };
    xml[start..].find(&close).map_or("", |end| &xml[start..start + end])
}

/// EventBridge's batch call, whose entries succeed or fail one by one.
const PUT_EVENTS: &str = "PutEvents";

/// An EventBridge `PutEvents` with entries failed on their own, as
/// EventBridge answers with a 200, an error code in each failed entry's
/// place and their count (here `InternalFailure`, which it names
/// retryable): the other entries are forwarded, and the answers merged in
/// the request's order.
async fn events(state: &State, request: &Message, server: &mut Option<BufReader<TcpStream>>) -> Option<Vec<u8>> {
    let mut body: Value = serde_json::from_slice(&request.body).ok()?;
    let entries = body["Entries"].as_array()?.clone();
    let refused: Vec<bool> = entries.iter().map(|_| refuse_one(state)).collect();
    let kept: Vec<Value> =
        entries.iter().zip(&refused).filter(|(_, refused)| !**refused).map(|(e, _)| e.clone()).collect();
    let (mut answers, mut failed) = (Vec::new().into_iter(), 0);
    if !kept.is_empty() {
        body["Entries"] = Value::Array(kept);
        let answer = forward(state, &request.with_body(&body.to_string()), server).await?;
        if !answer.head.starts_with("HTTP/1.1 200") {
            return Some(answer.raw);
        }
        let answer: Value = serde_json::from_slice(&answer.body).ok()?;
        failed = answer["FailedEntryCount"].as_u64().unwrap_or(0);
        answers = answer["Entries"].as_array()?.clone().into_iter();
    }
    let mut answer = |refused: &bool| match refused {
        true => {
            state.injected.statement_error.fetch_add(1, Ordering::SeqCst);
            failed += 1;
            json!({ "ErrorCode": "InternalFailure", "ErrorMessage": "injected: entry failed" })
        }
        false => answers.next().unwrap_or(Value::Null),
    };
    let entries: Vec<Value> = refused.iter().map(&mut answer).collect();
    Some(http_response(200, &json!({ "FailedEntryCount": failed, "Entries": entries }).to_string()))
}

/// The item a refused statement met, read now with a consistent `GetItem`:
/// the statement's table (its first quoted name) at the key its `id`
/// parameter names.
async fn refused_item(state: &State, statement: &Value) -> Option<Value> {
    let text = statement["Statement"].as_str()?;
    let table = text.split('"').nth(1)?;
    let at = text.find("\"id\" = ?").or_else(|| text.find("'id': ?"))?;
    let key = statement["Parameters"].get(text[..at].matches('?').count())?;
    let body = json!({ "TableName": table, "Key": { "id": key }, "ConsistentRead": true }).to_string();
    let request = format!(
        "POST / HTTP/1.1\r\nHost: {}\r\nX-Amz-Target: DynamoDB_20120810.GetItem\r\n\
         Content-Type: application/x-amz-json-1.0\r\nAuthorization: AWS4-HMAC-SHA256 \
         Credential=test/20200101/us-east-1/dynamodb/aws4_request, SignedHeaders=host, Signature=0\r\n\
         Content-Length: {}\r\n\r\n{body}",
        state.upstream,
        body.len()
    );
    let answer = forward(state, request.as_bytes(), &mut None).await?;
    serde_json::from_slice::<Value>(&answer.body).ok()?.get("Item").cloned()
}

/// Sends `raw` upstream over the connection's own upstream connection
/// (opened on first use, and again after a failure) and reads the answer.
async fn forward(state: &State, raw: &[u8], server: &mut Option<BufReader<TcpStream>>) -> Option<Message> {
    for _ in 0..2 {
        if server.is_none() {
            *server = Some(BufReader::new(TcpStream::connect(&state.upstream).await.ok()?));
        }
        let connection = server.as_mut()?;
        if connection.get_mut().write_all(raw).await.is_ok()
            && let Some(answer) = read_message(connection).await
        {
            if answer.closed {
                *server = None;
            }
            return Some(answer);
        }
        *server = None;
    }
    None
}

/// One HTTP/1.1 message with a `Content-Length` body.
#[derive(Debug)]
pub struct Message {
    /// The message as sent.
    pub raw: Vec<u8>,
    /// Its start line and headers.
    pub head: String,
    /// Its `X-Amz-Target` header: the operation, for AWS JSON protocols.
    pub target: String,
    /// Its body.
    pub body: Vec<u8>,
    /// The sender closes the connection after it: the next message needs a
    /// new one.
    pub closed: bool,
}

impl Message {
    /// The operation a request asks for: its target's last part (AWS's JSON
    /// protocols), or its form's `Action` (the query protocol).
    pub fn operation(&self) -> String {
        if let Some(operation) = self.target.rsplit('.').next().filter(|operation| !operation.is_empty()) {
            return operation.to_owned();
        }
        let body = String::from_utf8_lossy(&self.body);
        let action = body.split('&').find_map(|field| field.strip_prefix("Action="));
        action.unwrap_or_default().to_owned()
    }

    /// The same request with another body.
    pub(crate) fn with_body(&self, body: &str) -> Vec<u8> {
        [reframed(&self.head, body.len()).as_bytes(), body.as_bytes()].concat()
    }
}

/// `head` framing a body of `length` bytes by its `Content-Length`, its
/// other framing headers (chunks, the connection's end) taken out.
fn reframed(head: &str, length: usize) -> String {
    let framing = |line: &&str| {
        let name = line.split_once(':').map_or("", |(name, _)| name);
        ["transfer-encoding", "connection", "content-length"].iter().any(|framing| name.eq_ignore_ascii_case(framing))
    };
    let kept: String = head
        .split("\r\n")
        .filter(|line| !line.is_empty() && !framing(line))
        .map(|line| format!("{line}\r\n"))
        .collect();
    format!("{kept}Content-Length: {length}\r\n\r\n")
}

/// Reads one message from `stream`; `None` at its end or on malformed input.
pub async fn read_message(stream: &mut BufReader<TcpStream>) -> Option<Message> {
    let mut head = String::new();
    let (mut length, mut target) = (0, String::new());
    loop {
        let mut line = String::new();
        stream.read_line(&mut line).await.ok().filter(|read| *read > 0)?;
        head += &line;
        if line == "\r\n" {
            break;
        }
        if let Some((name, value)) = line.split_once(':') {
            match name.trim().to_ascii_lowercase().as_str() {
                "content-length" => length = value.trim().parse().ok()?,
                "x-amz-target" => target = value.trim().to_owned(),
                _ => {}
            }
        }
    }
    let header = |name: &str, value: &str| {
        head.lines().any(|line| {
            line.split_once(':')
                .is_some_and(|(n, v)| n.eq_ignore_ascii_case(name) && v.trim().eq_ignore_ascii_case(value))
        })
    };
    let closes = header("connection", "close");
    let has_length =
        head.lines().any(|line| line.split_once(':').is_some_and(|(n, _)| n.eq_ignore_ascii_case("content-length")));
    // DynamoDB Local answers a large response (a BatchGetItem of many items) in chunks, or, to a client that
    // closes, until the end of the connection. Either is read whole and passed on with its length.
    let body = if header("transfer-encoding", "chunked") {
        read_chunks(stream).await?
    } else if head.starts_with("HTTP/") && closes && !has_length {
        let mut body = Vec::new();
        stream.read_to_end(&mut body).await.ok()?;
        body
    } else {
        let mut body = vec![0; length];
        stream.read_exact(&mut body).await.ok()?;
        let raw = [head.as_bytes(), &body].concat();
        return Some(Message { raw, head, target, body, closed: closes });
    };
    let head = reframed(&head, body.len());
    let raw = [head.as_bytes(), &body].concat();
    Some(Message { raw, head, target, body, closed: closes })
}

/// A chunked body, read to its last chunk and trailers, its chunks joined.
async fn read_chunks(stream: &mut BufReader<TcpStream>) -> Option<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        let mut line = String::new();
        stream.read_line(&mut line).await.ok().filter(|read| *read > 0)?;
        let size = usize::from_str_radix(line.trim().split(';').next()?.trim(), 16).ok()?;
        if size == 0 {
            // Trailers, up to the empty line.
            loop {
                let mut trailer = String::new();
                stream.read_line(&mut trailer).await.ok().filter(|read| *read > 0)?;
                if trailer == "\r\n" {
                    return Some(body);
                }
            }
        }
        let start = body.len();
        body.resize(start + size + 2, 0);
        stream.read_exact(&mut body[start..]).await.ok()?;
        body.truncate(start + size);
    }
}

/// An answer of `status` with `body`, typed as XML or JSON as it reads.
fn http_response(status: u16, body: &str) -> Vec<u8> {
    let content_type = if body.starts_with('<') { "text/xml" } else { "application/x-amz-json-1.0" };
    format!(
        "HTTP/1.1 {status} Injected\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}
