//! OpenID Connect sign-in with any standard provider, from its issuer URL: discovery, the
//! authorization-code flow with PKCE, `state` and `nonce`, the ID token checked (signature by
//! the provider's keys, re-read when a token names a key not yet seen; issuer; audience;
//! expiry; nonce) and its claims mapped to a person (email, name, groups).
//!
//! The provider is the operator's (its URL is in the server's configuration), so it is
//! reached like any configured upstream, not through a tenant's egress policy.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use data_encoding::BASE64URL_NOPAD;
use serde::Deserialize;
use sha2::Digest as _;

use crate::error::{Error, Result};
use crate::jwt::{self, JwkSet};
use crate::model::Role;

/// Who may sign in the first time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Signup {
    /// Anyone the provider vouches for (within the allowed domains) becomes a member.
    #[default]
    Open,
    /// Only people invited or added by an admin (or by SCIM).
    Invited,
}

/// Which ID-token claims carry what.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClaimNames {
    /// The email (`email`).
    pub email: String,
    /// The display name (`name`).
    pub name: String,
    /// The groups, a list of names (`groups`).
    pub groups: String,
}

impl Default for ClaimNames {
    fn default() -> Self {
        ClaimNames { email: "email".into(), name: "name".into(), groups: "groups".into() }
    }
}

/// `[server.oidc]`: the provider people sign in with.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OidcSettings {
    /// The issuer URL (`https://login.acme.example/realms/acme`); its
    /// `/.well-known/openid-configuration` is read.
    pub issuer: String,
    /// This server's client id at the provider.
    pub client_id: String,
    /// The client secret (or `CARET_OIDC_CLIENT_SECRET`); none for a public client.
    #[serde(default)]
    pub client_secret: Option<String>,
    /// The organisation people sign in to: its name (or its id).
    pub organisation: String,
    /// Scopes asked for (`openid email profile` and, when groups are mapped, whatever scope
    /// carries them).
    #[serde(default = "default_scopes")]
    pub scopes: Vec<String>,
    /// Claim names.
    #[serde(default)]
    pub claims: ClaimNames,
    /// Email domains allowed to sign in (none: every domain).
    #[serde(default)]
    pub allowed_domains: Vec<String>,
    /// Whether a first sign-in makes the person.
    #[serde(default)]
    pub signup: Signup,
    /// Provider groups that give a role (`"caret-admins" = "admin"`); where set, a sign-in
    /// sets the person's role from their groups (never an owner's, which only an owner changes).
    #[serde(default)]
    pub group_roles: BTreeMap<String, Role>,
    /// Whether the provider's groups become the person's groups (made as needed, source
    /// `oidc`), so group policies (models, budgets) follow the provider.
    #[serde(default = "yes")]
    pub sync_groups: bool,
}

fn default_scopes() -> Vec<String> {
    vec!["openid".into(), "email".into(), "profile".into()]
}

fn yes() -> bool {
    true
}

/// The provider's metadata (`/.well-known/openid-configuration`): what is used of it.
#[derive(Debug, Clone, Deserialize)]
pub struct Metadata {
    /// Must equal the configured issuer.
    pub issuer: String,
    /// Where the browser is sent.
    pub authorization_endpoint: String,
    /// Where a code is exchanged.
    pub token_endpoint: String,
    /// The provider's signing keys.
    pub jwks_uri: String,
    /// Where the person's claims are read when the ID token leaves them out.
    #[serde(default)]
    pub userinfo_endpoint: Option<String>,
    /// How the provider accepts a client's secret.
    #[serde(default)]
    pub token_endpoint_auth_methods_supported: Vec<String>,
}

/// Who the provider says signed in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignedIn {
    /// The provider's subject (`sub`).
    pub subject: String,
    /// Email, lower-cased.
    pub email: String,
    /// Display name (the email's local part when the provider gives none).
    pub name: String,
    /// Group names from the groups claim.
    pub groups: Vec<String>,
}

/// A PKCE verifier (RFC 7636) and its S256 challenge.
pub fn pkce() -> Result<(String, String)> {
    let verifier = random_text()?;
    let challenge = challenge_of(&verifier);
    Ok((verifier, challenge))
}

/// The S256 challenge of `verifier`.
pub fn challenge_of(verifier: &str) -> String {
    BASE64URL_NOPAD.encode(&sha2::Sha256::digest(verifier.as_bytes()))
}

/// 256 random bits as URL-safe text (states, nonces, verifiers, codes).
pub fn random_text() -> Result<String> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(|e| Error::Upstream(format!("no randomness: {e}")))?;
    Ok(BASE64URL_NOPAD.encode(&bytes))
}

/// How long the provider's metadata and keys are kept before they are read again.
const KEEP: Duration = Duration::from_secs(3600);
/// A token naming an unknown key makes the keys be read again at most this often.
const REREAD_KEYS_EVERY: Duration = Duration::from_secs(1);
/// Clock skew allowed on `exp`, `iat` and `nbf`.
const SKEW_S: i64 = 60;

#[derive(Debug, Default)]
struct Cached {
    metadata: Option<(Metadata, Instant)>,
    keys: Option<(JwkSet, Instant)>,
}

/// A provider, its metadata and keys kept.
#[derive(Debug)]
pub struct Oidc {
    settings: OidcSettings,
    http: reqwest::Client,
    cached: Mutex<Cached>,
}

fn upstream(what: &str, e: impl std::fmt::Display) -> Error {
    Error::Upstream(format!("{what}: {e}"))
}

impl Oidc {
    /// The provider of `settings` (nothing is fetched until it is used).
    pub fn new(mut settings: OidcSettings) -> Result<Oidc> {
        settings.issuer = settings.issuer.trim_end_matches('/').to_owned();
        if settings.client_secret.is_none() {
            settings.client_secret = std::env::var("CARET_OIDC_CLIENT_SECRET").ok().filter(|s| !s.is_empty());
        }
        if !settings.scopes.iter().any(|s| s == "openid") {
            settings.scopes.insert(0, "openid".into());
        }
        for d in &mut settings.allowed_domains {
            *d = d.trim().trim_start_matches('@').to_ascii_lowercase();
        }
        let _ = rustls::crypto::ring::default_provider().install_default();
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| upstream("an HTTP client", e))?;
        Ok(Oidc { settings, http, cached: Mutex::new(Cached::default()) })
    }

    /// The settings.
    pub fn settings(&self) -> &OidcSettings {
        &self.settings
    }

    async fn get_json<T: serde::de::DeserializeOwned>(&self, url: &str, what: &str) -> Result<T> {
        let response = self.http.get(url).send().await.map_err(|e| upstream(what, e))?;
        if !response.status().is_success() {
            return Err(upstream(what, format!("{url} answered {}", response.status())));
        }
        response.json().await.map_err(|e| upstream(what, e))
    }

    /// The provider's metadata, read again after an hour.
    pub async fn metadata(&self) -> Result<Metadata> {
        if let Some((m, at)) = &self.cached.lock().unwrap_or_else(|e| e.into_inner()).metadata
            && at.elapsed() < KEEP
        {
            return Ok(m.clone());
        }
        let url = format!("{}/.well-known/openid-configuration", self.settings.issuer);
        let m: Metadata = self.get_json(&url, "the provider's discovery document").await?;
        if m.issuer.trim_end_matches('/') != self.settings.issuer {
            return Err(Error::Upstream(format!(
                "the provider names itself {:?}, not the configured issuer {:?}",
                m.issuer, self.settings.issuer
            )));
        }
        self.cached.lock().unwrap_or_else(|e| e.into_inner()).metadata = Some((m.clone(), Instant::now()));
        Ok(m)
    }

    /// The provider's keys: those kept, unless `kid` is not among them (a rotation), in
    /// which case they are read again (at most once a second).
    async fn keys(&self, kid: Option<&str>) -> Result<JwkSet> {
        let knows = |set: &JwkSet| kid.is_none_or(|k| set.keys.iter().any(|j| j.kid.as_deref() == Some(k)));
        if let Some((set, at)) = &self.cached.lock().unwrap_or_else(|e| e.into_inner()).keys
            && ((at.elapsed() < KEEP && knows(set)) || at.elapsed() < REREAD_KEYS_EVERY)
        {
            return Ok(set.clone());
        }
        let uri = self.metadata().await?.jwks_uri;
        let set: JwkSet = self.get_json(&uri, "the provider's keys").await?;
        self.cached.lock().unwrap_or_else(|e| e.into_inner()).keys = Some((set.clone(), Instant::now()));
        Ok(set)
    }

    /// Where to send the browser: the provider's authorization endpoint with this sign-in's
    /// `state`, `nonce` and PKCE challenge.
    pub async fn authorize_url(&self, redirect_uri: &str, state: &str, nonce: &str, challenge: &str) -> Result<String> {
        let m = self.metadata().await?;
        let mut url =
            url::Url::parse(&m.authorization_endpoint).map_err(|e| upstream("the authorization endpoint", e))?;
        url.query_pairs_mut()
            .append_pair("response_type", "code")
            .append_pair("client_id", &self.settings.client_id)
            .append_pair("redirect_uri", redirect_uri)
            .append_pair("scope", &self.settings.scopes.join(" "))
            .append_pair("state", state)
            .append_pair("nonce", nonce)
            .append_pair("code_challenge", challenge)
            .append_pair("code_challenge_method", "S256");
        Ok(url.into())
    }

    /// Exchanges the provider's `code` (with the sign-in's PKCE verifier) and checks the ID
    /// token it answers with against `nonce`.
    pub async fn finish(&self, code: &str, verifier: &str, redirect_uri: &str, nonce: &str) -> Result<SignedIn> {
        let m = self.metadata().await?;
        let mut form = vec![
            ("grant_type", "authorization_code"),
            ("code", code),
            ("redirect_uri", redirect_uri),
            ("code_verifier", verifier),
        ];
        let mut request = self.http.post(&m.token_endpoint);
        let basic = m.token_endpoint_auth_methods_supported.is_empty()
            || m.token_endpoint_auth_methods_supported.iter().any(|a| a == "client_secret_basic");
        match &self.settings.client_secret {
            Some(secret) if basic => request = request.basic_auth(&self.settings.client_id, Some(secret)),
            Some(secret) => form.extend([("client_id", self.settings.client_id.as_str()), ("client_secret", secret)]),
            None => form.push(("client_id", &self.settings.client_id)),
        }
        let response = request.form(&form).send().await.map_err(|e| upstream("the provider's token endpoint", e))?;
        let status = response.status();
        let body: serde_json::Value =
            response.json().await.map_err(|e| upstream("the provider's token endpoint", e))?;
        if !status.is_success() {
            // A code used twice, expired or not this client's: the provider says which.
            let why = body.get("error_description").or(body.get("error")).and_then(|v| v.as_str()).unwrap_or("");
            return Err(Error::BadToken(format!("the provider refused the code ({status}): {why}")));
        }
        let id_token = body
            .get("id_token")
            .and_then(|v| v.as_str())
            .ok_or_else(|| Error::Upstream("the provider answered without an ID token".into()))?;
        let mut claims = self.checked_claims(id_token, nonce, crate::db::now_ms() / 1000).await?;
        // A provider may keep the person's claims for its userinfo endpoint (OpenID Connect
        // Core 5.4): read there, for the same subject only.
        let access = body.get("access_token").and_then(|v| v.as_str());
        if !claims.contains_key(&self.settings.claims.email)
            && let (Some(endpoint), Some(access)) = (&m.userinfo_endpoint, access)
        {
            let r = self.http.get(endpoint).bearer_auth(access).send().await.map_err(|e| upstream("userinfo", e))?;
            if !r.status().is_success() {
                return Err(upstream("userinfo", format!("answered {}", r.status())));
            }
            let info: serde_json::Map<String, serde_json::Value> =
                r.json().await.map_err(|e| upstream("userinfo", e))?;
            if info.get("sub") != claims.get("sub") {
                return Err(Error::BadToken("the userinfo is another subject's".into()));
            }
            for (k, v) in info {
                claims.entry(k).or_insert(v);
            }
        }
        self.map_claims(&claims)
    }

    /// Checks an ID token: signed by one of the provider's keys with an accepted algorithm,
    /// issued by the issuer for this client, not expired, carrying `nonce`; then maps its
    /// claims.
    pub async fn check_id_token(&self, token: &str, nonce: &str, now_s: i64) -> Result<SignedIn> {
        self.map_claims(&self.checked_claims(token, nonce, now_s).await?)
    }

    /// The claims of an ID token that passes [`Oidc::check_id_token`]'s checks.
    async fn checked_claims(
        &self,
        token: &str,
        nonce: &str,
        now_s: i64,
    ) -> Result<serde_json::Map<String, serde_json::Value>> {
        let header = jwt::header(token)?;
        if !jwt::ALGORITHMS.contains(&header.alg.as_str()) {
            return Err(Error::BadToken(format!("the signature algorithm {:?} is not accepted", header.alg)));
        }
        let set = self.keys(header.kid.as_deref()).await?;
        let key = set
            .keys
            .iter()
            .filter(|k| header.kid.is_none() || k.kid == header.kid)
            .find(|k| jwt::fits(k, &header.alg))
            .ok_or_else(|| Error::BadToken(format!("no key of the provider's is {:?}", header.kid)))?;
        let claims = jwt::verify(token, key)?;
        self.check_claims(&claims, nonce, now_s)?;
        Ok(claims)
    }

    fn check_claims(&self, c: &serde_json::Map<String, serde_json::Value>, nonce: &str, now_s: i64) -> Result<()> {
        let bad = |why: String| Err(Error::BadToken(why));
        let text = |name: &str| c.get(name).and_then(|v| v.as_str());
        let number = |name: &str| c.get(name).and_then(serde_json::Value::as_i64);
        if text("iss").map(|i| i.trim_end_matches('/')) != Some(self.settings.issuer.as_str()) {
            return bad(format!("the token's issuer is {:?}", text("iss")));
        }
        let audiences: Vec<&str> = match c.get("aud") {
            Some(serde_json::Value::String(a)) => vec![a],
            Some(serde_json::Value::Array(list)) => list.iter().filter_map(|v| v.as_str()).collect(),
            _ => vec![],
        };
        let me = self.settings.client_id.as_str();
        if !audiences.contains(&me) {
            return bad(format!("the token is for {audiences:?}, not this server"));
        }
        if audiences.len() > 1 && text("azp").is_some_and(|a| a != me) {
            return bad("the token was issued to another party (azp)".into());
        }
        match number("exp") {
            Some(exp) if exp + SKEW_S > now_s => {}
            Some(_) => return bad("the token has expired".into()),
            None => return bad("the token has no expiry".into()),
        }
        if number("iat").is_some_and(|iat| iat > now_s + SKEW_S) || number("nbf").is_some_and(|n| n > now_s + SKEW_S) {
            return bad("the token is not valid yet".into());
        }
        let given = text("nonce").unwrap_or("");
        if nonce.is_empty() || !crate::constant_time_eq(given.as_bytes(), nonce.as_bytes()) {
            return bad("the token's nonce is not this sign-in's".into());
        }
        Ok(())
    }

    fn map_claims(&self, c: &serde_json::Map<String, serde_json::Value>) -> Result<SignedIn> {
        let names = &self.settings.claims;
        let subject = c.get("sub").and_then(|v| v.as_str()).unwrap_or_default().to_owned();
        let email = c.get(&names.email).and_then(|v| v.as_str()).unwrap_or_default();
        if subject.is_empty() || email.is_empty() {
            return Err(Error::BadToken(format!("the token lacks sub or {}", names.email)));
        }
        if c.get("email_verified").and_then(serde_json::Value::as_bool) == Some(false) {
            return Err(Error::Forbidden(format!("{email} is not verified at the provider")));
        }
        let email = crate::people::normal_email(email)?;
        let domain = email.rsplit_once('@').map(|(_, d)| d).unwrap_or_default();
        let domains = &self.settings.allowed_domains;
        if !domains.is_empty() && !domains.iter().any(|d| d == domain) {
            return Err(Error::Forbidden(format!("{domain} is not among the domains allowed to sign in")));
        }
        let name = c
            .get(&names.name)
            .and_then(|v| v.as_str())
            .filter(|n| !n.trim().is_empty())
            .map_or_else(|| email.split('@').next().unwrap_or_default().to_owned(), |n| n.trim().to_owned());
        let groups = match c.get(&names.groups) {
            Some(serde_json::Value::Array(list)) => list.iter().filter_map(|v| v.as_str()).map(String::from).collect(),
            Some(serde_json::Value::String(one)) => vec![one.clone()],
            _ => vec![],
        };
        Ok(SignedIn { subject, email, name, groups })
    }

    /// The role `groups` give, where roles are mapped from groups.
    pub fn role_of(&self, groups: &[String]) -> Option<Role> {
        Role::from_groups(&self.settings.group_roles, groups)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::jwt::tests::TestKey;

    fn provider(key: &TestKey) -> Oidc {
        let oidc = Oidc::new(OidcSettings {
            issuer: "https://login.acme.example/".into(),
            client_id: "caret".into(),
            client_secret: Some("s".into()),
            organisation: "acme".into(),
            scopes: default_scopes(),
            claims: ClaimNames::default(),
            allowed_domains: vec!["@Acme.example".into()],
            signup: Signup::Open,
            group_roles: [("admins".to_owned(), Role::Admin)].into(),
            sync_groups: true,
        })
        .unwrap();
        oidc.cached.lock().unwrap().keys = Some((JwkSet { keys: vec![key.jwk()] }, Instant::now()));
        oidc
    }

    fn claims(now: i64) -> serde_json::Value {
        serde_json::json!({
            "iss": "https://login.acme.example", "aud": "caret", "sub": "u1", "exp": now + 300, "iat": now,
            "nonce": "n1", "email": "Ada@Acme.example", "name": "Ada", "groups": ["admins", "eng"],
        })
    }

    fn with(now: i64, change: impl FnOnce(&mut serde_json::Map<String, serde_json::Value>)) -> serde_json::Value {
        let mut c = claims(now);
        change(c.as_object_mut().unwrap());
        c
    }

    #[tokio::test]
    async fn an_id_token_is_checked_and_mapped() {
        let key = TestKey::new("k1");
        let oidc = provider(&key);
        let now = 1_800_000_000;
        let signed = oidc.check_id_token(&key.sign(&claims(now)), "n1", now).await.unwrap();
        assert_eq!(signed.email, "ada@acme.example");
        assert_eq!(signed.groups, ["admins", "eng"]);
        assert_eq!(oidc.role_of(&signed.groups), Some(Role::Admin));
        assert_eq!(oidc.role_of(&["eng".into()]), Some(Role::Member));

        let refused = |c: serde_json::Value, nonce: &'static str| {
            let token = key.sign(&c);
            let oidc = &oidc;
            async move { oidc.check_id_token(&token, nonce, now).await.unwrap_err().to_string() }
        };
        assert!(refused(claims(now), "n2").await.contains("nonce"));
        assert!(refused(with(now, |c| drop(c.remove("nonce"))), "n1").await.contains("nonce"));
        assert!(
            refused(with(now, |c| drop(c.insert("iss".into(), "https://evil".into()))), "n1").await.contains("issuer")
        );
        assert!(
            refused(with(now, |c| drop(c.insert("aud".into(), "other".into()))), "n1")
                .await
                .contains("not this server")
        );
        let azp = with(now, |c| {
            c.insert("aud".into(), serde_json::json!(["caret", "other"]));
            c.insert("azp".into(), "other".into());
        });
        assert!(refused(azp, "n1").await.contains("azp"));
        assert!(
            refused(with(now, |c| drop(c.insert("exp".into(), (now - 120).into()))), "n1").await.contains("expired")
        );
        assert!(refused(with(now, |c| drop(c.remove("exp"))), "n1").await.contains("no expiry"));
        assert!(
            refused(with(now, |c| drop(c.insert("iat".into(), (now + 3600).into()))), "n1")
                .await
                .contains("not valid yet")
        );
        let other_domain = with(now, |c| drop(c.insert("email".into(), "eve@evil.example".into())));
        assert!(refused(other_domain, "n1").await.contains("not among the domains"));
        let unverified = with(now, |c| drop(c.insert("email_verified".into(), false.into())));
        assert!(refused(unverified, "n1").await.contains("not verified"));
        // Signed by a key the provider does not have (nothing to read again: keys were just read).
        let stranger = TestKey::new("k1");
        let e = oidc.check_id_token(&stranger.sign(&claims(now)), "n1", now).await.unwrap_err().to_string();
        assert!(e.contains("does not match"), "{e}");
    }

    #[test]
    fn pkce_challenges_are_the_rfc_s256() {
        // RFC 7636, appendix B.
        assert_eq!(
            challenge_of("dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk"),
            "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM"
        );
        let (v, c) = pkce().unwrap();
        assert_eq!(challenge_of(&v), c);
        assert_ne!(pkce().unwrap().0, v);
    }
}
