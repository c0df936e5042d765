//! `demo`: a handler for trying the tool and for tests.
//!
//! Every body succeeds, except a JSON object that asks otherwise:
//! `{"sleep_ms": 250}` sleeps first, and `{"fail": "retryable" | "permanent" |
//! "panic"}` fails that way. Each time it runs, before obeying anything, it
//! appends `<key>\t<messageId>\n` to the file named by `SQS_ONCE_DEMO_LOG`, so
//! a test can count how often a side effect started.
//!
//! On a message's first delivery only (`ApproximateReceiveCount` 1), and
//! before its side effect starts (so before the log line), `{"fail_first":
//! "retryable" | "permanent"}` fails that way and `{"stall_first_ms": 10000}`
//! waits that long: a dependency that is down, or a handler cut off at the
//! deadline, on one delivery and not the next. `{"block_first_ms": 5000}`
//! blocks the thread that long instead, as no handler may: the whole
//! invocation stalls with it, past its deadline, and Lambda kills the
//! process (what the tests of a late answer need).

use std::{
    fs::{File, OpenOptions},
    io::Write,
    path::Path,
    time::Duration,
};

use serde::Deserialize;

use sqs_once::{Handler, HandlerError, HandlerResult, Record};

/// The demo handler.
#[derive(Debug, Default)]
pub struct Demo {
    log: Option<File>,
}

/// The directives a body may carry; anything else in it is ignored.
#[derive(Debug, Default, Deserialize)]
struct Directives {
    sleep_ms: Option<u64>,
    fail: Option<String>,
    fail_first: Option<String>,
    stall_first_ms: Option<u64>,
    block_first_ms: Option<u64>,
}

impl Demo {
    /// A demo handler logging to `SQS_ONCE_DEMO_LOG`, if set. A log that
    /// cannot be opened stops the start: every count taken from it would be wrong.
    pub fn from_env() -> Result<Self, String> {
        match std::env::var_os("SQS_ONCE_DEMO_LOG") {
            Some(path) => Self::with_log(&path)
                .map_err(|error| format!("cannot open SQS_ONCE_DEMO_LOG {}: {error}", Path::new(&path).display())),
            None => Ok(Self::default()),
        }
    }

    /// A demo handler appending its run log to `path`.
    pub fn with_log(path: impl AsRef<Path>) -> std::io::Result<Self> {
        let log = OpenOptions::new().create(true).append(true).open(path)?;
        Ok(Self { log: Some(log) })
    }
}

impl Handler for Demo {
    async fn handle(&self, record: &Record) -> HandlerResult {
        let directives: Directives = serde_json::from_str(&record.body).unwrap_or_default();
        if record.receive_count == 1 {
            if let Some(ms) = directives.stall_first_ms {
                tokio::time::sleep(Duration::from_millis(ms)).await;
            }
            if let Some(ms) = directives.block_first_ms {
                std::thread::sleep(Duration::from_millis(ms));
            }
            if let Some(kind) = directives.fail_first.as_deref() {
                return Err(failure(kind));
            }
        }
        if let Some(mut log) = self.log.as_ref() {
            // One write per line: with O_APPEND, lines of several processes never interleave.
            log.write_all(format!("{}\t{}\n", record.key, record.message_id).as_bytes())
                .map_err(|error| HandlerError::retryable(format!("demo log: {error}")))?;
        }
        if let Some(ms) = directives.sleep_ms {
            tokio::time::sleep(Duration::from_millis(ms)).await;
        }
        match directives.fail.as_deref() {
            None => Ok(None),
            Some(kind) => Err(failure(kind)),
        }
    }
}

/// The failure a `fail` directive asks for.
fn failure(kind: &str) -> HandlerError {
    match kind {
        "retryable" => HandlerError::retryable("demo: asked to fail (retryable)"),
        "permanent" => HandlerError::permanent("demo: asked to fail (permanent)"),
        "panic" => panic!("demo: asked to panic"),
        other => HandlerError::permanent(format!("demo: unknown directive fail={other:?}")),
    }
}
