//! `caret docs`: documentation sources (@Docs) — add, refresh, list, remove, search.

use std::io::{IsTerminal as _, Write as _};
use std::ops::ControlFlow;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::Context as _;
use caret_docs::pages::{Counts, Origin, Source};
use caret_host::config::Config;
use caret_host::remote::Api;
use caret_host::runtime::runtime;
use caret_host::units::thousands;
use caret_protocol::docs::{AddDocsSource, DocsSearch, DocsSource, DocsState};

use crate::sync::RemoteArgs;

#[derive(Debug, clap::Subcommand)]
pub enum DocsCommand {
    /// Add a docs site (crawled under its directory, or `--prefix`), an `llms.txt`, or a local
    /// folder of HTML, Markdown or reStructuredText; then index it.
    Add(AddArgs),
    /// Crawl sources again (all, or NAME): unchanged pages cost one request and no embedding.
    Refresh(RefreshArgs),
    /// List the sources.
    Ls {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Remove a source and its pages from the index.
    Rm {
        /// The source.
        name: String,
    },
    /// Search the documentation.
    Search(SearchArgs),
}

#[derive(Debug, clap::Args)]
pub struct AddArgs {
    /// A URL (`https://docs.example.com/guide/`, `…/llms.txt`) or a folder.
    what: String,
    /// The source's name (`@Docs NAME`).
    #[arg(long)]
    name: String,
    /// Only pages whose URL starts with this (default: the URL's directory).
    #[arg(long)]
    prefix: Option<String>,
    /// Links followed from the first page, at most.
    #[arg(long, default_value_t = 6)]
    depth: u32,
    /// Pages kept, at most.
    #[arg(long, default_value_t = 2000)]
    max_pages: usize,
    /// Requests a second, at most (a site's Crawl-delay may ask for fewer).
    #[arg(long, default_value_t = 20.0)]
    rate: f64,
    /// Crawl it again this often (`7d`, `12h`) when Caret searches docs.
    #[arg(long)]
    refresh: Option<String>,
    /// Do not embed now (search is lexical until `caret docs refresh`).
    #[arg(long)]
    no_embed: bool,
}

#[derive(Debug, clap::Args)]
pub struct RefreshArgs {
    /// The source (default: every one).
    name: Option<String>,
    /// Only sources whose `refresh` interval has passed.
    #[arg(long)]
    due: bool,
    /// Do not embed now.
    #[arg(long)]
    no_embed: bool,
}

#[derive(Debug, clap::Args)]
pub struct SearchArgs {
    /// A question or keywords.
    query: String,
    /// Only this source (repeatable).
    #[arg(long)]
    name: Vec<String>,
    /// Hits to show.
    #[arg(short, default_value_t = 8)]
    k: usize,
    /// Print JSON: a list of {url, title, heading, text, score, source}, best first.
    #[arg(long)]
    json: bool,
}

/// `caret docs`: this machine's sources, or with `--server URL --token T` a team server's.
#[derive(Debug, clap::Args)]
pub struct DocsArgs {
    #[command(subcommand)]
    cmd: DocsCommand,
    #[command(flatten)]
    remote: RemoteArgs,
}

pub fn run(config: &Config, DocsArgs { cmd, remote }: DocsArgs) -> anyhow::Result<ExitCode> {
    if let Some(api) = Api::open(&remote.remote())? {
        return runtime()?.block_on(team(&api, cmd));
    }
    match cmd {
        DocsCommand::Add(args) => add(config, args),
        DocsCommand::Refresh(args) => refresh(config, args),
        DocsCommand::Ls { json } => ls(config, json),
        DocsCommand::Rm { name } => {
            runtime()?.block_on(caret_host::docs::remove(config, &name))?;
            println!("removed {name}");
            Ok(ExitCode::SUCCESS)
        }
        DocsCommand::Search(args) => search(config, args),
    }
}

/// The same commands against a team server's sources (it crawls; this follows its progress).
async fn team(api: &Api, cmd: DocsCommand) -> anyhow::Result<ExitCode> {
    use caret_host::team_docs as client;
    let line = |s: &DocsSource| {
        let (c, error) = (&s.last, s.error.as_deref().map(|e| format!(": {e}")).unwrap_or_default());
        let counts =
            format!("{} found, {} fetched, {} written, {} unchanged", c.found, c.fetched, c.written, c.unchanged);
        format!("{}  {}  {} pages, {:?}{error} ({counts})", s.name, s.url, thousands(s.pages), s.state)
    };
    // Each change once; a crawl no worker has taken says what it waits for.
    let mut said = String::new();
    let mut follow = |s: &DocsSource| {
        let mut now = line(s);
        if s.state == DocsState::Queued {
            now.push_str(" — waiting for a worker (`caret worker --server URL`, or `caret serve --workers N`)");
        }
        if now != said {
            eprintln!("{now}");
            said = now;
        }
    };
    let done = match cmd {
        DocsCommand::Add(a) => {
            let max_pages = u32::try_from(a.max_pages).ok();
            let (depth, rate) = (Some(a.depth), Some(a.rate));
            let req = AddDocsSource {
                name: a.name,
                url: a.what,
                prefix: a.prefix,
                depth,
                max_pages,
                rate,
                refresh: a.refresh,
            };
            client::add(api, &req).await?;
            client::wait(api, &req.name, &mut follow).await?
        }
        DocsCommand::Refresh(RefreshArgs { name, .. }) => {
            let name = name.context("name the source to refresh on a team server (its schedule refreshes the rest)")?;
            client::refresh(api, &name).await?;
            client::wait(api, &name, &mut follow).await?
        }
        DocsCommand::Ls { json } => {
            let all = client::list(api).await?;
            let text = if json {
                serde_json::to_string_pretty(&all)?
            } else {
                all.iter().map(line).collect::<Vec<_>>().join("\n")
            };
            println!("{text}");
            return Ok(ExitCode::SUCCESS);
        }
        DocsCommand::Rm { name } => {
            client::remove(api, &name).await?;
            println!("removed {name}");
            return Ok(ExitCode::SUCCESS);
        }
        DocsCommand::Search(a) => {
            anyhow::ensure!((1..=50).contains(&a.k), "-k must be 1-50");
            let req = DocsSearch { query: a.query.clone(), names: a.name.clone(), k: a.k as u32 };
            return print_hits(&client::search(api, &req).await?, a.json);
        }
    };
    println!("{}", line(&done));
    match done.error {
        Some(e) => anyhow::bail!("{}: {e}", done.name),
        None => Ok(ExitCode::SUCCESS),
    }
}

fn add(config: &Config, args: AddArgs) -> anyhow::Result<ExitCode> {
    if let Some(r) = &args.refresh {
        caret_host::config::parse_duration(r).context("--refresh")?;
    }
    let origin = if args.what.starts_with("http://") || args.what.starts_with("https://") {
        caret_host::docs::site(&args.what, args.prefix.clone(), args.depth, args.max_pages, args.rate)?
    } else {
        let path = std::fs::canonicalize(PathBuf::from(&args.what))
            .with_context(|| format!("{} is neither an http(s) URL nor a folder", args.what))?;
        anyhow::ensure!(path.is_dir(), "{} is not a folder", path.display());
        Origin::Folder { path }
    };
    let source = Source { name: args.name.clone(), origin, refresh: args.refresh.clone() };
    caret_host::docs::add(config, &source)?;
    let updated = update(config, &args.name, !args.no_embed);
    // A source whose first crawl kept nothing (its URL did not answer) is not kept either.
    if updated.is_err() {
        let d = caret_host::docs::dir(config, &args.name)?;
        if d.state().map_or(true, |s| s.pages.is_empty()) {
            let _ = std::fs::remove_dir_all(&d.root);
        }
    }
    updated
}

fn refresh(config: &Config, args: RefreshArgs) -> anyhow::Result<ExitCode> {
    let all = caret_host::docs::list(config)?;
    let names: Vec<String> = match &args.name {
        Some(n) => vec![n.clone()],
        None if args.due => caret_host::docs::due(config)?,
        None => all.iter().map(|l| l.source.name.clone()).collect(),
    };
    if names.is_empty() {
        println!("nothing to refresh");
    }
    // One source failing (or being updated elsewhere) leaves the others to their update.
    let mut code = ExitCode::SUCCESS;
    for name in names {
        if let Err(e) = update(config, &name, !args.no_embed) {
            eprintln!("caret: error: {name}: {e:#}");
            code = ExitCode::FAILURE;
        }
    }
    Ok(code)
}

/// Crawls (or reads) a source, syncs its pages, and embeds them; progress on a terminal.
/// Ctrl-C stops the crawl where it is: the next refresh goes on from there.
fn update(config: &Config, name: &str, embed: bool) -> anyhow::Result<ExitCode> {
    let tty = std::io::stderr().is_terminal();
    let stop = Arc::new(AtomicBool::new(false));
    runtime()?.block_on(async {
        let flag = stop.clone();
        tokio::spawn(async move {
            if tokio::signal::ctrl_c().await.is_ok() {
                flag.store(true, Ordering::Relaxed);
            }
        });
        let started = std::time::Instant::now();
        let mut progress = |c: &Counts| {
            if tty {
                let secs = started.elapsed().as_secs_f64().max(1e-3);
                eprint!(
                    "\r{name}: {} found, {} fetched, {} written, {} unchanged ({:.0} pages/s)   ",
                    c.found,
                    c.fetched,
                    c.written,
                    c.unchanged,
                    c.fetched as f64 / secs
                );
                let _ = std::io::stderr().flush();
            }
            if stop.load(Ordering::Relaxed) { ControlFlow::Break(()) } else { ControlFlow::Continue(()) }
        };
        let updated = caret_host::docs::update(config, name, &mut progress, embed).await;
        if tty {
            eprintln!();
        }
        let u = updated?;
        let c = &u.counts;
        println!(
            "{name}: {} pages fetched in {:.1} s ({:.0} pages/s): {} written, {} unchanged, {} removed; indexed \
             (+{} ~{} -{}), the last {:.1} s after the crawl: lexical search is ready",
            thousands(c.fetched),
            u.crawl_seconds,
            c.fetched as f64 / u.crawl_seconds.max(1e-3),
            thousands(c.written),
            thousands(c.unchanged),
            c.removed,
            u.synced.0,
            u.synced.1,
            u.synced.2,
            u.sync_seconds,
        );
        for (why, n) in c.skipped.iter().chain(&c.failed) {
            println!("  {n} × {why}");
        }
        match (&u.model, u.embedded_after) {
            (Some(model), Some(after)) => println!(
                "{name}: embedded {} chunks ({model}); all {} have vectors {:.1} s after the start",
                thousands(u.embedded),
                thousands(u.vectors.0),
                after
            ),
            (None, Some(_)) => println!("{name}: no embedding model: search is lexical only"),
            _ => {}
        }
        anyhow::Ok(())
    })?;
    Ok(ExitCode::SUCCESS)
}

fn ls(config: &Config, json: bool) -> anyhow::Result<ExitCode> {
    let all = caret_host::docs::list(config)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&all)?);
        return Ok(ExitCode::SUCCESS);
    }
    if all.is_empty() {
        println!("no docs sources (`caret docs add URL --name NAME`)");
    }
    for l in all {
        let what = match &l.source.origin {
            Origin::Site { url, .. } => url.clone(),
            Origin::Folder { path } => path.display().to_string(),
        };
        let state = if l.unfinished { ", update interrupted (`caret docs refresh`)" } else { "" };
        let every = l.source.refresh.as_deref().map(|r| format!(", refreshed every {r}")).unwrap_or_default();
        println!("{}  {what}  {} pages{every}{state}", l.source.name, thousands(l.pages as u64));
    }
    Ok(ExitCode::SUCCESS)
}

fn search(config: &Config, args: SearchArgs) -> anyhow::Result<ExitCode> {
    anyhow::ensure!((1..=50).contains(&args.k), "-k must be 1-50");
    caret_host::docs::refresh_due_in_background(config);
    let hits = runtime()?.block_on(caret_host::docs::search(config, &args.query, &args.name, args.k))?;
    print_hits(&hits, args.json)
}

fn print_hits(hits: &[caret_host::docs::DocHit], json: bool) -> anyhow::Result<ExitCode> {
    if json {
        println!("{}", serde_json::to_string_pretty(&hits)?);
    } else {
        for h in hits {
            let heading = if h.heading.is_empty() { String::new() } else { format!(" › {}", h.heading) };
            println!("{}{heading}  ({}, {:.4})\n  {}", h.title, h.source, h.score, h.url);
            for line in h.text.lines().filter(|l| !l.trim().is_empty()).take(6) {
                println!("    {line}");
            }
            println!();
        }
        if hits.is_empty() {
            println!("no results");
        }
    }
    Ok(if hits.is_empty() { ExitCode::from(1) } else { ExitCode::SUCCESS })
}
