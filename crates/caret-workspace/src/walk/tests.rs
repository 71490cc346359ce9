//! The walk: ignore tiers, default excludes, links, unreadable entries, odd names.

use std::os::unix::ffi::OsStrExt;

use caret_test_support::TempDir;
use expect_test::{Expect, expect};

use super::*;

fn config() -> WalkConfig {
    WalkConfig { global_excludes: None, ..WalkConfig::default() }
}

/// Renders a walk as `+ kept` and `- skipped  reason` lines, sorted by path.
fn render(out: &WalkOutput) -> String {
    let mut lines: Vec<(String, String)> =
        out.files.iter().map(|f| (f.path.to_string(), format!("+ {}", f.path))).collect();
    for s in &out.skipped {
        let slash = if s.is_dir { "/" } else { "" };
        lines.push((s.path.to_string(), format!("- {}{slash}  {}", s.path, s.reason)));
    }
    lines.sort();
    lines.into_iter().map(|(_, l)| l + "\n").collect()
}

fn check(dir: &TempDir, config: &WalkConfig, expect: Expect) {
    let out = walk(dir.path(), config).unwrap();
    expect.assert_eq(&render(&out));
}

#[test]
fn nested_gitignores_and_negations() {
    let dir = TempDir::new();
    dir.write(".gitignore", "*.log\nbuild/\n/only-top.txt\n");
    dir.write("a.log", "x");
    dir.write("only-top.txt", "x");
    dir.write("src/main.rs", "fn main() {}\n");
    dir.write("src/only-top.txt", "x");
    dir.write("src/.gitignore", "!keep.log\ngenerated/\n");
    dir.write("src/keep.log", "x");
    dir.write("src/drop.log", "x");
    dir.write("src/generated/out.rs", "x");
    dir.write("build/out.rs", "x");
    check(
        &dir,
        &config(),
        expect![[r#"
            + .gitignore
            - a.log  ignored by .gitignore: *.log
            - build/  ignored by .gitignore: build/
            - only-top.txt  ignored by .gitignore: /only-top.txt
            + src/.gitignore
            - src/drop.log  ignored by .gitignore: *.log
            - src/generated/  ignored by src/.gitignore: generated/
            + src/keep.log
            + src/main.rs
            + src/only-top.txt
        "#]],
    );
}

#[test]
fn cursorignore_and_caretignore_take_precedence() {
    let dir = TempDir::new();
    dir.write(".gitignore", "tmp/\n");
    dir.write(".cursorignore", "docs/\n!tmp/\n");
    dir.write(".caretignore", "private.rs\n!vendor/\n");
    dir.write("docs/guide.md", "# Guide\n");
    dir.write("tmp/scratch.rs", "x");
    dir.write("private.rs", "x");
    dir.write("vendor/lib.rs", "x");
    dir.write("node_modules/left-pad/index.js", "x");
    dir.write("lib.rs", "x");
    check(
        &dir,
        &config(),
        expect![[r#"
            + .caretignore
            + .cursorignore
            + .gitignore
            - docs/  ignored by .cursorignore: docs/
            + lib.rs
            - node_modules/  default exclude (vendor): node_modules/
            - private.rs  ignored by .caretignore: private.rs
            + tmp/scratch.rs
            + vendor/lib.rs
        "#]],
    );
}

#[test]
fn git_info_exclude_global_excludes_and_parent_gitignores() {
    let dir = TempDir::new();
    dir.git_init();
    dir.write(".gitignore", "*.tmp\n");
    dir.write(".git/info/exclude", "notes.md\n");
    let global = dir.write("global-ignore", "*.orig\n");
    dir.write("sub/a.rs", "x");
    dir.write("sub/b.tmp", "x");
    dir.write("sub/notes.md", "x");
    dir.write("sub/c.rs.orig", "x");
    let config = WalkConfig { global_excludes: Some(global), ..config() };
    let out = walk(&dir.join("sub"), &config).unwrap();
    expect![[r#"
        + a.rs
        - b.tmp  ignored by .gitignore: *.tmp
        - c.rs.orig  ignored by global-ignore: *.orig
        - notes.md  ignored by .git/info/exclude: notes.md
    "#]]
    .assert_eq(&render(&out).replace(&format!("{}/", dir.path().canonicalize().unwrap().display()), ""));
}

#[test]
fn default_excludes_by_family() {
    let dir = TempDir::new();
    dir.git_init();
    for f in [
        ".env",
        ".env.production",
        "deploy/id_rsa",
        "certs/server.pem",
        "package-lock.json",
        "Cargo.lock",
        "static/app.min.js",
        "static/app.js.map",
        "api/service.pb.go",
        "api/service_pb2.py",
        "src/lib.rs",
        "target/debug/build.rs",
        "logo.png",
        "terraform.tfstate",
    ] {
        dir.write(f, "x\n");
    }
    dir.write("target/CACHEDIR.TAG", "Signature: 8a477f597d28d172789f06886806bc55\n");
    check(
        &dir,
        &config(),
        expect![[r#"
            - .env  default exclude (sensitive): *.env
            - .env.production  default exclude (sensitive): .env.*
            - .git/  default exclude (vcs): .git/
            - Cargo.lock  default exclude (lockfile): *.lock
            - api/service.pb.go  default exclude (generated): *.pb.go
            - api/service_pb2.py  default exclude (generated): *_pb2.py
            - certs/server.pem  default exclude (sensitive): *.pem
            - deploy/id_rsa  default exclude (sensitive): id_rsa*
            - logo.png  binary: file extension
            - package-lock.json  default exclude (lockfile): package-lock.json
            + src/lib.rs
            - static/app.js.map  default exclude (minified): *.map
            - static/app.min.js  default exclude (minified): *.min.js
            - target/  default exclude (cache-dir): CACHEDIR.TAG
            - terraform.tfstate  default exclude (sensitive): *.tfstate
        "#]],
    );
    let all = WalkConfig { default_excludes: false, ..config() };
    let out = walk(dir.path(), &all).unwrap();
    assert!(out.files.iter().any(|f| f.path.to_string() == ".env"), "defaults can be switched off");
    assert!(out.skipped.iter().any(|s| s.path.to_string() == ".git"), "VCS directories never are");
}

#[test]
fn symlinks_are_never_followed_and_loops_do_not_hang() {
    let outside = TempDir::new();
    outside.write("secret.rs", "x");
    let dir = TempDir::new();
    dir.write("real/a.rs", "x");
    dir.symlink(outside.path(), "out");
    dir.symlink("real", "inside-dir");
    dir.symlink("real/a.rs", "inside-file");
    dir.symlink("loop-b", "loop-a");
    dir.symlink("loop-a", "loop-b");
    dir.symlink("missing", "dangling");
    dir.symlink(".", "real/self");
    check(
        &dir,
        &config(),
        expect![[r#"
            - dangling  symlink is dangling or loops
            - inside-dir  symlink not followed (target is inside the workspace)
            - inside-file  symlink not followed (target is inside the workspace)
            - loop-a  symlink is dangling or loops
            - loop-b  symlink is dangling or loops
            - out  symlink not followed (target is outside the workspace)
            + real/a.rs
            - real/self  symlink not followed (target is inside the workspace)
        "#]],
    );
}

#[test]
fn special_files_large_files_and_odd_names() {
    let dir = TempDir::new();
    let fifo = dir.join("pipe");
    let status = std::process::Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(status.success());
    dir.write("big.txt", &"x".repeat(200));
    dir.write("small.txt", "x");
    let odd = std::ffi::OsStr::from_bytes(b"caf\xe9.rs");
    std::fs::write(dir.path().join(odd), "fn f() {}\n").unwrap();
    let config = WalkConfig { max_file_size: 100, ..config() };
    let out = walk(dir.path(), &config).unwrap();
    check(
        &dir,
        &config,
        expect![[r#"
            - big.txt  too large: 200 bytes > 100
            + caf�.rs
            - pipe  not a regular file (fifo, socket or device)
            + small.txt
        "#]],
    );
    let odd_entry = out.files.iter().find(|f| f.path.as_bytes() == b"caf\xe9.rs");
    assert!(odd_entry.is_some(), "non-UTF-8 names are kept byte for byte");
}

#[test]
fn unreadable_root_is_an_error_with_the_path() {
    let dir = TempDir::new();
    let missing = dir.join("nope");
    let err = walk(&missing, &config()).unwrap_err().to_string();
    assert!(err.starts_with("opening workspace root") && err.contains("nope"), "{err}");
    let file = dir.write("file.txt", "x");
    let err = walk(&file, &config()).unwrap_err().to_string();
    assert!(err.contains("is not a directory"), "{err}");
}

#[test]
fn bad_lines_in_an_ignore_file_do_not_drop_the_rules_after_them() {
    let dir = TempDir::new();
    let mut rules = b"\xef\xbb\xbfsecret.env\n\xff\xfe not text \0\n[z-a\n*.key\r\n".to_vec();
    rules.extend_from_slice(b"private/\n");
    dir.write_bytes(".caretignore", &rules);
    dir.write("secret.env", "x");
    dir.write("id.key", "x");
    dir.write("private/notes.md", "x");
    dir.write("main.rs", "fn main() {}\n");
    check(
        &dir,
        &config(),
        expect![[r#"
            + .caretignore
            - id.key  ignored by .caretignore: *.key
            + main.rs
            - private/  ignored by .caretignore: private/
            - secret.env  ignored by .caretignore: secret.env
        "#]],
    );
}
