//! ARCHITECTURE.md against the crates' real dependencies (`cargo metadata`): its diagram
//! draws only real dependencies and implies every one, its crate table lists each crate's
//! direct dependencies exactly, and the layering rules hold (the policies are pure, the
//! simulator drives them without the master).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Crates `elastrec-control` must never reach: a policy that could block on a runtime, a
/// socket or a database is no longer one the simulator can drive.
const NOT_IN_A_POLICY: [&str; 5] = ["tokio", "tonic", "sqlx", "kube", "reqwest"];

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn cargo() -> Command {
    let mut c = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    c.current_dir(workspace());
    c
}

/// Each workspace crate (without the `elastrec-` prefix) -> its direct dependencies on
/// other workspace crates (normal ones, optional included).
fn real_dependencies() -> BTreeMap<String, BTreeSet<String>> {
    let out = cargo()
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .output()
        .expect("cargo metadata runs");
    assert!(
        out.status.success(),
        "cargo metadata: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).expect("metadata is JSON");
    let packages = meta["packages"].as_array().expect("packages");
    let short = |n: &str| n.trim_start_matches("elastrec-").to_string();
    let members: BTreeSet<String> = packages
        .iter()
        .map(|p| p["name"].as_str().unwrap().to_string())
        .collect();
    packages
        .iter()
        .map(|p| {
            let deps = p["dependencies"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|d| d["kind"].is_null())
                .filter_map(|d| d["name"].as_str())
                .filter(|n| members.contains(*n))
                .map(short)
                .collect();
            (short(p["name"].as_str().unwrap()), deps)
        })
        .collect()
}

fn architecture_md() -> String {
    std::fs::read_to_string(workspace().join("ARCHITECTURE.md")).expect("ARCHITECTURE.md")
}

/// The edges of the ```mermaid block: `a --> b` (or `a -.-> b`, a dependency behind a
/// feature).
fn drawn_edges(md: &str) -> BTreeSet<(String, String)> {
    let block = md
        .split("```mermaid")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .expect("ARCHITECTURE.md has a ```mermaid diagram");
    block
        .lines()
        .filter_map(|l| {
            let l = l.trim();
            let (from, to) = l.split_once("-->").or_else(|| l.split_once("-.->"))?;
            Some((from.trim().to_string(), to.trim().to_string()))
        })
        .collect()
}

/// The crate table's rows: `| \`crate\` | owns | depends on |`.
fn tabled_dependencies(md: &str) -> BTreeMap<String, BTreeSet<String>> {
    md.lines()
        .filter(|l| l.starts_with("| `"))
        .map(|l| {
            let cells: Vec<&str> = l.trim_matches('|').split(" | ").collect();
            let name = cells[0].trim().trim_matches('`').to_string();
            let deps = cells
                .last()
                .unwrap()
                .split(',')
                .map(|d| d.split_whitespace().next().unwrap_or("").trim_matches('`'))
                .filter(|d| !d.is_empty() && *d != "—")
                .map(str::to_string)
                .collect();
            (name, deps)
        })
        .collect()
}

fn reachable(edges: &BTreeSet<(String, String)>, from: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    let mut todo = vec![from.to_string()];
    while let Some(n) = todo.pop() {
        for (a, b) in edges {
            if *a == n && seen.insert(b.clone()) {
                todo.push(b.clone());
            }
        }
    }
    seen
}

#[test]
fn the_diagram_draws_the_real_dependencies() {
    let real = real_dependencies();
    let drawn = drawn_edges(&architecture_md());
    let not_real: Vec<String> = drawn
        .iter()
        .filter(|(a, b)| !real.get(a).is_some_and(|d| d.contains(b)))
        .map(|(a, b)| format!("{a} --> {b}"))
        .collect();
    assert!(
        not_real.is_empty(),
        "ARCHITECTURE.md draws dependencies no Cargo.toml has; remove: {not_real:?}"
    );
    let mut missing = Vec::new();
    for (from, deps) in &real {
        let implied = reachable(&drawn, from);
        for to in deps {
            if !implied.contains(to) {
                missing.push(format!("{from} --> {to}"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "ARCHITECTURE.md's diagram implies no path for these dependencies; draw them: {missing:?}"
    );
}

#[test]
fn the_crate_table_lists_each_crates_direct_dependencies() {
    let real = real_dependencies();
    let table = tabled_dependencies(&architecture_md());
    let names: BTreeSet<&String> = real.keys().collect();
    let rows: BTreeSet<&String> = table.keys().collect();
    assert_eq!(
        rows, names,
        "ARCHITECTURE.md's crate table has a row per crate"
    );
    for (name, deps) in &real {
        assert_eq!(
            &table[name], deps,
            "ARCHITECTURE.md: the `depends on` cell of `{name}`"
        );
    }
}

#[test]
fn the_policies_are_pure_and_the_simulator_drives_them_without_the_master() {
    let real = real_dependencies();
    assert!(
        !real["sim"].contains("master"),
        "the simulator reaches the policies through `control`, not the master"
    );
    assert!(real["sim"].contains("control"));
    assert!(real["master"].contains("control"));
    let out = cargo()
        .args([
            "tree",
            "--offline",
            "-p",
            "elastrec-control",
            "-e",
            "normal",
            "--prefix",
            "none",
            "--format",
            "{p}",
        ])
        .output()
        .expect("cargo tree runs");
    assert!(
        out.status.success(),
        "cargo tree: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let tree = String::from_utf8_lossy(&out.stdout);
    let reached: BTreeSet<&str> = tree
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert!(reached.contains("elastrec-brain"), "{tree}");
    for c in NOT_IN_A_POLICY {
        assert!(
            !reached.contains(c),
            "elastrec-control depends on {c}:\n{tree}"
        );
    }
}
