//! `[server]`: how `caret serve` listens, stores, signs people in and reaches out.

use std::path::PathBuf;

use serde::Deserialize;

use crate::units::Size;

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
/// `[server]`: how `caret serve` listens, stores, signs people in and reaches out.
pub struct ServerSection {
    /// Address to listen on.
    pub addr: String,
    /// Default: `$CARET_HOME/server`.
    pub data_dir: Option<PathBuf>,
    /// Default: a SQLite file in the data directory.
    pub database_url: Option<String>,
    /// Default: `objects/` in the data directory; or `s3://bucket/prefix`.
    pub object_store: Option<String>,
    /// PEM certificate chain for TLS.
    pub tls_cert: Option<PathBuf>,
    /// PEM private key for TLS.
    pub tls_key: Option<PathBuf>,
    /// Serve plaintext HTTP on a non-loopback address (a TLS proxy in front).
    pub allow_insecure_http: bool,
    /// Requests per second per API token.
    pub rate_limit_per_second: f64,
    /// Burst per API token.
    pub rate_limit_burst: u32,
    /// Requests per second per client address (the TCP peer).
    pub ip_rate_limit_per_second: f64,
    /// Burst per client address.
    pub ip_rate_limit_burst: u32,
    /// Largest request body.
    pub body_limit: Size,
    /// Committed chunk texts held in memory until their vectors exist, so that a client
    /// sends each text once (0: none; every text is sent again to be embedded).
    pub held_texts: Size,
    /// Workspaces a server keeps loaded in memory at most (the least recently used beyond
    /// are unloaded; they load again from the bucket when asked for).
    pub loaded_workspaces: usize,
    /// Bytes the loaded workspaces may hold at most, a segment shared by a team's copies
    /// counted once (the least recently used beyond are unloaded); unset: half the memory of
    /// the machine or the container.
    pub loaded_memory: Option<Size>,
    /// A loaded workspace no request has used for this long is unloaded (`30m`, `2h`).
    pub unload_idle_after: String,
    /// Directories agent sessions (`POST /v1/agent/sessions`) may work in, by name
    /// (`[server.agent_workspaces]`, `name = "/path"`); none: no agent sessions.
    pub agent_workspaces: std::collections::BTreeMap<String, PathBuf>,
    /// Agent sessions a tenant may have running at once.
    pub agent_sessions_per_tenant: usize,
    /// An agent session with no op and no watcher for this long is shut down (`30m`, `2h`).
    pub agent_idle_timeout: String,
    /// Internal hosts fetches for tenants may reach (`docs.intranet:443`, `10.1.2.0/24`); every
    /// other loopback, private, link-local or otherwise internal address is refused.
    pub egress_allow: Vec<String>,
    /// Whether a run may ask for the whole network (which nothing filters).
    pub runs_network: bool,
    /// Who may add and remove @Docs sources: `members` (default) or admins (anything else).
    pub docs_sources: String,
    /// Where browsers reach this server (`https://caret.acme.example`), for sign-in redirects.
    pub public_url: Option<String>,
    /// `[server.oidc]`: the OpenID Connect provider people sign in with.
    pub oidc: Option<caret_identity::oidc::OidcSettings>,
    /// `[server.ldap]`: the directory people sign in with (beside or instead of OIDC).
    pub ldap: Option<caret_identity::ldap::LdapSettings>,
}

impl ServerSection {
    /// The egress policy of a team server's fetches for tenants (its own and its workers').
    pub fn egress(&self) -> anyhow::Result<caret_sandbox::egress::Egress> {
        caret_sandbox::egress::Egress::guarded(&self.egress_allow).map_err(anyhow::Error::msg)
    }
}

impl Default for ServerSection {
    fn default() -> Self {
        let limit = caret_server::limit::RateLimit::default();
        let per_address = caret_server::limit::RateLimit::per_address();
        ServerSection {
            addr: "127.0.0.1:7878".to_owned(),
            data_dir: None,
            database_url: None,
            object_store: None,
            tls_cert: None,
            tls_key: None,
            allow_insecure_http: false,
            rate_limit_per_second: limit.per_second,
            rate_limit_burst: limit.burst,
            ip_rate_limit_per_second: per_address.per_second,
            ip_rate_limit_burst: per_address.burst,
            body_limit: Size(64 << 20),
            held_texts: Size(caret_index::held::DEFAULT_BUDGET as u64),
            loaded_workspaces: caret_index::service::Residency::default().max_loaded,
            loaded_memory: None,
            unload_idle_after: "30m".to_owned(),
            agent_workspaces: Default::default(),
            agent_sessions_per_tenant: 4,
            agent_idle_timeout: "1h".to_owned(),
            egress_allow: Vec::new(),
            runs_network: false,
            docs_sources: "members".to_owned(),
            public_url: None,
            oidc: None,
            ldap: None,
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_held_texts_budget_is_a_size() {
        let config: crate::config::Config = toml::from_str("[server]\nheld_texts = \"1M\"\n").unwrap_or_default();
        assert_eq!(config.server.held_texts.0, 1 << 20);
        let off: crate::config::Config = toml::from_str("[server]\nheld_texts = 0\n").unwrap_or_default();
        assert_eq!(off.server.held_texts.0, 0);
        assert_eq!(crate::config::Config::default().server.held_texts.0, caret_index::held::DEFAULT_BUDGET as u64);
        assert!(toml::from_str::<crate::config::Config>("[server]\nheld_texts = \"lots\"\n").is_err());
    }
}
