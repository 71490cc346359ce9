//! `caret hooks` (the hook files a session here runs, those waiting for trust, and trusting
//! the project's), `caret skills` and `caret commands` (what a session here has).

use std::process::ExitCode;

use anyhow::Context as _;
use caret_host::config::Config;

#[derive(Debug, clap::Subcommand)]
pub enum HooksCommand {
    /// The hook files a session here runs (yours, and the project's you trusted), their hooks,
    /// what Caret left out of them, and the project's files waiting for your trust.
    Ls {
        /// The project (default: the current directory).
        #[arg(short = 'C', long, default_value = ".")]
        workspace: std::path::PathBuf,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Trust the project's hook files as they are now (`.caret/hooks.json`,
    /// `.claude/settings.json`, `.claude/settings.local.json`, `.cursor/hooks.json`); a file
    /// changed later needs trusting again.
    Trust {
        /// The project (default: the current directory).
        #[arg(short = 'C', long, default_value = ".")]
        workspace: std::path::PathBuf,
    },
}

pub fn run(config: &Config, cmd: HooksCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        HooksCommand::Ls { workspace, json } => {
            let root = std::fs::canonicalize(&workspace).with_context(|| format!("opening {}", workspace.display()))?;
            let files = caret_host::hooks::files_for(config, &root);
            let loaded = caret_host::hooks::load_for(config, &root);
            if json {
                let hooks: Vec<serde_json::Value> = loaded
                    .hooks
                    .iter()
                    .map(|h| {
                        serde_json::json!({"event": h.event.name(), "native": h.native, "source": h.source,
                            "matcher": h.matcher.as_ref().map(|m| m.as_str().to_owned()), "command": h.command,
                            "timeout_s": h.timeout.as_secs_f64()})
                    })
                    .collect();
                let problems: Vec<serde_json::Value> = loaded
                    .problems
                    .iter()
                    .map(|p| serde_json::json!({"source": p.source, "message": p.message}))
                    .collect();
                let out = serde_json::json!({"files": files, "hooks": hooks, "problems": problems});
                println!("{}", serde_json::to_string_pretty(&out)?);
                return Ok(ExitCode::SUCCESS);
            }
            if files.is_empty() {
                println!("no hook files (.caret/hooks.json, .claude/settings.json, .cursor/hooks.json, or yours)");
            }
            for f in &files {
                let state = if f.trusted { "runs" } else { "not trusted: `caret hooks trust` to run it" };
                println!("{}  ({state})", f.shown);
                for h in loaded.hooks.iter().filter(|h| h.source == f.shown) {
                    let on = h.matcher.as_ref().map(|m| format!(" [{}]", m.as_str())).unwrap_or_default();
                    println!("  {}{on}  {}", h.native, h.command);
                }
                for p in loaded.problems.iter().filter(|p| p.source == f.shown) {
                    println!("  left out: {}", p.message);
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        HooksCommand::Trust { workspace } => {
            let root = std::fs::canonicalize(&workspace).with_context(|| format!("opening {}", workspace.display()))?;
            let trusted = caret_host::hooks::trust(&config.home, &root)?;
            anyhow::ensure!(!trusted.is_empty(), "{} has no hook files to trust", root.display());
            for f in trusted {
                println!("trusted {} of {}", f.shown, root.display());
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

#[derive(Debug, clap::Args)]
pub struct ListArgs {
    /// The project (default: the current directory).
    #[arg(short = 'C', long, default_value = ".")]
    workspace: std::path::PathBuf,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

/// `caret skills`: the skills a session here has, and the folders left out.
pub fn skills(config: &Config, args: ListArgs) -> anyhow::Result<ExitCode> {
    let root =
        std::fs::canonicalize(&args.workspace).with_context(|| format!("opening {}", args.workspace.display()))?;
    let (skills, skipped) = caret_host::conventions::skills(config, &root);
    if args.json {
        let list: Vec<serde_json::Value> = skills
            .iter()
            .map(
                |s| serde_json::json!({"name": s.name, "description": s.description, "dir": s.dir, "source": s.source}),
            )
            .collect();
        let left: Vec<serde_json::Value> =
            skipped.iter().map(|s| serde_json::json!({"dir": s.dir, "why": s.why})).collect();
        println!("{}", serde_json::to_string_pretty(&serde_json::json!({"skills": list, "skipped": left}))?);
        return Ok(ExitCode::SUCCESS);
    }
    if skills.is_empty() {
        println!(
            "no skills (folders with a SKILL.md under .caret/skills, .claude/skills, .agents/skills or $CARET_HOME/skills)"
        );
    }
    for s in &skills {
        println!("{}  ({})\n  {}", s.name, s.source, s.description);
    }
    for s in &skipped {
        println!("left out: {}: {}", s.dir.display(), s.why);
    }
    Ok(ExitCode::SUCCESS)
}

/// `caret commands`: the custom slash commands a session here has.
pub fn commands(config: &Config, args: ListArgs) -> anyhow::Result<ExitCode> {
    let root =
        std::fs::canonicalize(&args.workspace).with_context(|| format!("opening {}", args.workspace.display()))?;
    let (commands, skipped) = caret_host::conventions::commands(config, &root);
    if args.json {
        let list: Vec<serde_json::Value> = commands
            .iter()
            .map(|c| {
                serde_json::json!({"name": c.name, "description": c.description, "argument_hint": c.argument_hint,
                    "model": c.model, "allowed_tools": c.allowed_tools, "file": c.file, "source": c.source})
            })
            .collect();
        let left: Vec<serde_json::Value> =
            skipped.iter().map(|s| serde_json::json!({"file": s.file, "why": s.why})).collect();
        println!("{}", serde_json::to_string_pretty(&serde_json::json!({"commands": list, "skipped": left}))?);
        return Ok(ExitCode::SUCCESS);
    }
    if commands.is_empty() {
        println!(
            "no commands (Markdown prompts under .caret/commands, .claude/commands, .cursor/commands or $CARET_HOME/commands)"
        );
    }
    for c in &commands {
        let hint = c.argument_hint.as_deref().map(|h| format!(" {h}")).unwrap_or_default();
        println!("/{}{hint}  ({})\n  {}", c.name, c.source, c.description);
    }
    for s in &skipped {
        println!("left out: {}: {}", s.file.display(), s.why);
    }
    Ok(ExitCode::SUCCESS)
}
