//! Signing in: the sign-ins waiting for the identity provider (their `state`, `nonce` and
//! PKCE verifier, each used once), the person a provider vouched for (made on first sign-in
//! where that is allowed), and what a sign-in gives a client:
//!
//! - a one-time code for a client's loopback redirect, exchanged with the client's own PKCE
//!   verifier (as `gh auth login` does);
//! - a device code (RFC 8628) a machine without a browser polls while its person signs in
//!   elsewhere;
//! - sign-in tokens: a short-lived access token and a refresh token, rotated on each use; a
//!   refresh token used twice revokes its whole sign-in (the family).
//!
//! Every state, code and token is stored as its SHA-256 only.

use serde::{Deserialize, Serialize};
use sqlx::Row as _;

use crate::db::{Identity, new_id, now_ms};
use crate::error::{Error, Result};
use crate::model::{CredentialKind, Role, User, UserState};
use crate::oidc::{SignedIn, Signup, random_text};
use crate::people::NewUser;
use crate::tokens::{Holder, NewCredential};

/// How long a sign-in may wait for the provider.
const SIGN_IN_MS: i64 = 10 * 60_000;
/// How long a loopback code lasts.
const CODE_MS: i64 = 60_000;
/// How long a device code lasts.
const DEVICE_MS: i64 = 10 * 60_000;
/// The polling interval a device is given, seconds.
pub const DEVICE_INTERVAL_S: i64 = 2;
/// An access token's life.
pub const ACCESS_MS: i64 = 60 * 60_000;
/// A refresh token's life.
pub const REFRESH_MS: i64 = 30 * 86_400_000;
/// A team page's session's life.
pub const PAGE_MS: i64 = 12 * 60 * 60_000;

/// What a sign-in is for: where it goes once the provider answers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "purpose", rename_all = "snake_case")]
pub enum Purpose {
    /// The team pages: a cookie session, then this path.
    Page {
        /// A path on this server.
        next: String,
    },
    /// A client on this machine's loopback: a code sent to its redirect.
    Client {
        /// `http://127.0.0.1:PORT/…`.
        redirect_uri: String,
        /// The client's own state, handed back.
        state: String,
        /// The client's PKCE challenge (S256).
        challenge: String,
    },
    /// A device waiting with this user code.
    Device {
        /// The code shown on the device.
        user_code: String,
    },
}

/// A sign-in waiting for the provider.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pending {
    /// The organisation.
    pub tenant: String,
    /// Where it goes.
    pub purpose: Purpose,
    /// The ID token's expected nonce.
    pub nonce: String,
    /// The PKCE verifier for the provider's code.
    pub verifier: String,
}

/// Tokens a sign-in gives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionTokens {
    /// The bearer token.
    pub access_token: String,
    /// Buys the next pair (none for a page session).
    pub refresh_token: Option<String>,
    /// When the access token stops working, Unix ms.
    pub expires_at: i64,
    /// The access token's credential id.
    pub credential: String,
    /// Who signed in.
    pub user: User,
}

/// A device's sign-in, just started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceStart {
    /// The device's secret, polled with.
    pub device_code: String,
    /// What its person types (`BCDF-GHJK`).
    pub user_code: String,
    /// Seconds it lasts.
    pub expires_in: i64,
    /// Seconds between polls.
    pub interval: i64,
}

/// What a device's poll finds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DevicePoll {
    /// Nobody has signed in for it yet.
    Pending,
    /// Polled faster than its interval.
    SlowDown,
    /// Signed in: the tokens (given once).
    Done(Box<SessionTokens>),
}

/// How a provider's person joins.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Joining {
    /// `oidc` or `ldap`.
    pub source: &'static str,
    /// Whether a first sign-in makes the person.
    pub signup: Signup,
    /// The role the provider's groups give (none: roles are not mapped).
    pub role: Option<Role>,
    /// Whether the provider's groups become the person's.
    pub sync_groups: bool,
}

fn hash(text: &str) -> String {
    caret_crypto::hash_api_token(text)
}

/// A user code's alphabet: consonants only, no lookalikes (RFC 8628, 6.1).
const USER_CODE_LETTERS: &[u8] = b"BCDFGHJKLMNPQRSTVWXZ";

/// A user code as typed (any case, with or without its dash), as stored.
pub fn normal_user_code(text: &str) -> String {
    text.chars().filter(char::is_ascii_alphabetic).map(|c| c.to_ascii_uppercase()).collect()
}

fn new_user_code() -> Result<String> {
    let mut bytes = [0u8; 8];
    getrandom::fill(&mut bytes).map_err(|e| Error::Upstream(format!("no randomness: {e}")))?;
    Ok(bytes.iter().map(|b| USER_CODE_LETTERS[usize::from(*b) % USER_CODE_LETTERS.len()] as char).collect())
}

/// A user code as shown: `BCDF-GHJK`.
pub fn shown_user_code(code: &str) -> String {
    if code.len() == 8 { format!("{}-{}", &code[..4], &code[4..]) } else { code.to_owned() }
}

impl Identity {
    /// Starts a sign-in for `purpose`; returns its `state` (for the provider) and what the
    /// provider's answer is checked with.
    pub async fn begin_sign_in(&self, tenant: &str, purpose: Purpose) -> Result<(String, Pending)> {
        let (state, nonce, (verifier, _)) = (random_text()?, random_text()?, crate::oidc::pkce()?);
        let now = now_ms();
        sqlx::query("DELETE FROM sign_ins WHERE expires_at < $1").bind(now).execute(&self.pool).await?;
        let target = serde_json::to_string(&purpose).map_err(|e| Error::BadRequest(e.to_string()))?;
        sqlx::query(
            "INSERT INTO sign_ins (state_hash, tenant_id, purpose, target, nonce, verifier, expires_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7)",
        )
        .bind(hash(&state))
        .bind(tenant)
        .bind(match &purpose {
            Purpose::Page { .. } => "page",
            Purpose::Client { .. } => "client",
            Purpose::Device { .. } => "device",
        })
        .bind(target)
        .bind(&nonce)
        .bind(&verifier)
        .bind(now + SIGN_IN_MS)
        .execute(&self.pool)
        .await?;
        Ok((state, Pending { tenant: tenant.to_owned(), purpose, nonce, verifier }))
    }

    /// Takes the sign-in of `state`: once, before it expires.
    pub async fn take_sign_in(&self, state: &str) -> Result<Pending> {
        let h = hash(state);
        let row =
            sqlx::query("SELECT tenant_id, target, nonce, verifier, expires_at FROM sign_ins WHERE state_hash = $1")
                .bind(&h)
                .fetch_optional(&self.pool)
                .await?;
        let taken = sqlx::query("DELETE FROM sign_ins WHERE state_hash = $1")
            .bind(&h)
            .execute(&self.pool)
            .await?
            .rows_affected();
        let unknown = || Error::BadToken("this sign-in is unknown, used already or expired: start again".into());
        let Some(r) = row.filter(|r| taken == 1 && r.get::<i64, _>(4) > now_ms()) else { return Err(unknown()) };
        let purpose = serde_json::from_str(&r.get::<String, _>(1)).map_err(|_| unknown())?;
        Ok(Pending { tenant: r.get(0), purpose, nonce: r.get(2), verifier: r.get(3) })
    }

    /// The person the provider vouched for: found by email, or made where `joining` allows
    /// (an open sign-up, or an invitation waiting for that email); their role and groups
    /// follow the provider's groups where they are mapped. A deactivated person is refused.
    pub async fn signed_in(&self, tenant: &str, who: &SignedIn, joining: &Joining) -> Result<User> {
        let user = match self.user_by_email(tenant, &who.email).await? {
            Some(u) if u.state != UserState::Active => {
                return Err(Error::Forbidden(format!("{} is deactivated in this organisation", u.email)));
            }
            Some(u) => u,
            None => {
                let invited = self.take_invitation(tenant, &who.email).await?;
                if invited.is_none() && joining.signup == Signup::Invited {
                    return Err(Error::Forbidden(format!(
                        "{} is not a person of this organisation; ask an admin for an invitation",
                        who.email
                    )));
                }
                let role = invited.or(joining.role).unwrap_or(Role::Member).min(Role::Admin);
                let new =
                    NewUser { email: who.email.clone(), name: who.name.clone(), role, source: joining.source.into() };
                self.create_user(tenant, new).await?
            }
        };
        let user = match joining.role {
            Some(role) if user.role != Role::Owner && role != user.role => {
                self.set_role(tenant, &user.id, role).await?
            }
            _ => user,
        };
        if joining.sync_groups {
            self.sync_groups(tenant, &user.id, &who.groups, joining.source).await?;
        }
        Ok(user)
    }

    /// Makes the provider's groups `user`'s: joins those named (made as needed) and leaves
    /// the provider's groups not named; groups made by hand are left alone.
    async fn sync_groups(&self, tenant: &str, user: &str, names: &[String], source: &str) -> Result<()> {
        use crate::people::Membership;
        let groups = self.groups(tenant).await?;
        for name in names.iter().filter(|n| !n.trim().is_empty()).take(100) {
            let id = match groups.iter().find(|g| &g.name == name) {
                Some(g) => g.id.clone(),
                None => self.create_group(tenant, name, source).await?.id,
            };
            self.set_member(tenant, &id, user, Membership::In).await?;
        }
        for g in groups.iter().filter(|g| g.source == source && !names.contains(&g.name)) {
            if g.members.iter().any(|m| m == user) {
                self.set_member(tenant, &g.id, user, Membership::Out).await?;
            }
        }
        Ok(())
    }

    /// Uses an invitation waiting for `email` (its role), if one is.
    async fn take_invitation(&self, tenant: &str, email: &str) -> Result<Option<Role>> {
        let now = now_ms();
        let row = sqlx::query(
            "SELECT id, role FROM invitations WHERE tenant_id = $1 AND email = $2 AND used_at IS NULL \
             AND expires_at > $3 ORDER BY created_at DESC",
        )
        .bind(tenant)
        .bind(email)
        .bind(now)
        .fetch_optional(&self.pool)
        .await?;
        let Some(r) = row else { return Ok(None) };
        let taken = sqlx::query("UPDATE invitations SET used_at = $1 WHERE id = $2 AND used_at IS NULL")
            .bind(now)
            .bind(r.get::<String, _>(0))
            .execute(&self.pool)
            .await?
            .rows_affected();
        Ok((taken == 1).then(|| r.get::<String, _>(1).parse().unwrap_or(Role::Member)))
    }

    /// Sign-in tokens for `user`: an access token for `access_ms` with every scope their role
    /// allows, and (`refresh`) a refresh token, both of one new family unless `family` is
    /// given.
    pub async fn issue_session(
        &self,
        tenant: &str,
        user: &User,
        name: &str,
        access_ms: i64,
        refresh: bool,
        family: Option<&str>,
    ) -> Result<SessionTokens> {
        let family = match family {
            Some(f) => f.to_owned(),
            None => new_id()?,
        };
        let now = now_ms();
        let new = |kind, expires_at| NewCredential {
            holder: Holder::User(user.id.clone()),
            kind,
            name: name.to_owned(),
            scopes: user.role.allows(),
            expires_at: Some(expires_at),
        };
        let (access_token, c) =
            self.make_credential(tenant, new(CredentialKind::Access, now + access_ms), Some(&family)).await?;
        let refresh_token = if refresh {
            let r = new(CredentialKind::Refresh, now + REFRESH_MS);
            Some(self.make_credential(tenant, r, Some(&family)).await?.0)
        } else {
            None
        };
        Ok(SessionTokens {
            access_token,
            refresh_token,
            expires_at: now + access_ms,
            credential: c.id,
            user: user.clone(),
        })
    }

    /// Revokes every credential of sign-in `family`.
    pub async fn revoke_family(&self, family: &str) -> Result<()> {
        let mut tx = self.pool.begin().await?;
        sqlx::query("UPDATE credentials SET revoked_at = $1 WHERE family = $2 AND revoked_at IS NULL")
            .bind(now_ms())
            .bind(family)
            .execute(&mut *tx)
            .await?;
        Identity::bump(&mut tx).await?;
        tx.commit().await?;
        Ok(())
    }

    /// Signs out the sign-in credential `credential` belongs to; a token of no sign-in (a
    /// personal access token) is refused: it is revoked as itself.
    pub async fn sign_out(&self, tenant: &str, credential: &str) -> Result<()> {
        let family: Option<String> = sqlx::query("SELECT family FROM credentials WHERE tenant_id = $1 AND id = $2")
            .bind(tenant)
            .bind(credential)
            .fetch_optional(&self.pool)
            .await?
            .and_then(|r| r.get(0));
        match family {
            Some(f) => self.revoke_family(&f).await,
            None => Err(Error::Conflict("this token is not a sign-in's: revoke it as a token".into())),
        }
    }

    /// A new pair for refresh token `token`, which stops working. A refresh token presented
    /// again after its use revokes its whole sign-in: one of the two holders stole it.
    pub async fn refresh(&self, token: &str) -> Result<SessionTokens> {
        let row = sqlx::query(
            "SELECT id, tenant_id, user_id, family, expires_at, revoked_at FROM credentials \
             WHERE token_hash = $1 AND kind = 'refresh'",
        )
        .bind(hash(token))
        .fetch_optional(&self.pool)
        .await?;
        let Some(r) = row else { return Err(Error::BadToken("unknown refresh token".into())) };
        let (id, tenant, user, family): (String, String, Option<String>, Option<String>) =
            (r.get(0), r.get(1), r.get(2), r.get(3));
        let now = now_ms();
        if r.get::<Option<i64>, _>(4).is_some_and(|e| e <= now) {
            return Err(Error::BadToken("the refresh token has expired: sign in again".into()));
        }
        let used = sqlx::query("UPDATE credentials SET revoked_at = $1 WHERE id = $2 AND revoked_at IS NULL")
            .bind(now)
            .bind(&id)
            .execute(&self.pool)
            .await?
            .rows_affected();
        if used != 1 {
            if let Some(f) = &family {
                self.revoke_family(f).await?;
            }
            return Err(Error::BadToken(
                "this refresh token was used already: its sign-in is revoked everywhere; sign in again".into(),
            ));
        }
        let user = self.user(&tenant, user.as_deref().unwrap_or_default()).await?;
        if user.state != UserState::Active {
            return Err(Error::BadToken(format!("{} is deactivated", user.email)));
        }
        self.issue_session(&tenant, &user, "sign-in", ACCESS_MS, true, family.as_deref()).await
    }

    /// A one-time code for a client's loopback redirect: `user`'s sign-in, given to whoever
    /// shows the verifier of `challenge` within a minute.
    pub async fn issue_code(&self, tenant: &str, user: &str, redirect_uri: &str, challenge: &str) -> Result<String> {
        let code = random_text()?;
        sqlx::query(
            "INSERT INTO grants (code_hash, kind, tenant_id, user_id, challenge, redirect, state, expires_at) \
             VALUES ($1, 'code', $2, $3, $4, $5, 'approved', $6)",
        )
        .bind(hash(&code))
        .bind(tenant)
        .bind(user)
        .bind(challenge)
        .bind(redirect_uri)
        .bind(now_ms() + CODE_MS)
        .execute(&self.pool)
        .await?;
        Ok(code)
    }

    /// Sign-in tokens for loopback `code`: once, with the verifier of its challenge and the
    /// same redirect. A code used twice revokes what it gave the first time.
    pub async fn redeem_code(&self, code: &str, verifier: &str, redirect_uri: &str) -> Result<SessionTokens> {
        let h = hash(code);
        let row = sqlx::query(
            "SELECT tenant_id, user_id, challenge, redirect, state, family, expires_at FROM grants \
             WHERE code_hash = $1 AND kind = 'code'",
        )
        .bind(&h)
        .fetch_optional(&self.pool)
        .await?;
        let Some(r) = row else { return Err(Error::BadToken("unknown code".into())) };
        let (tenant, user, challenge, redirect): (String, String, String, String) =
            (r.get(0), r.get(1), r.get(2), r.get(3));
        let family = new_id()?;
        let taken = sqlx::query(
            "UPDATE grants SET state = 'used', family = $1 WHERE code_hash = $2 AND state = 'approved' AND expires_at > $3",
        )
        .bind(&family)
        .bind(&h)
        .bind(now_ms())
        .execute(&self.pool)
        .await?
        .rows_affected();
        if taken != 1 {
            if let Some(f) = r.get::<Option<String>, _>(5) {
                self.revoke_family(&f).await?;
            }
            return Err(Error::BadToken("this code is used already or expired".into()));
        }
        if redirect != redirect_uri {
            return Err(Error::BadToken("the redirect is not the one the code was given to".into()));
        }
        if !crate::constant_time_eq(crate::oidc::challenge_of(verifier).as_bytes(), challenge.as_bytes()) {
            return Err(Error::BadToken("the code verifier does not match the challenge".into()));
        }
        let user = self.user(&tenant, &user).await?;
        self.issue_session(&tenant, &user, "sign-in", ACCESS_MS, true, Some(&family)).await
    }

    /// Starts a device's sign-in for `tenant`.
    pub async fn start_device(&self, tenant: &str) -> Result<DeviceStart> {
        let (device_code, user_code) = (random_text()?, new_user_code()?);
        let now = now_ms();
        sqlx::query("DELETE FROM grants WHERE expires_at < $1").bind(now - 86_400_000).execute(&self.pool).await?;
        sqlx::query(
            "INSERT INTO grants (code_hash, kind, tenant_id, user_code, state, expires_at) \
             VALUES ($1, 'device', $2, $3, 'pending', $4)",
        )
        .bind(hash(&device_code))
        .bind(tenant)
        .bind(&user_code)
        .bind(now + DEVICE_MS)
        .execute(&self.pool)
        .await?;
        Ok(DeviceStart {
            device_code,
            user_code: shown_user_code(&user_code),
            expires_in: DEVICE_MS / 1000,
            interval: DEVICE_INTERVAL_S,
        })
    }

    /// The organisation of a waiting device's `user_code`.
    pub async fn device_tenant(&self, user_code: &str) -> Result<String> {
        sqlx::query("SELECT tenant_id FROM grants WHERE user_code = $1 AND state = 'pending' AND expires_at > $2")
            .bind(normal_user_code(user_code))
            .bind(now_ms())
            .fetch_optional(&self.pool)
            .await?
            .map(|r| r.get(0))
            .ok_or_else(|| Error::BadToken("this code is unknown, used already or expired".into()))
    }

    /// `user` signed in for the device showing `user_code`.
    pub async fn approve_device(&self, tenant: &str, user_code: &str, user: &str) -> Result<()> {
        let n = sqlx::query(
            "UPDATE grants SET state = 'approved', user_id = $1 \
             WHERE user_code = $2 AND tenant_id = $3 AND state = 'pending' AND expires_at > $4",
        )
        .bind(user)
        .bind(normal_user_code(user_code))
        .bind(tenant)
        .bind(now_ms())
        .execute(&self.pool)
        .await?
        .rows_affected();
        if n == 1 { Ok(()) } else { Err(Error::BadToken("this code is unknown, used already or expired".into())) }
    }

    /// A device's poll.
    pub async fn poll_device(&self, device_code: &str) -> Result<DevicePoll> {
        let h = hash(device_code);
        let row = sqlx::query(
            "SELECT tenant_id, user_id, state, expires_at, polled_at FROM grants WHERE code_hash = $1 AND kind = 'device'",
        )
        .bind(&h)
        .fetch_optional(&self.pool)
        .await?;
        let Some(r) = row else { return Err(Error::BadToken("unknown device code".into())) };
        let now = now_ms();
        if r.get::<i64, _>(3) <= now {
            return Err(Error::BadToken("the device code has expired: start again".into()));
        }
        let state: String = r.get(2);
        let polled: Option<i64> = r.get(4);
        sqlx::query("UPDATE grants SET polled_at = $1 WHERE code_hash = $2")
            .bind(now)
            .bind(&h)
            .execute(&self.pool)
            .await?;
        if polled.is_some_and(|p| now - p < DEVICE_INTERVAL_S * 1000 - 200) && state == "pending" {
            return Ok(DevicePoll::SlowDown);
        }
        match state.as_str() {
            "pending" => Ok(DevicePoll::Pending),
            "approved" => {
                let taken = sqlx::query("UPDATE grants SET state = 'used' WHERE code_hash = $1 AND state = 'approved'")
                    .bind(&h)
                    .execute(&self.pool)
                    .await?
                    .rows_affected();
                if taken != 1 {
                    return Err(Error::BadToken("this device code is used already".into()));
                }
                let (tenant, user): (String, Option<String>) = (r.get(0), r.get(1));
                let user = self.user(&tenant, user.as_deref().unwrap_or_default()).await?;
                let tokens = self.issue_session(&tenant, &user, "sign-in (device)", ACCESS_MS, true, None).await?;
                Ok(DevicePoll::Done(Box::new(tokens)))
            }
            _ => Err(Error::BadToken("this device code is used already".into())),
        }
    }
}
