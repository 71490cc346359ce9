//! People, tokens, groups and the audit trail of an organisation on a team server: who the
//! caller is (`GET /v1/me`), their own tokens (`/v1/me/tokens`) and the admin API
//! (`/v1/admin/…`, for admins and owners).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// `GET /v1/me`: who the credential acts as.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Me {
    /// The organisation's id.
    pub organisation: String,
    /// The organisation's name.
    pub organisation_name: String,
    /// The person's id (none: a service account).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// The person's email, or the service account's name.
    pub name: String,
    /// `owner`, `admin` or `member`.
    pub role: String,
    /// What the credential may do.
    pub scopes: Vec<String>,
    /// `personal`, `service`, `access` or `refresh`.
    pub kind: String,
    /// The credential's id.
    pub credential: String,
    /// When the credential stops working, Unix ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<i64>,
    /// The person's daily budget of model tokens (none: unlimited).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub daily_tokens: Option<i64>,
    /// Model tokens they spent today (UTC).
    #[serde(default)]
    pub spent_today: i64,
}

/// A person as the admin API shows them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Person {
    /// Opaque id.
    pub id: String,
    /// Email.
    pub email: String,
    /// Display name.
    pub name: String,
    /// `owner`, `admin` or `member`.
    pub role: String,
    /// `active` or `deactivated`.
    pub state: String,
    /// Where the record came from.
    pub source: String,
    /// When made, Unix ms.
    pub created_at: i64,
}

/// `POST /v1/admin/users`: a person added by hand.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AddPerson {
    /// Email.
    pub email: String,
    /// Display name (default: the email's local part).
    #[serde(default)]
    pub name: String,
    /// `owner`, `admin` or `member` (default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
}

/// `PATCH /v1/admin/users/{id}`: a new role or state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ChangePerson {
    /// `owner`, `admin` or `member`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    /// `active` or `deactivated` (every credential of theirs ends at once).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
}

/// A credential as listed (never the token).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct TokenInfo {
    /// Opaque id (what revocation names).
    pub id: String,
    /// A name for people.
    pub name: String,
    /// `personal`, `service`, `access`, `refresh` or `tenant` (made before people existed).
    pub kind: String,
    /// Whose (a person's id; none: a service account's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// A service account's role.
    pub role: String,
    /// What it may do.
    pub scopes: Vec<String>,
    /// When made, Unix ms.
    pub created_at: i64,
    /// When it stops working, Unix ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<i64>,
    /// When last used, Unix ms (to within a minute).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_used_at: Option<i64>,
    /// When revoked, Unix ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revoked_at: Option<i64>,
}

/// `POST /v1/me/tokens` (a personal access token) or `POST /v1/admin/tokens` (a service
/// account's).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateToken {
    /// A name for people (`laptop`, `ci`).
    pub name: String,
    /// Scopes: `search`, `sync`, `complete`, `chat`, `agent`, `runs`, `docs`, `admin`, or
    /// `all` (default: all the role allows but `admin`).
    #[serde(default)]
    pub scopes: Vec<String>,
    /// Days until it expires (default 90; at most 366).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 366))]
    pub expires_in_days: Option<u32>,
    /// A service account's role, `member` (default) or `admin`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    /// `service` (default), or `scim`: the identity provider's token, which opens `/scim/v2`
    /// and nothing else.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
}

/// A token just made: the token itself, shown this once.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct TokenCreated {
    /// The bearer token.
    pub token: String,
    /// Its record.
    pub info: TokenInfo,
}

/// A group as listed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct GroupInfo {
    /// Opaque id.
    pub id: String,
    /// Name.
    pub name: String,
    /// Where it came from.
    pub source: String,
    /// Its members' ids.
    pub members: Vec<String>,
    /// The model aliases its members may use (none: no restriction from this group).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub models: Option<Vec<String>>,
    /// Each member's daily budget of model tokens (none: this group sets none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub daily_tokens: Option<i64>,
}

/// `PUT /v1/admin/groups/{id}/budget`: a daily budget of model tokens for each member (at
/// 80% their answers carry a warning; at 100% model calls answer 429 until the next UTC day).
/// A person's budget is the largest of their groups'; in none with a budget, unlimited.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct GroupBudget {
    /// Tokens a day (none: this group sets no budget).
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub daily_tokens: Option<i64>,
}

/// `GET /v1/admin/usage`: model tokens spent, per person, per model and per group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct UsageReport {
    /// The first UTC day counted (`2026-11-20`).
    pub since: String,
    /// Per person and model, per day.
    pub rows: Vec<UsageRow>,
    /// Totals per person (their email).
    pub by_person: Vec<UsageTotal>,
    /// Totals per model alias.
    pub by_model: Vec<UsageTotal>,
    /// Totals per group (a person in several groups counts in each).
    pub by_group: Vec<UsageTotal>,
    /// What each person did, from the usage telemetry (empty where the server does not
    /// collect it): per person and event, over the same days.
    #[serde(default)]
    pub activity: Vec<Activity>,
}

/// A person's use of a capability (counts only; never what they searched, typed or asked).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Activity {
    /// The person's id.
    pub user: String,
    /// Their email.
    pub email: String,
    /// The event (`tab.shown`, `tab.accepted`, `search`, `chat`, `agent.turn`…).
    pub event: String,
    /// How many.
    pub count: u64,
    /// How many failed.
    pub failed: u64,
}

/// A person's spending on a model on a day.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct UsageRow {
    /// The UTC day (`2026-11-27`).
    pub day: String,
    /// The person's id.
    pub user: String,
    /// Their email.
    pub email: String,
    /// The model alias.
    pub model: String,
    /// Tokens (prompt and completion).
    pub tokens: i64,
    /// Model calls.
    pub requests: i64,
}

/// A total.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct UsageTotal {
    /// Whose or what.
    pub name: String,
    /// Tokens.
    pub tokens: i64,
    /// Model calls.
    pub requests: i64,
}

/// `PUT /v1/admin/groups/{id}/models`: the model aliases a group's members may use. A person
/// in groups with lists may use the aliases of any of them; in none, every alias.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GroupModels {
    /// The aliases (none: this group restricts nothing).
    pub models: Option<Vec<String>>,
}

/// `POST /v1/admin/groups`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateGroup {
    /// Name.
    pub name: String,
}

/// One record of the audit trail.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct AuditRecord {
    /// Its number.
    pub seq: i64,
    /// When, Unix ms.
    pub at_ms: i64,
    /// Who: `user:ID`, `service:ID`, `operator`, `anonymous`.
    pub actor: String,
    /// The client's address.
    pub address: String,
    /// What (`token.create`, `user.role`, `run.submit`…).
    pub action: String,
    /// On what (an id or a name of Caret's).
    pub target: String,
    /// `ok`, or why not.
    pub outcome: String,
    /// The hash of the record before.
    pub prev_hash: String,
    /// Its own hash.
    pub hash: String,
}

/// `GET /v1/admin/audit`: query.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct AuditQuery {
    /// From this time, Unix ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since_ms: Option<i64>,
    /// Only this person's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// After this record.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<i64>,
    /// At most this many (default 100, at most 1,000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<i64>,
}

/// `POST /v1/admin/audit/verify`: what a check of the chain found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct AuditVerification {
    /// Records checked (every organisation's: the chain is one).
    pub records: i64,
    /// The head's hash.
    pub head: String,
    /// Every break found; empty: intact.
    pub problems: Vec<String>,
}

/// `POST /v1/admin/invitations`: someone invited by email.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Invite {
    /// Their email.
    pub email: String,
    /// The role they get: `member` (default), `admin` or `owner` (an owner's to give).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    /// Days until the invitation expires (default 7, at most 30).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 30))]
    pub days: Option<u32>,
}

/// An invitation made: its code, shown this once (`caret login --invitation CODE`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Invited {
    /// Its id.
    pub id: String,
    /// The single-use code.
    pub code: String,
    /// Who may use it.
    pub email: String,
    /// The role they get.
    pub role: String,
    /// When it expires, Unix ms.
    pub expires_at: i64,
}

/// `POST /v1/invitations/accept`: an invitation used.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AcceptInvitation {
    /// The code.
    pub code: String,
    /// The person's name (default: their email's local part).
    #[serde(default)]
    pub name: String,
}

/// Someone who joined: the person and their first personal token, shown this once.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Joined {
    /// The organisation's name.
    pub organisation_name: String,
    /// The person.
    pub person: Person,
    /// Their first token.
    pub token: TokenCreated,
}

/// `GET /v1/admin/settings`: the organisation's settings as they hold (its own, else the
/// server's).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Settings {
    /// Who may add and remove @Docs sources: `members` or `admins`.
    pub docs_sources: String,
    /// The longest a personal access token may live, days.
    pub token_max_days: u32,
    /// The settings this organisation set (the rest are the server's defaults).
    pub overridden: Vec<String>,
}

/// `PATCH /v1/admin/settings`: the settings to change (the others are left).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ChangeSettings {
    /// `members`, `admins`, or `default` (the server's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub docs_sources: Option<String>,
    /// 1 to 366 days, or 0 (the server's default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 366))]
    pub token_max_days: Option<i64>,
}

/// `GET /v1/admin/flags`: a flag as it falls for the organisation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct FlagInfo {
    /// The flag (`agent`, `model.big`, `experiment.x`).
    pub name: String,
    /// Whether it is on for this organisation.
    pub on: bool,
    /// Whose rule decides: `this organisation` or `every organisation`.
    pub rule: String,
}
