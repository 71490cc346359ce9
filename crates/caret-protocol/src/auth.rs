//! Signing in on a team server (`/v1/auth/…`): the ways offered, a device's sign-in (RFC 8628)
//! and the tokens a sign-in gives (RFC 6749's token answer, with who signed in).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// `GET /v1/auth/methods`: how one signs in on this server.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Methods {
    /// Through the organisation's OpenID Connect provider, in a browser.
    pub oidc: bool,
    /// A machine without a browser, its person signing in elsewhere.
    pub device: bool,
    /// With a user name and password checked by the organisation's directory (LDAP).
    #[serde(default)]
    pub ldap: bool,
    /// With a token (personal access token, service account, invitation).
    pub tokens: bool,
}

/// `POST /v1/auth/device`: a device's sign-in, started.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct DeviceAuthorization {
    /// The device's secret: polled with at `POST /v1/auth/token`.
    pub device_code: String,
    /// What its person confirms (`BCDF-GHJK`).
    pub user_code: String,
    /// The page its person opens.
    pub verification_uri: String,
    /// The page with the code filled in.
    pub verification_uri_complete: String,
    /// Seconds the codes last.
    pub expires_in: i64,
    /// Seconds between polls.
    pub interval: i64,
}

/// `POST /v1/auth/token`: sign-in tokens.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct TokenResponse {
    /// The bearer token.
    pub access_token: String,
    /// `Bearer`.
    pub token_type: String,
    /// Seconds the access token lasts.
    pub expires_in: i64,
    /// Buys the next pair, once (`grant_type=refresh_token`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refresh_token: Option<String>,
    /// Who signed in.
    pub email: String,
    /// Their organisation's id.
    pub organisation: String,
}

/// An OAuth error answer of `/v1/auth/token` (RFC 6749, 5.2; `authorization_pending` and
/// `slow_down` while a device waits).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct OAuthError {
    /// `invalid_grant`, `invalid_request`, `authorization_pending`, `slow_down`, `expired_token`, …
    pub error: String,
    /// Why, for people.
    #[serde(default)]
    pub error_description: String,
}

/// `POST /v1/auth/ldap`: a user name and password for the organisation's directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct LdapSignIn {
    /// The directory's user name (`uid`).
    pub username: String,
    /// The password (checked by the directory, never kept).
    pub password: String,
    /// A team page's session (cookies) instead of tokens.
    #[serde(default)]
    pub page: bool,
}
