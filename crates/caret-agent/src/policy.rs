//! Which commands run, which wait for the user, which are refused.
//!
//! The sandbox bounds what a command can do; the policy decides whether to ask first. A
//! command line is split into its simple commands (at `;`, `&&`, `||`, `|`, newlines, outside
//! quotes), each read as words with leading `VAR=value` assignments skipped. Rules match a
//! command's first words: `deny` refuses the whole line, `ask` asks, `allow` makes it
//! trusted. Then the approval mode: `never` runs what no rule refuses, `always` asks for
//! everything, `risky` (the default) asks when a command is neither allowed by a rule nor
//! approved earlier in the session and looks risky (network, deletion, history rewriting,
//! installs, privilege, process killing).

use serde::{Deserialize, Serialize};

/// When to ask the user.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Approval {
    /// Never ask (only `deny` rules stop a command).
    Never,
    /// Ask for risky commands.
    #[default]
    Risky,
    /// Ask for every command.
    Always,
}

/// What a rule does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    /// Trusted: runs without asking.
    Allow,
    /// Always asks.
    Ask,
    /// Refused.
    Deny,
}

/// A rule: commands starting with `prefix` (words, e.g. `git push`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rule {
    /// The first words.
    pub prefix: String,
    /// What happens.
    pub action: Action,
}

/// The verdict on a command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Run it.
    Run,
    /// Ask the user first; why.
    Ask(String),
    /// Do not run it; why.
    Refuse(String),
}

/// Commands whose first words make them risky.
const RISKY: &[&str] = &[
    "rm",
    "rmdir",
    "shred",
    "dd",
    "mkfs",
    "chmod -R",
    "chown",
    "sudo",
    "su",
    "doas",
    "kill",
    "pkill",
    "killall",
    "curl",
    "wget",
    "ssh",
    "scp",
    "rsync",
    "nc",
    "ncat",
    "git push",
    "git reset --hard",
    "git clean",
    "git checkout --",
    "git rebase",
    "git filter-branch",
    "pip install",
    "pip3 install",
    "npm install",
    "npm publish",
    "yarn add",
    "cargo install",
    "cargo publish",
    "apt",
    "apt-get",
    "docker",
    "reboot",
    "shutdown",
];

/// The policy of a session.
#[derive(Debug, Clone, Default)]
pub struct Policy {
    /// When to ask.
    pub approval: Approval,
    /// Rules, first match wins within each action (deny before ask before allow).
    pub rules: Vec<Rule>,
    /// Command prefixes the user approved for the rest of the session.
    pub approved: Vec<String>,
}

/// Splits a command line into simple commands (quote-aware), each as words.
pub fn commands(line: &str) -> Vec<Vec<String>> {
    let (mut out, mut words, mut word) = (Vec::new(), Vec::new(), String::new());
    let mut quote: Option<char> = None;
    let mut chars = line.chars().peekable();
    let end_word = |word: &mut String, words: &mut Vec<String>| {
        if !word.is_empty() {
            words.push(std::mem::take(word));
        }
    };
    while let Some(c) = chars.next() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), '\\') => {
                if let Some(n) = chars.next() {
                    word.push(n);
                }
            }
            (Some(_), c) => word.push(c),
            (None, '\'' | '"') => quote = Some(c),
            (None, '\\') => {
                if let Some(n) = chars.next() {
                    word.push(n);
                }
            }
            (None, ';' | '|' | '&' | '\n' | '(' | ')') => {
                end_word(&mut word, &mut words);
                if !words.is_empty() {
                    out.push(std::mem::take(&mut words));
                }
                // `&&`, `||`: the second character is part of the same separator.
                if matches!(c, '|' | '&') && chars.peek() == Some(&c) {
                    chars.next();
                }
            }
            (None, c) if c.is_whitespace() => end_word(&mut word, &mut words),
            (None, c) => word.push(c),
        }
    }
    end_word(&mut word, &mut words);
    if !words.is_empty() {
        out.push(words);
    }
    // Leading assignments (`FOO=1 cmd`) are not the command.
    for cmd in &mut out {
        let skip = cmd.iter().take_while(|w| w.split_once('=').is_some_and(|(k, _)| is_name(k))).count();
        cmd.drain(..skip.min(cmd.len()));
    }
    out.retain(|c| !c.is_empty());
    out
}

fn is_name(s: &str) -> bool {
    !s.is_empty()
        && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !s.starts_with(|c: char| c.is_ascii_digit())
}

/// Whether `words` start with the words of `prefix`.
fn starts_with(words: &[String], prefix: &str) -> bool {
    let p: Vec<&str> = prefix.split_whitespace().collect();
    !p.is_empty()
        && words.len() >= p.len()
        && words.iter().zip(&p).enumerate().all(|(i, (w, p))| if i == 0 { base(w) == *p } else { w == p })
}

/// A program's name without its directory (`/bin/rm` → `rm`).
fn base(word: &str) -> &str {
    word.rsplit('/').next().unwrap_or(word)
}

impl Policy {
    /// The verdict on a command line.
    pub fn check(&self, line: &str) -> Verdict {
        let cmds = commands(line);
        if cmds.is_empty() {
            return Verdict::Refuse("an empty command".into());
        }
        let rule = |words: &[String], action: Action| {
            self.rules.iter().find(|r| r.action == action && starts_with(words, &r.prefix)).map(|r| r.prefix.clone())
        };
        for c in &cmds {
            if let Some(p) = rule(c, Action::Deny) {
                return Verdict::Refuse(format!("`{p}` commands are not allowed here"));
            }
        }
        if self.approval == Approval::Always {
            return Verdict::Ask("every command is confirmed (approval: always)".into());
        }
        for c in &cmds {
            if let Some(p) = rule(c, Action::Ask) {
                return Verdict::Ask(format!("`{p}` commands are confirmed first"));
            }
        }
        if self.approval == Approval::Never {
            return Verdict::Run;
        }
        for c in &cmds {
            let trusted = rule(c, Action::Allow).is_some() || self.approved.iter().any(|a| starts_with(c, a));
            if !trusted && let Some(r) = RISKY.iter().find(|r| starts_with(c, r)) {
                return Verdict::Ask(format!("`{r}` may delete, publish, install or reach the network"));
            }
        }
        Verdict::Run
    }

    /// Remembers the user's approval of `line` for the session: its first command's first
    /// two words (`cargo test`, `rm -rf`) run without asking from now on.
    pub fn approve_for_session(&mut self, line: &str) {
        if let Some(first) = commands(line).first() {
            let prefix = first.iter().take(2).cloned().collect::<Vec<_>>().join(" ");
            if !self.approved.contains(&prefix) {
                self.approved.push(prefix);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(line: &str) -> Vec<Vec<String>> {
        commands(line)
    }

    fn expect(v: &[&[&str]]) -> Vec<Vec<String>> {
        v.iter().map(|c| c.iter().map(|w| (*w).to_owned()).collect()).collect()
    }

    #[test]
    fn command_lines_split_into_commands() {
        assert_eq!(words("cargo test && rm -rf target"), expect(&[&["cargo", "test"], &["rm", "-rf", "target"]]));
        assert_eq!(words("echo 'a; rm -rf /' | wc -l"), expect(&[&["echo", "a; rm -rf /"], &["wc", "-l"]]));
        assert_eq!(
            words("RUST_LOG=debug FOO=1 cargo run; (cd x && ls)"),
            expect(&[&["cargo", "run"], &["cd", "x"], &["ls"]])
        );
        assert_eq!(words("echo \"x \\\" y\"\nls"), expect(&[&["echo", "x \" y"], &["ls"]]));
    }

    #[test]
    fn rules_and_modes_decide() {
        let mut p = Policy {
            rules: vec![
                Rule { prefix: "git push".into(), action: Action::Deny },
                Rule { prefix: "make deploy".into(), action: Action::Ask },
                Rule { prefix: "rm -rf target".into(), action: Action::Allow },
            ],
            ..Policy::default()
        };
        assert_eq!(p.check("cargo test"), Verdict::Run);
        assert!(matches!(p.check("ls && git push origin main"), Verdict::Refuse(_)));
        assert!(matches!(p.check("make deploy"), Verdict::Ask(_)));
        assert!(matches!(p.check("cargo build | tee log; curl https://x"), Verdict::Ask(r) if r.contains("curl")));
        assert!(matches!(p.check("/bin/rm -f a"), Verdict::Ask(_)), "a path to a risky program is the program");
        assert_eq!(p.check("rm -rf target"), Verdict::Run, "allowed by a rule");
        assert!(matches!(p.check("rm -rf src"), Verdict::Ask(_)));
        p.approve_for_session("rm -rf src");
        assert_eq!(p.check("rm -rf docs"), Verdict::Run, "approved for the session");
        assert!(matches!(p.check("rm other"), Verdict::Ask(_)));
        assert!(matches!(p.check("  "), Verdict::Refuse(_)));
        p.approval = Approval::Always;
        assert!(matches!(p.check("ls"), Verdict::Ask(_)));
        assert!(matches!(p.check("git push"), Verdict::Refuse(_)), "deny wins over every mode");
        p.approval = Approval::Never;
        assert_eq!(p.check("curl https://x"), Verdict::Run);
        assert!(matches!(p.check("make deploy"), Verdict::Ask(_)), "an ask rule asks in every mode");
    }
}
