//! The `elastrec` Python package (`pip install ./python`, which the test command runs):
//! the walk-through of `docs/python.md` runs as written.

mod common;

use std::process::Command;

use common::{data_home, exe};

/// The ```python blocks of `docs/python.md`, in order, as one script.
fn walkthrough() -> String {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/python.md"))
        .unwrap();
    let mut script = String::new();
    let mut inside = false;
    for line in doc.lines() {
        match (inside, line.trim_end()) {
            (false, "```python") => inside = true,
            (true, "```") => {
                inside = false;
                script.push('\n');
            }
            (true, l) => {
                script.push_str(l);
                script.push('\n');
            }
            _ => {}
        }
    }
    script
}

#[test]
fn the_python_walkthrough_in_the_docs_runs() {
    if !elastrec_common::skip::python_imports("PYTHON_PACKAGE", "elastrec, numpy") {
        return;
    }
    let script = walkthrough();
    assert!(script.contains("elastrec.Model("), "{script}");
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("walkthrough.py"), &script).unwrap();
    let out = Command::new("python3")
        .arg("walkthrough.py")
        .current_dir(tmp.path())
        .env("ELASTREC_BIN", exe())
        .env("XDG_DATA_HOME", data_home())
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    eprintln!("{stdout}");
    assert!(out.status.success(), "the walk-through failed:\n{stderr}");
    // What a reader of the page sees happen.
    for want in [
        "table item_id:",
        "probabilities:",
        "refused:",
        "rows read: 20000",
        "held at",
        "AUC",
    ] {
        assert!(stdout.contains(want), "{want:?} not in:\n{stdout}");
    }
}
