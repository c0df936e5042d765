//! The layers of the library, checked on its source: the crates it is cut
//! into depend on each other one way (`sqs-once-cli`, the command → `sqs-once`
//! → `sqs-once-engine` → `sqs-once-core`; `sqs-once` → `sqs-once-dynamodb` →
//! `sqs-once-aws`, and the DynamoDB store on the core), the stores and
//! destinations on the vocabulary alone, never the engine; no two modules
//! of a crate import each other (directly or round a circle), no crate
//! hides a public module from its documentation, and none takes another's
//! items through its own root's re-exports.
//!
//! Each crate is one layer: Cargo keeps the crates' direction once their
//! manifests point one way. Test code (`#[cfg(test)]` modules and the files
//! they declare) may reach anywhere and is left out.

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt, fs,
    path::{Path, PathBuf},
};

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Layer {
    Core,
    Aws,
    DynamoDb,
    Engine,
    Consumer,
    Command,
}

/// A crate of the library: its package, its folder, the file its modules
/// are declared from, and its layer.
struct Crate {
    package: &'static str,
    folder: &'static str,
    entry: &'static str,
    layer: Layer,
}

const CRATES: &[Crate] = &[
    Crate { package: "sqs-once-core", folder: "core", entry: "src/lib.rs", layer: Layer::Core },
    Crate { package: "sqs-once-aws", folder: "aws", entry: "src/lib.rs", layer: Layer::Aws },
    Crate { package: "sqs-once-dynamodb", folder: "dynamodb", entry: "src/lib.rs", layer: Layer::DynamoDb },
    Crate { package: "sqs-once-engine", folder: "engine", entry: "src/lib.rs", layer: Layer::Engine },
    Crate { package: "sqs-once", folder: ".", entry: "src/lib.rs", layer: Layer::Consumer },
    Crate { package: "sqs-once-cli", folder: "app", entry: "src/main.rs", layer: Layer::Command },
];

/// A module of the crate: its path (`engine::run`) and file.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Module {
    path: Vec<String>,
    file: PathBuf,
}

impl fmt::Display for Module {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() { f.write_str("crate") } else { f.write_str(&self.path.join("::")) }
    }
}

impl Crate {
    fn root(&self) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join(self.folder)
    }
}

/// The crate's production modules, found by following `mod` declarations
/// from its entry file; `#[cfg(test)]` ones are left out with everything below them.
fn modules(krate: &Crate) -> Vec<(Module, String)> {
    let mut found = Vec::new();
    let mut pending = vec![Module { path: Vec::new(), file: krate.root().join(krate.entry) }];
    while let Some(module) = pending.pop() {
        let text =
            fs::read_to_string(&module.file).unwrap_or_else(|error| panic!("{}: {error}", module.file.display()));
        let code = production_code(&text);
        for child in declared_modules(&code) {
            let mut path = module.path.clone();
            path.push(child.clone());
            let file = child_file(&module, &child);
            pending.push(Module { path, file });
        }
        found.push((module, code));
    }
    found.sort();
    found
}

/// Where a child module's file is: beside `lib.rs` or `mod.rs`, else in the
/// folder named after its parent's file.
fn child_file(parent: &Module, child: &str) -> PathBuf {
    let folder = match parent.file.file_name().and_then(|name| name.to_str()) {
        Some("lib.rs" | "main.rs" | "mod.rs") => parent.file.parent().map(Path::to_path_buf),
        _ => Some(parent.file.with_extension("")),
    }
    .unwrap_or_default();
    let flat = folder.join(format!("{child}.rs"));
    if flat.exists() { flat } else { folder.join(child).join("mod.rs") }
}

/// The source without comments and without `#[cfg(test)]` items.
fn production_code(text: &str) -> String {
    let without_comments: String = text
        .lines()
        .map(|line| match line.find("//") {
            Some(at) if !line[..at].contains('"') => &line[..at],
            _ => line,
        })
        .collect::<Vec<_>>()
        .join("\n");
    let mut out = String::new();
    let mut rest = without_comments.as_str();
    while let Some(at) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..at]);
        rest = skip_item(&rest[at + "#[cfg(test)]".len()..]);
    }
    out.push_str(rest);
    out
}

/// The text after the item that starts `text`: up to its `;` or its balanced
/// `{ … }`, whichever comes first.
fn skip_item(text: &str) -> &str {
    let mut depth = 0usize;
    for (at, c) in text.char_indices() {
        match c {
            ';' if depth == 0 => return &text[at + 1..],
            '{' => depth += 1,
            '}' => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    return &text[at + 1..];
                }
            }
            _ => {}
        }
    }
    ""
}

/// `mod name;` declarations (with any visibility).
fn declared_modules(code: &str) -> Vec<String> {
    code.lines()
        .filter_map(|line| {
            let line = line.trim();
            let after = line.split_once("mod ")?;
            let before = after.0.trim();
            let visibility_only = before.is_empty() || before.starts_with("pub");
            let name = after.1.strip_suffix(';')?.trim();
            (visibility_only && is_ident(name)).then(|| name.to_string())
        })
        .collect()
}

fn is_ident(word: &str) -> bool {
    !word.is_empty() && word.chars().all(|c| c.is_alphanumeric() || c == '_')
}

/// Every path the code names through `crate::` or `super::`, as paths from
/// the crate's root, use-groups expanded.
fn named_paths(module: &Module, code: &str) -> BTreeSet<Vec<String>> {
    let mut paths = BTreeSet::new();
    for (anchor, base) in
        [("crate::", Vec::new()), ("super::", module.path[..module.path.len().saturating_sub(1)].to_vec())]
    {
        let mut rest = code;
        while let Some(at) = rest.find(anchor) {
            let preceded_by_ident =
                rest[..at].chars().next_back().is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':');
            rest = &rest[at + anchor.len()..];
            if preceded_by_ident {
                continue;
            }
            let (tree, _) = use_tree(rest);
            for leaf in tree {
                let mut path = base.clone();
                path.extend(leaf);
                paths.insert(path);
            }
        }
    }
    paths
}

/// The paths of a use tree (`a::b::{c, d::{e, f}}`) at the start of `text`,
/// and the text after it.
fn use_tree(text: &str) -> (Vec<Vec<String>>, &str) {
    let mut prefix = Vec::new();
    let mut rest = text.trim_start();
    loop {
        if let Some(inner) = rest.strip_prefix('{') {
            let mut leaves = Vec::new();
            let mut inside = inner;
            loop {
                inside = inside.trim_start();
                if let Some(after) = inside.strip_prefix('}') {
                    let paths = leaves
                        .into_iter()
                        .map(|leaf: Vec<String>| prefix.iter().cloned().chain(leaf).collect())
                        .collect();
                    return (paths, after);
                }
                if inside.is_empty() {
                    return (vec![prefix], inside);
                }
                let (branch, after) = use_tree(inside);
                leaves.extend(branch);
                inside = after.trim_start().strip_prefix(',').unwrap_or(after);
            }
        }
        let end = rest.find(|c: char| !(c.is_alphanumeric() || c == '_')).unwrap_or(rest.len());
        let (word, after) = rest.split_at(end);
        if !word.is_empty() && word != "self" {
            prefix.push(word.to_string());
        }
        match after.strip_prefix("::") {
            Some(next) => rest = next.trim_start(),
            None => return (vec![prefix], after),
        }
    }
}

/// The module a path lands in: its longest prefix that is a module.
fn owner<'a>(path: &[String], modules: &'a BTreeMap<Vec<String>, Module>) -> Option<&'a Module> {
    (1..=path.len()).rev().find_map(|n| modules.get(&path[..n]))
}

/// Every import between two production modules of a crate: (from, to, the
/// path named). A path into another crate (`sqs_once_core::…`, or a name the
/// crate's root imports from it) lands in no module of this one.
fn imports(krate: &Crate) -> Vec<(Module, Module, String)> {
    let found = modules(krate);
    let by_path: BTreeMap<Vec<String>, Module> =
        found.iter().map(|(module, _)| (module.path.clone(), module.clone())).collect();
    let mut edges = Vec::new();
    for (module, code) in &found {
        let children = declared_modules(code).into_iter().map(|child| {
            let mut path = module.path.clone();
            path.push(child);
            path
        });
        for path in named_paths(module, code).into_iter().chain(children) {
            if let Some(target) = owner(&path, &by_path)
                && target != module
            {
                edges.push((module.clone(), target.clone(), path.join("::")));
            }
        }
    }
    edges
}

/// The crates' own dependencies (not their tests') name only crates of lower
/// layers: a store crate never depends on the consumer, the core on nothing
/// of sqs-once's.
#[test]
fn crates_depend_down_the_layers() {
    let layer = |package: &str| CRATES.iter().find(|krate| krate.package == package).map(|krate| krate.layer);
    let mut upward = Vec::new();
    for krate in CRATES {
        let manifest = fs::read_to_string(krate.root().join("Cargo.toml")).expect("the crate's manifest");
        let own = krate.layer;
        for dependency in dependencies(&manifest) {
            match layer(&dependency) {
                Some(theirs) if theirs >= own => upward.push(format!("{} depends on {dependency}", krate.package)),
                _ => {}
            }
        }
    }
    assert!(upward.is_empty(), "dependencies that do not point down a layer: {upward:?}");
    let core = fs::read_to_string(CRATES[0].root().join("Cargo.toml")).expect("the core's manifest");
    assert!(dependencies(&core).iter().all(|dependency| dependency != "sqs-once-dynamodb"));
}

/// Stores and destinations are written in the vocabulary: the DynamoDB
/// store (a layer below the engine, which the test above holds) and
/// `sqs-once`'s own implementations of the vocabulary's traits (the SQLite
/// store, the AWS destinations, S3's payloads) name nothing of the engine,
/// so that what they build on changes with a store's contract, never with
/// the engine.
#[test]
fn stores_and_destinations_name_nothing_of_the_engine() {
    let front = CRATES.iter().find(|krate| krate.package == "sqs-once").expect("the front crate");
    let implementations = ["sqlite", "destinations", "s3"];
    let mut reaching = Vec::new();
    for (module, code) in modules(front) {
        if module.path.first().is_some_and(|first| implementations.contains(&first.as_str()))
            && production_code(&code).contains("sqs_once_engine")
        {
            reaching.push(module.to_string());
        }
    }
    assert!(reaching.is_empty(), "stores and destinations that name the engine: {reaching:?}");
}

/// A program that brings its own store builds `sqs-once` without its
/// default features: nothing of DynamoDB may be compiled then, and the
/// `dynamodb` feature brings it back. Read from `cargo tree`, which resolves
/// the features as a build would, without building.
#[test]
fn a_program_with_a_store_of_its_own_compiles_no_dynamodb_client() {
    let packages = |features: &[&str]| -> BTreeSet<String> {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let output = std::process::Command::new(cargo)
            .args(["tree", "--locked", "--offline", "-p", "sqs-once", "--no-default-features", "-e", "normal"])
            .args(["--prefix", "none", "--format", "{p}", "--features", &features.join(",")])
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .output()
            .expect("cargo tree runs");
        assert!(output.status.success(), "cargo tree: {}", String::from_utf8_lossy(&output.stderr));
        let text = String::from_utf8_lossy(&output.stdout);
        text.lines().filter_map(|line| line.split_whitespace().next()).map(str::to_owned).collect()
    };
    let dynamodb = ["aws-sdk-dynamodb", "sqs-once-dynamodb"];
    let without = packages(&[]);
    assert!(without.contains("sqs-once-core") && without.contains("aws-sdk-sqs"), "{without:?}");
    assert!(dynamodb.iter().all(|package| !without.contains(*package)), "without `dynamodb`: {without:?}");
    let with = packages(&["dynamodb"]);
    assert!(dynamodb.iter().all(|package| with.contains(*package)), "with `dynamodb`: {with:?}");
}

/// The packages a manifest's `[dependencies]` names.
fn dependencies(manifest: &str) -> Vec<String> {
    let Some((_, section)) = manifest.split_once("\n[dependencies]\n") else { return Vec::new() };
    let section = section.split("\n[").next().unwrap_or_default();
    section
        .lines()
        .filter_map(|line| line.split_once('=').map(|(name, _)| name.trim().to_string()))
        .filter(|name| !name.is_empty() && !name.starts_with('#'))
        .collect()
}

/// What one crate uses of another is in its documentation, in
/// `docs/public-api.txt` and under the semver check: `#[doc(hidden)]` on a
/// public module is for the support of macros alone, under the name
/// `__private`, as in tokio and axum-core.
#[test]
fn no_crate_hides_a_public_module() {
    let mut hidden = Vec::new();
    for krate in CRATES {
        for (module, code) in modules(krate) {
            let lines: Vec<&str> = code.lines().map(str::trim).filter(|line| !line.is_empty()).collect();
            for (at, line) in lines.iter().enumerate() {
                let Some(name) = line.strip_prefix("pub mod ").and_then(|rest| rest.strip_suffix(';')) else {
                    continue;
                };
                let attributes = lines[..at].iter().rev().take_while(|line| line.starts_with("#["));
                if name.trim() != "__private" && attributes.into_iter().any(|line| *line == "#[doc(hidden)]") {
                    hidden.push(format!("{}: {module}::{}", krate.package, name.trim()));
                }
            }
        }
    }
    assert!(hidden.is_empty(), "public modules hidden from the documentation: {hidden:?}");
}

/// The names a crate's root re-exports from the crates below it
/// (`pub use sqs_once_core::{report, Handler}`): paths for its users, which
/// the crate itself does not take for its own.
fn reexported(code: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = code;
    while let Some(at) = rest.find("pub use ") {
        let (tree, after) = use_tree(&rest[at + "pub use ".len()..]);
        rest = after;
        for path in tree {
            if path.len() > 1 && path[0].starts_with("sqs_once") {
                names.extend(path.last().cloned());
            }
        }
    }
    names
}

/// A crate's code names what it takes from another crate by that crate
/// (`sqs_once_engine::report::Failure`), not by the path its own root
/// re-exports it under for its users (`crate::report::Failure`), so that
/// an import says which crate a name comes from.
#[test]
fn a_name_from_another_crate_is_imported_from_it() {
    let mut rerooted = Vec::new();
    for krate in CRATES {
        let found = modules(krate);
        let Some((_, root)) = found.iter().find(|(module, _)| module.path.is_empty()) else { continue };
        let names = reexported(root);
        for (module, code) in &found {
            for path in named_paths(module, code) {
                if path.first().is_some_and(|first| names.contains(first)) {
                    rerooted.push(format!("{}: {module} names crate::{}", krate.package, path.join("::")));
                }
            }
        }
    }
    assert!(rerooted.is_empty(), "names taken through a re-export of the crate's own root: {rerooted:?}");
}

/// Modules import each other in a circle when, at the level where their
/// paths part, each side reaches the other (`engine::run` and
/// `engine::finish`; `report` and `store` through `transaction`).
#[test]
fn no_import_circle() {
    let mut described = Vec::new();
    for krate in CRATES {
        let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        let mut examples: BTreeMap<(String, String), String> = BTreeMap::new();
        for (from, to, named) in imports(krate) {
            let shared = from.path.iter().zip(&to.path).take_while(|(a, b)| a == b).count();
            if shared == from.path.len() || shared == to.path.len() {
                continue; // a parent and its own child
            }
            let a = from.path[..=shared].join("::");
            let b = to.path[..=shared].join("::");
            examples.entry((a.clone(), b.clone())).or_insert(format!("{from} names {named}"));
            graph.entry(a).or_default().insert(b);
        }
        for circle in strongly_connected(&graph) {
            let edges: Vec<&String> = examples
                .iter()
                .filter(|((a, b), _)| circle.contains(a) && circle.contains(b))
                .map(|(_, example)| example)
                .collect();
            described.push(format!("{}: {circle:?}: {edges:?}", krate.package));
        }
    }
    assert!(described.is_empty(), "import circles:\n{}", described.join("\n"));
}

/// Tarjan's strongly connected components of more than one node.
fn strongly_connected(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<BTreeSet<String>> {
    struct Search<'g> {
        graph: &'g BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'g str, usize>,
        low: BTreeMap<&'g str, usize>,
        stack: Vec<&'g str>,
        found: Vec<BTreeSet<String>>,
    }
    impl<'g> Search<'g> {
        fn visit(&mut self, node: &'g str) {
            let at = self.index.len();
            self.index.insert(node, at);
            self.low.insert(node, at);
            self.stack.push(node);
            for next in self.graph.get(node).into_iter().flatten() {
                if !self.index.contains_key(next.as_str()) {
                    self.visit(next);
                    let low = self.low[node].min(self.low[next.as_str()]);
                    self.low.insert(node, low);
                } else if self.stack.contains(&next.as_str()) {
                    let low = self.low[node].min(self.index[next.as_str()]);
                    self.low.insert(node, low);
                }
            }
            if self.low[node] == self.index[node] {
                let mut component = BTreeSet::new();
                while let Some(top) = self.stack.pop() {
                    component.insert(top.to_string());
                    if top == node {
                        break;
                    }
                }
                if component.len() > 1 {
                    self.found.push(component);
                }
            }
        }
    }
    let mut search =
        Search { graph, index: BTreeMap::new(), low: BTreeMap::new(), stack: Vec::new(), found: Vec::new() };
    for node in graph.keys() {
        if !search.index.contains_key(node.as_str()) {
            search.visit(node);
        }
    }
    search.found
}

#[test]
fn use_trees_expand_to_every_path() {
    let (paths, rest) = use_tree("{a::{b, c::d}, e, self}; rest");
    let paths: Vec<String> = paths.iter().map(|path| path.join("::")).collect();
    assert_eq!(paths, ["a::b", "a::c::d", "e", ""]);
    assert_eq!(rest, "; rest");
    let code = production_code("use crate::a;\n#[cfg(test)]\nmod tests { use crate::b; }\n// crate::c\n");
    assert!(code.contains("crate::a") && !code.contains("crate::b") && !code.contains("crate::c"));
}
