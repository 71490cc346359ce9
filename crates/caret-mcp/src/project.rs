//! The servers a project declares in `.caret/mcp.json` or `.cursor/mcp.json`: `{"mcpServers":
//! {NAME: {"command", "args", "env"} or {"url", "headers"}}}`, the format Cursor and Claude
//! use. Parsing only; who reads the files, and whether their servers start, is the caller's.

use std::collections::BTreeMap;

use serde_json::Value;

/// The files, in order: a name declared in the first wins.
pub const FILES: [&str; 2] = [".caret/mcp.json", ".cursor/mcp.json"];

/// One declared server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Declared {
    /// A program spoken to over stdio.
    Stdio {
        /// The program.
        command: String,
        /// Its arguments.
        args: Vec<String>,
        /// Its environment.
        env: BTreeMap<String, String>,
    },
    /// A remote server.
    Http {
        /// Its URL.
        url: String,
        /// Its headers.
        headers: BTreeMap<String, String>,
    },
}

/// The servers `text` (one file's contents) declares, by name; an entry with neither
/// `command` nor `url` is skipped with a warning naming `file`.
pub fn parse(file: &str, text: &str) -> Result<BTreeMap<String, Declared>, String> {
    let parsed: Value = serde_json::from_str(text).map_err(|e| format!("{file} is not JSON ({e})"))?;
    let strings = |v: &Value| -> BTreeMap<String, String> {
        v.as_object().into_iter().flatten().filter_map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_owned()))).collect()
    };
    let mut out = BTreeMap::new();
    for (name, s) in parsed["mcpServers"].as_object().into_iter().flatten() {
        let declared = match (s["command"].as_str(), s["url"].as_str()) {
            (Some(command), _) => Declared::Stdio {
                command: command.to_owned(),
                args: s["args"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|a| a.as_str().map(str::to_owned))
                    .collect(),
                env: strings(&s["env"]),
            },
            (None, Some(url)) => Declared::Http { url: url.to_owned(), headers: strings(&s["headers"]) },
            (None, None) => {
                tracing::warn!("{file}: MCP server {name} has neither `command` nor `url`");
                continue;
            }
        };
        out.insert(name.clone(), declared);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stdio_and_remote_entries_are_read_and_the_rest_skipped() {
        let text = r#"{"mcpServers": {
            "time": {"command": "python3", "args": ["-m", "mcp_server_time"], "env": {"TZ": "UTC"}},
            "tracker": {"url": "https://mcp.example/mcp", "headers": {"X-Team": "caret"}},
            "odd": {"args": ["x"]}
        }}"#;
        let got = parse(".cursor/mcp.json", text).unwrap();
        assert_eq!(
            got,
            BTreeMap::from([
                (
                    "time".to_owned(),
                    Declared::Stdio {
                        command: "python3".into(),
                        args: vec!["-m".into(), "mcp_server_time".into()],
                        env: BTreeMap::from([("TZ".into(), "UTC".into())]),
                    }
                ),
                (
                    "tracker".to_owned(),
                    Declared::Http {
                        url: "https://mcp.example/mcp".into(),
                        headers: BTreeMap::from([("X-Team".into(), "caret".into())]),
                    }
                ),
            ])
        );
        assert!(parse(".caret/mcp.json", "{not json").unwrap_err().contains(".caret/mcp.json is not JSON"));
    }
}
