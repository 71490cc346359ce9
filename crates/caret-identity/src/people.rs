//! People and groups of an organisation: made, listed, given roles, deactivated.

use sqlx::Row as _;
use sqlx::any::AnyRow;

use crate::db::{Identity, new_id, now_ms};
use crate::error::{Error, Result, conflict_if_duplicate};
use crate::model::{Group, Role, User, UserState};

/// A new person.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewUser {
    /// Email (checked and lowercased).
    pub email: String,
    /// Display name (the email's local part when empty).
    pub name: String,
    /// Role.
    pub role: Role,
    /// Where the record comes from (`bootstrap`, `admin`, `invitation`, `oidc`, `ldap`, `scim`).
    pub source: String,
}

/// A checked, lowercased email address.
pub fn normal_email(email: &str) -> Result<String> {
    let e = email.trim().to_ascii_lowercase();
    let ok = e.len() <= 254
        && e.split_once('@').is_some_and(|(local, domain)| {
            !local.is_empty() && domain.contains('.') && !domain.starts_with('.') && !domain.ends_with('.')
        })
        && e.chars().all(|c| c.is_ascii_graphic())
        && e.matches('@').count() == 1;
    if ok { Ok(e) } else { Err(Error::BadRequest(format!("{email:?} is not an email address"))) }
}

const USER_COLUMNS: &str = "id, tenant_id, email, name, role, state, source, created_at";

fn user_of(r: &AnyRow) -> User {
    User {
        id: r.get(0),
        tenant: r.get(1),
        email: r.get(2),
        name: r.get(3),
        role: r.get::<String, _>(4).parse().unwrap_or(Role::Member),
        state: UserState::parse(&r.get::<String, _>(5)),
        source: r.get(6),
        created_at: r.get(7),
    }
}

impl Identity {
    /// Adds a person to `tenant`.
    pub async fn create_user(&self, tenant: &str, new: NewUser) -> Result<User> {
        let email = normal_email(&new.email)?;
        let name = if new.name.trim().is_empty() {
            email.split('@').next().unwrap_or_default().to_owned()
        } else {
            new.name.trim().chars().take(200).collect()
        };
        let (id, now) = (new_id()?, now_ms());
        sqlx::query(
            "INSERT INTO users (id, tenant_id, email, name, role, state, source, created_at, updated_at) \
             VALUES ($1, $2, $3, $4, $5, 'active', $6, $7, $7)",
        )
        .bind(&id)
        .bind(tenant)
        .bind(&email)
        .bind(&name)
        .bind(new.role.name())
        .bind(&new.source)
        .bind(now)
        .execute(&self.pool)
        .await
        .map_err(|e| conflict_if_duplicate(e, || format!("{email} is already a person of this organisation")))?;
        Ok(User {
            id,
            tenant: tenant.to_owned(),
            email,
            name,
            role: new.role,
            state: UserState::Active,
            source: new.source,
            created_at: now,
        })
    }

    /// `tenant`'s person `id` (another organisation's is as unknown as a made-up one).
    pub async fn user(&self, tenant: &str, id: &str) -> Result<User> {
        sqlx::query(&format!("SELECT {USER_COLUMNS} FROM users WHERE tenant_id = $1 AND id = $2"))
            .bind(tenant)
            .bind(id)
            .fetch_optional(&self.pool)
            .await?
            .map(|r| user_of(&r))
            .ok_or_else(|| Error::NotFound(format!("person {id}")))
    }

    /// `tenant`'s person with this email, if any.
    pub async fn user_by_email(&self, tenant: &str, email: &str) -> Result<Option<User>> {
        let email = normal_email(email)?;
        Ok(sqlx::query(&format!("SELECT {USER_COLUMNS} FROM users WHERE tenant_id = $1 AND email = $2"))
            .bind(tenant)
            .bind(&email)
            .fetch_optional(&self.pool)
            .await?
            .map(|r| user_of(&r)))
    }

    /// `tenant`'s people, by email.
    pub async fn users(&self, tenant: &str) -> Result<Vec<User>> {
        Ok(sqlx::query(&format!("SELECT {USER_COLUMNS} FROM users WHERE tenant_id = $1 ORDER BY email"))
            .bind(tenant)
            .fetch_all(&self.pool)
            .await?
            .iter()
            .map(user_of)
            .collect())
    }

    /// Gives `id` a role. The last active owner keeps theirs; a lowered role takes effect on
    /// every replica at the next epoch.
    pub async fn set_role(&self, tenant: &str, id: &str, role: Role) -> Result<User> {
        let mut tx = self.pool.begin().await?;
        let user = sqlx::query(&format!("SELECT {USER_COLUMNS} FROM users WHERE tenant_id = $1 AND id = $2"))
            .bind(tenant)
            .bind(id)
            .fetch_optional(&mut *tx)
            .await?
            .map(|r| user_of(&r))
            .ok_or_else(|| Error::NotFound(format!("person {id}")))?;
        if user.role == Role::Owner && role != Role::Owner && user.state == UserState::Active {
            let owners: i64 =
                sqlx::query("SELECT COUNT(*) FROM users WHERE tenant_id = $1 AND role = 'owner' AND state = 'active'")
                    .bind(tenant)
                    .fetch_one(&mut *tx)
                    .await?
                    .get(0);
            if owners <= 1 {
                return Err(Error::Conflict(format!("{} is the organisation's last owner", user.email)));
            }
        }
        sqlx::query("UPDATE users SET role = $1, updated_at = $2 WHERE tenant_id = $3 AND id = $4")
            .bind(role.name())
            .bind(now_ms())
            .bind(tenant)
            .bind(id)
            .execute(&mut *tx)
            .await?;
        if role < user.role {
            Identity::bump(&mut tx).await?;
        }
        tx.commit().await?;
        Ok(User { role, ..user })
    }

    /// Deactivates `id` (every credential of theirs revoked at once, on every replica at the
    /// next epoch) or activates them again (their old credentials stay revoked).
    pub async fn set_state(&self, tenant: &str, id: &str, state: UserState) -> Result<User> {
        let user = self.user(tenant, id).await?;
        if state == UserState::Deactivated && user.role == Role::Owner && user.state == UserState::Active {
            let owners = self.users(tenant).await?;
            let active = owners.iter().filter(|u| u.role == Role::Owner && u.state == UserState::Active).count();
            if active <= 1 {
                return Err(Error::Conflict(format!("{} is the organisation's last owner", user.email)));
            }
        }
        let now = now_ms();
        let mut tx = self.pool.begin().await?;
        sqlx::query("UPDATE users SET state = $1, updated_at = $2 WHERE tenant_id = $3 AND id = $4")
            .bind(state.name())
            .bind(now)
            .bind(tenant)
            .bind(id)
            .execute(&mut *tx)
            .await?;
        if state == UserState::Deactivated {
            sqlx::query("UPDATE credentials SET revoked_at = $1 WHERE user_id = $2 AND revoked_at IS NULL")
                .bind(now)
                .bind(id)
                .execute(&mut *tx)
                .await?;
            Identity::bump(&mut tx).await?;
        }
        tx.commit().await?;
        Ok(User { state, ..user })
    }

    /// Makes a group.
    pub async fn create_group(&self, tenant: &str, name: &str, source: &str) -> Result<Group> {
        let name = name.trim();
        if name.is_empty() || name.len() > 200 || name.chars().any(char::is_control) {
            return Err(Error::BadRequest(format!("{name:?} is not a group name")));
        }
        let id = new_id()?;
        sqlx::query("INSERT INTO user_groups (id, tenant_id, name, source, created_at) VALUES ($1, $2, $3, $4, $5)")
            .bind(&id)
            .bind(tenant)
            .bind(name)
            .bind(source)
            .bind(now_ms())
            .execute(&self.pool)
            .await
            .map_err(|e| conflict_if_duplicate(e, || format!("a group named {name} exists already")))?;
        Ok(Group {
            id,
            tenant: tenant.to_owned(),
            name: name.to_owned(),
            source: source.to_owned(),
            members: Vec::new(),
            models: None,
            daily_tokens: None,
        })
    }

    /// `tenant`'s groups with their members, by name.
    pub async fn groups(&self, tenant: &str) -> Result<Vec<Group>> {
        let rows = sqlx::query(
            "SELECT id, name, source, models, daily_tokens FROM user_groups WHERE tenant_id = $1 ORDER BY name",
        )
        .bind(tenant)
        .fetch_all(&self.pool)
        .await?;
        let members = sqlx::query(
            "SELECT m.group_id, m.user_id FROM group_members m JOIN user_groups g ON g.id = m.group_id \
             WHERE g.tenant_id = $1 ORDER BY m.user_id",
        )
        .bind(tenant)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .iter()
            .map(|r| {
                let id: String = r.get(0);
                let members =
                    members.iter().filter(|m| m.get::<String, _>(0) == id).map(|m| m.get::<String, _>(1)).collect();
                let models = r.get::<Option<String>, _>(3).map(|m| split_models(&m));
                let daily_tokens = r.get(4);
                Group { id, tenant: tenant.to_owned(), name: r.get(1), source: r.get(2), members, models, daily_tokens }
            })
            .collect())
    }

    /// The names of the groups `user` belongs to.
    pub async fn groups_of(&self, tenant: &str, user: &str) -> Result<Vec<String>> {
        Ok(sqlx::query(
            "SELECT g.name FROM user_groups g JOIN group_members m ON m.group_id = g.id \
             WHERE g.tenant_id = $1 AND m.user_id = $2 ORDER BY g.name",
        )
        .bind(tenant)
        .bind(user)
        .fetch_all(&self.pool)
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect())
    }

    /// Puts `user` in `group` (`add`) or takes them out; both must be `tenant`'s.
    pub async fn set_member(&self, tenant: &str, group: &str, user: &str, member: Membership) -> Result<()> {
        let found = sqlx::query("SELECT 1 FROM user_groups WHERE tenant_id = $1 AND id = $2")
            .bind(tenant)
            .bind(group)
            .fetch_optional(&self.pool)
            .await?;
        if found.is_none() {
            return Err(Error::NotFound(format!("group {group}")));
        }
        self.user(tenant, user).await?;
        let query = match member {
            Membership::In => "INSERT INTO group_members (group_id, user_id) VALUES ($1, $2) ON CONFLICT DO NOTHING",
            Membership::Out => "DELETE FROM group_members WHERE group_id = $1 AND user_id = $2",
        };
        let mut tx = self.pool.begin().await?;
        sqlx::query(query).bind(group).bind(user).execute(&mut *tx).await?;
        // What the person may use changed: replicas read it again.
        Identity::bump(&mut tx).await?;
        tx.commit().await?;
        Ok(())
    }

    /// Sets the model aliases `group`'s members may use (none: no restriction from it).
    pub async fn set_group_models(&self, tenant: &str, group: &str, models: Option<&[String]>) -> Result<()> {
        if let Some(list) = models
            && list.iter().any(|m| m.trim().is_empty() || m.contains(','))
        {
            return Err(Error::BadRequest("model aliases are names without commas".into()));
        }
        let set = "UPDATE user_groups SET models = $1 WHERE tenant_id = $2 AND id = $3";
        self.set_group_policy(set, models.map(|m| m.join(",")), tenant, group).await
    }

    /// Runs `update` (`$1` the value, `$2` the tenant, `$3` the group) on one of `tenant`'s
    /// groups' policies, moving the epoch so every replica applies it at once.
    pub(crate) async fn set_group_policy<'q, T>(
        &self,
        update: &'q str,
        value: T,
        tenant: &'q str,
        group: &'q str,
    ) -> Result<()>
    where
        T: 'q + Send + sqlx::Encode<'q, sqlx::Any> + sqlx::Type<sqlx::Any>,
    {
        let mut tx = self.pool.begin().await?;
        let n = sqlx::query(update).bind(value).bind(tenant).bind(group).execute(&mut *tx).await?.rows_affected();
        if n == 0 {
            return Err(Error::NotFound(format!("group {group}")));
        }
        Identity::bump(&mut tx).await?;
        tx.commit().await?;
        Ok(())
    }

    /// The model aliases `user` may use: the union of their groups' lists; none when no group
    /// of theirs restricts them.
    pub async fn allowed_models(&self, tenant: &str, user: &str) -> Result<Option<std::collections::BTreeSet<String>>> {
        let rows = sqlx::query(
            "SELECT g.models FROM user_groups g JOIN group_members m ON m.group_id = g.id \
             WHERE g.tenant_id = $1 AND m.user_id = $2 AND g.models IS NOT NULL",
        )
        .bind(tenant)
        .bind(user)
        .fetch_all(&self.pool)
        .await?;
        if rows.is_empty() {
            return Ok(None);
        }
        Ok(Some(rows.iter().flat_map(|r| split_models(&r.get::<String, _>(0))).collect()))
    }

    /// Deletes `tenant`'s group `id`.
    pub async fn delete_group(&self, tenant: &str, id: &str) -> Result<()> {
        let mut tx = self.pool.begin().await?;
        let gone = sqlx::query("DELETE FROM user_groups WHERE tenant_id = $1 AND id = $2")
            .bind(tenant)
            .bind(id)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        if gone == 0 {
            return Err(Error::NotFound(format!("group {id}")));
        }
        sqlx::query("DELETE FROM group_members WHERE group_id = $1").bind(id).execute(&mut *tx).await?;
        tx.commit().await?;
        Ok(())
    }
}

fn split_models(list: &str) -> Vec<String> {
    list.split(',').map(str::trim).filter(|m| !m.is_empty()).map(String::from).collect()
}

/// In a group or out of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Membership {
    /// A member.
    In,
    /// Not a member.
    Out,
}
