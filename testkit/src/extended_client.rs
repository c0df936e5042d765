//! The Amazon SQS Extended Client for Python (amazon-sqs-extended-client, as
//! its users run it), driven through scripts/extended-client.py in the
//! environment the SQS server runs in (scripts/sqs-local installs both), on
//! the SQS and S3 servers the tests use.

use std::{
    io::Write,
    path::PathBuf,
    process::{Command, Stdio},
};

/// The Python that has the client: `SQS_ONCE_TEST_PYTHON`, or the SQS server's.
fn python() -> PathBuf {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    std::env::var_os("SQS_ONCE_TEST_PYTHON").map_or_else(|| root.join(".tools/moto/bin/python"), PathBuf::from)
}

/// Runs `extended-client.py` with `args`, `input` on its standard input;
/// what it printed. Panics, naming the script's error, when it fails.
pub fn run(args: &[&str], input: &str) -> String {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scripts/extended-client.py");
    let mut child = Command::new(python())
        .arg(script)
        .args(args)
        .env("AWS_ENDPOINT_URL_S3", crate::sqs::endpoint())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|error| panic!("{}: {error}; run scripts/test once (it installs it)", python().display()));
    child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
    let output = child.wait_with_output().unwrap();
    assert!(output.status.success(), "extended-client.py {args:?}: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8(output.stdout).unwrap()
}
