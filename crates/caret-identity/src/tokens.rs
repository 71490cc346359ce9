//! Credentials: personal access tokens, service accounts and sign-in tokens — made, listed,
//! checked and revoked. Only a token's SHA-256 is stored.

use sqlx::Row as _;
use sqlx::any::AnyRow;

use crate::db::{Identity, new_id, now_ms};
use crate::error::{Error, Result};
use crate::model::{Credential, CredentialKind, Principal, Role, Scopes, UserState};

/// Whose a new credential is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Holder {
    /// A person's (personal access token or sign-in): it acts with their role.
    User(String),
    /// A service account's, with this role.
    Service(Role),
}

/// A credential to make.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewCredential {
    /// Whose.
    pub holder: Holder,
    /// Kind (a service account's is always [`CredentialKind::Service`]).
    pub kind: CredentialKind,
    /// A name for people (`laptop`, `ci`).
    pub name: String,
    /// What it may do: within what the holder's role allows.
    pub scopes: Scopes,
    /// When it stops working, Unix ms (none: never).
    pub expires_at: Option<i64>,
}

const COLUMNS: &str =
    "id, tenant_id, user_id, kind, name, role, scopes, created_at, expires_at, last_used_at, revoked_at";

fn credential_of(r: &AnyRow) -> Credential {
    Credential {
        id: r.get(0),
        tenant: r.get(1),
        user: r.get(2),
        kind: CredentialKind::parse(&r.get::<String, _>(3)),
        name: r.get(4),
        role: r.get::<String, _>(5).parse().unwrap_or(Role::Member),
        scopes: Scopes::parse(&r.get::<String, _>(6)).unwrap_or_default(),
        created_at: r.get(7),
        expires_at: r.get(8),
        last_used_at: r.get(9),
        revoked_at: r.get(10),
    }
}

/// How often a credential's last use is written (at most).
const TOUCH_EVERY_MS: i64 = 60_000;

impl Identity {
    /// Makes a credential in `tenant`; returns the token (shown once, never stored) and the
    /// record. A person's credential needs them active and scopes their role allows.
    pub async fn create_credential(&self, tenant: &str, new: NewCredential) -> Result<(String, Credential)> {
        self.make_credential(tenant, new, None).await
    }

    /// [`Identity::create_credential`], in sign-in `family` (revoked together) when given.
    pub(crate) async fn make_credential(
        &self,
        tenant: &str,
        new: NewCredential,
        family: Option<&str>,
    ) -> Result<(String, Credential)> {
        let name = new.name.trim();
        if name.is_empty() || name.len() > 100 || name.chars().any(char::is_control) {
            return Err(Error::BadRequest(format!("{name:?} is not a token name")));
        }
        if new.scopes == Scopes::NONE {
            return Err(Error::BadRequest("a token needs at least one scope".into()));
        }
        let now = now_ms();
        if new.expires_at.is_some_and(|e| e <= now) {
            return Err(Error::BadRequest("the expiry is in the past".into()));
        }
        let (user, role, kind) = match &new.holder {
            Holder::User(id) => {
                let user = self.user(tenant, id).await?;
                if user.state != UserState::Active {
                    return Err(Error::Conflict(format!("{} is deactivated", user.email)));
                }
                (Some(user.id), user.role, new.kind)
            }
            Holder::Service(role) => {
                let kind =
                    if new.kind == CredentialKind::Scim { CredentialKind::Scim } else { CredentialKind::Service };
                (None, *role, kind)
            }
        };
        if !new.scopes.within(role.allows()) {
            return Err(Error::Forbidden(format!(
                "a {} may not hold the scopes {}",
                role.name(),
                new.scopes.and(Scopes::ALL).names().join(",")
            )));
        }
        let token = caret_crypto::new_api_token().map_err(|source| Error::Crypto { what: "making a token", source })?;
        let id = new_id()?;
        sqlx::query(
            "INSERT INTO credentials \
             (id, tenant_id, user_id, kind, name, role, token_hash, scopes, created_at, expires_at, family) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
        )
        .bind(&id)
        .bind(tenant)
        .bind(&user)
        .bind(kind.name())
        .bind(name)
        .bind(role.name())
        .bind(caret_crypto::hash_api_token(&token))
        .bind(new.scopes.to_string())
        .bind(now)
        .bind(new.expires_at)
        .bind(family)
        .execute(&self.pool)
        .await?;
        let credential = Credential {
            id,
            tenant: tenant.to_owned(),
            user,
            kind,
            name: name.to_owned(),
            scopes: new.scopes,
            role,
            created_at: now,
            expires_at: new.expires_at,
            last_used_at: None,
            revoked_at: None,
        };
        Ok((token, credential))
    }

    /// `tenant`'s credentials (only `user`'s when given), newest first; sign-in tokens are
    /// left out unless `user` is given.
    pub async fn credentials(&self, tenant: &str, user: Option<&str>) -> Result<Vec<Credential>> {
        let rows = match user {
            Some(u) => sqlx::query(&format!(
                "SELECT {COLUMNS} FROM credentials WHERE tenant_id = $1 AND user_id = $2 ORDER BY created_at DESC, id"
            ))
            .bind(tenant)
            .bind(u)
            .fetch_all(&self.pool)
            .await?,
            None => sqlx::query(&format!(
                "SELECT {COLUMNS} FROM credentials WHERE tenant_id = $1 AND kind IN ('personal', 'service', 'scim') \
                     ORDER BY created_at DESC, id"
            ))
            .bind(tenant)
            .fetch_all(&self.pool)
            .await?,
        };
        Ok(rows.iter().map(credential_of).collect())
    }

    /// `tenant`'s credential `id`.
    pub async fn credential(&self, tenant: &str, id: &str) -> Result<Credential> {
        sqlx::query(&format!("SELECT {COLUMNS} FROM credentials WHERE tenant_id = $1 AND id = $2"))
            .bind(tenant)
            .bind(id)
            .fetch_optional(&self.pool)
            .await?
            .map(|r| credential_of(&r))
            .ok_or_else(|| Error::NotFound(format!("token {id}")))
    }

    /// Revokes `tenant`'s credential `id` (every replica refuses it at the next epoch).
    pub async fn revoke(&self, tenant: &str, id: &str) -> Result<Credential> {
        let now = now_ms();
        let mut tx = self.pool.begin().await?;
        let n = sqlx::query(
            "UPDATE credentials SET revoked_at = $1 WHERE tenant_id = $2 AND id = $3 AND revoked_at IS NULL",
        )
        .bind(now)
        .bind(tenant)
        .bind(id)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        if n > 0 {
            Identity::bump(&mut tx).await?;
        }
        tx.commit().await?;
        self.credential(tenant, id).await
    }

    /// Who `token` acts as, if it is a live credential: not revoked, not expired, its person
    /// active, and not a refresh token (which only buys new sign-in tokens). Its scopes are cut to what the role allows now.
    pub async fn authenticate(&self, token: &str) -> Result<Option<Principal>> {
        let row = sqlx::query(
            "SELECT c.id, c.tenant_id, c.user_id, c.kind, c.name, c.role, c.scopes, c.expires_at, \
                    u.email, u.role, u.state \
             FROM credentials c LEFT JOIN users u ON u.id = c.user_id \
             WHERE c.token_hash = $1 AND c.revoked_at IS NULL AND c.kind <> 'refresh'",
        )
        .bind(caret_crypto::hash_api_token(token))
        .fetch_optional(&self.pool)
        .await?;
        let Some(r) = row else { return Ok(None) };
        let user: Option<String> = r.get(2);
        let expires_at: Option<i64> = r.get(7);
        if expires_at.is_some_and(|e| e <= now_ms()) {
            return Ok(None);
        }
        let (name, role) = match &user {
            Some(_) => {
                let state: Option<String> = r.get(10);
                if state.as_deref() != Some("active") {
                    return Ok(None);
                }
                let role: Option<String> = r.get(9);
                (
                    r.get::<Option<String>, _>(8).unwrap_or_default(),
                    role.and_then(|x| x.parse().ok()).unwrap_or(Role::Member),
                )
            }
            None => (r.get(4), r.get::<String, _>(5).parse().unwrap_or(Role::Member)),
        };
        let scopes = Scopes::parse(&r.get::<String, _>(6)).unwrap_or_default().and(role.allows());
        Ok(Some(Principal {
            tenant: r.get(1),
            user,
            name,
            role,
            scopes,
            credential: r.get(0),
            kind: CredentialKind::parse(&r.get::<String, _>(3)),
            expires_at,
        }))
    }

    /// Records that credential `id` was used now (written at most once a minute).
    pub async fn touch(&self, id: &str) -> Result<()> {
        let now = now_ms();
        sqlx::query(
            "UPDATE credentials SET last_used_at = $1 WHERE id = $2 AND (last_used_at IS NULL OR last_used_at < $3)",
        )
        .bind(now)
        .bind(id)
        .bind(now - TOUCH_EVERY_MS)
        .execute(&self.pool)
        .await?;
        Ok(())
    }
}
