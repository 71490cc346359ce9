//! OAuth 2.1 for remote servers (the MCP authorization spec, through `rmcp`'s client): the
//! server's protected-resource metadata leads to its authorization server, Caret registers
//! itself there (dynamic client registration), and the user authorizes in a browser with
//! PKCE; the code comes back to a one-shot listener on loopback. Tokens go to a
//! [`CredentialStore`] the host provides (it keeps them encrypted) and are refreshed by the
//! transport when they expire. Addresses on private networks are allowed: the user
//! configured (or trusted) the server's URL.

use std::sync::Arc;
use std::time::Duration;

pub use rmcp::transport::auth::{AuthError, CredentialStore, StoredCredentials};
use rmcp::transport::auth::{AuthorizationManager, AuthorizationRequest, OAuthState};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

/// A store shared by a login and the connections that use its tokens.
#[derive(Clone)]
pub(crate) struct Shared(pub(crate) Arc<dyn CredentialStore>);

#[async_trait::async_trait]
impl CredentialStore for Shared {
    async fn load(&self) -> Result<Option<StoredCredentials>, AuthError> {
        self.0.load().await
    }

    async fn save(&self, credentials: StoredCredentials) -> Result<(), AuthError> {
        self.0.save(credentials).await
    }

    async fn clear(&self) -> Result<(), AuthError> {
        self.0.clear().await
    }
}

/// The manager of `url`'s authorization, its tokens in `store`.
pub(crate) async fn manager(url: &str, store: Arc<dyn CredentialStore>) -> Result<AuthorizationManager, String> {
    let mut manager = AuthorizationManager::new_allowing_private_addresses(url)
        .await
        .map_err(|e| format!("its authorization: {e}"))?;
    manager.set_credential_store(Shared(store));
    Ok(manager)
}

/// An authorization under way: the page to open, and the listener the browser comes back to.
pub struct Login {
    state: OAuthState,
    listener: tokio::net::TcpListener,
    page: String,
}

impl std::fmt::Debug for Login {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Login").finish_non_exhaustive()
    }
}

impl Login {
    /// Finds `url`'s authorization server, registers Caret with it and prepares the page the
    /// user authorizes on; the code will come back to a port on 127.0.0.1.
    pub async fn begin(url: &str, store: Arc<dyn CredentialStore>) -> Result<Login, String> {
        // reqwest's TLS takes the process's provider.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0))
            .await
            .map_err(|e| format!("listening on loopback for the browser: {e}"))?;
        let port = listener.local_addr().map_err(|e| e.to_string())?.port();
        let redirect = format!("http://127.0.0.1:{port}/callback");
        let mut state = OAuthState::Unauthorized(manager(url, store).await?);
        state
            .start_authorization(AuthorizationRequest::new(redirect).with_client_name("Caret"))
            .await
            .map_err(|e| format!("starting the authorization with {url}: {e}"))?;
        let page = state.get_authorization_url().await.map_err(|e| e.to_string())?;
        Ok(Login { state, listener, page })
    }

    /// The page the user opens to authorize Caret.
    pub fn page(&self) -> &str {
        &self.page
    }

    /// Waits (up to `within`) for the browser to come back with the code, exchanges it for
    /// tokens and stores them.
    pub async fn finish(mut self, within: Duration) -> Result<(), String> {
        let query = tokio::time::timeout(within, callback(&self.listener))
            .await
            .map_err(|_| format!("nobody authorized within {within:?}"))??;
        let param = |name: &str| {
            query.split('&').find_map(|kv| {
                let (k, v) = kv.split_once('=')?;
                (k == name).then(|| percent_decode(v))
            })
        };
        if let Some(error) = param("error") {
            let why = param("error_description").unwrap_or_default();
            return Err(format!("the authorization was refused: {error} {why}").trim_end().to_owned());
        }
        let code = param("code").ok_or("the browser came back without a code")?;
        let csrf = param("state").ok_or("the browser came back without the state")?;
        self.state.handle_callback(&code, &csrf).await.map_err(|e| format!("exchanging the code: {e}"))?;
        Ok(())
    }
}

/// Serves the browser's return to `/callback` (other paths answer 404) and gives its query.
async fn callback(listener: &tokio::net::TcpListener) -> Result<String, String> {
    loop {
        let (mut stream, _) = listener.accept().await.map_err(|e| e.to_string())?;
        let mut head = Vec::new();
        let mut buf = [0u8; 2048];
        while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 16 * 1024 {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => head.extend_from_slice(&buf[..n]),
            }
        }
        let head = String::from_utf8_lossy(&head);
        let target = head.lines().next().and_then(|l| l.split(' ').nth(1)).unwrap_or("");
        let (path, query) = target.split_once('?').unwrap_or((target, ""));
        let (status, body) = if path == "/callback" {
            ("200 OK", "Caret is authorized; you can close this tab.")
        } else {
            ("404 Not Found", "not here")
        };
        let answer = format!(
            "HTTP/1.1 {status}\r\ncontent-type: text/plain; charset=utf-8\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        );
        let _ = stream.write_all(answer.as_bytes()).await;
        if path == "/callback" {
            return Ok(query.to_owned());
        }
    }
}

/// `%XX` and `+` of a query's value decoded.
fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                match std::str::from_utf8(&bytes[i + 1..i + 3]).ok().and_then(|h| u8::from_str_radix(h, 16).ok()) {
                    Some(b) => {
                        out.push(b);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    #[test]
    fn query_values_are_decoded() {
        assert_eq!(super::percent_decode("a%20b+c%2Fd"), "a b c/d");
        assert_eq!(super::percent_decode("100%"), "100%");
        assert_eq!(super::percent_decode("%zz"), "%zz");
    }
}
