//! `sqs-once new` writes a consumer crate and nothing else: never into an
//! existing directory, never under a name Cargo would refuse. (The crate it
//! writes is built, tested, invoked and linted by scripts/new-consumer.)

use crate::common;

use std::{path::Path, process::Output};

fn new(dir: &Path, args: &[&str]) -> Output {
    common::command_in(dir).arg("new").args(args).output().unwrap()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn a_new_crate_is_the_example_with_a_manifest_template_and_event_around_it() {
    let dir = tempfile::tempdir().unwrap();
    let output = new(dir.path(), &["consumers/payments"]);
    assert!(output.status.success(), "{}", stderr(&output));
    let crate_dir = dir.path().join("consumers/payments");
    let read = |file: &str| std::fs::read_to_string(crate_dir.join(file)).unwrap();
    let repository =
        |file: &str| std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(file)).unwrap();
    assert_eq!(read("src/main.rs"), repository("examples/own_consumer.rs"));
    assert_eq!(read("events/batch.json"), repository("events/payments.json"));
    // The versions CI tested, the workspace's formatting, and nothing the local tools write under version control.
    assert_eq!(read("Cargo.lock"), repository("Cargo.lock"));
    assert_eq!(read("rustfmt.toml"), repository("rustfmt.toml"));
    assert!(read(".gitignore").lines().any(|line| line == "/.tools"), "{}", read(".gitignore"));
    let manifest = read("Cargo.toml");
    assert!(manifest.contains("name = \"payments\""), "{manifest}");
    assert!(manifest.contains("panic = \"unwind\""), "{manifest}");
    // As the bundled binary: mimalloc without transparent huge pages, on one thread (docs/lambda.md, "Features, runtime and allocator").
    assert!(manifest.contains(r#"mimalloc = { version = "0.1", default-features = false, features = ["no_thp"] }"#));
    let main = read("src/main.rs");
    assert!(main.contains("#[global_allocator]\nstatic ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;"), "{main}");
    assert!(main.contains("#[tokio::main(flavor = \"current_thread\")]"), "{main}");
    assert!(read("samconfig.toml").contains("stack_name = \"payments\""));
    // One key everywhere, set in code: its test, `cargo run -- invoke`, the binary run directly, the function.
    assert!(main.contains("Consumer::builder().key(KEY)") && main.contains("TestConsumer::new(Payments).key(KEY)"));
    assert!(!crate_dir.join(".cargo").exists() && !read("template.yaml").contains("SQS_ONCE_KEY"));
    let env: serde_json::Value = serde_json::from_str(&read("env.json")).unwrap();
    let settings = env["ConsumerFunction"].as_object().unwrap();
    assert!(settings.contains_key("AWS_ENDPOINT_URL_DYNAMODB") && settings.contains_key("SQS_ONCE_DLQ_URL"));
    assert!(!settings.keys().any(|name| name.starts_with("SQS_ONCE_LEDGER_")), "{settings:?}");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains("cargo test"), "it says what to do next: {stdout}");
}

/// Written inside another crate's workspace (the README's first block, run
/// in a checkout of sqs-once), the crate is a workspace of its own, and
/// Cargo loads it rather than refusing a package outside the members.
#[test]
fn a_crate_written_inside_a_workspace_is_a_workspace_of_its_own() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("Cargo.toml"), "[workspace]\nmembers = []\nresolver = \"3\"\n").unwrap();
    let output = new(dir.path(), &["payments"]);
    assert!(output.status.success(), "{}", stderr(&output));
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let located = std::process::Command::new(cargo)
        .args(["locate-project", "--workspace", "--message-format", "plain"])
        .current_dir(dir.path().join("payments"))
        .output()
        .unwrap();
    assert!(located.status.success(), "{}", stderr(&located));
    let workspace = String::from_utf8_lossy(&located.stdout);
    assert_eq!(Path::new(workspace.trim()), dir.path().join("payments/Cargo.toml"));
}

#[test]
fn an_existing_directory_is_never_written_into() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("payments")).unwrap();
    std::fs::write(dir.path().join("payments/Cargo.toml"), "mine").unwrap();
    let output = new(dir.path(), &["payments"]);
    assert_eq!(output.status.code(), Some(1));
    assert!(stderr(&output).contains("payments already exists"), "{}", stderr(&output));
    assert_eq!(std::fs::read_dir(dir.path().join("payments")).unwrap().count(), 1);
    assert_eq!(std::fs::read_to_string(dir.path().join("payments/Cargo.toml")).unwrap(), "mine");
}

#[test]
fn a_name_cargo_would_refuse_is_refused_before_anything_is_written() {
    let dir = tempfile::tempdir().unwrap();
    for (name, reason) in [
        ("3d-orders", "starts with an ASCII letter"),
        ("orders!", "only ASCII letters, digits"),
        ("match", "keyword"),
        ("sqs_once", "sqs-once itself"),
    ] {
        let output = new(dir.path(), &[name]);
        assert_eq!(output.status.code(), Some(1), "{name}");
        let stderr = stderr(&output);
        assert!(
            stderr.contains(&format!("`{name}` cannot name a crate")) && stderr.contains(reason),
            "{name}: {stderr}"
        );
    }
    let output = new(dir.path(), &["payments", "--library-path", "no/such/dir"]);
    assert!(stderr(&output).contains("no/such/dir holds no library"), "{}", stderr(&output));
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "nothing was written");
}

/// `new` is the bundled binary's own command, before the library's command
/// line: its help names it first, then lists the library's commands (which
/// a consumer's own binary has alone).
#[test]
fn help_names_new_first_then_the_librarys_commands() {
    let dir = tempfile::tempdir().unwrap();
    let output = common::command_in(dir.path()).arg("--help").output().unwrap();
    let help = String::from_utf8_lossy(&output.stdout);
    assert!(help.starts_with("sqs-once new <PATH>: write a consumer crate of one's own"), "{help}");
    let commands: Vec<&str> = help
        .lines()
        .skip_while(|line| *line != "Commands:")
        .skip(1)
        .take_while(|line| !line.is_empty())
        .filter_map(|line| line.split_whitespace().next())
        .collect();
    assert_eq!(commands, ["invoke", "poll", "create-table", "claims", "help"], "{help}");
    let new_help = common::command_in(dir.path()).args(["new", "--help"]).output().unwrap();
    let new_help = String::from_utf8_lossy(&new_help.stdout);
    assert!(new_help.contains("Usage: sqs-once new [OPTIONS] <PATH>"), "{new_help}");
}
