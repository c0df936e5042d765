//! A Lambda Runtime API server for tests: it hands events to a function
//! process that polls `/next`, as Lambda does, and collects its answers. Each
//! event gets the deadline the test chooses.

use std::{
    collections::HashMap,
    net::SocketAddr,
    process::Stdio,
    sync::{Arc, Mutex},
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use serde_json::Value;
use tokio::{
    io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader},
    net::{TcpListener, TcpStream},
    process::{Child, Command},
    sync::{mpsc, oneshot},
    time::Instant,
};

/// What the function answered to one invocation.
#[derive(Debug, Clone)]
pub enum Answer {
    /// `/response`, with its JSON body.
    Response(Value),
    /// `/error`, with its JSON body (`errorType`, `errorMessage`).
    Error(Value),
}

struct Pending {
    request_id: String,
    deadline_ms: u64,
    trace_header: String,
    event: Vec<u8>,
}

#[derive(Default)]
struct State {
    answers: Mutex<HashMap<String, oneshot::Sender<Answer>>>,
    init_errors: Mutex<Vec<Value>>,
    /// When the function first asked for an event: its init phase was over.
    polling_since: std::sync::OnceLock<Instant>,
    /// Run when the function next asks for an event: where Lambda freezes it.
    at_next: Mutex<Option<Box<dyn FnOnce() + Send>>>,
    /// Extensions registered (name, the events they subscribed to), each
    /// with whether the function had asked for an event yet.
    extensions: Mutex<Vec<Registered>>,
    /// The `Lambda-Runtime-Trace-Id` of each invocation, in order.
    trace_headers: Mutex<Vec<String>>,
}

/// An extension as the function registered it with the Extensions API.
#[derive(Debug, Clone, PartialEq)]
pub struct Registered {
    /// `Lambda-Extension-Name`.
    pub name: String,
    /// The events it subscribed to.
    pub events: Value,
    /// Whether it registered in the init phase, before the function first
    /// asked for an event (Lambda refuses a later registration).
    pub in_init: bool,
}

/// The server, listening on a free loopback port.
#[allow(missing_debug_implementations)]
pub struct RuntimeApi {
    /// Where the function reaches it (`AWS_LAMBDA_RUNTIME_API`).
    pub address: SocketAddr,
    events: mpsc::UnboundedSender<Pending>,
    state: Arc<State>,
}

impl RuntimeApi {
    /// Starts serving; events are queued with the methods below.
    pub async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let (events, queue) = mpsc::unbounded_channel();
        let queue = Arc::new(tokio::sync::Mutex::new(queue));
        let state = Arc::new(State::default());
        let accepting = Arc::clone(&state);
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(serve(stream, Arc::clone(&queue), Arc::clone(&accepting)));
            }
        });
        Self { address, events, state }
    }

    /// Sends `event` with a deadline `timeout` from now; returns the answer
    /// and when it arrived, or `None` if none came within `timeout` + 5 s.
    ///
    /// The deadline counts from the moment the function waits for events, as
    /// Lambda's does: a cold start (slow under an emulator such as
    /// `qemu-aarch64`) is not taken out of the invocation's time.
    pub async fn invoke(&self, event: &Value, timeout: Duration) -> Option<(Answer, Instant, Instant)> {
        self.initialized().await;
        let deadline_ms =
            u64::try_from((SystemTime::now() + timeout).duration_since(UNIX_EPOCH).unwrap().as_millis()).unwrap();
        self.invoke_with_deadline_header(event, timeout, deadline_ms).await
    }

    /// Like [`invoke`](Self::invoke), with `deadline_ms` sent as the deadline
    /// header whatever it means.
    pub async fn invoke_with_deadline_header(
        &self,
        event: &Value,
        timeout: Duration,
        deadline_ms: u64,
    ) -> Option<(Answer, Instant, Instant)> {
        let request_id = uuid::Uuid::new_v4().to_string();
        let deadline = Instant::now() + timeout;
        let (answer, answered) = oneshot::channel();
        self.state.answers.lock().unwrap().insert(request_id.clone(), answer);
        let event = serde_json::to_vec(event).unwrap();
        let trace_header = lambda_trace_header();
        self.state.trace_headers.lock().unwrap().push(trace_header.clone());
        self.events.send(Pending { request_id, deadline_ms, trace_header, event }).ok()?;
        let answer = tokio::time::timeout(timeout + Duration::from_secs(5), answered).await.ok()?.ok()?;
        Some((answer, Instant::now(), deadline))
    }

    /// The X-Ray trace header each invocation carried
    /// (`Lambda-Runtime-Trace-Id`), in the order they were sent: as Lambda
    /// writes it with active tracing, a new trace per invocation, sampled.
    pub fn trace_headers(&self) -> Vec<String> {
        self.state.trace_headers.lock().unwrap().clone()
    }

    /// Waits, up to 60 s, until the function has asked for its first event.
    pub async fn initialized(&self) {
        let started = Instant::now();
        while self.initialized_at().is_none() && started.elapsed() < Duration::from_secs(60) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// When the function first asked for an event (its init phase ended).
    pub fn initialized_at(&self) -> Option<Instant> {
        self.state.polling_since.get().copied()
    }

    /// Runs `hook` when the function next asks for an event, after its
    /// answer, as Lambda freezes an environment there: the hook stops the
    /// process (SIGSTOP) and drops what its connections had not delivered.
    pub fn at_next_request(&self, hook: impl FnOnce() + Send + 'static) {
        *self.state.at_next.lock().unwrap() = Some(Box::new(hook));
    }

    /// The extensions the function registered.
    pub fn extensions(&self) -> Vec<Registered> {
        self.state.extensions.lock().unwrap().clone()
    }

    /// Init errors the function reported.
    pub fn init_errors(&self) -> Vec<Value> {
        self.state.init_errors.lock().unwrap().clone()
    }

    /// Starts `command` as Lambda starts a function, pointed at this server.
    pub fn spawn(&self, command: std::process::Command, envs: &[(&str, String)]) -> Child {
        Command::from(command)
            .env("AWS_LAMBDA_RUNTIME_API", self.address.to_string())
            .env("AWS_LAMBDA_FUNCTION_NAME", "sqs-once-test")
            .env("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "256")
            .env("AWS_LAMBDA_FUNCTION_VERSION", "$LATEST")
            .env("AWS_LAMBDA_LOG_FORMAT", "JSON")
            .envs(envs.iter().map(|(name, value)| (*name, value.as_str())))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap()
    }
}

/// One connection of the function's HTTP client; requests are served in turn.
async fn serve(stream: TcpStream, queue: Arc<tokio::sync::Mutex<mpsc::UnboundedReceiver<Pending>>>, state: Arc<State>) {
    let mut stream = BufReader::new(stream);
    while let Some((method, path, headers, body)) = read_request(&mut stream).await {
        if let Some(extension) = path.strip_prefix("/2020-01-01/extension/") {
            let reply = match (method.as_str(), extension) {
                ("POST", "register") => {
                    let registered = Registered {
                        name: headers.get("lambda-extension-name").cloned().unwrap_or_default(),
                        events: serde_json::from_slice::<Value>(&body).unwrap_or(Value::Null)["events"].clone(),
                        in_init: state.polling_since.get().is_none(),
                    };
                    state.extensions.lock().unwrap().push(registered);
                    let identifier = format!("Lambda-Extension-Identifier: {}\r\n", uuid::Uuid::new_v4());
                    response(200, &identifier, b"{}")
                }
                // No event comes to an extension subscribed to none: the request waits as long as the environment.
                ("GET", "event/next") => std::future::pending().await,
                _ => response(404, "", b"{}"),
            };
            if stream.get_mut().write_all(&reply).await.is_err() {
                return;
            }
            continue;
        }
        let segments: Vec<&str> = path.trim_start_matches("/2018-06-01/runtime/").split('/').collect();
        let reply = match (method.as_str(), segments.as_slice()) {
            ("GET", ["invocation", "next"]) => {
                state.polling_since.get_or_init(Instant::now);
                let hook = state.at_next.lock().unwrap().take();
                if let Some(hook) = hook {
                    hook();
                }
                let Some(pending) = queue.lock().await.recv().await else { return };
                let headers = format!(
                    "Lambda-Runtime-Aws-Request-Id: {}\r\nLambda-Runtime-Deadline-Ms: {}\r\n\
                     Lambda-Runtime-Invoked-Function-Arn: arn:aws:lambda:us-east-1:123456789012:function:sqs-once-test\r\n\
                     Lambda-Runtime-Trace-Id: {}\r\n",
                    pending.request_id, pending.deadline_ms, pending.trace_header
                );
                response(200, &headers, &pending.event)
            }
            ("POST", ["invocation", request_id, outcome @ ("response" | "error")]) => {
                let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                let answer = if *outcome == "response" { Answer::Response(body) } else { Answer::Error(body) };
                if let Some(waiting) = state.answers.lock().unwrap().remove(*request_id) {
                    let _ = waiting.send(answer);
                }
                response(202, "", b"{}")
            }
            ("POST", ["init", "error"]) => {
                state.init_errors.lock().unwrap().push(serde_json::from_slice(&body).unwrap_or(Value::Null));
                response(202, "", b"{}")
            }
            _ => response(404, "", b"{}"),
        };
        if stream.get_mut().write_all(&reply).await.is_err() {
            return;
        }
    }
}

/// A trace header as Lambda's: `Root=1-{epoch seconds, hex}-{24 hex};Parent={16 hex};Sampled=1`.
fn lambda_trace_header() -> String {
    let hex = |digits: usize| (0..digits).map(|_| format!("{:x}", fastrand::u8(..16))).collect::<String>();
    let seconds = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs();
    format!("Root=1-{seconds:08x}-{};Parent={};Sampled=1;Lineage=1:a87bd80c:0", hex(24), hex(16))
}

pub(crate) type Request = (String, String, HashMap<String, String>, Vec<u8>);

pub(crate) async fn read_request(stream: &mut BufReader<TcpStream>) -> Option<Request> {
    let mut line = String::new();
    stream.read_line(&mut line).await.ok().filter(|read| *read > 0)?;
    let mut parts = line.split_whitespace();
    let (method, path) = (parts.next()?.to_owned(), parts.next()?.to_owned());
    let mut headers = HashMap::new();
    loop {
        let mut header = String::new();
        stream.read_line(&mut header).await.ok().filter(|read| *read > 0)?;
        let Some((name, value)) = header.trim_end().split_once(':') else { break };
        headers.insert(name.trim().to_ascii_lowercase(), value.trim().to_owned());
    }
    let mut body = Vec::new();
    if let Some(length) = headers.get("content-length").and_then(|length| length.parse::<usize>().ok()) {
        body.resize(length, 0);
        stream.read_exact(&mut body).await.ok()?;
    } else if headers.get("transfer-encoding").is_some_and(|encoding| encoding.contains("chunked")) {
        loop {
            let mut size = String::new();
            stream.read_line(&mut size).await.ok()?;
            let size = usize::from_str_radix(size.trim().split(';').next()?, 16).ok()?;
            let mut chunk = vec![0; size + 2];
            stream.read_exact(&mut chunk).await.ok()?;
            if size == 0 {
                break;
            }
            body.extend_from_slice(&chunk[..size]);
        }
    }
    Some((method, path, headers, body))
}

pub(crate) fn response(status: u16, headers: &str, body: &[u8]) -> Vec<u8> {
    let mut reply = format!(
        "HTTP/1.1 {status} {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n{headers}\r\n",
        if status < 300 { "OK" } else { "Not Found" },
        body.len()
    )
    .into_bytes();
    reply.extend_from_slice(body);
    reply
}
