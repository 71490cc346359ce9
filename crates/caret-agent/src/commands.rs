//! Custom slash commands: Markdown prompts in the places a front end names (the project's
//! `.caret/commands/`, `.claude/commands/`, `.cursor/commands/`, then the user's), named by
//! their path (`review.md` is `/review`, `git/commit.md` is `/git:commit`), with optional front
//! matter (`description`, `argument-hint`, `model`, `allowed-tools`) and `$ARGUMENTS`, `$1`…`$9`
//! in their text. `/name args` at the start of a request is replaced by the command's prompt
//! before the model sees it, in every front end alike.

use std::path::{Path, PathBuf};

use crate::front_matter;

/// Largest command file read.
const MAX_COMMAND_BYTES: u64 = 256 * 1024;

/// A command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Command {
    /// Its name, without the `/`.
    pub name: String,
    /// What it does (its front matter's, else its first line).
    pub description: String,
    /// What it takes (`[file] [focus]`).
    pub argument_hint: Option<String>,
    /// A model alias for the turn it starts.
    pub model: Option<String>,
    /// The tools that turn may use (Caret's names, or Claude Code's: `Bash(git:*)`, `Read`).
    pub allowed_tools: Option<Vec<String>>,
    /// Its prompt.
    pub body: String,
    /// Its file.
    pub file: PathBuf,
    /// Where it was found, as listings name it (`.claude/commands`).
    pub source: String,
}

/// A command file left out, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skipped {
    /// The file.
    pub file: PathBuf,
    /// Why.
    pub why: String,
}

fn read(file: &Path, name: String, source: &str) -> Result<Command, String> {
    let meta = std::fs::metadata(file).map_err(|e| e.to_string())?;
    if meta.len() > MAX_COMMAND_BYTES {
        return Err(format!("over {} KiB", MAX_COMMAND_BYTES / 1024));
    }
    let text = std::fs::read_to_string(file).map_err(|e| format!("not text: {e}"))?;
    let (front, body) = front_matter::split(&text);
    let fields = front_matter::fields(front);
    let text_of = |k: &str| front_matter::get(&fields, k).map(front_matter::Value::text).filter(|t| !t.is_empty());
    let body = body.trim().to_owned();
    if body.is_empty() {
        return Err("its prompt is empty".into());
    }
    let description = text_of("description")
        .unwrap_or_else(|| body.lines().next().unwrap_or_default().trim_start_matches('#').trim().to_owned());
    let argument_hint = front_matter::get(&fields, "argument-hint").map(|v| match v {
        front_matter::Value::List(items) => items.iter().map(|i| format!("[{i}]")).collect::<Vec<_>>().join(" "),
        front_matter::Value::Text(t) => t.clone(),
    });
    Ok(Command {
        name,
        description,
        argument_hint,
        model: text_of("model"),
        allowed_tools: front_matter::get(&fields, "allowed-tools").map(front_matter::Value::items),
        body,
        file: file.to_path_buf(),
        source: source.to_owned(),
    })
}

fn valid_name(name: &str) -> bool {
    !name.is_empty() && name.len() <= 64 && name.chars().all(|c| c.is_ascii_alphanumeric() || "-_:.".contains(c))
}

/// The commands in `places` (folders of Markdown files, each with how listings name it), the
/// first place's first: a name found again later is left out.
pub fn discover(places: &[(PathBuf, String)]) -> (Vec<Command>, Vec<Skipped>) {
    let mut out: Vec<Command> = Vec::new();
    let mut skipped = Vec::new();
    for (place, source) in places {
        if !place.is_dir() {
            continue;
        }
        let mut files: Vec<PathBuf> = ignore::WalkBuilder::new(place)
            .hidden(false)
            .max_depth(Some(4))
            .build()
            .flatten()
            .filter(|e| e.file_type().is_some_and(|t| t.is_file()))
            .map(|e| e.into_path())
            .filter(|p| p.extension().is_some_and(|x| x == "md"))
            .collect();
        files.sort();
        for file in files {
            let Ok(rel) = file.strip_prefix(place) else { continue };
            let name = rel
                .with_extension("")
                .components()
                .map(|c| c.as_os_str().to_string_lossy())
                .collect::<Vec<_>>()
                .join(":");
            if !valid_name(&name) {
                skipped.push(Skipped { file, why: format!("{name:?} is not a command name") });
                continue;
            }
            if out.iter().any(|c| c.name == name) {
                skipped.push(Skipped { file, why: format!("a command /{name} was found before") });
                continue;
            }
            match read(&file, name, source) {
                Ok(c) => out.push(c),
                Err(why) => skipped.push(Skipped { file, why }),
            }
        }
    }
    (out, skipped)
}

/// `input` as `(name, arguments)` when it starts with `/name`.
pub fn invocation(input: &str) -> Option<(&str, &str)> {
    let rest = input.trim_start().strip_prefix('/')?;
    let (name, args) = rest.split_once(char::is_whitespace).unwrap_or((rest, ""));
    valid_name(name).then_some((name, args.trim()))
}

/// Splits arguments as a shell would for `$1`…`$9` (quotes group words).
fn words(args: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut word = String::new();
    let (mut quote, mut any) = (None, false);
    for c in args.chars() {
        match (quote, c) {
            (None, '"' | '\'') => {
                quote = Some(c);
                any = true;
            }
            (Some(q), c) if c == q => quote = None,
            (None, c) if c.is_whitespace() => {
                if any {
                    out.push(std::mem::take(&mut word));
                    any = false;
                }
            }
            (_, c) => {
                word.push(c);
                any = true;
            }
        }
    }
    if any {
        out.push(word);
    }
    out
}

/// The command's prompt with its arguments put in: `$ARGUMENTS` (all of them), `$1`…`$9`
/// (each); a prompt that names none gets the arguments after it.
pub fn expand(command: &Command, args: &str) -> String {
    let words = words(args);
    let mut text = command.body.replace("$ARGUMENTS", args);
    for i in (1..=9).rev() {
        text = text.replace(&format!("${i}"), words.get(i - 1).map_or("", String::as_str));
    }
    let named = command.body.contains("$ARGUMENTS") || (1..=9).any(|i| command.body.contains(&format!("${i}")));
    if !named && !args.is_empty() {
        text.push_str(&format!("\n\n{args}"));
    }
    text
}

/// Caret's tool names of an `allowed-tools` list (Claude Code's `Bash(git:*)`, `Read`…, or
/// Caret's own).
pub fn tool_names(allowed: &[String]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for a in allowed {
        let base = a.split('(').next().unwrap_or(a).trim();
        let name = crate::hooks::names::caret_tool(crate::hooks::Dialect::Claude, base).to_owned();
        if !name.is_empty() && !out.contains(&name) {
            out.push(name);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_are_found_named_by_path_and_expanded() {
        let dir = caret_test_support::TempDir::new();
        dir.write(
            ".claude/commands/review.md",
            "---\ndescription: Review a file\nargument-hint: [file] [focus]\nallowed-tools: Read, Grep, Bash(git diff:*)\nmodel: big\n---\nReview $1 with an eye on $2.\n",
        );
        dir.write(".claude/commands/git/commit.md", "# Commit the staged changes\n\nWrite a message for: $ARGUMENTS\n");
        dir.write(".caret/commands/review.md", "---\ndescription: the project's own\n---\nReview: $ARGUMENTS\n");
        dir.write(".caret/commands/empty.md", "---\ndescription: nothing\n---\n");
        dir.write(".caret/commands/plain.md", "Explain this code.\n");
        let places = [
            (dir.path().join(".caret/commands"), ".caret/commands".to_owned()),
            (dir.path().join(".claude/commands"), ".claude/commands".to_owned()),
        ];
        let (commands, skipped) = discover(&places);
        let names: Vec<&str> = commands.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, vec!["plain", "review", "git:commit"]);
        assert_eq!(skipped.len(), 2, "{skipped:?}");
        let review = &commands[1];
        assert_eq!(review.source, ".caret/commands");
        let commit = &commands[2];
        assert_eq!(commit.description, "Commit the staged changes");
        assert_eq!(
            expand(commit, "fix the parser"),
            "# Commit the staged changes\n\nWrite a message for: fix the parser"
        );
        assert_eq!(expand(&commands[0], "src/lib.rs"), "Explain this code.\n\nsrc/lib.rs");
        let (claude, _) = discover(&places[1..]);
        let r = &claude[1];
        assert_eq!(expand(r, "\"src/main.rs\" errors"), "Review src/main.rs with an eye on errors.");
        assert_eq!((r.model.as_deref(), r.argument_hint.as_deref()), (Some("big"), Some("[file] [focus]")));
        assert_eq!(tool_names(r.allowed_tools.as_ref().unwrap()), vec!["read_file", "grep", "run_terminal_cmd"]);
        assert_eq!(invocation("/git:commit  tidy up "), Some(("git:commit", "tidy up")));
        assert_eq!(invocation("/usr/bin is odd"), None);
        assert_eq!(invocation("no command"), None);
    }
}
