//! The tokens `caret login` keeps for team servers: `$CARET_HOME/credentials.json`, written
//! with mode 0600, one per server URL. Every client that names a server and no token uses the
//! one kept for it (the command line, `caret lsp`, `caret ui`, `caret mcp serve`).

use std::collections::BTreeMap;
use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use serde::{Deserialize, Serialize};

/// A token kept for a server.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Saved {
    /// The bearer token.
    pub token: String,
    /// Who it acts as (an email, or a service account's name).
    pub name: String,
    /// The organisation's name.
    pub organisation: String,
    /// When it stops working, Unix ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<i64>,
}

fn file(home: &Path) -> PathBuf {
    home.join("credentials.json")
}

/// A server URL as it is kept (no trailing `/`).
fn key(server: &str) -> String {
    server.trim().trim_end_matches('/').to_owned()
}

/// Every token kept (none when the file is missing or unreadable: a damaged file is ignored,
/// and the next `caret login` writes a new one).
pub fn load(home: &Path) -> BTreeMap<String, Saved> {
    std::fs::read(file(home)).ok().and_then(|b| serde_json::from_slice(&b).ok()).unwrap_or_default()
}

/// The token kept for `server`, while it has not expired.
pub fn token_for(home: &Path, server: &str) -> Option<String> {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis());
    let now = i64::try_from(now).unwrap_or(i64::MAX);
    load(home).remove(&key(server)).filter(|s| s.expires_at.is_none_or(|e| e > now)).map(|s| s.token)
}

fn write(home: &Path, all: &BTreeMap<String, Saved>) -> anyhow::Result<()> {
    std::fs::create_dir_all(home).with_context(|| format!("creating {}", home.display()))?;
    let path = file(home);
    let tmp = path.with_extension("json.tmp");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .with_context(|| format!("writing {}", tmp.display()))?;
    f.write_all(&serde_json::to_vec_pretty(all)?)?;
    f.sync_all()?;
    std::fs::rename(&tmp, &path).with_context(|| format!("writing {}", path.display()))
}

/// Keeps `saved` for `server` (replacing what was kept).
pub fn save(home: &Path, server: &str, saved: Saved) -> anyhow::Result<()> {
    let mut all = load(home);
    all.insert(key(server), saved);
    write(home, &all)
}

/// Forgets the token kept for `server`; whether there was one.
pub fn remove(home: &Path, server: &str) -> anyhow::Result<bool> {
    let mut all = load(home);
    let had = all.remove(&key(server)).is_some();
    if had {
        write(home, &all)?;
    }
    Ok(had)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;

    #[test]
    fn tokens_are_kept_per_server_privately_and_not_past_their_expiry() {
        let home = tempfile::tempdir().unwrap();
        let saved = |token: &str, expires_at| Saved {
            token: token.into(),
            name: "ada".into(),
            organisation: "acme".into(),
            expires_at,
        };
        save(home.path(), "https://caret.acme.example/", saved("t1", None)).unwrap();
        save(home.path(), "http://127.0.0.1:7878", saved("t2", Some(1))).unwrap();
        assert_eq!(token_for(home.path(), "https://caret.acme.example"), Some("t1".into()));
        assert_eq!(token_for(home.path(), "http://127.0.0.1:7878"), None, "expired");
        assert_eq!(std::fs::metadata(file(home.path())).unwrap().permissions().mode() & 0o777, 0o600);
        assert!(remove(home.path(), "https://caret.acme.example").unwrap());
        assert!(!remove(home.path(), "https://caret.acme.example").unwrap());
        std::fs::write(file(home.path()), "not json").unwrap();
        assert!(load(home.path()).is_empty(), "a damaged file is ignored");
    }
}
