//! The tokens `caret login` keeps for team servers: `$CARET_HOME/credentials.json`, written
//! with mode 0600, one per server URL. Every client that names a server and no token uses the
//! one kept for it (the command line, `caret lsp`, `caret ui`, `caret mcp serve`). A sign-in's
//! access token is short-lived: once it is (nearly) spent, its refresh token buys the next pair,
//! under a lock so that two clients at once do not both spend the same refresh token (which
//! the server would take for a theft and revoke the sign-in).

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
    /// A sign-in's refresh token: buys the next access token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refresh_token: Option<String>,
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

fn now_ms() -> i64 {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis());
    i64::try_from(now).unwrap_or(i64::MAX)
}

/// An access token this close to its end is refreshed first.
const REFRESH_BEFORE_MS: i64 = 60_000;

/// The token kept for `server`, while it has not expired; a sign-in's is refreshed when it
/// (nearly) has. A refresh that fails leaves the kept token as it was.
pub fn token_for(home: &Path, server: &str) -> Option<String> {
    let now = now_ms();
    let saved = load(home).remove(&key(server))?;
    if saved.expires_at.is_none_or(|e| e > now + REFRESH_BEFORE_MS) || saved.refresh_token.is_none() {
        return saved.expires_at.is_none_or(|e| e > now).then_some(saved.token);
    }
    match refreshed(home, server) {
        Ok(token) => Some(token),
        Err(e) => {
            eprintln!(
                "caret: refreshing the sign-in for {server}: {e:#} (sign in again: caret login --server {server})"
            );
            saved.expires_at.is_some_and(|e| e > now).then_some(saved.token)
        }
    }
}

/// Refreshes the sign-in kept for `server` under the credentials' lock; another client that
/// refreshed meanwhile leaves a live token to take instead.
fn refreshed(home: &Path, server: &str) -> anyhow::Result<String> {
    std::fs::create_dir_all(home)?;
    let lock =
        std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(home.join("credentials.lock"))?;
    lock.lock()?;
    let saved = load(home).remove(&key(server)).context("the sign-in is no longer kept")?;
    if saved.expires_at.is_none_or(|e| e > now_ms() + REFRESH_BEFORE_MS) {
        return Ok(saved.token);
    }
    let refresh = saved.refresh_token.clone().context("no refresh token")?;
    let url = format!("{}/v1/auth/token", key(server));
    // Its own thread: the blocking client must not run on an async runtime's thread.
    let answer = std::thread::spawn(move || -> anyhow::Result<caret_protocol::auth::TokenResponse> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = reqwest::blocking::Client::builder().timeout(std::time::Duration::from_secs(15)).build()?;
        let r =
            client.post(url).form(&[("grant_type", "refresh_token"), ("refresh_token", refresh.as_str())]).send()?;
        let status = r.status();
        let body = r.text()?;
        if !status.is_success() {
            let why: Option<caret_protocol::auth::OAuthError> = serde_json::from_str(&body).ok();
            anyhow::bail!("{status}: {}", why.map_or(body, |w| w.error_description));
        }
        Ok(serde_json::from_str(&body)?)
    })
    .join()
    .map_err(|_| anyhow::anyhow!("the refresh panicked"))??;
    let next = Saved {
        token: answer.access_token.clone(),
        expires_at: Some(now_ms() + answer.expires_in * 1000),
        refresh_token: answer.refresh_token,
        ..saved
    };
    save(home, server, next)?;
    Ok(answer.access_token)
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
            refresh_token: None,
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
