//! Rules files: nested order, fallbacks, front matter, globs, the cap.

use super::*;
use caret_test_support::TempDir;

fn names(rules: &[Rule]) -> Vec<&str> {
    rules.iter().map(|r| r.name.as_str()).collect()
}

#[test]
fn agents_files_go_from_the_root_down_to_the_working_directory() {
    let dir = TempDir::new();
    dir.write("AGENTS.md", "Run tests with `make check`.\n");
    dir.write("CLAUDE.md", "ignored: this directory has an AGENTS.md\n");
    dir.write("services/CLAUDE.md", "Services use tokio.\n");
    dir.write("services/api/AGENTS.md", "   \n\n"); // blank: skipped
    dir.write("services/api/v2/AGENTS.md", "Use the v2 error type.\n");
    dir.write("elsewhere/AGENTS.md", "not on the way\n");
    let user = dir.write("home/AGENTS.md", "Answer in British English.\n");
    let root = dir.path();
    let rules = ProjectRules::load(root, &root.join("services/api/v2"), Some(&user), DEFAULT_CAP);
    assert_eq!(names(&rules.always), ["~/AGENTS.md", "AGENTS.md", "services/CLAUDE.md", "services/api/v2/AGENTS.md"]);
    let prompt = rules.prompt().unwrap();
    let at = |s: &str| prompt.find(s).unwrap_or_else(|| panic!("{s} missing from {prompt}"));
    assert!(at("British") < at("make check") && at("make check") < at("tokio") && at("tokio") < at("v2 error"));
    assert!(!prompt.contains("ignored") && !prompt.contains("not on the way"));
    // Outside the repository: the root's only.
    let outside = ProjectRules::load(root, Path::new("/"), None, DEFAULT_CAP);
    assert_eq!(names(&outside.always), ["AGENTS.md"]);
    assert!(ProjectRules::load(&root.join("elsewhere/none"), &root.join("x"), None, DEFAULT_CAP).is_empty());
}

#[test]
fn cursor_and_caret_rules_by_their_front_matter() {
    let dir = TempDir::new();
    dir.write(".cursorrules", "Legacy: prefer small functions.\n");
    dir.write(".cursor/rules/style.mdc", "---\ndescription: House style\nalwaysApply: true\n---\nTabs, not spaces.\n");
    dir.write(".cursor/rules/db/sql.mdc", "---\ndescription: SQL\nglobs: \"*.sql, migrations/**\"\nalwaysApply: false\n---\nEvery migration is reversible.\n");
    dir.write(".caret/rules/py.md", "---\nglobs:\n  - \"**/*.py\"\n  - scripts/*.sh\n---\nType-annotate Python.\n");
    dir.write(
        ".caret/rules/deploy.mdc",
        "---\ndescription: How to deploy the service\n---\nUse the blue/green script.\n",
    );
    dir.write(".caret/rules/plain.md", "No front matter: always.\n");
    dir.write(".caret/rules/notes.txt", "not a rules file\n");
    let rules = ProjectRules::load(dir.path(), dir.path(), None, DEFAULT_CAP);
    assert_eq!(names(&rules.always), [".cursorrules", ".caret/rules/plain.md", ".cursor/rules/style.mdc"]);
    assert_eq!(names(&rules.globbed), [".caret/rules/py.md", ".cursor/rules/db/sql.mdc"]);
    assert_eq!(names(&rules.on_request), [".caret/rules/deploy.mdc"]);
    assert_eq!(rules.always[2].text, "Tabs, not spaces.");

    assert_eq!(
        names(&rules.matching("src/app/models.py").into_iter().cloned().collect::<Vec<_>>()),
        [".caret/rules/py.md"]
    );
    assert_eq!(rules.matching("scripts/run.sh").len(), 1);
    assert!(rules.matching("scripts/deep/run.sh").is_empty(), "a glob with a slash is anchored");
    assert_eq!(rules.matching("db/0001_init.sql")[0].name, ".cursor/rules/db/sql.mdc");
    assert_eq!(rules.matching("migrations/2026/a.txt")[0].name, ".cursor/rules/db/sql.mdc");
    assert!(rules.matching("README.md").is_empty());

    let prompt = rules.prompt().unwrap();
    assert!(
        prompt.contains("Tabs, not spaces.") && prompt.contains("- .caret/rules/deploy.mdc: How to deploy the service")
    );
    assert!(!prompt.contains("blue/green") && !prompt.contains("reversible"), "fetched or attached, not always");
    assert_eq!(rules.get(".caret/rules/deploy.mdc").unwrap().text, "Use the blue/green script.");
    let why = rules.explain(Some("db/x.sql"));
    assert!(why.iter().any(|(r, w)| r.name.ends_with("sql.mdc") && w.contains("db/x.sql matches")), "{why:?}");
}

#[test]
fn the_cap_leaves_out_whole_files_and_names_them() {
    let dir = TempDir::new();
    dir.write("AGENTS.md", &"root rule. ".repeat(100));
    dir.write("big/AGENTS.md", &"x".repeat(5000));
    dir.write("big/small/AGENTS.md", "nearest rule\n");
    let rules = ProjectRules::load(dir.path(), &dir.path().join("big/small"), None, 2000);
    assert_eq!(names(&rules.always), ["AGENTS.md", "big/small/AGENTS.md"]);
    assert_eq!(rules.dropped, vec![("big/AGENTS.md".to_owned(), 5000)]);
}

#[test]
fn front_matter_edge_cases() {
    let r = parse_rule("a.mdc".into(), "---\r\ndescription: 'quoted'\r\nglobs: [a.rs, \"b/*.rs\"]\r\n---\r\nbody\r\n");
    assert_eq!(r.description.as_deref(), Some("quoted"));
    assert_eq!(r.when, When::Globs(vec!["a.rs".into(), "b/*.rs".into()]));
    assert_eq!(r.text, "body");
    // An unclosed front matter is all body.
    let r = parse_rule("b.mdc".into(), "---\ndescription: x\nno end\n");
    assert_eq!((r.when, r.description), (When::Always, None));
    let r = parse_rule("c.mdc".into(), "---\nglobs:\nalwaysApply: false\n---\nneither: always\n");
    assert_eq!(r.when, When::Always);
}
