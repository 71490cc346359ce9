//! Project rules files: what a repository (and the user) tells coding agents, gathered the
//! way the tools a team already uses read them.
//!
//! - `AGENTS.md` of every directory from the repository root down to the working directory,
//!   root first and the nearest last (it wins where they disagree); `CLAUDE.md` where a
//!   directory has no `AGENTS.md`; empty files skipped. The user's own `$CARET_HOME/AGENTS.md`
//!   comes before them all.
//! - `.cursor/rules/**/*.mdc` and `.caret/rules/**/*.md[c]`, each with optional front matter
//!   (`description`, `globs`, `alwaysApply`): an always-rule goes in the system prompt; a rule
//!   with globs is attached when the session reads, edits or mentions a matching file; a rule
//!   with only a description is listed for the model, which fetches it with `fetch_rule`.
//!   A legacy `.cursorrules` file is an always-rule.
//!
//! What goes in the system prompt is capped (32 KiB by default): a file that does not fit is
//! left out whole, and named in [`ProjectRules::dropped`]. Nothing here is sent anywhere but
//! the model's prompt.

use std::path::{Path, PathBuf};

use crate::front_matter::{split as split_front_matter, unquote};

/// The default cap on the rules in the system prompt, in bytes.
pub const DEFAULT_CAP: usize = 32 * 1024;

/// Largest rules file read (a bigger one is skipped, as if absent).
const MAX_FILE: u64 = 1 << 20;

/// When a rule applies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum When {
    /// Always: it is in the system prompt.
    Always,
    /// When the session touches a file matching one of these globs (workspace-relative).
    Globs(Vec<String>),
    /// When the model asks for it by name (`fetch_rule`), from its description.
    OnRequest,
}

/// One rules file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// Its name: the path relative to the repository root (`src/AGENTS.md`,
    /// `.cursor/rules/db.mdc`), or `~/AGENTS.md` for the user's own.
    pub name: String,
    /// What it is about (front matter `description`).
    pub description: Option<String>,
    /// When it applies.
    pub when: When,
    /// Its text (without front matter).
    pub text: String,
}

/// The rules of one session.
#[derive(Debug, Clone, Default)]
pub struct ProjectRules {
    /// In the system prompt, in order.
    pub always: Vec<Rule>,
    /// Attached when a matching file is touched.
    pub globbed: Vec<Rule>,
    /// Listed by description; fetched by name.
    pub on_request: Vec<Rule>,
    /// Files left out of the system prompt by the cap, with their sizes.
    pub dropped: Vec<(String, usize)>,
    /// Glob rules' matchers, in the order of `globbed`.
    matchers: Vec<globset::GlobSet>,
}

impl ProjectRules {
    /// The rules for a session in `cwd` within the repository at `root` (`cwd` outside `root`
    /// counts as `root`), the user's own file first when there is one, the prompt's share capped
    /// at `cap` bytes.
    pub fn load(root: &Path, cwd: &Path, user_file: Option<&Path>, cap: usize) -> ProjectRules {
        let mut always = Vec::new();
        if let Some(text) = user_file.and_then(read_text) {
            always.push(Rule { name: "~/AGENTS.md".to_owned(), description: None, when: When::Always, text });
        }
        for dir in dirs_down(root, cwd) {
            let found = ["AGENTS.md", "CLAUDE.md"].iter().find_map(|f| read_text(&dir.join(f)).map(|t| (*f, t)));
            if let Some((file, text)) = found {
                let rel = dir.strip_prefix(root).unwrap_or(Path::new(""));
                let name = rel.join(file).to_string_lossy().into_owned();
                always.push(Rule { name, description: None, when: When::Always, text });
            }
        }
        if let Some(text) = read_text(&root.join(".cursorrules")) {
            always.push(Rule { name: ".cursorrules".to_owned(), description: None, when: When::Always, text });
        }
        let mut rules = ProjectRules::default();
        let mut files = Vec::new();
        for (dir, exts) in [(".cursor/rules", &["mdc"][..]), (".caret/rules", &["md", "mdc"][..])] {
            collect(&root.join(dir), exts, &mut files);
        }
        files.sort();
        for path in files {
            let Some(raw) = read_text(&path) else { continue };
            let name = path.strip_prefix(root).unwrap_or(&path).to_string_lossy().into_owned();
            let rule = parse_rule(name, &raw);
            match &rule.when {
                When::Always => always.push(rule),
                When::Globs(globs) => {
                    let mut set = globset::GlobSetBuilder::new();
                    for g in globs {
                        // `*.py` matches at any depth, as in Cursor.
                        let g = if g.contains('/') { g.clone() } else { format!("**/{g}") };
                        match globset::GlobBuilder::new(&g).literal_separator(true).build() {
                            Ok(glob) => {
                                set.add(glob);
                            }
                            Err(e) => tracing::warn!(rule = %rule.name, glob = %g, "a rule's glob is not valid: {e}"),
                        }
                    }
                    match set.build() {
                        Ok(set) => {
                            rules.matchers.push(set);
                            rules.globbed.push(rule);
                        }
                        Err(e) => tracing::warn!(rule = %rule.name, "a rule's globs are not valid: {e}"),
                    }
                }
                When::OnRequest => rules.on_request.push(rule),
            }
        }
        let mut used = 0;
        for rule in always {
            if used + rule.text.len() > cap {
                tracing::warn!(rule = %rule.name, bytes = rule.text.len(), cap, "a rules file is left out: over the cap");
                rules.dropped.push((rule.name, rule.text.len()));
                continue;
            }
            used += rule.text.len();
            rules.always.push(rule);
        }
        rules
    }

    /// Whether there are none at all.
    pub fn is_empty(&self) -> bool {
        self.always.is_empty() && self.globbed.is_empty() && self.on_request.is_empty()
    }

    /// The system prompt's part: the always-rules, then the rules the model may fetch.
    pub fn prompt(&self) -> Option<String> {
        if self.always.is_empty() && self.on_request.is_empty() {
            return None;
        }
        let mut out = String::new();
        if !self.always.is_empty() {
            out.push_str(
                "Project rules (from the repository's rules files; where they disagree, a later one — \
                 nearer the working directory — wins):\n",
            );
            for r in &self.always {
                out.push_str(&format!("\n<rule name=\"{}\">\n{}\n</rule>\n", r.name, r.text.trim_end()));
            }
        }
        if !self.on_request.is_empty() {
            out.push_str("\nMore project rules, fetched by name with fetch_rule when they concern the task:\n");
            for r in &self.on_request {
                let what = r.description.as_deref().unwrap_or("(no description)");
                out.push_str(&format!("- {}: {what}\n", r.name));
            }
        }
        Some(out)
    }

    /// The glob rules matching `path` (workspace-relative).
    pub fn matching(&self, path: &str) -> Vec<&Rule> {
        let path = path.trim_start_matches("./");
        self.globbed.iter().zip(&self.matchers).filter(|(_, m)| m.is_match(path)).map(|(r, _)| r).collect()
    }

    /// A rule by name, for `fetch_rule` (any rule: the model may ask for a glob rule too).
    pub fn get(&self, name: &str) -> Option<&Rule> {
        self.always.iter().chain(&self.globbed).chain(&self.on_request).find(|r| r.name == name)
    }

    /// What would apply to a session working on `path`, and why: `(rule, reason)`.
    pub fn explain(&self, path: Option<&str>) -> Vec<(&Rule, String)> {
        let mut out: Vec<(&Rule, String)> = self
            .always
            .iter()
            .map(|r| {
                let why = match r.name.as_str() {
                    "~/AGENTS.md" => "the user's own rules, first".to_owned(),
                    ".cursorrules" => "legacy .cursorrules: always".to_owned(),
                    n if n.ends_with("AGENTS.md") || n.ends_with("CLAUDE.md") => {
                        "on the way from the repository root to the working directory".to_owned()
                    }
                    _ => "alwaysApply".to_owned(),
                };
                (r, why)
            })
            .collect();
        if let Some(p) = path {
            for r in self.matching(p) {
                let When::Globs(globs) = &r.when else { continue };
                out.push((r, format!("{p} matches {}", globs.join(", "))));
            }
        }
        for r in &self.on_request {
            out.push((r, "listed for the model to fetch by its description".to_owned()));
        }
        out
    }
}

/// A file's text when it exists, is not too big, is text and is not blank.
fn read_text(path: &Path) -> Option<String> {
    let meta = std::fs::metadata(path).ok()?;
    if !meta.is_file() || meta.len() > MAX_FILE {
        return None;
    }
    let text = String::from_utf8(std::fs::read(path).ok()?).ok()?;
    (!text.trim().is_empty()).then_some(text)
}

/// `root`, then each directory down to `cwd` (just `root` when `cwd` is not inside it).
fn dirs_down(root: &Path, cwd: &Path) -> Vec<PathBuf> {
    let mut dirs = vec![root.to_path_buf()];
    if let Ok(rel) = cwd.strip_prefix(root) {
        let mut dir = root.to_path_buf();
        for part in rel.components() {
            dir.push(part);
            dirs.push(dir.clone());
        }
    }
    dirs
}

/// Files with these extensions under `dir`, at any depth (no links followed).
fn collect(dir: &Path, exts: &[&str], out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        let Ok(kind) = e.file_type() else { continue };
        let path = e.path();
        if kind.is_dir() {
            collect(&path, exts, out);
        } else if kind.is_file() && path.extension().and_then(|x| x.to_str()).is_some_and(|x| exts.contains(&x)) {
            out.push(path);
        }
    }
}

/// A rules file's front matter (`---` … `---`: `description`, `globs`, `alwaysApply`) and
/// body. Without front matter, or with neither globs nor `alwaysApply`, a rule with a
/// description is fetched on request and one without is always applied (as `.md` rules
/// without front matter are meant).
pub fn parse_rule(name: String, raw: &str) -> Rule {
    let (front, body) = split_front_matter(raw);
    let (mut description, mut globs, mut always) = (None, Vec::new(), false);
    let mut in_globs_list = false;
    for line in front.lines() {
        let trimmed = line.trim();
        if in_globs_list {
            if let Some(item) = trimmed.strip_prefix("- ") {
                globs.push(unquote(item).to_owned());
                continue;
            }
            in_globs_list = false;
        }
        let Some((key, value)) = trimmed.split_once(':') else { continue };
        let value = value.trim();
        match key.trim() {
            "description" if !value.is_empty() => description = Some(unquote(value).to_owned()),
            "globs" => {
                if value.is_empty() {
                    in_globs_list = true;
                } else {
                    let list = unquote(value).trim_start_matches('[').trim_end_matches(']');
                    globs.extend(list.split(',').map(|g| unquote(g.trim()).to_owned()).filter(|g| !g.is_empty()));
                }
            }
            "alwaysApply" => always = value.eq_ignore_ascii_case("true"),
            _ => {}
        }
    }
    let when = if always {
        When::Always
    } else if !globs.is_empty() {
        When::Globs(globs)
    } else if description.is_some() {
        When::OnRequest
    } else {
        When::Always
    };
    Rule { name, description, when, text: body.trim().to_owned() }
}

#[cfg(test)]
mod tests;
