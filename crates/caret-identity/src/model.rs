//! The data: roles, scopes, people, groups, credentials and who a request acts as.

use serde::{Deserialize, Serialize};

/// A person's role in their organisation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Uses the capabilities; sees their own sessions, runs and tokens.
    Member,
    /// Also administers people, groups, tokens, flags and settings, and reads the audit trail.
    Admin,
    /// Also makes and removes owners; an organisation always keeps one.
    Owner,
}

impl Role {
    /// Its name as stored and shown.
    pub fn name(self) -> &'static str {
        match self {
            Role::Member => "member",
            Role::Admin => "admin",
            Role::Owner => "owner",
        }
    }

    /// The role an identity provider's `groups` give where `group_roles` maps groups to roles
    /// (none: roles are not mapped): the highest mapped, else member.
    pub fn from_groups(group_roles: &std::collections::BTreeMap<String, Role>, groups: &[String]) -> Option<Role> {
        if group_roles.is_empty() {
            return None;
        }
        Some(groups.iter().filter_map(|g| group_roles.get(g)).copied().max().unwrap_or(Role::Member))
    }

    /// The scopes this role may hold.
    pub fn allows(self) -> Scopes {
        match self {
            Role::Member => Scopes::ALL.without(Scope::Admin),
            Role::Admin | Role::Owner => Scopes::ALL,
        }
    }
}

impl std::str::FromStr for Role {
    type Err = String;
    fn from_str(s: &str) -> Result<Role, String> {
        match s {
            "member" => Ok(Role::Member),
            "admin" => Ok(Role::Admin),
            "owner" => Ok(Role::Owner),
            other => Err(format!("a role is owner, admin or member, not {other:?}")),
        }
    }
}

/// What a credential may be used for: one per family of routes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Scope {
    /// Searching workspaces.
    Search,
    /// Syncing workspaces (trees, plans, commits, embedding).
    Sync,
    /// Tab and apply.
    Complete,
    /// The model gateway's chat, completions and embeddings.
    Chat,
    /// Agent sessions.
    Agent,
    /// Background runs, environments and secrets.
    Runs,
    /// @Docs sources and their search.
    Docs,
    /// The admin API.
    Admin,
}

impl Scope {
    /// Every scope, in order.
    pub const ALL: [Scope; 8] = [
        Scope::Search,
        Scope::Sync,
        Scope::Complete,
        Scope::Chat,
        Scope::Agent,
        Scope::Runs,
        Scope::Docs,
        Scope::Admin,
    ];

    /// Its name.
    pub fn name(self) -> &'static str {
        match self {
            Scope::Search => "search",
            Scope::Sync => "sync",
            Scope::Complete => "complete",
            Scope::Chat => "chat",
            Scope::Agent => "agent",
            Scope::Runs => "runs",
            Scope::Docs => "docs",
            Scope::Admin => "admin",
        }
    }

    fn bit(self) -> u16 {
        1 << (Scope::ALL.iter().position(|s| *s == self).unwrap_or(0))
    }
}

impl std::str::FromStr for Scope {
    type Err = String;
    fn from_str(s: &str) -> Result<Scope, String> {
        Scope::ALL.into_iter().find(|x| x.name() == s).ok_or_else(|| {
            let names: Vec<&str> = Scope::ALL.iter().map(|x| x.name()).collect();
            format!("a scope is one of {}, not {s:?}", names.join(", "))
        })
    }
}

/// A set of scopes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Scopes(u16);

impl Scopes {
    /// Every scope.
    pub const ALL: Scopes = Scopes(0xff);
    /// No scope.
    pub const NONE: Scopes = Scopes(0);

    /// Whether `scope` is in the set.
    pub fn has(self, scope: Scope) -> bool {
        self.0 & scope.bit() != 0
    }

    /// The set with `scope`.
    pub fn with(self, scope: Scope) -> Scopes {
        Scopes(self.0 | scope.bit())
    }

    /// The set without `scope`.
    pub fn without(self, scope: Scope) -> Scopes {
        Scopes(self.0 & !scope.bit())
    }

    /// Scopes in both.
    pub fn and(self, other: Scopes) -> Scopes {
        Scopes(self.0 & other.0)
    }

    /// Whether every scope of `self` is in `other`.
    pub fn within(self, other: Scopes) -> bool {
        self.0 & !other.0 == 0
    }

    /// Parses `search,sync` (or `all`); the first unknown name is the error.
    pub fn parse(text: &str) -> Result<Scopes, String> {
        let mut out = Scopes::NONE;
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            out = if part == "all" { Scopes::ALL } else { out.with(part.parse()?) };
        }
        Ok(out)
    }

    /// The names, in order.
    pub fn names(self) -> Vec<&'static str> {
        Scope::ALL.into_iter().filter(|s| self.has(*s)).map(Scope::name).collect()
    }
}

impl std::fmt::Display for Scopes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.names().join(","))
    }
}

impl Serialize for Scopes {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.names().serialize(s)
    }
}

impl<'de> Deserialize<'de> for Scopes {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Scopes, D::Error> {
        let names = Vec::<String>::deserialize(d)?;
        Scopes::parse(&names.join(",")).map_err(serde::de::Error::custom)
    }
}

/// Whether a person may sign in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UserState {
    /// Signs in; their credentials work.
    Active,
    /// Ended: every credential and session of theirs refused.
    Deactivated,
}

impl UserState {
    /// Its name as stored.
    pub fn name(self) -> &'static str {
        match self {
            UserState::Active => "active",
            UserState::Deactivated => "deactivated",
        }
    }

    pub(crate) fn parse(s: &str) -> UserState {
        if s == "active" { UserState::Active } else { UserState::Deactivated }
    }
}

/// A person of an organisation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct User {
    /// Opaque id.
    pub id: String,
    /// Their organisation (tenant id).
    pub tenant: String,
    /// Email, lowercase; unique in the organisation.
    pub email: String,
    /// Display name.
    pub name: String,
    /// Role.
    pub role: Role,
    /// Active or deactivated.
    pub state: UserState,
    /// Where the record came from: `bootstrap`, `admin`, `invitation`, `oidc`, `ldap`, `scim`.
    pub source: String,
    /// When made (Unix ms).
    pub created_at: i64,
}

/// A group of people (made by hand, or from the identity provider).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Group {
    /// Opaque id.
    pub id: String,
    /// Its organisation.
    pub tenant: String,
    /// Name, unique in the organisation.
    pub name: String,
    /// Where it came from: `admin`, `oidc`, `ldap`, `scim`.
    pub source: String,
    /// Ids of its members.
    pub members: Vec<String>,
    /// The model aliases its members may use (none: the group does not restrict them).
    pub models: Option<Vec<String>>,
    /// Each member's daily budget of model tokens (none: the group sets none).
    pub daily_tokens: Option<i64>,
}

/// What kind of credential a token is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CredentialKind {
    /// A person's personal access token.
    Personal,
    /// A service account's token (CI, scripts; tenant tokens made before people existed).
    Service,
    /// A short-lived access token of a sign-in.
    Access,
    /// The refresh token of a sign-in.
    Refresh,
    /// The identity provider's SCIM token: `/scim/v2` only.
    Scim,
}

impl CredentialKind {
    /// Its name as stored.
    pub fn name(self) -> &'static str {
        match self {
            CredentialKind::Personal => "personal",
            CredentialKind::Service => "service",
            CredentialKind::Access => "access",
            CredentialKind::Refresh => "refresh",
            CredentialKind::Scim => "scim",
        }
    }

    pub(crate) fn parse(s: &str) -> CredentialKind {
        match s {
            "personal" => CredentialKind::Personal,
            "access" => CredentialKind::Access,
            "refresh" => CredentialKind::Refresh,
            "scim" => CredentialKind::Scim,
            _ => CredentialKind::Service,
        }
    }
}

/// A credential as listed (never the token itself).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Credential {
    /// Opaque id (what revocation names).
    pub id: String,
    /// Its organisation.
    pub tenant: String,
    /// Whose it is (none: a service account's).
    pub user: Option<String>,
    /// Kind.
    pub kind: CredentialKind,
    /// A name for people.
    pub name: String,
    /// What it may be used for.
    pub scopes: Scopes,
    /// A service account's role (a person's credentials take the person's).
    pub role: Role,
    /// When made, Unix ms.
    pub created_at: i64,
    /// When it stops working, Unix ms (none: never).
    pub expires_at: Option<i64>,
    /// When it was last used, Unix ms (to within a minute).
    pub last_used_at: Option<i64>,
    /// When it was revoked, Unix ms.
    pub revoked_at: Option<i64>,
}

/// Who a request acts as: the organisation, the person (none for a service account), their
/// role and what the credential may do.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Principal {
    /// The organisation (tenant id).
    pub tenant: String,
    /// The person's id (none: a service account).
    pub user: Option<String>,
    /// The person's email or the service account's name.
    pub name: String,
    /// Role: the person's, or the service account's.
    pub role: Role,
    /// The credential's scopes within what the role allows.
    pub scopes: Scopes,
    /// The credential's id.
    pub credential: String,
    /// The credential's kind.
    pub kind: CredentialKind,
    /// When the credential stops working, Unix ms.
    pub expires_at: Option<i64>,
}

impl Principal {
    /// Whether the credential may be used for `scope`.
    pub fn may(&self, scope: Scope) -> bool {
        self.scopes.has(scope)
    }

    /// Whether it has expired at `now_ms`.
    pub fn expired(&self, now_ms: i64) -> bool {
        self.expires_at.is_some_and(|e| e <= now_ms)
    }

    /// Who it is, for the audit trail: `user:ID` or `service:CREDENTIAL`.
    pub fn actor(&self) -> String {
        match &self.user {
            Some(u) => format!("user:{u}"),
            None => format!("service:{}", self.credential),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scopes_parse_print_and_stay_within_roles() {
        let s = Scopes::parse("search, sync").unwrap();
        assert!(s.has(Scope::Search) && s.has(Scope::Sync) && !s.has(Scope::Admin));
        assert_eq!(s.to_string(), "search,sync");
        assert_eq!(Scopes::parse("all").unwrap(), Scopes::ALL);
        assert!(Scopes::parse("search,root").unwrap_err().contains("not \"root\""));
        assert!(!Scopes::ALL.within(Role::Member.allows()));
        assert!(Scopes::ALL.without(Scope::Admin).within(Role::Member.allows()));
        assert!(Scopes::ALL.within(Role::Owner.allows()));
        let json = serde_json::to_string(&s).unwrap();
        assert_eq!(json, r#"["search","sync"]"#);
        assert_eq!(serde_json::from_str::<Scopes>(&json).unwrap(), s);
        assert_eq!("owner".parse::<Role>(), Ok(Role::Owner));
        assert!(Role::Owner > Role::Admin && Role::Admin > Role::Member);
    }
}
