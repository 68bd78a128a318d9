//! No import circle between the top-level modules of `nephele-cloud` (see
//! ARCHITECTURE.md): each `src/X.rs` or `src/X/` tree is a node, and every `crate::Y`
//! mention in it (code or doc comment, outside files whose name contains `tests`) is an
//! edge X → Y; so is `super::Y` written in a top-level file `src/X.rs`. A strongly
//! connected component of more than one module is a circle: the modules in it cannot be
//! understood, tested or moved apart. Break one by moving what is shared to where it
//! belongs (a leaf module, the lower of the two), not by hiding the path.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

const SRC: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../cloud/nephele-cloud/src");

/// Where each edge was seen: `file:line`.
type Edges = BTreeMap<String, BTreeMap<String, Vec<String>>>;

/// Every `.rs` file under `dir`, as a path relative to `root` with `/` separators.
fn rust_files(root: &Path, dir: &Path, found: &mut Vec<String>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("read {dir:?}: {e}"));
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(root, &path, found);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let relative = path.strip_prefix(root).unwrap_or(&path);
            let parts: Vec<String> = relative
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            found.push(parts.join("/"));
        }
    }
}

/// The module names following each `prefix` in `text` (`[a-z_]+`, as the rule reads
/// them), with their line numbers.
fn mentions(text: &str, prefix: &str) -> Vec<(String, usize)> {
    let mut found = Vec::new();
    for (at, _) in text.match_indices(prefix) {
        let rest = &text[at + prefix.len()..];
        let name: String = rest
            .chars()
            .take_while(|c| c.is_ascii_lowercase() || *c == '_')
            .collect();
        if !name.is_empty() {
            let line = text[..at].matches('\n').count() + 1;
            found.push((name, line));
        }
    }
    found
}

fn module_graph() -> Edges {
    let root = Path::new(SRC);
    let mut files = Vec::new();
    rust_files(root, root, &mut files);
    files.sort();
    assert!(files.iter().any(|f| f == "lib.rs"), "no lib.rs under {SRC}");
    let mut edges = Edges::new();
    for file in files {
        let name = file.rsplit('/').next().unwrap_or(&file);
        if name.contains("tests") {
            continue;
        }
        let first = file.split('/').next().unwrap_or(&file);
        let top = first.strip_suffix(".rs").unwrap_or(first).to_string();
        if top == "lib" || top == "main" {
            continue;
        }
        let text = std::fs::read_to_string(root.join(&file))
            .unwrap_or_else(|e| panic!("read {file}: {e}"));
        let mut found = mentions(&text, "crate::");
        if !file.contains('/') {
            found.extend(mentions(&text, "super::"));
        }
        let out = edges.entry(top.clone()).or_default();
        for (target, line) in found {
            if target != top {
                out.entry(target)
                    .or_default()
                    .push(format!("{file}:{line}"));
            }
        }
    }
    edges
}

/// Tarjan's strongly connected components of `edges`.
fn components(edges: &Edges) -> Vec<Vec<String>> {
    struct State<'a> {
        edges: &'a Edges,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        next: usize,
        found: Vec<Vec<String>>,
    }
    fn visit<'a>(state: &mut State<'a>, v: &'a str) {
        state.index.insert(v, state.next);
        state.low.insert(v, state.next);
        state.next += 1;
        state.stack.push(v);
        state.on_stack.insert(v);
        let targets: Vec<&'a str> = state
            .edges
            .get(v)
            .map(|out| out.keys().map(String::as_str).collect())
            .unwrap_or_default();
        for w in targets {
            if !state.index.contains_key(w) {
                visit(state, w);
                let low = state.low[v].min(state.low[w]);
                state.low.insert(v, low);
            } else if state.on_stack.contains(w) {
                let low = state.low[v].min(state.index[w]);
                state.low.insert(v, low);
            }
        }
        if state.low[v] == state.index[v] {
            let mut component = Vec::new();
            while let Some(w) = state.stack.pop() {
                state.on_stack.remove(w);
                component.push(w.to_string());
                if w == v {
                    break;
                }
            }
            component.sort();
            state.found.push(component);
        }
    }
    let mut nodes: BTreeSet<&str> = edges.keys().map(String::as_str).collect();
    for out in edges.values() {
        nodes.extend(out.keys().map(String::as_str));
    }
    let mut state = State {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        next: 0,
        found: Vec::new(),
    };
    for v in nodes {
        if !state.index.contains_key(v) {
            visit(&mut state, v);
        }
    }
    state.found
}

#[test]
fn cloud_modules_have_no_import_circle() {
    let edges = module_graph();
    assert!(
        edges.contains_key("federation") && edges.contains_key("scheduler"),
        "the module graph of {SRC} looks empty: {:?}",
        edges.keys().collect::<Vec<_>>()
    );
    let circles: Vec<Vec<String>> = components(&edges)
        .into_iter()
        .filter(|c| c.len() > 1)
        .collect();
    let mut report = String::new();
    for circle in &circles {
        report.push_str(&format!("circle: {}\n", circle.join(", ")));
        for from in circle {
            for (to, seen) in &edges[from] {
                if circle.contains(to) {
                    report.push_str(&format!("  {from} -> {to} at {}\n", seen.join(", ")));
                }
            }
        }
    }
    assert!(
        circles.is_empty(),
        "import circles between the top-level modules of nephele-cloud:\n{report}"
    );
}

#[test]
fn the_rule_finds_a_circle() {
    let mut edges = Edges::new();
    edges
        .entry("a".into())
        .or_default()
        .insert("b".into(), vec!["a.rs:1".into()]);
    edges
        .entry("b".into())
        .or_default()
        .insert("a".into(), vec!["b.rs:1".into()]);
    edges
        .entry("b".into())
        .or_default()
        .insert("c".into(), vec!["b.rs:2".into()]);
    let circles: Vec<Vec<String>> = components(&edges)
        .into_iter()
        .filter(|c| c.len() > 1)
        .collect();
    assert_eq!(circles, vec![vec!["a".to_string(), "b".to_string()]]);
    assert_eq!(
        mentions("use crate::store::Store;\n/// [`crate::x`]", "crate::"),
        vec![("store".to_string(), 1), ("x".to_string(), 2)]
    );
}
