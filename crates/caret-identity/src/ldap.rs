//! LDAP sign-in, for organisations without OpenID Connect: search then bind. The server binds
//! as its service account, finds the one entry whose attribute matches the user name (the name
//! escaped by RFC 4515, so `*`, `(`, `)`, `\` and NUL match only themselves), binds as that
//! entry with the password given, then reads the person's email, name and groups. StartTLS or
//! LDAPS keep the password off the wire in the clear; a server certificate is checked against
//! the system's roots or the configured CA.

use std::sync::Arc;
use std::time::Duration;

use ldap3::{LdapConnAsync, LdapConnSettings, Scope, SearchEntry};
use serde::Deserialize;

use crate::error::{Error, Result};
use crate::model::Role;
use crate::oidc::{SignedIn, Signup};

/// `[server.ldap]`: the directory people sign in with.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LdapSettings {
    /// `ldap://host:389` (with `starttls`) or `ldaps://host:636`.
    pub url: String,
    /// Upgrade an `ldap://` connection with StartTLS before anything is sent.
    #[serde(default)]
    pub starttls: bool,
    /// A PEM file of the CA that signed the directory's certificate (default: the system's).
    #[serde(default)]
    pub ca_cert: Option<std::path::PathBuf>,
    /// The service account that searches (`cn=caret,ou=services,dc=acme,dc=example`); none:
    /// an anonymous search.
    #[serde(default)]
    pub bind_dn: Option<String>,
    /// Its password (or `CARET_LDAP_BIND_PASSWORD`).
    #[serde(default)]
    pub bind_password: Option<String>,
    /// Where people are searched (`ou=people,dc=acme,dc=example`).
    pub base_dn: String,
    /// The search, `{username}` standing for the escaped user name.
    #[serde(default = "default_user_filter")]
    pub user_filter: String,
    /// The email attribute.
    #[serde(default = "default_mail")]
    pub email_attribute: String,
    /// The display name attribute.
    #[serde(default = "default_cn")]
    pub name_attribute: String,
    /// Where groups are searched (none: groups are not read).
    #[serde(default)]
    pub group_base_dn: Option<String>,
    /// The groups of a person, `{dn}` standing for their escaped entry.
    #[serde(default = "default_group_filter")]
    pub group_filter: String,
    /// A group's name attribute.
    #[serde(default = "default_cn")]
    pub group_name_attribute: String,
    /// The organisation people sign in to (its name or id).
    pub organisation: String,
    /// Email domains allowed to sign in (none: every domain).
    #[serde(default)]
    pub allowed_domains: Vec<String>,
    /// Whether a first sign-in makes the person.
    #[serde(default)]
    pub signup: Signup,
    /// Directory groups that give a role (`"caret-admins" = "admin"`).
    #[serde(default)]
    pub group_roles: std::collections::BTreeMap<String, Role>,
    /// Whether the directory's groups become the person's groups.
    #[serde(default = "yes")]
    pub sync_groups: bool,
}

fn default_user_filter() -> String {
    "(&(objectClass=person)(uid={username}))".into()
}
fn default_mail() -> String {
    "mail".into()
}
fn default_cn() -> String {
    "cn".into()
}
fn default_group_filter() -> String {
    "(&(objectClass=groupOfNames)(member={dn}))".into()
}
fn yes() -> bool {
    true
}

/// `text` escaped for an LDAP filter's value (RFC 4515, 3): `*`, `(`, `)`, `\` and NUL (and
/// every non-ASCII byte) as `\XX`.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        match b {
            b'*' | b'(' | b')' | b'\\' | 0 => out.push_str(&format!("\\{b:02x}")),
            b if b.is_ascii() => out.push(char::from(b)),
            b => out.push_str(&format!("\\{b:02x}")),
        }
    }
    out
}

/// The directory, connected per sign-in.
#[derive(Debug)]
pub struct Ldap {
    settings: LdapSettings,
    tls: Option<Arc<rustls::ClientConfig>>,
}

fn upstream(what: &str, e: impl std::fmt::Display) -> Error {
    Error::Upstream(format!("the directory ({what}): {e}"))
}

/// The refusal of a wrong name or password (the same for both: nothing says which).
fn refused() -> Error {
    Error::BadToken("the user name or password is wrong".into())
}

impl Ldap {
    /// The directory of `settings` (its CA read now; nothing is connected).
    pub fn new(mut settings: LdapSettings) -> Result<Ldap> {
        if settings.bind_password.is_none() {
            settings.bind_password = std::env::var("CARET_LDAP_BIND_PASSWORD").ok().filter(|p| !p.is_empty());
        }
        for d in &mut settings.allowed_domains {
            *d = d.trim().trim_start_matches('@').to_ascii_lowercase();
        }
        if !settings.user_filter.contains("{username}") {
            return Err(Error::BadRequest("[server.ldap] user_filter must hold {username}".into()));
        }
        let secure = settings.url.starts_with("ldaps://") || settings.starttls;
        let tls = match (&settings.ca_cert, secure) {
            (Some(path), true) => {
                use rustls::pki_types::CertificateDer;
                use rustls::pki_types::pem::PemObject as _;
                let _ = rustls::crypto::ring::default_provider().install_default();
                let mut roots = rustls::RootCertStore::empty();
                for cert in CertificateDer::pem_file_iter(path).map_err(|e| upstream("its CA", e))? {
                    roots.add(cert.map_err(|e| upstream("its CA", e))?).map_err(|e| upstream("its CA", e))?;
                }
                Some(Arc::new(rustls::ClientConfig::builder().with_root_certificates(roots).with_no_client_auth()))
            }
            _ => None,
        };
        Ok(Ldap { settings, tls })
    }

    /// The settings.
    pub fn settings(&self) -> &LdapSettings {
        &self.settings
    }

    async fn connect(&self) -> Result<ldap3::Ldap> {
        let mut settings = LdapConnSettings::new()
            .set_conn_timeout(Duration::from_secs(10))
            .set_starttls(self.settings.starttls && self.settings.url.starts_with("ldap://"));
        if let Some(tls) = &self.tls {
            settings = settings.set_config(tls.clone());
        }
        let (conn, ldap) =
            LdapConnAsync::with_settings(settings, &self.settings.url).await.map_err(|e| upstream("connecting", e))?;
        ldap3::drive!(conn);
        Ok(ldap)
    }

    /// Binds as the service account (an anonymous search without one).
    async fn bind_service(&self, ldap: &mut ldap3::Ldap) -> Result<()> {
        if let Some(dn) = &self.settings.bind_dn {
            ldap.simple_bind(dn, self.settings.bind_password.as_deref().unwrap_or_default())
                .await
                .and_then(|r| r.success())
                .map_err(|e| upstream("the service account's bind", e))?;
        }
        Ok(())
    }

    /// Checks `username` and `password` against the directory: who they are.
    pub async fn sign_in(&self, username: &str, password: &str) -> Result<SignedIn> {
        let username = username.trim();
        // An empty password is an unauthenticated bind, which directories accept: never.
        if username.is_empty() || password.is_empty() || username.len() > 256 || password.len() > 1024 {
            return Err(refused());
        }
        let s = &self.settings;
        let mut ldap = self.connect().await?;
        let answer = tokio::time::timeout(Duration::from_secs(20), async {
            self.bind_service(&mut ldap).await?;
            let filter = s.user_filter.replace("{username}", &escape(username));
            let attrs = vec![s.email_attribute.as_str(), s.name_attribute.as_str()];
            let (found, _) = ldap
                .search(&s.base_dn, Scope::Subtree, &filter, attrs)
                .await
                .and_then(|r| r.success())
                .map_err(|e| upstream("searching", e))?;
            let [entry] = found.as_slice() else { return Err(refused()) };
            let entry = SearchEntry::construct(entry.clone());
            // The person's own bind: the password checked by the directory.
            let bound = ldap.simple_bind(&entry.dn, password).await.map_err(|e| upstream("binding", e))?;
            if bound.rc != 0 {
                return Err(refused());
            }
            let first = |attr: &str| {
                entry.attrs.iter().find(|(k, _)| k.eq_ignore_ascii_case(attr)).and_then(|(_, v)| v.first()).cloned()
            };
            let email = first(&s.email_attribute)
                .ok_or_else(|| Error::Forbidden(format!("{username} has no {} in the directory", s.email_attribute)))?;
            let email = crate::people::normal_email(&email)?;
            let domain = email.rsplit_once('@').map(|(_, d)| d).unwrap_or_default();
            if !s.allowed_domains.is_empty() && !s.allowed_domains.iter().any(|d| d == domain) {
                return Err(Error::Forbidden(format!("{domain} is not among the domains allowed to sign in")));
            }
            let name = first(&s.name_attribute).unwrap_or_else(|| username.to_owned());
            let mut groups = Vec::new();
            if let Some(base) = &s.group_base_dn {
                // Searched as the service account again (the person may not read groups).
                self.bind_service(&mut ldap).await?;
                let filter = s.group_filter.replace("{dn}", &escape(&entry.dn));
                let (found, _) = ldap
                    .search(base, Scope::Subtree, &filter, vec![s.group_name_attribute.as_str()])
                    .await
                    .and_then(|r| r.success())
                    .map_err(|e| upstream("searching groups", e))?;
                for g in found.into_iter().take(200) {
                    let g = SearchEntry::construct(g);
                    if let Some((_, v)) = g.attrs.iter().find(|(k, _)| k.eq_ignore_ascii_case(&s.group_name_attribute))
                        && let Some(name) = v.first()
                    {
                        groups.push(name.clone());
                    }
                }
            }
            Ok(SignedIn { subject: entry.dn, email, name, groups })
        })
        .await
        .map_err(|_| upstream("answering", "no answer within 20 s"))?;
        let _ = ldap.unbind().await;
        answer
    }

    /// The role the directory's groups give, where roles are mapped from groups.
    pub fn role_of(&self, groups: &[String]) -> Option<Role> {
        Role::from_groups(&self.settings.group_roles, groups)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filter_values_are_escaped() {
        assert_eq!(escape("ada"), "ada");
        assert_eq!(escape("*)(uid=*"), "\\2a\\29\\28uid=\\2a");
        assert_eq!(escape("a\\b\0"), "a\\5cb\\00");
        assert_eq!(escape("zoë"), "zo\\c3\\ab");
        assert_eq!(escape("uid=ada,ou=people"), "uid=ada,ou=people");
    }
}
