//! What DynamoDB charges: a proxy in front of DynamoDB Local that asks, in
//! every request, for the capacity it consumes (`ReturnConsumedCapacity:
//! INDEXES`) and adds up what the answers report, on the table and on its
//! indexes, in read and write units.
//!
//! Where DynamoDB Local's accounting leaves something out, the meter applies
//! the rate AWS documents, and counts it apart so that a reader sees which
//! is which:
//!
//! - a write refused by its condition (`ConditionalCheckFailedException`) is
//!   charged as the write it would have been (AWS: "a failed conditional
//!   write still consumes write capacity"); Local's error carries no
//!   capacity, so the meter charges 1 write unit, the rate of an item of up to
//!   1 KB, which every claim is;
//! - `BatchExecuteStatement` answers carry no capacity at all in Local: the
//!   meter counts its statements ([`Units::statements`]) and charges none, so
//!   a measure of units must run with batched statements off (each
//!   statement is charged as its single request);
//! - Local 1.25.1 reports 4 units for any `TransactWriteItems`, of one action
//!   or of two: the meter charges 2 units per action instead, AWS's rate for
//!   a transactional write of up to 1 KB, and counts the actions
//!   ([`Units::transaction_actions`]). It does not see index writes inside a
//!   transaction (an outbox item's entry in the open-claims index, 1 unit per
//!   staged message).

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
};

use serde_json::Value;
use tokio::{
    io::{AsyncWriteExt, BufReader},
    net::{TcpListener, TcpStream},
};

use crate::faults::{Message, read_message};

/// Units charged so far.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Units {
    /// Write units on each table, as the answers report them.
    pub table_writes: BTreeMap<String, f64>,
    /// Write units on each global secondary index, by index name.
    pub index_writes: BTreeMap<String, f64>,
    /// Read units, tables and indexes together.
    pub reads: f64,
    /// Writes refused by their condition, each charged 1 write unit in
    /// [`Units::table_writes`] (Local reports none for them).
    pub refused_writes: u64,
    /// Statements sent in `BatchExecuteStatement` requests, which Local
    /// charges nothing for.
    pub statements: u64,
    /// Actions of `TransactWriteItems` requests, each charged 2 write units
    /// in [`Units::table_writes`].
    pub transaction_actions: u64,
    /// Requests, by operation.
    pub requests: BTreeMap<String, u64>,
}

impl Units {
    /// Write units on tables and indexes together.
    pub fn writes(&self) -> f64 {
        self.table_writes.values().chain(self.index_writes.values()).fold(0.0, |sum, units| sum + units)
    }

    /// Write units on indexes alone.
    pub fn index_writes(&self) -> f64 {
        // Folded from 0.0: an empty `sum` of floats is -0.0.
        self.index_writes.values().fold(0.0, |sum, units| sum + units)
    }
}

/// A running meter.
#[derive(Debug, Clone)]
pub struct Meter {
    /// Where clients reach it (`http://127.0.0.1:port`).
    pub url: String,
    units: Arc<Mutex<Units>>,
}

impl Meter {
    /// A meter in front of DynamoDB Local.
    pub async fn start() -> Self {
        Self::start_to(&crate::dynamodb::endpoint()).await
    }

    /// A meter in front of the DynamoDB server at `upstream` (`http://host:port`).
    pub async fn start_to(upstream: &str) -> Self {
        let upstream = upstream.trim_start_matches("http://").trim_end_matches('/').to_owned();
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("a local port");
        let url = format!("http://{}", listener.local_addr().expect("its address"));
        let units = Arc::new(Mutex::new(Units::default()));
        let counted = Arc::clone(&units);
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                tokio::spawn(relay(client, upstream.clone(), Arc::clone(&counted)));
            }
        });
        Self { url, units }
    }

    /// The units charged so far.
    pub fn units(&self) -> Units {
        self.units.lock().expect("the meter's lock").clone()
    }

    /// The units charged so far, and a fresh count from now on.
    pub fn take(&self) -> Units {
        std::mem::take(&mut *self.units.lock().expect("the meter's lock"))
    }
}

/// The operations that accept `ReturnConsumedCapacity`.
const METERED: &[&str] = &[
    "PutItem",
    "UpdateItem",
    "DeleteItem",
    "GetItem",
    "Query",
    "Scan",
    "BatchGetItem",
    "BatchWriteItem",
    "TransactWriteItems",
    "TransactGetItems",
    "BatchExecuteStatement",
    "ExecuteStatement",
    "ExecuteTransaction",
];

/// Whether `operation` writes.
fn writes(operation: &str) -> bool {
    matches!(
        operation,
        "PutItem" | "UpdateItem" | "DeleteItem" | "BatchWriteItem" | "TransactWriteItems" | "ExecuteTransaction"
    )
}

async fn relay(client: TcpStream, upstream: String, units: Arc<Mutex<Units>>) {
    let mut client = BufReader::new(client);
    let mut server: Option<BufReader<TcpStream>> = None;
    while let Some(request) = read_message(&mut client).await {
        let operation = request.target.rsplit('.').next().unwrap_or_default().to_owned();
        let mut body: Value = serde_json::from_slice(&request.body).unwrap_or(Value::Null);
        let metered = METERED.contains(&operation.as_str()) && body.is_object();
        if metered {
            body["ReturnConsumedCapacity"] = "INDEXES".into();
        }
        let raw = if metered { request.with_body(&body.to_string()) } else { request.raw.clone() };
        if server.is_none() {
            let Ok(connection) = TcpStream::connect(&upstream).await else { return };
            server = Some(BufReader::new(connection));
        }
        let Some(connection) = server.as_mut() else { return };
        if connection.get_mut().write_all(&raw).await.is_err() {
            return;
        }
        let Some(answer) = read_message(connection).await else { return };
        if answer.closed {
            server = None;
        }
        count(&units, &operation, &body, &answer);
        if client.get_mut().write_all(&answer.raw).await.is_err() {
            return;
        }
    }
}

fn count(units: &Mutex<Units>, operation: &str, request: &Value, answer: &Message) {
    let mut units = units.lock().expect("the meter's lock");
    *units.requests.entry(operation.to_owned()).or_default() += 1;
    if operation == "BatchExecuteStatement" {
        units.statements += request["Statements"].as_array().map_or(0, |statements| statements.len() as u64);
    }
    let answer: Value = serde_json::from_slice(&answer.body).unwrap_or(Value::Null);
    if answer["__type"].as_str().is_some_and(|kind| kind.ends_with("ConditionalCheckFailedException")) {
        units.refused_writes += 1;
        let table = request["TableName"].as_str().unwrap_or_default().to_owned();
        *units.table_writes.entry(table).or_default() += 1.0;
        return;
    }
    if operation == "TransactWriteItems" {
        for action in request["TransactItems"].as_array().into_iter().flatten() {
            let table = action.as_object().and_then(|action| action.values().next()).map(|action| &action["TableName"]);
            let table = table.and_then(Value::as_str).unwrap_or_default().to_owned();
            units.transaction_actions += 1;
            *units.table_writes.entry(table).or_default() += 2.0;
        }
        return;
    }
    let consumed = match &answer["ConsumedCapacity"] {
        Value::Array(each) => each.clone(),
        Value::Null => Vec::new(),
        one => vec![one.clone()],
    };
    for capacity in consumed {
        let table = capacity["TableName"].as_str().unwrap_or_default().to_owned();
        let on = |part: &Value| part["CapacityUnits"].as_f64().unwrap_or(0.0);
        let table_units = capacity.get("Table").map_or_else(|| on(&capacity), on);
        let indexes: Vec<(String, f64)> = capacity["GlobalSecondaryIndexes"]
            .as_object()
            .map(|indexes| indexes.iter().map(|(name, part)| (name.clone(), on(part))).collect())
            .unwrap_or_default();
        if writes(operation) {
            *units.table_writes.entry(table).or_default() += table_units;
            for (index, index_units) in indexes {
                *units.index_writes.entry(index).or_default() += index_units;
            }
        } else {
            units.reads += table_units + indexes.iter().map(|(_, units)| units).sum::<f64>();
        }
    }
}
