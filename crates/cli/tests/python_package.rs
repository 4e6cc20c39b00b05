//! The `elastrec` Python package: the walk-through of `docs/python.md` runs as written,
//! against this build's native module.

mod common;

use std::path::{Path, PathBuf};
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

/// The package as `pip install ./python` lays it out: `python/elastrec` with the native
/// module beside it. The module is the one cargo built for this test run
/// (`libelastrec_native.so` next to the `elastrec` binary; `scripts/test.sh` builds it
/// with the tests), not a wheel maturin built earlier from other sources.
fn stage_package(into: &Path) -> Option<PathBuf> {
    let native = Path::new(exe()).with_file_name("libelastrec_native.so");
    if !native.exists() {
        elastrec_common::skip::skip_test(
            "PYTHON_PACKAGE",
            &format!(
                "{} is missing (cargo build -p elastrec-python, or scripts/test.sh, builds it)",
                native.display()
            ),
        );
        return None;
    }
    let site = into.join("site");
    let package = site.join("elastrec");
    std::fs::create_dir_all(&package).unwrap();
    let source = concat!(env!("CARGO_MANIFEST_DIR"), "/../../python/elastrec");
    for entry in std::fs::read_dir(source).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), package.join(entry.file_name())).unwrap();
    }
    // Python imports `elastrec._native` from any `_native*.so` that exports `PyInit__native`.
    std::fs::copy(&native, package.join("_native.so")).unwrap();
    Some(site)
}

#[test]
fn the_python_walkthrough_in_the_docs_runs() {
    if !elastrec_common::skip::python_imports("PYTHON_PACKAGE", "numpy") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let Some(site) = stage_package(tmp.path()) else {
        return;
    };
    let script = walkthrough();
    assert!(script.contains("elastrec.Model("), "{script}");
    std::fs::write(tmp.path().join("walkthrough.py"), &script).unwrap();
    let out = Command::new("python3")
        .arg("walkthrough.py")
        .current_dir(tmp.path())
        .env("PYTHONPATH", &site)
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
