//! Builds the workspace page that `caret ui` serves and embeds it in the binary.
//!
//! The page's sources are `web/` (plain JavaScript modules, Monaco and esbuild from the npm
//! registry, pinned by `web/package-lock.json`). Here, with Node.js and npm on the PATH: the
//! packages are installed once per lock file into `OUT_DIR/web-deps` (`npm ci`, no install
//! scripts), and `web/build.mjs` bundles the page into `OUT_DIR/web-dist`. Without them: a
//! page built earlier by hand (`cd web && npm ci && npm run build` → `web/dist`), or the
//! directory `CARET_WEB_DIST` names; failing both, a page that says how to build it (and a
//! cargo warning). Either way `OUT_DIR/web_assets.rs` lists every file, embedded with
//! `include_bytes!`, so the binary needs no Node at run time and no network.

use std::error::Error;
use std::path::{Path, PathBuf};
use std::process::Command;

type Result<T> = std::result::Result<T, Box<dyn Error>>;

fn main() -> Result<()> {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?);
    let web = manifest.join("web").canonicalize()?;
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    for f in ["src", "package.json", "package-lock.json", "build.mjs"] {
        println!("cargo:rerun-if-changed={}", web.join(f).display());
    }
    println!("cargo:rerun-if-env-changed=CARET_WEB_DIST");
    let dist = match std::env::var_os("CARET_WEB_DIST") {
        Some(d) => PathBuf::from(d),
        None => match build(&web, &out) {
            Ok(d) => d,
            Err(e) if web.join("dist/index.html").is_file() => {
                println!("cargo:warning=building the workspace page failed ({e}); embedding web/dist as it is");
                web.join("dist")
            }
            Err(e) => {
                println!(
                    "cargo:warning=the workspace page was not built ({e}): `caret ui` will say how to build it. \
                     Install Node.js 18+ and npm and build again."
                );
                placeholder(&out, &e.to_string())?
            }
        },
    };
    let mut files = Vec::new();
    collect(&dist, &dist, &mut files)?;
    files.sort();
    let mut code = String::from("/// The workspace page's files: (path under /assets/, content type, bytes).\n");
    code.push_str("pub static ASSETS: &[(&str, &str, &[u8])] = &[\n");
    for rel in &files {
        let abs = dist.join(rel);
        code.push_str(&format!(
            "    ({:?}, {:?}, include_bytes!({:?})),\n",
            rel,
            content_type(rel),
            abs.display().to_string()
        ));
    }
    code.push_str("];\n");
    std::fs::write(out.join("web_assets.rs"), code)?;
    Ok(())
}

/// `npm ci` (when the lock changed) and the bundle; returns the directory built.
fn build(web: &Path, out: &Path) -> Result<PathBuf> {
    let deps = out.join("web-deps");
    std::fs::create_dir_all(&deps)?;
    let lock = std::fs::read(web.join("package-lock.json"))?;
    let installed = deps.join("installed.lock");
    if std::fs::read(&installed).ok().as_deref() != Some(&lock[..]) || !deps.join("node_modules").is_dir() {
        std::fs::copy(web.join("package.json"), deps.join("package.json"))?;
        std::fs::write(deps.join("package-lock.json"), &lock)?;
        let _ = std::fs::remove_file(&installed);
        run(Command::new("npm")
            .args(["ci", "--ignore-scripts", "--no-audit", "--no-fund", "--loglevel=error"])
            .current_dir(&deps))?;
        std::fs::write(&installed, &lock)?;
    }
    std::fs::copy(web.join("build.mjs"), deps.join("build.mjs"))?;
    let dist = out.join("web-dist");
    run(Command::new("node")
        .arg(deps.join("build.mjs"))
        .env("WEB", web)
        .env("OUT", &dist)
        .env("NODE_MODULES", deps.join("node_modules"))
        .current_dir(&deps))?;
    Ok(dist)
}

fn run(cmd: &mut Command) -> Result<()> {
    let what = format!("{:?}", cmd.get_program());
    let output = cmd.output().map_err(|e| format!("running {what}: {e}"))?;
    if !output.status.success() {
        let err = String::from_utf8_lossy(&output.stderr);
        let tail: String =
            err.lines().rev().take(12).collect::<Vec<_>>().into_iter().rev().collect::<Vec<_>>().join(" | ");
        return Err(format!("{what} failed ({}): {tail}", output.status).into());
    }
    Ok(())
}

/// A page that says the real one was not built.
fn placeholder(out: &Path, why: &str) -> Result<PathBuf> {
    let dir = out.join("web-placeholder");
    std::fs::create_dir_all(&dir)?;
    let why = why.replace('&', "&amp;").replace('<', "&lt;");
    std::fs::write(
        dir.join("index.html"),
        format!(
            "<!doctype html><meta charset=utf-8><title>caret</title><body style=\"font:14px system-ui;margin:3em\">\
             <h1>The workspace page was not built into this caret</h1><p>{why}</p><p>Install Node.js (18 or later) \
             and npm, then build caret again (<code>cargo build --release -p caret</code>, or \
             <code>./scripts/setup.sh</code>).</p>"
        ),
    )?;
    Ok(dir)
}

fn collect(root: &Path, dir: &Path, files: &mut Vec<String>) -> Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            collect(root, &path, files)?;
        } else {
            files.push(path.strip_prefix(root)?.to_string_lossy().replace('\\', "/"));
        }
    }
    Ok(())
}

fn content_type(path: &str) -> &'static str {
    match path.rsplit('.').next().unwrap_or("") {
        "html" => "text/html; charset=utf-8",
        "js" | "mjs" => "text/javascript; charset=utf-8",
        "css" => "text/css; charset=utf-8",
        "ttf" => "font/ttf",
        "svg" => "image/svg+xml",
        "json" => "application/json",
        "png" => "image/png",
        _ => "application/octet-stream",
    }
}
