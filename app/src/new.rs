//! `sqs-once new <path>`: a consumer crate of one's own, ready to test,
//! `invoke` offline and deploy with SAM. The bundled binary's command alone:
//! a consumer's own binary has the library's commands, not a scaffolder and
//! its template.
//!
//! The crate is the library's example `own_consumer` as its
//! `src/main.rs` (a handler, its tests through `sqs_once::testing`, and
//! `sqs_once::run`), the repository's `template.yaml` without the bundled
//! handlers' parts and building the new crate's binary, its `samconfig.toml`
//! and `env.json`, the example's event as `events/batch.json`, and the
//! workspace's `Cargo.lock` and `rustfmt.toml`: the files
//! the repository tests are the files a new crate starts from. They reach
//! this package through the links in `scaffold/` (Cargo packs a link's
//! target), so a binary built from crates.io writes them as a checkout's
//! does.

use std::{
    ffi::OsString,
    fs, io,
    path::{Path, PathBuf},
    process::ExitCode,
};

use clap::Parser;

/// The example the new crate's `src/main.rs` is.
const MAIN: &str = include_str!("../scaffold/own_consumer.rs");
/// Its sample event, processed by `cargo run -- invoke events/batch.json`.
const EVENT: &str = include_str!("../scaffold/payments.json");
const TEMPLATE: &str = include_str!("../scaffold/template.yaml");
const SAMCONFIG: &str = include_str!("../scaffold/samconfig.toml");
/// The settings `sam local invoke` gives the function (samconfig.toml names it).
const SAM_LOCAL_ENV: &str = include_str!("../scaffold/env.json");
/// The workspace's `Cargo.lock`, the versions its tests ran with: the new
/// crate's Cargo keeps each of them that its own dependencies still take,
/// rather than resolve the newest.
const TESTED_LOCK: &str = include_str!("../scaffold/tested.lock");
/// The workspace's formatting, which the example is formatted to.
const RUSTFMT: &str = include_str!("../scaffold/rustfmt.toml");

/// The version of the library this binary was built with (the workspace
/// releases its crates at one version), which a new crate depends on
/// unless told otherwise.
const LIBRARY_VERSION: &str = env!("CARGO_PKG_VERSION");

/// Write a consumer crate of one's own: a handler with its tests, a SAM
/// template (queue, dead-letter queue, claim table, alarms), a sample event.
#[derive(Debug, Parser)]
#[command(name = "sqs-once new", bin_name = "sqs-once new", version)]
struct New {
    /// The directory to create; its last component names the crate.
    path: PathBuf,
    /// Depend on the sqs-once library in this directory (a checkout, or a package unpacked) instead of the one
    /// this binary was built with (its checkout, or its version on crates.io).
    #[arg(long, value_name = "DIR")]
    library_path: Option<PathBuf>,
}

/// Runs `new` when the command line (`args`, the program first) asks for
/// it, and says so in the top-level help the library prints after; `None`
/// leaves the command line to the library.
pub(crate) fn command(args: &[OsString]) -> Option<ExitCode> {
    match args.get(1).and_then(|arg| arg.to_str()) {
        Some("new") => Some(new(New::parse_from(&args[1..]))),
        Some("-h" | "--help" | "help") if args.len() == 2 => {
            println!("sqs-once new <PATH>: write a consumer crate of one's own (sqs-once new --help)\n");
            None
        }
        _ => None,
    }
}

/// Writes the crate and says what to do next, or why it wrote nothing.
fn new(args: New) -> ExitCode {
    let library = args.library_path.as_deref().map_or_else(Library::this_build, Library::local);
    let created = library.and_then(|library| Ok((create(&args.path, &library)?, library)));
    let (files, library) = match created {
        Ok(created) => created,
        Err(error) => {
            eprintln!("sqs-once: {error}");
            return ExitCode::FAILURE;
        }
    };
    let path = args.path.display();
    println!("created {path}, depending on {library}:");
    files.iter().for_each(|file| println!("  {}", file.display()));
    println!("next: cd {path} && cargo test && cargo run -- invoke events/batch.json");
    ExitCode::SUCCESS
}

/// Where the new crate gets the `sqs-once` library from.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Library {
    /// crates.io, at this version requirement.
    Registry(String),
    /// A directory holding the library's `Cargo.toml`: a checkout, or a
    /// package `cargo package` unpacked.
    Path(PathBuf),
}

impl std::fmt::Display for Library {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Registry(version) => write!(f, "sqs-once {version} from crates.io"),
            Self::Path(path) => write!(f, "the sqs-once library in {}", path.display()),
        }
    }
}

impl Library {
    /// The library this binary was built with. A package (crates.io's,
    /// unpacked in Cargo's `registry/src`, or any `cargo package` made and
    /// marked with `Cargo.toml.orig`) is depended on by its version, whether
    /// or not its sources are still on this machine; a checkout (`cargo
    /// install --path app`, `cargo run`) by its path, the directory above
    /// this package's, published or not, while it is still there.
    fn this_build() -> Result<Self, NewError> {
        Self::built_in(Path::new(env!("CARGO_MANIFEST_DIR")))
    }

    /// The library of a binary built from this package's directory `dir`.
    fn built_in(dir: &Path) -> Result<Self, NewError> {
        let components: Vec<_> = dir.components().map(|component| component.as_os_str()).collect();
        let in_registry = components.windows(2).any(|pair| pair[0] == "registry" && pair[1] == "src");
        if in_registry || dir.join("Cargo.toml.orig").is_file() {
            return Ok(Self::Registry(LIBRARY_VERSION.to_owned()));
        }
        let checkout = dir.parent().filter(|checkout| {
            fs::read_to_string(checkout.join("Cargo.toml")).is_ok_and(|manifest| names_the_library(&manifest))
        });
        checkout.map(|checkout| Self::Path(checkout.to_owned())).ok_or_else(|| NewError::CheckoutGone(dir.to_owned()))
    }

    /// The library in the directory `path` (made absolute, as the new crate
    /// lives elsewhere), which must hold a `Cargo.toml`.
    fn local(path: &Path) -> Result<Self, NewError> {
        let path = fs::canonicalize(path).map_err(|source| NewError::Library { path: path.to_owned(), source })?;
        let manifest = fs::read_to_string(path.join("Cargo.toml"));
        match manifest.map(|manifest| names_the_library(&manifest)) {
            Ok(true) => Ok(Self::Path(path)),
            Ok(false) => {
                let source = io::Error::new(io::ErrorKind::InvalidData, "its package is not sqs-once");
                Err(NewError::Library { path, source })
            }
            Err(source) => Err(NewError::Library { path, source }),
        }
    }

    /// The dependency as `Cargo.toml` spells it, with `features`.
    fn dependency(&self, features: &[&str]) -> String {
        let source = match self {
            Self::Registry(version) => format!("version = {}", toml_string(version)),
            // With the version: a checkout whose API moved on fails with a
            // clear version mismatch rather than compile errors in src/main.rs.
            Self::Path(path) => {
                format!("path = {}, version = {}", toml_string(&path.to_string_lossy()), toml_string(LIBRARY_VERSION))
            }
        };
        let features = match features {
            [] => String::new(),
            features => {
                format!(", features = [{}]", features.iter().map(|f| toml_string(f)).collect::<Vec<_>>().join(", "))
            }
        };
        format!("sqs-once = {{ {source}{features} }}")
    }
}

/// Why `new` wrote nothing.
#[derive(Debug, thiserror::Error)]
enum NewError {
    /// Something is already at the path; it is left as it is.
    #[error("{} already exists; `new` writes a new directory and never into an existing one", .0.display())]
    Exists(PathBuf),
    /// The directory's name cannot name a crate.
    #[error("`{name}` cannot name a crate: {reason}")]
    InvalidName {
        /// The directory's last component.
        name: String,
        /// Which rule it breaks.
        reason: &'static str,
    },
    /// This binary was built from a checkout that is gone, and no library was
    /// given: a dependency on the version from crates.io might not resolve.
    #[error(
        "this binary was built from the sqs-once sources in {}, which are gone: pass --library-path with a \
         checkout of sqs-once", .0.display()
    )]
    CheckoutGone(PathBuf),
    /// `--library-path` names no directory with a `Cargo.toml`.
    #[error("{} holds no library to depend on (its Cargo.toml: {source})", path.display())]
    Library {
        /// The directory given.
        path: PathBuf,
        /// Why it cannot be read.
        source: io::Error,
    },
    /// Writing failed; what was written is removed again.
    #[error("cannot write {}: {source}", path.display())]
    Write {
        /// The file or directory.
        path: PathBuf,
        /// What the file system said.
        source: io::Error,
    },
}

/// Writes a consumer crate at `path`, named after its last component, and
/// returns the files written, relative to `path`.
///
/// Nothing is written when `path` exists or its name cannot name a crate;
/// when a write fails, the directory is removed again.
fn create(path: &Path, library: &Library) -> Result<Vec<PathBuf>, NewError> {
    let name = crate_name(path)?;
    let files = files(&name, library);
    if let Some(parent) = path.parent().filter(|parent| !parent.as_os_str().is_empty()) {
        fs::create_dir_all(parent).map_err(|source| NewError::Write { path: parent.to_owned(), source })?;
    }
    // `create_dir` refuses an existing path atomically: nothing is overwritten
    // even if the path appears between a check and the write.
    fs::create_dir(path).map_err(|source| match source.kind() {
        io::ErrorKind::AlreadyExists => NewError::Exists(path.to_owned()),
        _ => NewError::Write { path: path.to_owned(), source },
    })?;
    let written = files.iter().try_for_each(|(file, text)| write(&path.join(file), text));
    if let Err(error) = written {
        // Best effort: the error that stopped the writes is the one to report.
        let _ = fs::remove_dir_all(path);
        return Err(error);
    }
    Ok(files.into_iter().map(|(file, _)| PathBuf::from(file)).collect())
}

fn write(path: &Path, text: &str) -> Result<(), NewError> {
    let failed = |source| NewError::Write { path: path.to_owned(), source };
    if let Some(parent) = path.parent() {
        fs::create_dir_all(parent).map_err(failed)?;
    }
    fs::write(path, text).map_err(failed)
}

/// The new crate's files, relative to its directory, and their text.
fn files(name: &str, library: &Library) -> Vec<(&'static str, String)> {
    vec![
        ("Cargo.toml", manifest(name, library)),
        ("src/main.rs", MAIN.to_owned()),
        ("events/batch.json", EVENT.to_owned()),
        ("template.yaml", template(name)),
        (
            "samconfig.toml",
            SAMCONFIG.replace("stack_name = \"sqs-once\"", &format!("stack_name = {}", toml_string(name))),
        ),
        ("env.json", sam_local_env()),
        ("Cargo.lock", TESTED_LOCK.to_owned()),
        ("rustfmt.toml", RUSTFMT.to_owned()),
        // What the builds, `sam build`, `invoke` and scripts/local-services write.
        (".gitignore", "/target\n/.aws-sam\n/.sqs-once\n/.tools\n".to_owned()),
        ("README.md", readme(name)),
    ]
}

fn manifest(name: &str, library: &Library) -> String {
    format!(
        r#"[package]
name = {name}
version = "0.1.0"
edition = "2024"
publish = false

[dependencies]
# `opentelemetry`: spans sent to a collector whenever OTEL_EXPORTER_OTLP_ENDPOINT is set.
{library}
mimalloc = {{ version = "0.1", default-features = false, features = ["no_thp"] }}
serde = {{ version = "1", features = ["derive"] }}
serde_json = "1"
tokio = {{ version = "1", features = ["macros", "rt"] }}

[dev-dependencies]
# `sqs_once::testing`: the handler through the real engine in tests.
{testing}

# A workspace of its own: written inside another crate's workspace (a checkout
# of sqs-once, say), the crate still builds on its own. To make it a member of
# a workspace of yours instead, delete this table and list it there.
[workspace]

[profile.release]
lto = true
codegen-units = 1
strip = true
# A handler's panic must fail its record, not the process: sqs-once catches
# it by unwinding. cargo-lambda (and so `sam build`) passes `-C panic=abort`
# unless the profile says otherwise, which would end the whole batch at the
# first panic; sqs-once refuses to compile without unwinding.
panic = "unwind"
"#,
        name = toml_string(name),
        library = library.dependency(&["opentelemetry"]),
        testing = library.dependency(&["testing"]),
    )
}

/// The repository's template, without the bundled handlers' lines (the key
/// among them: the crate sets its own in code), building the binary `name`.
fn template(name: &str) -> String {
    let mut bundled = false;
    let mut lines = Vec::new();
    for line in TEMPLATE.lines() {
        match line.trim() {
            "# bundled handlers: begin" => bundled = true,
            "# bundled handlers: end" => bundled = false,
            _ if bundled => {}
            "Binary: sqs-once" => lines.push(line.replace("sqs-once", name)),
            _ => lines.push(line.to_owned()),
        }
    }
    lines.push(String::new());
    lines.join("\n")
}

/// The repository's `env.json` less the bundled handlers' settings.
fn sam_local_env() -> String {
    let mut env: serde_json::Value = serde_json::from_str(SAM_LOCAL_ENV).expect("env.json is JSON (tested)");
    if let Some(function) = env["ConsumerFunction"].as_object_mut() {
        function.retain(|name, _| !name.starts_with("SQS_ONCE_LEDGER_"));
    }
    serde_json::to_string_pretty(&env).expect("JSON values serialize") + "\n"
}

fn readme(name: &str) -> String {
    format!(
        "# {name}\n\n\
         An SQS consumer on AWS Lambda that processes every message effectively once, built with\n\
         sqs-once. The handler and its key are in `src/main.rs`.\n\n\
         ```sh\n\
         cargo test                                   # the handler through sqs-once's engine\n\
         cargo run -- invoke events/batch.json        # a batch offline, claims in .sqs-once/claims.db\n\
         sam build && sam deploy --guided             # queue, dead-letter queue, claim table, alarms\n\
         cargo doc --features sqs-once/testing        # sqs-once's API reference: target/doc/sqs_once/index.html\n\
         ```\n"
    )
}

/// The crate name `path` gives, checked against the rules Cargo and
/// crates.io apply.
fn crate_name(path: &Path) -> Result<String, NewError> {
    let name = path.file_name().map(|name| name.to_string_lossy().into_owned()).unwrap_or_default();
    let invalid = |reason| Err(NewError::InvalidName { name: name.clone(), reason });
    if name.is_empty() {
        return invalid("the path has no last component to name the crate after");
    }
    if !name.starts_with(|c: char| c.is_ascii_alphabetic()) {
        return invalid("a crate name starts with an ASCII letter");
    }
    if !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') {
        return invalid("a crate name has only ASCII letters, digits, `-` and `_`");
    }
    if name.len() > 64 {
        return invalid("crates.io takes names of at most 64 characters");
    }
    let normalized = name.replace('-', "_").to_ascii_lowercase();
    if KEYWORDS.contains(&normalized.as_str()) {
        return invalid("a Rust keyword cannot name a crate");
    }
    if RESERVED.contains(&normalized.as_str()) {
        return invalid("the name is taken by Rust's own crates, by Cargo's build directories, or by sqs-once itself");
    }
    Ok(name)
}

/// Rust's keywords, strict and reserved, which Cargo refuses as package names.
const KEYWORDS: &[&str] = &[
    "abstract", "as", "async", "await", "become", "box", "break", "const", "continue", "crate", "do", "dyn", "else",
    "enum", "extern", "false", "final", "fn", "for", "gen", "if", "impl", "in", "let", "loop", "macro", "match", "mod",
    "move", "mut", "override", "priv", "pub", "ref", "return", "self", "static", "struct", "super", "trait", "true",
    "try", "type", "typeof", "unsafe", "unsized", "use", "virtual", "where", "while", "yield",
];

/// Whether `manifest` is the sqs-once library's: its `[package]` is named
/// `sqs-once` (a workspace member's, or a binary of that name, is not).
fn names_the_library(manifest: &str) -> bool {
    let mut in_package = false;
    manifest.lines().map(str::trim).any(|line| {
        if line.starts_with('[') {
            in_package = line == "[package]";
        }
        in_package
            && line.split_once('=').is_some_and(|(key, value)| key.trim() == "name" && value.trim() == "\"sqs-once\"")
    })
}

/// Names a binary crate cannot take: the standard library's crates, Cargo's
/// directories in `target/`, and the library the crate depends on.
const RESERVED: &[&str] =
    &["std", "core", "alloc", "proc_macro", "test", "build", "deps", "examples", "incremental", "sqs_once"];

/// `text` as a TOML basic string.
fn toml_string(text: &str) -> String {
    // A JSON string is a TOML basic string for every character JSON escapes.
    serde_json::Value::from(text).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rejected(name: &str) -> &'static str {
        match crate_name(Path::new(name)) {
            Err(NewError::InvalidName { reason, .. }) => reason,
            other => panic!("{name}: {other:?}"),
        }
    }

    #[test]
    fn names_follow_cargos_rules() {
        assert_eq!(crate_name(Path::new("some/dir/payments-consumer")).unwrap(), "payments-consumer");
        assert_eq!(crate_name(Path::new("orders_2")).unwrap(), "orders_2");
        assert!(rejected("2fast").contains("starts with an ASCII letter"));
        assert!(rejected("_private").contains("starts with an ASCII letter"));
        assert!(rejected("my consumer").contains("only ASCII letters"));
        assert!(rejected("café").contains("only ASCII letters"));
        assert!(rejected(&"a".repeat(65)).contains("64"));
        assert!(rejected("async").contains("keyword"));
        assert!(rejected("Self").contains("keyword"));
        assert!(rejected("sqs-once").contains("sqs-once itself"));
        assert!(rejected("proc-macro").contains("Rust's own"));
        assert!(rejected("..").contains("no last component"));
    }

    #[test]
    fn the_template_leaves_out_the_bundled_handlers_and_builds_the_new_binary() {
        let template = template("payments");
        assert!(!template.contains("bundled handlers"));
        for bundled in ["HandlerName", "SQS_ONCE_HANDLER", "Ledger", "ledger"] {
            assert!(!template.contains(bundled), "{bundled} is left in");
        }
        assert!(template.contains("        Binary: payments\n"));
        assert!(!template.contains("Binary: sqs-once"));
    }

    #[test]
    fn a_binary_depends_on_its_checkout_while_it_is_there_and_on_its_version_when_packaged() {
        let checkout = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        assert_eq!(Library::this_build().unwrap(), Library::Path(checkout.to_owned()));
        let packaged = tempfile::tempdir().unwrap();
        std::fs::write(packaged.path().join("Cargo.toml"), "").unwrap();
        std::fs::write(packaged.path().join("Cargo.toml.orig"), "").unwrap();
        assert_eq!(Library::built_in(packaged.path()).unwrap(), Library::Registry(LIBRARY_VERSION.to_owned()));
        let gone = packaged.path().join("gone");
        let error = Library::built_in(&gone).unwrap_err().to_string();
        assert!(error.contains("which are gone: pass --library-path"), "{error}");
        // Installed from crates.io, its sources since cleaned away: still its version.
        let registry = Path::new("/home/u/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/sqs-once-0.1.0");
        assert_eq!(Library::built_in(registry).unwrap(), Library::Registry(LIBRARY_VERSION.to_owned()));
    }

    #[test]
    fn a_library_path_must_hold_the_sqs_once_package() {
        let checkout = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        assert_eq!(Library::local(checkout).unwrap(), Library::Path(checkout.canonicalize().unwrap()));
        let error = Library::local(&checkout.join("handlers")).unwrap_err().to_string();
        assert!(
            error.contains("handlers holds no library to depend on (its Cargo.toml: its package is not sqs-once)"),
            "{error}"
        );
        assert!(names_the_library("[workspace]\nmembers = []\n\n[package]\nname = \"sqs-once\"\n"));
        assert!(!names_the_library("[package]\nname = \"app\"\n[[bin]]\nname = \"sqs-once\"\n"));
    }

    #[test]
    fn a_new_crate_sets_its_key_in_code_alone() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("payments");
        create(&path, &Library::Registry(LIBRARY_VERSION.to_owned())).unwrap();
        let read = |file: &str| std::fs::read_to_string(path.join(file)).unwrap();
        let main = read("src/main.rs");
        assert!(main.contains("const KEY: &str = \"body.order_id\";"), "{main}");
        assert!(main.contains("Consumer::builder().key(KEY)") && main.contains("TestConsumer::new(Payments).key(KEY)"));
        // Nothing else sets a key: not cargo's environment, not the template.
        assert!(!path.join(".cargo").exists());
        for setting in ["IdempotencyKey", "SQS_ONCE_KEY"] {
            assert!(!read("template.yaml").contains(setting), "{setting}");
        }
        assert_eq!(read("template.yaml"), template("payments"));
    }

    #[test]
    fn the_manifest_depends_on_the_library_given_and_unwinds() {
        let registry = manifest("payments", &Library::Registry(LIBRARY_VERSION.to_owned()));
        let exporting = format!("sqs-once = {{ version = \"{LIBRARY_VERSION}\", features = [\"opentelemetry\"] }}");
        assert!(registry.contains(&exporting), "{registry}");
        assert!(
            registry.contains(&format!("sqs-once = {{ version = \"{LIBRARY_VERSION}\", features = [\"testing\"] }}"))
        );
        assert!(registry.contains("panic = \"unwind\""));
        let local = manifest("payments", &Library::Path(PathBuf::from("/src/sqs \"once\"")));
        let dependency = format!(
            r#"sqs-once = {{ path = "/src/sqs \"once\"", version = "{LIBRARY_VERSION}", features = ["opentelemetry"] }}"#
        );
        assert!(local.contains(&dependency), "{local}");
    }
}
