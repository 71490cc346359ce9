//! Skills in the open Agent Skills format: a folder with a `SKILL.md` (front matter `name` and
//! `description`, then the instructions) and whatever files it needs. Found in the places a
//! front end names (the project's `.caret/skills`, `.claude/skills`, `.agents/skills`, then the
//! user's); only each skill's name and a description cut to a budget go into the system
//! prompt, and the model loads a skill's instructions and its list of files on demand with
//! `load_skill`. A skill's scripts run through the terminal tool like any command.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::{Value, json};

use crate::front_matter;
use crate::tools::{Ctx, Spec, Tool, ToolError, ToolResult};

/// Room a skills list may take in the system prompt (bytes).
pub const PROMPT_BUDGET: usize = 2000;
/// Largest `SKILL.md` read.
const MAX_SKILL_BYTES: u64 = 256 * 1024;
/// Files of a skill listed when it loads.
const MAX_LISTED: usize = 200;

/// A skill.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skill {
    /// Its name (lower-case letters, digits and `-`).
    pub name: String,
    /// What it is for, and when to use it.
    pub description: String,
    /// Its folder.
    pub dir: PathBuf,
    /// Where it was found, as listings name it (`.claude/skills`, `$CARET_HOME/skills`).
    pub source: String,
}

/// A skill folder left out, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skipped {
    /// The folder.
    pub dir: PathBuf,
    /// Why.
    pub why: String,
}

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-')
}

/// Reads the skill in `dir` (`SKILL.md`).
pub fn read(dir: &Path, source: &str) -> Result<Skill, String> {
    let file = dir.join("SKILL.md");
    let meta = std::fs::metadata(&file).map_err(|_| "no SKILL.md".to_owned())?;
    if meta.len() > MAX_SKILL_BYTES {
        return Err(format!("SKILL.md is over {} KiB", MAX_SKILL_BYTES / 1024));
    }
    let text = std::fs::read_to_string(&file).map_err(|e| format!("SKILL.md: {e}"))?;
    let (front, _) = front_matter::split(&text);
    if front.is_empty() {
        return Err("SKILL.md has no front matter (`---`, `name:`, `description:`, `---`)".into());
    }
    let fields = front_matter::fields(front);
    let name = front_matter::get(&fields, "name").map(front_matter::Value::text).unwrap_or_default();
    let description = front_matter::get(&fields, "description").map(front_matter::Value::text).unwrap_or_default();
    if !valid_name(&name) {
        return Err(format!("its name {name:?} is not lower-case letters, digits and `-` (at most 64)"));
    }
    if description.trim().is_empty() {
        return Err("it has no description".into());
    }
    Ok(Skill { name, description: description.trim().to_owned(), dir: dir.to_path_buf(), source: source.to_owned() })
}

/// The skills in `places` (folders holding skill folders, each with how listings name it), the
/// first place's first: a name found again later is left out.
pub fn discover(places: &[(PathBuf, String)]) -> (Vec<Skill>, Vec<Skipped>) {
    let mut skills: Vec<Skill> = Vec::new();
    let mut skipped = Vec::new();
    for (place, source) in places {
        let Ok(entries) = std::fs::read_dir(place) else { continue };
        let mut dirs: Vec<PathBuf> = entries.flatten().map(|e| e.path()).filter(|p| p.is_dir()).collect();
        dirs.sort();
        for dir in dirs {
            match read(&dir, source) {
                Ok(s) if skills.iter().any(|k| k.name == s.name) => {
                    skipped.push(Skipped { dir, why: format!("a skill named {} was found before", s.name) });
                }
                Ok(s) => skills.push(s),
                Err(why) => skipped.push(Skipped { dir, why }),
            }
        }
    }
    (skills, skipped)
}

/// The skills as the system prompt lists them: names and descriptions, each description cut
/// so that the list stays within `budget` bytes (names alone past that, then a count).
pub fn prompt(skills: &[Skill], budget: usize) -> String {
    if skills.is_empty() {
        return String::new();
    }
    let head = "Skills (instructions for particular tasks; call load_skill with a name before doing such a task):\n";
    let room = budget.saturating_sub(head.len());
    let names: usize = skills.iter().map(|s| s.name.len() + 3).sum();
    let per = room.saturating_sub(names) / skills.len();
    let mut out = head.to_owned();
    for (i, s) in skills.iter().enumerate() {
        let mut line = format!("- {}", s.name);
        if per >= 12 {
            let mut d: String = s.description.split_whitespace().collect::<Vec<_>>().join(" ");
            if d.len() + 2 > per {
                let mut cut = per.saturating_sub(5);
                while !d.is_char_boundary(cut) {
                    cut -= 1;
                }
                d.truncate(cut);
                d.push('…');
            }
            line.push_str(&format!(": {d}"));
        }
        if out.len() + line.len() + 1 > budget {
            out.push_str(&format!("- … and {} more (load_skill names them)\n", skills.len() - i));
            break;
        }
        out.push_str(&line);
        out.push('\n');
    }
    out
}

/// `load_skill`: a skill's instructions and the list of its files.
pub struct LoadSkill {
    skills: Arc<Vec<Skill>>,
    spec: Spec,
}

impl LoadSkill {
    /// The tool over `skills`.
    pub fn new(skills: Arc<Vec<Skill>>) -> LoadSkill {
        let spec = Spec {
            name: "load_skill",
            description: "Loads a skill listed in the system prompt: its instructions and the files it comes with \
                          (read them with read_file when inside the workspace; run its scripts with \
                          run_terminal_cmd). Call it before a task the skill is for.",
            parameters: json!({
                "type": "object",
                "properties": {"name": {"type": "string", "description": "The skill's name as listed"}},
                "required": ["name"]
            }),
            read_only: true,
        };
        LoadSkill { skills, spec }
    }
}

#[async_trait::async_trait]
impl Tool for LoadSkill {
    fn spec(&self) -> &Spec {
        &self.spec
    }

    async fn call(&self, args: Value, ctx: &Ctx) -> ToolResult {
        let name = args.get("name").and_then(Value::as_str).unwrap_or_default();
        let Some(skill) = self.skills.iter().find(|s| s.name == name) else {
            let known: Vec<&str> = self.skills.iter().map(|s| s.name.as_str()).collect();
            return Err(ToolError(format!("no skill {name:?} (there are: {})", known.join(", "))));
        };
        let text = std::fs::read_to_string(skill.dir.join("SKILL.md"))
            .map_err(|e| ToolError(format!("reading the skill {name}: {e}")))?;
        let (_, body) = front_matter::split(&text);
        let shown = |p: &Path| match p.strip_prefix(&ctx.root) {
            Ok(rel) => rel.display().to_string(),
            Err(_) => p.display().to_string(),
        };
        let mut files = Vec::new();
        for entry in ignore::WalkBuilder::new(&skill.dir).hidden(false).build().flatten().skip(1) {
            if entry.file_type().is_some_and(|t| t.is_file()) && entry.path() != skill.dir.join("SKILL.md") {
                files.push(shown(entry.path()));
            }
            if files.len() >= MAX_LISTED {
                files.push("…".into());
                break;
            }
        }
        let mut out = format!("Skill {name} (in {}):\n\n{}", shown(&skill.dir), body.trim());
        if !files.is_empty() {
            out.push_str(&format!("\n\nIts files:\n{}", files.join("\n")));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_skill(root: &Path, place: &str, name: &str, description: &str) {
        let dir = root.join(place).join(name);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("SKILL.md"),
            format!("---\nname: {name}\ndescription: {description}\n---\n# {name}\n\nDo it so.\n"),
        )
        .unwrap();
    }

    #[test]
    fn fifty_skills_stay_within_the_prompt_budget_and_bad_ones_are_named() {
        let dir = caret_test_support::TempDir::new();
        for i in 0..50 {
            let description =
                format!("Use this skill number {i} whenever the task involves widgets of kind {i}, with care.");
            write_skill(dir.path(), ".claude/skills", &format!("widget-{i:02}"), &description);
        }
        write_skill(dir.path(), ".caret/skills", "widget-07", "The project's own, found first.");
        write_skill(dir.path(), ".caret/skills", "Bad_Name", "x");
        std::fs::create_dir_all(dir.path().join(".caret/skills/empty")).unwrap();
        std::fs::write(dir.path().join(".caret/skills/empty/SKILL.md"), "no front matter").unwrap();
        let places = [
            (dir.path().join(".caret/skills"), ".caret/skills".to_owned()),
            (dir.path().join(".claude/skills"), ".claude/skills".to_owned()),
        ];
        let (skills, skipped) = discover(&places);
        assert_eq!(skills.len(), 50);
        assert_eq!(skills.iter().find(|s| s.name == "widget-07").unwrap().source, ".caret/skills");
        assert_eq!(skipped.len(), 3, "{skipped:?}");
        let listed = prompt(&skills, PROMPT_BUDGET);
        assert!(listed.len() <= PROMPT_BUDGET, "{} bytes", listed.len());
        assert!(listed.contains("- widget-49") && listed.contains("- widget-07: The project"), "{listed}");
    }

    #[tokio::test]
    async fn a_skill_loads_its_instructions_and_files_on_demand() {
        let dir = caret_test_support::TempDir::new();
        write_skill(dir.path(), ".agents/skills", "release-notes", "Writes release notes from the git log.");
        dir.write(".agents/skills/release-notes/scripts/collect.sh", "git log --oneline\n");
        let (skills, _) = discover(&[(dir.path().join(".agents/skills"), ".agents/skills".into())]);
        let tool = LoadSkill::new(Arc::new(skills));
        let ctx = Ctx::new(dir.path()).unwrap();
        let out = tool.call(json!({"name": "release-notes"}), &ctx).await.unwrap();
        assert!(
            out.starts_with("Skill release-notes (in .agents/skills/release-notes):\n\n# release-notes\n\nDo it so."),
            "{out}"
        );
        assert!(out.ends_with("Its files:\n.agents/skills/release-notes/scripts/collect.sh"), "{out}");
        let err = tool.call(json!({"name": "nope"}), &ctx).await.unwrap_err();
        assert!(err.to_string().contains("there are: release-notes"), "{err}");
    }
}
