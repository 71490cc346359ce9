//! Invitations: a single-use code, for one email and role, that expires; whoever holds it
//! joins the organisation as that person and gets their first personal token. The way in
//! without an identity provider.

use sqlx::Row as _;

use crate::db::{Identity, new_id, now_ms};
use crate::error::{Error, Result};
use crate::model::{Credential, CredentialKind, Role, Scope, User};
use crate::people::{NewUser, normal_email};
use crate::tokens::{Holder, NewCredential};

/// An invitation as made (never its code).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invitation {
    /// Opaque id.
    pub id: String,
    /// The organisation.
    pub tenant: String,
    /// Who may use it (their email, lowercase).
    pub email: String,
    /// The role they get.
    pub role: Role,
    /// When it stops working, Unix ms.
    pub expires_at: i64,
}

/// What accepting an invitation made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Joined {
    /// The new person.
    pub user: User,
    /// Their first personal token (shown once).
    pub token: String,
    /// Its record.
    pub credential: Credential,
}

impl Identity {
    /// Invites `email` to `tenant` as `role` for `days`; returns the code (shown once) and
    /// the invitation. `by` is the inviting actor.
    pub async fn invite(
        &self,
        tenant: &str,
        email: &str,
        role: Role,
        days: u32,
        by: &str,
    ) -> Result<(String, Invitation)> {
        let email = normal_email(email)?;
        if !(1..=30).contains(&days) {
            return Err(Error::BadRequest(format!("an invitation lasts 1 to 30 days, not {days}")));
        }
        if self.user_by_email(tenant, &email).await?.is_some() {
            return Err(Error::Conflict(format!("{email} is already a person of this organisation")));
        }
        let code = caret_crypto::new_api_token().map_err(|source| Error::Crypto { what: "making a code", source })?;
        let code = code.replacen("caret_", "caret_inv_", 1);
        let (id, now) = (new_id()?, now_ms());
        let expires_at = now + i64::from(days) * 86_400_000;
        sqlx::query(
            "INSERT INTO invitations (id, tenant_id, email, role, code_hash, created_by, created_at, expires_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
        )
        .bind(&id)
        .bind(tenant)
        .bind(&email)
        .bind(role.name())
        .bind(caret_crypto::hash_api_token(&code))
        .bind(by)
        .bind(now)
        .bind(expires_at)
        .execute(&self.pool)
        .await?;
        Ok((code, Invitation { id, tenant: tenant.to_owned(), email, role, expires_at }))
    }

    /// Uses invitation `code`: once, before it expires. The person is made with `name` and
    /// gets a personal token with every scope their role allows but `admin`'s, for 90 days.
    pub async fn accept(&self, code: &str, name: &str) -> Result<Joined> {
        let now = now_ms();
        let hash = caret_crypto::hash_api_token(code);
        // Taking it is one conditional update: of two at once, one wins.
        let taken = sqlx::query(
            "UPDATE invitations SET used_at = $1 WHERE code_hash = $2 AND used_at IS NULL AND expires_at > $1",
        )
        .bind(now)
        .bind(&hash)
        .execute(&self.pool)
        .await?
        .rows_affected();
        if taken != 1 {
            return Err(Error::BadRequest("this invitation is not valid: unknown, used already or expired".into()));
        }
        let r = sqlx::query("SELECT tenant_id, email, role FROM invitations WHERE code_hash = $1")
            .bind(&hash)
            .fetch_one(&self.pool)
            .await?;
        let (tenant, email, role): (String, String, String) = (r.get(0), r.get(1), r.get(2));
        let role: Role = role.parse().unwrap_or(Role::Member);
        let user = self
            .create_user(&tenant, NewUser { email, name: name.to_owned(), role, source: "invitation".into() })
            .await?;
        let new = NewCredential {
            holder: Holder::User(user.id.clone()),
            kind: CredentialKind::Personal,
            name: "first sign-in".into(),
            scopes: role.allows().without(Scope::Admin),
            expires_at: Some(now + 90 * 86_400_000),
        };
        let (token, credential) = self.create_credential(&tenant, new).await?;
        Ok(Joined { user, token, credential })
    }
}
