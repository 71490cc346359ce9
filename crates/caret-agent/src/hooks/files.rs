//! Hook files in their own formats: Caret's `.caret/hooks.json` and Claude Code's settings
//! (`.claude/settings.json`, `settings.local.json`, `~/.claude/settings.json`: a `hooks`
//! object of events, each a list of `{matcher, hooks: [{type: "command", command,
//! timeout}]}`), and Cursor's `.cursor/hooks.json` (`{version: 1, hooks: {event: [{command,
//! matcher?, timeout?}]}}`, its own event names). What a file holds that Caret cannot run is a
//! [`Problem`], never a failure: the rest of the file still applies.

use std::time::Duration;

use serde_json::Value;

use super::model::{Dialect, Hook, HookEvent, Problem, Tools};

/// Longest a hook may run unless its file says (Claude Code's default).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);
/// Longest a file may set.
const MAX_TIMEOUT: Duration = Duration::from_secs(600);

/// A project's hook files, where each agent keeps them: (path from the root, format).
pub const PROJECT: &[(&str, Dialect)] = &[
    (".caret/hooks.json", Dialect::Caret),
    (".claude/settings.json", Dialect::Claude),
    (".claude/settings.local.json", Dialect::Claude),
    (".cursor/hooks.json", Dialect::Cursor),
];

/// The hooks of a file of `dialect` (`source`: how events and listings name it).
pub fn parse(text: &str, source: &str, dialect: Dialect) -> (Vec<Hook>, Vec<Problem>) {
    match dialect {
        Dialect::Cursor => parse_cursor(text, source),
        _ => parse_claude(text, source, dialect),
    }
}

/// The hooks of the project at `root` (every file of [`PROJECT`] there), and what was left out.
pub fn project(root: &std::path::Path) -> (Vec<Hook>, Vec<Problem>) {
    let (mut hooks, mut problems) = (Vec::new(), Vec::new());
    for (rel, dialect) in PROJECT {
        let Ok(text) = std::fs::read_to_string(root.join(rel)) else { continue };
        let (h, p) = parse(&text, rel, *dialect);
        hooks.extend(h);
        problems.extend(p);
    }
    (hooks, problems)
}

/// The hooks of a file in Caret's or Claude Code's format (`dialect` says which names its
/// matchers and payloads use); a settings file without `hooks` has none.
pub fn parse_claude(text: &str, source: &str, dialect: Dialect) -> (Vec<Hook>, Vec<Problem>) {
    let mut problems = Vec::new();
    let mut hooks = Vec::new();
    let root: Value = match serde_json::from_str(text) {
        Ok(v) => v,
        Err(e) => return (hooks, vec![Problem::new(source, format!("not JSON: {e}"))]),
    };
    let Some(events) = root.get("hooks") else { return (hooks, problems) };
    let Some(events) = events.as_object() else {
        return (hooks, vec![Problem::new(source, "`hooks` is not an object of events")]);
    };
    for (name, groups) in events {
        let Some(event) = HookEvent::parse(name) else {
            problems.push(Problem::new(source, format!("unknown event {name:?} (left out)")));
            continue;
        };
        let Some(groups) = groups.as_array() else {
            problems.push(Problem::new(source, format!("{name}: not a list of matchers")));
            continue;
        };
        for group in groups {
            let matcher = match matcher_of(group, name, source) {
                Ok(m) => m,
                Err(p) => {
                    problems.push(p);
                    continue;
                }
            };
            let Some(list) = group.get("hooks").and_then(Value::as_array) else {
                problems.push(Problem::new(source, format!("{name}: a matcher without `hooks`")));
                continue;
            };
            for h in list {
                match command_of(h, name, source) {
                    Ok((command, timeout)) => hooks.push(Hook {
                        event,
                        native: name.clone(),
                        matcher: matcher.clone(),
                        tools: Tools::Any,
                        command,
                        timeout,
                        dialect,
                        source: source.to_owned(),
                    }),
                    Err(p) => problems.push(p),
                }
            }
        }
    }
    (hooks, problems)
}

/// An entry's `matcher`: a pattern of whole tool names (none, `""` or `*`: every tool).
fn matcher_of(entry: &Value, event: &str, source: &str) -> Result<Option<regex::Regex>, Problem> {
    match entry.get("matcher").and_then(Value::as_str) {
        None | Some("" | "*") => Ok(None),
        Some(m) => regex::Regex::new(&format!("^(?:{m})$"))
            .map(Some)
            .map_err(|e| Problem::new(source, format!("{event}: matcher {m:?} is not a pattern: {e}"))),
    }
}

/// A hook entry's command and timeout (`type` absent or `command`).
fn command_of(h: &Value, event: &str, source: &str) -> Result<(String, Duration), Problem> {
    match h.get("type").and_then(Value::as_str) {
        None | Some("command") => {}
        Some(other) => {
            return Err(Problem::new(
                source,
                format!("{event}: a {other:?} hook is not run by Caret (command hooks are)"),
            ));
        }
    }
    let command = h.get("command").and_then(Value::as_str).map(str::trim).filter(|c| !c.is_empty());
    let Some(command) = command else {
        return Err(Problem::new(source, format!("{event}: a hook without a command")));
    };
    let timeout = match h.get("timeout") {
        None => DEFAULT_TIMEOUT,
        Some(t) => match t.as_f64().filter(|s| *s > 0.0) {
            Some(s) => Duration::from_secs_f64(s).min(MAX_TIMEOUT),
            None => return Err(Problem::new(source, format!("{event}: timeout {t} is not a number of seconds"))),
        },
    };
    Ok((command.to_owned(), timeout))
}

/// Cursor's events: the Caret event each runs at and the tools it is about.
fn cursor_event(name: &str) -> Option<Option<(HookEvent, Tools)>> {
    Some(Some(match name {
        "beforeShellExecution" => (HookEvent::PreToolUse, Tools::Terminal),
        "beforeMCPExecution" => (HookEvent::PreToolUse, Tools::Mcp),
        "beforeReadFile" => (HookEvent::PreToolUse, Tools::Read),
        "preToolUse" => (HookEvent::PreToolUse, Tools::Any),
        "afterShellExecution" => (HookEvent::PostToolUse, Tools::Terminal),
        "afterMCPExecution" => (HookEvent::PostToolUse, Tools::Mcp),
        "afterFileEdit" => (HookEvent::PostToolUse, Tools::Edits),
        "postToolUse" => (HookEvent::PostToolUse, Tools::Any),
        "beforeSubmitPrompt" => (HookEvent::UserPromptSubmit, Tools::Any),
        "stop" => (HookEvent::Stop, Tools::Any),
        "subagentStop" => (HookEvent::SubagentStop, Tools::Any),
        "sessionStart" => (HookEvent::SessionStart, Tools::Any),
        "sessionEnd" => (HookEvent::SessionEnd, Tools::Any),
        "preCompact" => (HookEvent::PreCompact, Tools::Any),
        // Cursor's own, about things Caret does not have (Tab, thinking blocks).
        "afterAgentResponse" | "afterAgentThought" | "beforeTabFileRead" | "afterTabFileEdit" => return Some(None),
        _ => return None,
    }))
}

/// The hooks of a Cursor `hooks.json`.
pub fn parse_cursor(text: &str, source: &str) -> (Vec<Hook>, Vec<Problem>) {
    let mut problems = Vec::new();
    let mut hooks = Vec::new();
    let root: Value = match serde_json::from_str(text) {
        Ok(v) => v,
        Err(e) => return (hooks, vec![Problem::new(source, format!("not JSON: {e}"))]),
    };
    match root.get("version").and_then(Value::as_u64) {
        Some(1) => {}
        other => problems.push(Problem::new(source, format!("version {other:?}: read as version 1"))),
    }
    let Some(events) = root.get("hooks").and_then(Value::as_object) else {
        problems.push(Problem::new(source, "no `hooks` object"));
        return (hooks, problems);
    };
    for (name, list) in events {
        let (event, tools) = match cursor_event(name) {
            Some(Some(found)) => found,
            Some(None) => {
                problems.push(Problem::new(source, format!("{name} is Cursor's own and is not run by Caret")));
                continue;
            }
            None => {
                problems.push(Problem::new(source, format!("unknown event {name:?} (left out)")));
                continue;
            }
        };
        let Some(list) = list.as_array() else {
            problems.push(Problem::new(source, format!("{name}: not a list of hooks")));
            continue;
        };
        for h in list {
            let matcher = match matcher_of(h, name, source) {
                Ok(m) => m,
                Err(p) => {
                    problems.push(p);
                    continue;
                }
            };
            match command_of(h, name, source) {
                Ok((command, timeout)) => hooks.push(Hook {
                    event,
                    native: name.clone(),
                    matcher,
                    tools,
                    command,
                    timeout,
                    dialect: Dialect::Cursor,
                    source: source.to_owned(),
                }),
                Err(p) => problems.push(p),
            }
        }
    }
    (hooks, problems)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claude_codes_settings_as_it_writes_them() {
        let text = r#"{
          "permissions": {"allow": ["Bash(npm run lint)"]},
          "hooks": {
            "PreToolUse": [
              {"matcher": "Bash", "hooks": [{"type": "command", "command": "\"$CLAUDE_PROJECT_DIR\"/.claude/hooks/check.sh"}]},
              {"matcher": "Edit|Write", "hooks": [{"type": "command", "command": "python3 fmt.py", "timeout": 5}]}
            ],
            "Stop": [{"hooks": [{"type": "command", "command": "./gate.sh"}]}],
            "Notification": [{"hooks": [{"type": "command", "command": "notify-send hi"}]}],
            "PreToolUse2": []
          }
        }"#;
        let (hooks, problems) = parse_claude(text, ".claude/settings.json", Dialect::Claude);
        assert_eq!(hooks.len(), 4, "{problems:?}");
        let pre: Vec<&Hook> = hooks.iter().filter(|h| h.event == HookEvent::PreToolUse).collect();
        let bash = pre[0].matcher.as_ref().unwrap();
        assert!(bash.is_match("Bash") && !bash.is_match("Bashful"), "a matcher matches whole names");
        assert_eq!((pre[1].timeout, pre[0].timeout), (Duration::from_secs(5), DEFAULT_TIMEOUT));
        let stop = hooks.iter().find(|h| h.event == HookEvent::Stop).unwrap();
        assert!(stop.matcher.is_none() && stop.dialect == Dialect::Claude);
        assert!(hooks.iter().any(|h| h.event == HookEvent::Notification));
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].message.contains("PreToolUse2"));
    }

    #[test]
    fn malformed_files_are_problems_not_failures() {
        for bad in ["{", "[]", r#"{"hooks": 3}"#] {
            let (hooks, problems) = parse_claude(bad, "x.json", Dialect::Caret);
            assert!(hooks.is_empty() && (bad == "[]" || !problems.is_empty()), "{bad}: {problems:?}");
        }
        let text = r#"{"hooks": {"PreToolUse": [{"matcher": "(", "hooks": [{"command": "x"}]},
            {"hooks": [{"type": "prompt", "prompt": "is it ok?"}, {"command": ""}, {"command": "ok", "timeout": "soon"}]}]}}"#;
        let (hooks, problems) = parse_claude(text, "x.json", Dialect::Caret);
        assert!(hooks.is_empty());
        assert_eq!(problems.len(), 4, "{problems:?}");
    }

    #[test]
    fn cursors_hooks_json_with_its_own_events() {
        let text = r#"{"version": 1, "hooks": {
            "beforeShellExecution": [{"command": "./hooks/guard.sh"}],
            "afterFileEdit": [{"command": "./hooks/format.sh"}],
            "preToolUse": [{"command": "./hooks/any.sh", "matcher": "Write"}],
            "afterAgentThought": [{"command": "./hooks/think.sh"}],
            "beforeTeleport": [{"command": "x"}]
        }}"#;
        let (hooks, problems) = parse_cursor(text, ".cursor/hooks.json");
        assert_eq!(hooks.len(), 3);
        let shell = hooks.iter().find(|h| h.native == "beforeShellExecution").unwrap();
        assert_eq!((shell.event, shell.tools), (HookEvent::PreToolUse, Tools::Terminal));
        assert_eq!(problems.len(), 2, "{problems:?}");
    }
}
