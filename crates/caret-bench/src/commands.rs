//! `caret bench scan`'s command rows: `caret scan` and `caret sync` run as a developer runs
//! them — whole processes of this binary, on a home of their own — with no daemon and through
//! the daemon's watcher, for the table beside `git status`.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context as _;

use crate::process::Child;

/// One measured command: the median and the spread of its runs.
pub(crate) struct Timed {
    pub(crate) name: String,
    pub(crate) median: Duration,
    pub(crate) min: Duration,
    pub(crate) max: Duration,
    pub(crate) note: String,
}

/// A scratch Caret home, removed when dropped; its daemon (if started) stops first.
struct Home {
    dir: PathBuf,
    daemon: Option<Child>,
}

impl Drop for Home {
    fn drop(&mut self) {
        self.daemon.take();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Home {
    fn command(&self, args: &[&str], daemon: bool) -> anyhow::Result<Command> {
        let mut cmd = Command::new(std::env::current_exe().context("finding the caret binary")?);
        cmd.args(args)
            .env("CARET_HOME", &self.dir)
            .env("CARET_DAEMON", if daemon { "on" } else { "off" })
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        Ok(cmd)
    }

    fn run(&self, args: &[&str], daemon: bool) -> anyhow::Result<Duration> {
        let t = Instant::now();
        let out = self.command(args, daemon)?.output().context("running caret")?;
        let took = t.elapsed();
        anyhow::ensure!(out.status.success(), "caret {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        Ok(took)
    }

    fn start_daemon(&mut self) -> anyhow::Result<()> {
        let mut cmd = self.command(&["daemon", "--idle", "10m"], true)?;
        cmd.stderr(Stdio::null());
        self.daemon = Some(Child(cmd.spawn().context("starting caret daemon")?));
        let announce = self.dir.join("local").join("daemon.json");
        let deadline = Instant::now() + Duration::from_secs(60);
        while !announce.exists() {
            anyhow::ensure!(Instant::now() < deadline, "the daemon did not announce itself within a minute");
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }
}

fn timed(
    name: &str,
    runs: usize,
    note: &str,
    mut run: impl FnMut() -> anyhow::Result<Duration>,
) -> anyhow::Result<Timed> {
    let mut times = Vec::with_capacity(runs);
    for _ in 0..runs {
        times.push(run()?);
    }
    times.sort_unstable();
    Ok(Timed {
        name: name.to_owned(),
        median: times[times.len() / 2],
        min: times[0],
        max: times[times.len() - 1],
        note: note.to_owned(),
    })
}

/// `caret scan` (and `caret sync` against the embedded server, with `sync`) on `root` as
/// processes, nothing changed since the last run: without a daemon, then through its watcher.
/// `model_dir`: the embedding model of the developer's own home, whose tokenizer the scratch
/// home borrows (a linked file, not the weights: a sync here embeds nothing), so a scan sizes
/// chunks, and starts up, as on a developer's machine.
pub(crate) fn rows(
    bench_dir: &Path,
    root: &Path,
    runs: usize,
    sync: bool,
    model_dir: &Path,
) -> anyhow::Result<Vec<Timed>> {
    let mut home = Home { dir: bench_dir.join("home"), daemon: None };
    std::fs::create_dir_all(&home.dir).with_context(|| format!("creating {}", home.dir.display()))?;
    if let Some(name) = ["tokenizer.json", "vocab.txt"].into_iter().find(|n| model_dir.join(n).is_file()) {
        let dir = home.dir.join("models").join(caret_host::config::DEFAULT_EMBEDDING_MODEL);
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        std::os::unix::fs::symlink(model_dir.join(name), dir.join(name))
            .with_context(|| format!("linking the tokenizer into {}", dir.display()))?;
    }
    let root = root.to_str().context("the tree's path is not UTF-8")?;
    let mut out = Vec::new();
    home.run(&["scan", root], false)?;
    out.push(timed("caret scan, no daemon", runs, "a process; stat cache warm", || home.run(&["scan", root], false))?);
    if sync {
        let t = Instant::now();
        home.run(&["sync", root], false)?;
        println!("(first sync of the tree into the bench's embedded server: {:.1} s)", t.elapsed().as_secs_f64());
        out.push(timed("caret sync, no daemon", runs, "a process; embedded server in-process", || {
            home.run(&["sync", root], false)
        })?);
    }
    home.start_daemon()?;
    // The first command under the watcher walks and leaves its record.
    home.run(&["scan", root], true)?;
    out.push(timed("caret scan, daemon's watcher", runs, "a process; answered from the record", || {
        home.run(&["scan", root], true)
    })?);
    if sync {
        home.run(&["sync", root], true)?;
        out.push(timed("caret sync, daemon's watcher", runs, "a process; one request to the server", || {
            home.run(&["sync", root], true)
        })?);
    }
    Ok(out)
}
