//! A fresh clone is enough: the repository is cloned into an empty temporary directory (nothing beside it,
//! no `../shared`), and every file a test or the build reads — each `CARGO_MANIFEST_DIR`-relative path and
//! each `include_str!`/`include_bytes!` of the tracked sources — must resolve inside that clone and exist
//! there. Files the suite and `herald serve` generate must be ignored by git.

use std::path::{Component, Path, PathBuf};
use std::process::Command;

/// The repository this test was built from.
fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("repository root")
}

fn git(dir: &Path, args: &[&str]) -> String {
    let output = Command::new("git")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("git (the fresh-clone check needs it)");
    assert!(
        output.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// `path` without `.` and `..` components (lexically: the files need not exist).
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

/// The string literal that starts at or after `from` on this line, if any.
fn next_literal(line: &str, from: usize) -> Option<&str> {
    let rest = &line[from..];
    let start = rest.find('"')? + 1;
    let end = rest[start..].find('"')?;
    Some(&rest[start..start + end])
}

/// (file, the path it reads) for every read the sources spell out: relative to the crate directory after
/// `env!("CARGO_MANIFEST_DIR")`, relative to the source file for `include_str!`/`include_bytes!`.
fn reads(clone: &Path, file: &str, text: &str) -> Vec<(String, PathBuf)> {
    let source = clone.join(file);
    let crate_dir = file
        .strip_prefix("crates/")
        .and_then(|rest| rest.split('/').next())
        .map(|name| clone.join("crates").join(name));
    let mut found = Vec::new();
    for line in text.lines() {
        const MANIFEST: &str = "env!(\"CARGO_MANIFEST_DIR\")";
        if let (Some(at), Some(dir)) = (line.find(MANIFEST), &crate_dir)
            && let Some(literal) = next_literal(line, at + MANIFEST.len())
        {
            found.push((file.to_owned(), normalize(&dir.join(literal.trim_start_matches('/')))));
        }
        for macro_name in ["include_str!(", "include_bytes!("] {
            // A macro's name quoted in a string (as in this file) is no read.
            for (at, _) in line
                .match_indices(macro_name)
                .filter(|(at, _)| !line[..*at].ends_with('"'))
            {
                if let Some(literal) = next_literal(line, at + macro_name.len()) {
                    let base = source.parent().expect("a file has a directory");
                    found.push((file.to_owned(), normalize(&base.join(literal))));
                }
            }
        }
    }
    found
}

#[test]
fn a_fresh_clone_has_every_file_the_tests_read_and_nothing_outside() {
    let root = root();
    let scratch = tempfile::tempdir().expect("temp dir");
    let clone = scratch.path().join("herald");
    git(
        scratch.path(),
        &[
            "clone",
            "--quiet",
            "--no-hardlinks",
            &root.display().to_string(),
            "herald",
        ],
    );
    assert_eq!(
        std::fs::read_dir(scratch.path()).expect("scratch").count(),
        1,
        "the clone stands alone: no shared/ beside it"
    );
    let files = git(&clone, &["ls-files"]);
    let mut checked = 0;
    for file in files.lines() {
        let Some(ext) = Path::new(file).extension().and_then(|e| e.to_str()) else {
            continue;
        };
        if !["rs", "mjs", "js", "sh", "py", "toml"].contains(&ext) && !file.starts_with("scripts/") && file != ".ci/run"
        {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(clone.join(file)) else {
            continue;
        };
        // The design notes live outside the repository; nothing in it may reach for them.
        // Spelled in pieces, so this file does not match itself.
        for outside in [concat!("..", "/shared"), concat!("/work", "/shared")] {
            let uses = text
                .lines()
                .filter(|l| l.contains(outside) && !l.trim_start().starts_with("//"))
                .collect::<Vec<_>>();
            assert!(uses.is_empty(), "{file} reads outside the repository: {uses:?}");
        }
        for (from, path) in reads(&clone, file, &text) {
            assert!(
                path.starts_with(&clone),
                "{from} reads {}, outside the repository",
                path.display()
            );
            assert!(
                path.exists(),
                "{from} reads {}, which a fresh clone lacks",
                path.display()
            );
            checked += 1;
        }
    }
    assert!(checked >= 10, "suspiciously few file reads found: {checked}");

    // What the suite and `herald serve` write is never committed by accident.
    let ignored = git(
        &clone,
        &[
            "check-ignore",
            "herald.db",
            "herald.db.key",
            "herald.db-wal",
            "herald-inbox.db",
            "target/browser-screenshots/01-login.png",
            "tests/browser/node_modules/playwright-core/package.json",
        ],
    );
    assert_eq!(ignored.lines().count(), 6, "not ignored: {ignored}");
    let status = git(&root, &["status", "--porcelain", "--ignored=no"]);
    assert!(
        !status.lines().any(|l| l.contains(".db") || l.contains("node_modules")),
        "generated files show up as untracked: {status}"
    );
}
