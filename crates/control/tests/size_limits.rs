//! The size limits of issue 50: no non-test function over 150 lines, no file over 1,000
//! non-test lines, anywhere under `crates/*/src`. Nothing is over them now, so the lists
//! of exceptions below are empty; one may only be added with the size it has, and then
//! never grow (a list that only ever gets shorter).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

const MAX_FN_LINES: usize = 150;
const MAX_FILE_LINES: usize = 1000;

/// `(file, function) -> lines` of the functions still over [`MAX_FN_LINES`].
const LONG_FUNCTIONS: [(&str, &str, usize); 0] = [];

/// `file -> non-test lines` of the files still over [`MAX_FILE_LINES`].
const LONG_FILES: [(&str, usize); 0] = [];

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Every `.rs` file under `crates/*/src`, relative to the workspace, except test-only
/// modules (`tests.rs`, `tests/`).
fn sources() -> Vec<String> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                if p.file_name().is_some_and(|n| n != "tests") {
                    walk(&p, out);
                }
            } else if p.extension().is_some_and(|x| x == "rs")
                && p.file_name().is_some_and(|n| n != "tests.rs")
            {
                out.push(p);
            }
        }
    }
    let root = workspace();
    let mut files = Vec::new();
    for krate in std::fs::read_dir(root.join("crates"))
        .expect("crates/")
        .flatten()
    {
        walk(&krate.path().join("src"), &mut files);
    }
    let mut names: Vec<String> = files
        .iter()
        .map(|p| {
            p.strip_prefix(&root)
                .expect("under the workspace")
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    names.sort();
    names
}

/// The lines before the file's `#[cfg(test)]` module.
fn non_test_lines(text: &str) -> Vec<&str> {
    text.lines()
        .take_while(|l| !l.starts_with("#[cfg(test)]"))
        .collect()
}

/// The name of the function a line starts, if it does.
fn starts_fn(line: &str) -> Option<&str> {
    let mut rest = line.trim_start();
    for prefix in [
        "pub(crate) ",
        "pub(super) ",
        "pub ",
        "async ",
        "const ",
        "unsafe ",
    ] {
        rest = rest.strip_prefix(prefix).unwrap_or(rest);
    }
    let rest = rest.strip_prefix("fn ")?;
    let end = rest
        .find(|c: char| !(c.is_alphanumeric() || c == '_'))
        .unwrap_or(rest.len());
    (end > 0).then(|| &rest[..end])
}

/// Braces opened minus closed on a line, outside strings, characters and comments.
fn brace_balance(line: &str) -> i64 {
    let b = line.as_bytes();
    let (mut i, mut depth) = (0, 0);
    while i < b.len() {
        match b[i] {
            b'/' if b.get(i + 1) == Some(&b'/') => break,
            b'"' => {
                i += 1;
                while i < b.len() && b[i] != b'"' {
                    i += if b[i] == b'\\' { 2 } else { 1 };
                }
            }
            // A character literal ('{', '\n'); a lifetime ('a) has no closing quote there.
            b'\'' if b.get(i + 2) == Some(&b'\'') => i += 2,
            b'\'' if b.get(i + 1) == Some(&b'\\') => {
                while i + 1 < b.len() && b[i + 1] != b'\'' {
                    i += 1;
                }
                i += 1;
            }
            b'{' => depth += 1,
            b'}' => depth -= 1,
            _ => {}
        }
        i += 1;
    }
    depth
}

/// `(function, lines)` of every function in `lines` (nested ones too).
fn functions(lines: &[&str]) -> Vec<(String, usize)> {
    let mut out = Vec::new();
    for (start, line) in lines.iter().enumerate() {
        let Some(name) = starts_fn(line) else {
            continue;
        };
        let (mut depth, mut opened) = (0, false);
        for (j, l) in lines[start..].iter().enumerate() {
            let d = brace_balance(l);
            opened |= d > 0 || l.contains('{');
            depth += d;
            if !opened && l.trim_end().ends_with(';') {
                break; // a declaration without a body (a trait's)
            }
            if opened && depth <= 0 {
                out.push((name.to_string(), j + 1));
                break;
            }
        }
    }
    out
}

#[test]
fn no_function_or_file_outgrows_the_size_limits() {
    let root = workspace();
    let allowed_fn: BTreeMap<(&str, &str), usize> = LONG_FUNCTIONS
        .iter()
        .map(|&(f, n, l)| ((f, n), l))
        .collect();
    let allowed_file: BTreeMap<&str, usize> = LONG_FILES.into_iter().collect();
    let mut wrong = Vec::new();
    let mut seen_fn = Vec::new();
    let mut seen_file = Vec::new();
    for file in sources() {
        let text = std::fs::read_to_string(root.join(&file)).expect("readable");
        let lines = non_test_lines(&text);
        let limit = allowed_file.get(file.as_str()).copied();
        if lines.len() > MAX_FILE_LINES {
            seen_file.push(file.clone());
            match limit {
                Some(l) if lines.len() <= l => {}
                Some(l) => wrong.push(format!("{file}: {} lines, grown past {l}", lines.len())),
                None => wrong.push(format!(
                    "{file}: {} non-test lines, over {MAX_FILE_LINES}",
                    lines.len()
                )),
            }
        }
        for (name, n) in functions(&lines) {
            if n <= MAX_FN_LINES {
                continue;
            }
            seen_fn.push((file.clone(), name.clone()));
            match allowed_fn.get(&(file.as_str(), name.as_str())) {
                Some(&l) if n <= l => {}
                Some(&l) => wrong.push(format!("{file}: fn {name}: {n} lines, grown past {l}")),
                None => wrong.push(format!("{file}: fn {name}: {n} lines, over {MAX_FN_LINES}")),
            }
        }
    }
    for (f, n, _) in LONG_FUNCTIONS {
        if !seen_fn.iter().any(|(sf, sn)| sf == f && sn == n) {
            wrong.push(format!(
                "{f}: fn {n} is within the limit now: take it off LONG_FUNCTIONS"
            ));
        }
    }
    for (f, _) in LONG_FILES {
        if !seen_file.iter().any(|s| s == f) {
            wrong.push(format!(
                "{f} is within the limit now: take it off LONG_FILES"
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn the_scanner_measures_functions_as_written() {
    let src = "\
pub(crate) async fn outer(x: u32) -> u32 {
    let s = \"}}\"; // a brace in a string: }
    let c = '{';
    fn inner<'a>(v: &'a str) -> &'a str {
        v
    }
    x
}
fn declared(&self);
";
    let lines: Vec<&str> = src.lines().collect();
    assert_eq!(
        functions(&lines),
        vec![("outer".to_string(), 8), ("inner".to_string(), 3)]
    );
}
