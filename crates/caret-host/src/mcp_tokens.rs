//! Where `caret mcp login` keeps a remote MCP server's OAuth tokens:
//! `$CARET_HOME/mcp-oauth/NAME.sealed`, encrypted (XChaCha20-Poly1305, `caret_crypto`'s
//! sealer) with a key of its own in `$CARET_HOME/mcp-oauth.key` (mode 0600) and bound to the
//! server's URL, so tokens never open for another server put under the same name. Written
//! through a file renamed into place; never logged.

use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};

use caret_crypto::WorkspaceKey;
use caret_mcp::oauth::{AuthError, CredentialStore, StoredCredentials};

/// One server's tokens.
#[derive(Debug, Clone)]
pub struct TokenStore {
    file: PathBuf,
    key_file: PathBuf,
    label: String,
}

impl TokenStore {
    /// The store of server `name` at `url`, under `home`.
    pub fn new(home: &Path, name: &str, url: &str) -> TokenStore {
        TokenStore {
            file: home.join("mcp-oauth").join(format!("{name}.sealed")),
            key_file: home.join("mcp-oauth.key"),
            label: format!("mcp-oauth/{name}/{url}"),
        }
    }

    /// Forgets server `name`'s tokens (whatever its URL); whether there were any.
    pub fn remove(home: &Path, name: &str) -> std::io::Result<bool> {
        match std::fs::remove_file(home.join("mcp-oauth").join(format!("{name}.sealed"))) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Whether tokens were stored (`caret mcp login` ran).
    pub fn exists(&self) -> bool {
        self.file.exists()
    }

    /// The key, made on first use.
    fn key(&self) -> Result<WorkspaceKey, AuthError> {
        let fail = |e: caret_crypto::Error| AuthError::InternalError(format!("the MCP token key: {e}"));
        if !self.key_file.exists() {
            match WorkspaceKey::generate().map_err(fail)?.save_new(&self.key_file) {
                // Another process made it first: use theirs.
                Ok(()) | Err(caret_crypto::Error::Io { .. }) => {}
                Err(e) => return Err(fail(e)),
            }
        }
        WorkspaceKey::load(&self.key_file).map_err(fail)
    }

    fn read(&self) -> Result<Option<StoredCredentials>, AuthError> {
        let sealed = match std::fs::read(&self.file) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(AuthError::InternalError(format!("reading {}: {e}", self.file.display()))),
        };
        // Tokens sealed for another URL (or a damaged file) are as good as none: log in again.
        let Ok(plain) = self.key()?.sealer("mcp-oauth").open(&self.label, &sealed) else {
            tracing::warn!("{} does not open for this server: log in again", self.file.display());
            return Ok(None);
        };
        Ok(serde_json::from_slice(&plain).ok())
    }
}

#[async_trait::async_trait]
impl CredentialStore for TokenStore {
    async fn load(&self) -> Result<Option<StoredCredentials>, AuthError> {
        self.read()
    }

    async fn save(&self, credentials: StoredCredentials) -> Result<(), AuthError> {
        let fail = |what: &str, e: &dyn std::fmt::Display| AuthError::InternalError(format!("{what}: {e}"));
        let plain = serde_json::to_vec(&credentials).map_err(|e| fail("encoding the tokens", &e))?;
        let sealed = self.key()?.sealer("mcp-oauth").seal(&self.label, &plain).map_err(|e| fail("sealing", &e))?;
        let dir = self.file.parent().unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir).map_err(|e| fail("creating the token directory", &e))?;
        let tmp = self.file.with_extension("sealed.tmp");
        let write = || -> std::io::Result<()> {
            use std::io::Write as _;
            let mut f = std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(&tmp)?;
            f.write_all(&sealed)?;
            f.sync_all()?;
            std::fs::rename(&tmp, &self.file)
        };
        write().map_err(|e| fail(&format!("writing {}", self.file.display()), &e))
    }

    async fn clear(&self) -> Result<(), AuthError> {
        match std::fs::remove_file(&self.file) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(AuthError::InternalError(format!("removing {}: {e}", self.file.display()))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn tokens_are_sealed_and_bound_to_the_servers_url() {
        let home = tempfile::tempdir().unwrap();
        let store = TokenStore::new(home.path(), "tracker", "https://a.example/mcp");
        assert!(store.load().await.unwrap().is_none() && !store.exists());
        let creds = StoredCredentials::new("client-1".into(), None, vec!["read".into()], Some(7));
        store.save(creds).await.unwrap();
        let on_disk = std::fs::read(home.path().join("mcp-oauth/tracker.sealed")).unwrap();
        assert!(!String::from_utf8_lossy(&on_disk).contains("client-1"), "sealed, not plain");
        let back = store.load().await.unwrap().unwrap();
        assert_eq!((back.client_id.as_str(), back.granted_scopes.as_slice()), ("client-1", &["read".to_owned()][..]));
        // The same name at another URL: nothing to use.
        let moved = TokenStore::new(home.path(), "tracker", "https://b.example/mcp");
        assert!(moved.load().await.unwrap().is_none());
        store.clear().await.unwrap();
        assert!(store.load().await.unwrap().is_none());
    }
}
