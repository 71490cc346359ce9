//! The VS Code extension (`editors/vscode`): installed from its lock file, type-checked,
//! its logic tested with Node's test runner, and packaged as a `.vsix` whose contents are
//! checked. (It cannot be run inside VS Code on these machines; see its README.)

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Read as _;
use std::path::Path;
use std::process::Command;

fn npm(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("npm").args(args).current_dir(dir).output().unwrap_or_else(|e| {
        panic!("npm {args:?}: {e} (the extension's test needs Node.js and npm; .ci/run installs them)")
    });
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "npm {args:?} failed:\n{text}");
    text
}

#[test]
fn the_vscode_extension_type_checks_passes_its_tests_and_packages() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../editors/vscode");
    npm(&dir, &["ci", "--ignore-scripts", "--no-audit", "--no-fund", "--loglevel=error"]);
    npm(&dir, &["run", "check"]);
    let tests = npm(&dir, &["test"]);
    assert!(tests.contains("# fail 0") && !tests.contains("# pass 0"), "{tests}");
    npm(&dir, &["run", "package"]);
    let vsix = std::fs::File::open(dir.join("caret.vsix")).unwrap();
    let mut zip = zip::ZipArchive::new(vsix).unwrap();
    let names: Vec<String> = zip.file_names().map(str::to_owned).collect();
    for want in [
        "extension/package.json",
        "extension/dist/extension.js",
        "extension/media/panel.js",
        "extension/media/panel.css",
    ] {
        assert!(names.iter().any(|n| n == want), "{want} not in the package: {names:?}");
    }
    assert!(
        !names.iter().any(|n| n.contains("node_modules") || n.contains("/src/")),
        "sources or packages shipped: {names:?}"
    );
    let mut manifest = String::new();
    zip.by_name("extension/package.json").unwrap().read_to_string(&mut manifest).unwrap();
    let manifest: serde_json::Value = serde_json::from_str(&manifest).unwrap();
    assert_eq!(manifest["main"], "./dist/extension.js");
    let commands: Vec<&str> = manifest["contributes"]["commands"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["command"].as_str().unwrap())
        .collect();
    assert_eq!(commands, ["caret.openAgent", "caret.search", "caret.grep", "caret.restartServer"]);
    // The extension reuses the page's panel component rather than a copy of it.
    let mut panel = String::new();
    zip.by_name("extension/media/panel.js").unwrap().read_to_string(&mut panel).unwrap();
    assert!(panel.contains("Restore checkpoint"), "the webview bundles web/src/agent-panel.js");
}
