//! Tests that cannot run on this machine (no server, no control groups) say so in one
//! place: the line goes to stderr and, where the test command set `ELASTREC_SKIP_LOG`, to
//! that file, which `scripts/test.sh` counts and prints at the end of the run. A variable
//! `ELASTREC_REQUIRE_<WHAT>` turns the skip into a failure (CI sets them).

use std::io::Write;

/// Records that the running test skipped itself because of `why`, unless
/// `ELASTREC_REQUIRE_<require>` is set, in which case it panics with `why`.
pub fn skip_test(require: &str, why: &str) {
    let var = format!("ELASTREC_REQUIRE_{require}");
    assert!(
        std::env::var_os(&var).is_none(),
        "{var} is set, but this test cannot run: {why}"
    );
    let test = std::thread::current()
        .name()
        .unwrap_or("a test")
        .to_string();
    eprintln!("skipped {test}: {why}");
    if let Some(path) = std::env::var_os("ELASTREC_SKIP_LOG") {
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        {
            let _ = writeln!(f, "{test}: {why}");
        }
    }
}

/// Whether `python3` imports every module of `modules` (`"onnxruntime, numpy"`);
/// otherwise the running test is skipped ([`skip_test`] with `require`), saying which
/// modules are missing and that `scripts/test.sh` installs them.
pub fn python_imports(require: &str, modules: &str) -> bool {
    let ok = std::process::Command::new("python3")
        .args(["-c", &format!("import {modules}")])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        skip_test(
            require,
            &format!("python3 cannot import {modules} (scripts/test.sh installs them)"),
        );
    }
    ok
}
