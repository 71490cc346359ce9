//! `caret login` through the organisation's identity provider: in a browser (a loopback
//! redirect with PKCE, as `gh auth login` does), on a machine without one the device flow
//! (RFC 8628: a code confirmed in a browser elsewhere while this machine polls), or with a
//! directory's (LDAP) user name and password.

use std::time::{Duration, Instant};

use anyhow::Context as _;
use caret_protocol::auth::{DeviceAuthorization, OAuthError, TokenResponse};
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader};

/// How long a sign-in may take.
const WAIT: Duration = Duration::from_secs(600);

fn client() -> anyhow::Result<reqwest::Client> {
    Ok(reqwest::Client::builder().timeout(Duration::from_secs(30)).build()?)
}

/// Posts `form` to the server's token endpoint: the tokens, or the OAuth error.
async fn token(server: &str, form: &[(&str, &str)]) -> anyhow::Result<Result<TokenResponse, OAuthError>> {
    let r = client()?.post(format!("{server}/v1/auth/token")).form(form).send().await?;
    let status = r.status();
    let body = r.text().await?;
    if status.is_success() {
        return Ok(Ok(serde_json::from_str(&body).context("the server's tokens")?));
    }
    match serde_json::from_str::<OAuthError>(&body) {
        Ok(e) => Ok(Err(e)),
        Err(_) => anyhow::bail!("{server} answered {status}: {}", body.chars().take(300).collect::<String>()),
    }
}

fn open_browser(url: &str) {
    let opener = std::env::var("BROWSER").ok().filter(|b| !b.is_empty()).unwrap_or_else(|| "xdg-open".into());
    let _ = std::process::Command::new(opener)
        .arg(url)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn();
}

/// Signs in in a browser: the server's sign-in page opened (or printed), its code taken on a
/// loopback port and exchanged with this sign-in's PKCE verifier.
pub async fn browser(server: &str, open: bool) -> anyhow::Result<TokenResponse> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.context("listening on loopback")?;
    let redirect = format!("http://127.0.0.1:{}/callback", listener.local_addr()?.port());
    let (verifier, challenge) = caret_identity::oidc::pkce()?;
    let state = caret_identity::oidc::random_text()?;
    let mut url = url::Url::parse(&format!("{server}/v1/auth/login")).context("the server's URL")?;
    url.query_pairs_mut()
        .append_pair("redirect_uri", &redirect)
        .append_pair("state", &state)
        .append_pair("code_challenge", &challenge)
        .append_pair("code_challenge_method", "S256");
    eprintln!("Open this address to sign in:\n{url}");
    if open {
        open_browser(url.as_str());
    }
    let code =
        tokio::time::timeout(WAIT, take_code(&listener, &state)).await.context("no sign-in within 10 minutes")??;
    let form = [
        ("grant_type", "authorization_code"),
        ("code", code.as_str()),
        ("code_verifier", verifier.as_str()),
        ("redirect_uri", redirect.as_str()),
    ];
    token(server, &form).await?.map_err(|e| anyhow::anyhow!("the server refused the sign-in: {}", e.error_description))
}

/// The code the browser brings back to the loopback redirect (other requests answer 404).
async fn take_code(listener: &tokio::net::TcpListener, state: &str) -> anyhow::Result<String> {
    loop {
        let (stream, _) = listener.accept().await?;
        let mut stream = BufReader::new(stream);
        let mut line = String::new();
        stream.read_line(&mut line).await?;
        let target = line.split_whitespace().nth(1).unwrap_or("");
        let Ok(url) = url::Url::parse(&format!("http://127.0.0.1{target}")) else { continue };
        if url.path() != "/callback" {
            let _ = stream.get_mut().write_all(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n").await;
            continue;
        }
        let q = |name: &str| url.query_pairs().find(|(k, _)| k == name).map(|(_, v)| v.into_owned());
        let (ok, text) = match (q("code"), q("state")) {
            (Some(code), Some(s)) if s == state => (Some(code), "Signed in. You may close this tab."),
            _ => (None, "This sign-in is not the one Caret is waiting for."),
        };
        let page = format!(
            "<!doctype html><html lang=\"en\"><meta charset=\"utf-8\"><title>Caret</title><p id=\"done\">{text}</p>"
        );
        let answer = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: text/html; charset=utf-8\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{page}",
            page.len()
        );
        let _ = stream.get_mut().write_all(answer.as_bytes()).await;
        if let Some(code) = ok {
            return Ok(code);
        }
    }
}

/// Signs in with the device flow: the code and the page to confirm it on printed, the server
/// polled until its person has signed in.
pub async fn device(server: &str) -> anyhow::Result<TokenResponse> {
    let r = client()?.post(format!("{server}/v1/auth/device")).send().await?;
    if !r.status().is_success() {
        let status = r.status();
        anyhow::bail!("{server} does not sign in devices ({status}): {}", r.text().await.unwrap_or_default());
    }
    let start: DeviceAuthorization = r.json().await.context("the server's device sign-in")?;
    eprintln!(
        "On any device with a browser, open\n{}\nand sign in (or open {} and enter the code {})",
        start.verification_uri_complete, start.verification_uri, start.user_code
    );
    let mut interval = Duration::from_secs(u64::try_from(start.interval.max(1)).unwrap_or(5));
    let until = Instant::now() + Duration::from_secs(u64::try_from(start.expires_in).unwrap_or(600));
    let form = [("grant_type", "urn:ietf:params:oauth:grant-type:device_code"), ("device_code", &start.device_code)];
    while Instant::now() < until {
        tokio::time::sleep(interval).await;
        match token(server, &form).await? {
            Ok(tokens) => return Ok(tokens),
            Err(e) if e.error == "authorization_pending" => {}
            Err(e) if e.error == "slow_down" => interval += Duration::from_secs(1),
            Err(e) => anyhow::bail!("the sign-in failed: {}", e.error_description),
        }
    }
    anyhow::bail!("nobody signed in before the code expired")
}

/// The password: `CARET_PASSWORD`, or a line read from the terminal with its echo off.
fn password() -> anyhow::Result<String> {
    if let Ok(p) = std::env::var("CARET_PASSWORD") {
        return Ok(p);
    }
    use std::io::{BufRead as _, IsTerminal as _, Write as _};
    let terminal = std::io::stdin().is_terminal();
    if terminal {
        eprint!("Password: ");
        std::io::stderr().flush()?;
        let _ = std::process::Command::new("stty").arg("-echo").stdin(std::process::Stdio::inherit()).status();
    }
    let mut line = String::new();
    let read = std::io::stdin().lock().read_line(&mut line);
    if terminal {
        let _ = std::process::Command::new("stty").arg("echo").stdin(std::process::Stdio::inherit()).status();
        eprintln!();
    }
    read?;
    Ok(line.trim_end_matches(['\r', '\n']).to_owned())
}

/// Signs in with the directory: `username` and its password, checked by the server's LDAP.
pub async fn ldap(server: &str, username: &str) -> anyhow::Result<TokenResponse> {
    let body = caret_protocol::auth::LdapSignIn { username: username.to_owned(), password: password()?, page: false };
    let r = client()?.post(format!("{server}/v1/auth/ldap")).json(&body).send().await?;
    let status = r.status();
    let text = r.text().await?;
    if !status.is_success() {
        let why = serde_json::from_str::<caret_protocol::ErrorBody>(&text).map(|b| b.error.message).unwrap_or(text);
        anyhow::bail!("the sign-in failed ({status}): {why}");
    }
    serde_json::from_str(&text).context("the server's tokens")
}
