//! SCIM 2.0 (RFC 7643, 7644) as the identity provider sees an organisation: its people as
//! `User` resources (userName, displayName, active, emails, externalId) and its groups as
//! `Group` resources (displayName, members, externalId). Resources are read and written as
//! JSON here; PATCH is applied to a resource's JSON and the result stored as a replacement;
//! list filters are evaluated on the JSON too. The routes are the server's.
//!
//! A person's email is their primary email (else the first, else a userName that is one);
//! `active: false` deactivates them (every token and sign-in ends); DELETE removes them (their
//! audit records stay). Group members must be people of the organisation.

pub mod filter;
pub mod patch;

use serde_json::{Value, json};
use sqlx::Row as _;
use sqlx::any::AnyRow;

use crate::db::{Identity, new_id, now_ms};
use crate::error::{Error, conflict_if_duplicate};
use crate::model::{Role, UserState};
use crate::people::normal_email;

/// The core schemas' URNs.
pub const USER_SCHEMA: &str = "urn:ietf:params:scim:schemas:core:2.0:User";
/// The Group schema.
pub const GROUP_SCHEMA: &str = "urn:ietf:params:scim:schemas:core:2.0:Group";
/// A list answer.
pub const LIST_SCHEMA: &str = "urn:ietf:params:scim:api:messages:2.0:ListResponse";
/// An error answer.
pub const ERROR_SCHEMA: &str = "urn:ietf:params:scim:api:messages:2.0:Error";

/// A SCIM error: its HTTP status, `scimType` and detail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScimError {
    /// HTTP status.
    pub status: u16,
    /// RFC 7644's `scimType` (`invalidFilter`, `uniqueness`, …).
    pub scim_type: Option<&'static str>,
    /// Why.
    pub detail: String,
}

impl ScimError {
    /// An error.
    pub fn new(status: u16, scim_type: Option<&'static str>, detail: impl Into<String>) -> ScimError {
        ScimError { status, scim_type, detail: detail.into() }
    }

    /// Its JSON body.
    pub fn body(&self) -> Value {
        let mut b = json!({ "schemas": [ERROR_SCHEMA], "status": self.status.to_string(), "detail": self.detail });
        if let Some(t) = self.scim_type {
            b["scimType"] = t.into();
        }
        b
    }
}

impl From<Error> for ScimError {
    fn from(e: Error) -> Self {
        match e {
            Error::BadRequest(m) => ScimError::new(400, Some("invalidValue"), m),
            Error::NotFound(m) => ScimError::new(404, None, format!("{m} not found")),
            Error::Conflict(m) => ScimError::new(409, Some("uniqueness"), m),
            Error::Forbidden(m) => ScimError::new(403, None, m),
            other => ScimError::new(500, None, other.to_string()),
        }
    }
}

impl From<sqlx::Error> for ScimError {
    fn from(e: sqlx::Error) -> Self {
        Error::Database(e).into()
    }
}

type Result<T> = std::result::Result<T, ScimError>;

fn invalid(why: impl Into<String>) -> ScimError {
    ScimError::new(400, Some("invalidValue"), why)
}

/// The fields of a `User` that are kept.
#[derive(Debug, Clone, PartialEq, Eq)]
struct UserFields {
    user_name: String,
    display_name: String,
    active: bool,
    emails: Vec<Value>,
    external_id: Option<String>,
    email: String,
}

fn text(v: &Value, name: &str) -> Option<String> {
    filter::values(v, name).first().and_then(|x| x.as_str()).map(str::to_owned)
}

fn user_fields(v: &Value) -> Result<UserFields> {
    if !v.is_object() {
        return Err(ScimError::new(400, Some("invalidSyntax"), "a User is a JSON object"));
    }
    let user_name = text(v, "userName").map(|s| s.trim().to_owned()).filter(|s| !s.is_empty());
    let user_name = user_name.ok_or_else(|| invalid("userName is required"))?;
    if user_name.len() > 254 || user_name.chars().any(char::is_control) {
        return Err(invalid("userName is over 254 characters or holds control characters"));
    }
    let emails: Vec<Value> = match filter::values(v, "emails").as_slice() {
        [] => vec![],
        list => list
            .iter()
            .filter_map(|e| {
                let value = e.get("value")?.as_str()?;
                let mut kept = json!({ "value": value });
                if let Some(p) = e.get("primary").and_then(Value::as_bool) {
                    kept["primary"] = p.into();
                }
                Some(kept)
            })
            .take(20)
            .collect(),
    };
    let primary = emails
        .iter()
        .find(|e| e["primary"] == true)
        .or(emails.first())
        .and_then(|e| e["value"].as_str())
        .map(str::to_owned)
        .or_else(|| normal_email(&user_name).ok());
    let email = normal_email(&primary.ok_or_else(|| invalid("a person needs an email: userName or emails"))?)
        .map_err(|e| invalid(e.to_string()))?;
    let display_name = text(v, "displayName")
        .or_else(|| text(v, "name.formatted"))
        .unwrap_or_default()
        .trim()
        .chars()
        .take(200)
        .collect();
    let active = match filter::values(v, "active").first() {
        None | Some(Value::Null) => true,
        Some(Value::Bool(b)) => *b,
        Some(Value::String(s)) if s.eq_ignore_ascii_case("true") => true,
        Some(Value::String(s)) if s.eq_ignore_ascii_case("false") => false,
        Some(other) => return Err(invalid(format!("active is a boolean, not {other}"))),
    };
    let external_id = text(v, "externalId").filter(|s| !s.is_empty());
    Ok(UserFields { user_name, display_name, active, emails, external_id, email })
}

const USER_COLUMNS: &str = "id, user_name, email, name, state, emails, external_id, created_at, updated_at, role";

fn user_json(r: &AnyRow, base: &str) -> Value {
    let id: String = r.get(0);
    let email: String = r.get(2);
    let mut v = json!({
        "schemas": [USER_SCHEMA],
        "id": id,
        "userName": r.get::<Option<String>, _>(1).unwrap_or_else(|| email.clone()),
        "active": r.get::<String, _>(4) == "active",
        "emails": r.get::<Option<String>, _>(5).and_then(|e| serde_json::from_str::<Value>(&e).ok())
            .unwrap_or_else(|| json!([{ "value": email, "primary": true }])),
        "meta": {
            "resourceType": "User",
            "created": caret_usage::rfc3339(r.get(7)),
            "lastModified": caret_usage::rfc3339(r.get(8)),
            "location": format!("{base}/Users/{id}"),
            "version": format!("W/\"{}\"", r.get::<i64, _>(8)),
        },
    });
    if let Some(x) = r.get::<Option<String>, _>(6) {
        v["externalId"] = x.into();
    }
    // A display name the provider removed is absent (the pages show the email instead).
    let name: String = r.get(3);
    if !name.is_empty() {
        v["displayName"] = name.into();
    }
    v
}

/// A list answer: `items` matching `filter`, from 1-based `start`, at most `count`.
pub fn list(items: Vec<Value>, filter: Option<&str>, start: Option<i64>, count: Option<i64>) -> Result<Value> {
    let filter = filter.filter(|f| !f.trim().is_empty()).map(filter::Filter::parse).transpose()?;
    let matching: Vec<Value> = items.into_iter().filter(|i| filter.as_ref().is_none_or(|f| f.matches(i))).collect();
    let start = start.unwrap_or(1).max(1);
    let count = count.unwrap_or(100).clamp(0, 1000);
    let page: Vec<Value> = matching
        .iter()
        .skip(usize::try_from(start - 1).unwrap_or(usize::MAX))
        .take(usize::try_from(count).unwrap_or(0))
        .cloned()
        .collect();
    Ok(json!({
        "schemas": [LIST_SCHEMA],
        "totalResults": matching.len(),
        "startIndex": start,
        "itemsPerPage": page.len(),
        "Resources": page,
    }))
}

impl Identity {
    /// `tenant`'s people as SCIM Users (locations under `base`, `…/scim/v2`).
    pub async fn scim_users(&self, tenant: &str, base: &str) -> Result<Vec<Value>> {
        let rows =
            sqlx::query(&format!("SELECT {USER_COLUMNS} FROM users WHERE tenant_id = $1 ORDER BY created_at, id"))
                .bind(tenant)
                .fetch_all(&self.pool)
                .await?;
        Ok(rows.iter().map(|r| user_json(r, base)).collect())
    }

    /// `tenant`'s person `id` as a SCIM User.
    pub async fn scim_user(&self, tenant: &str, id: &str, base: &str) -> Result<Value> {
        sqlx::query(&format!("SELECT {USER_COLUMNS} FROM users WHERE tenant_id = $1 AND id = $2"))
            .bind(tenant)
            .bind(id)
            .fetch_optional(&self.pool)
            .await?
            .map(|r| user_json(&r, base))
            .ok_or_else(|| ScimError::new(404, None, format!("User {id} not found")))
    }

    /// Makes a person from a SCIM User (a member; roles come from groups or admins).
    pub async fn scim_create_user(&self, tenant: &str, body: &Value, base: &str) -> Result<Value> {
        let f = user_fields(body)?;
        self.scim_unique_user_name(tenant, &f.user_name, None).await?;
        let (id, now) = (new_id()?, now_ms());
        sqlx::query(
            "INSERT INTO users (id, tenant_id, email, name, role, state, source, external_id, user_name, emails, \
             created_at, updated_at) VALUES ($1, $2, $3, $4, $5, $6, 'scim', $7, $8, $9, $10, $10)",
        )
        .bind(&id)
        .bind(tenant)
        .bind(&f.email)
        .bind(&f.display_name)
        .bind(Role::Member.name())
        .bind(if f.active { "active" } else { "deactivated" })
        .bind(&f.external_id)
        .bind(&f.user_name)
        .bind(serde_json::to_string(&f.emails).unwrap_or_default())
        .bind(now)
        .execute(&self.pool)
        .await
        .map_err(|e| conflict_if_duplicate(e, || format!("{} is already a person of this organisation", f.email)))?;
        self.scim_user(tenant, &id, base).await
    }

    async fn scim_unique_user_name(&self, tenant: &str, user_name: &str, except: Option<&str>) -> Result<()> {
        let taken = sqlx::query("SELECT id FROM users WHERE tenant_id = $1 AND LOWER(COALESCE(user_name, email)) = $2")
            .bind(tenant)
            .bind(user_name.to_lowercase())
            .fetch_all(&self.pool)
            .await?;
        if taken.iter().any(|r| Some(r.get::<String, _>(0).as_str()) != except) {
            return Err(ScimError::new(409, Some("uniqueness"), format!("userName {user_name:?} is taken")));
        }
        Ok(())
    }

    /// Replaces person `id` with a SCIM User (PUT, and PATCH's result). Deactivating ends
    /// every credential of theirs.
    pub async fn scim_replace_user(&self, tenant: &str, id: &str, body: &Value, base: &str) -> Result<Value> {
        let f = user_fields(body)?;
        let current = self.user(tenant, id).await?;
        self.scim_unique_user_name(tenant, &f.user_name, Some(id)).await?;
        let state = if f.active { UserState::Active } else { UserState::Deactivated };
        if state != current.state {
            self.set_state(tenant, id, state).await?;
        }
        sqlx::query(
            "UPDATE users SET email = $1, name = $2, external_id = $3, user_name = $4, emails = $5, updated_at = $6 \
             WHERE tenant_id = $7 AND id = $8",
        )
        .bind(&f.email)
        .bind(&f.display_name)
        .bind(&f.external_id)
        .bind(&f.user_name)
        .bind(serde_json::to_string(&f.emails).unwrap_or_default())
        .bind(now_ms().max(current.created_at + 1))
        .bind(tenant)
        .bind(id)
        .execute(&self.pool)
        .await
        .map_err(|e| conflict_if_duplicate(e, || format!("{} is already a person of this organisation", f.email)))?;
        self.scim_user(tenant, id, base).await
    }

    /// Removes person `id`: their credentials revoked, their memberships ended, the record
    /// gone (the audit trail keeps what they did). The last owner stays.
    pub async fn scim_delete_user(&self, tenant: &str, id: &str) -> Result<()> {
        let user = self.user(tenant, id).await?;
        if user.role == Role::Owner && user.state == UserState::Active {
            self.set_state(tenant, id, UserState::Deactivated).await?;
        }
        let mut tx = self.pool.begin().await?;
        sqlx::query("UPDATE credentials SET revoked_at = $1 WHERE user_id = $2 AND revoked_at IS NULL")
            .bind(now_ms())
            .bind(id)
            .execute(&mut *tx)
            .await?;
        sqlx::query("DELETE FROM group_members WHERE user_id = $1").bind(id).execute(&mut *tx).await?;
        sqlx::query("DELETE FROM users WHERE tenant_id = $1 AND id = $2")
            .bind(tenant)
            .bind(id)
            .execute(&mut *tx)
            .await?;
        Identity::bump(&mut tx).await?;
        tx.commit().await?;
        Ok(())
    }

    /// `tenant`'s groups as SCIM Groups.
    pub async fn scim_groups(&self, tenant: &str, base: &str) -> Result<Vec<Value>> {
        let names: std::collections::HashMap<String, String> =
            self.users(tenant).await?.into_iter().map(|u| (u.id, u.name)).collect();
        let rows = sqlx::query("SELECT id, external_id, created_at, updated_at FROM user_groups WHERE tenant_id = $1")
            .bind(tenant)
            .fetch_all(&self.pool)
            .await?;
        let groups = self.groups(tenant).await?;
        let mut out = Vec::new();
        for r in &rows {
            let id: String = r.get(0);
            let Some(g) = groups.iter().find(|g| g.id == id) else { continue };
            let created: i64 = r.get(2);
            let modified = r.get::<Option<i64>, _>(3).unwrap_or(created);
            let members: Vec<Value> = g
                .members
                .iter()
                .map(|m| {
                    json!({ "value": m, "display": names.get(m).cloned().unwrap_or_default(),
                                 "$ref": format!("{base}/Users/{m}") })
                })
                .collect();
            let mut v = json!({
                "schemas": [GROUP_SCHEMA],
                "id": id,
                "displayName": g.name,
                "members": members,
                "meta": {
                    "resourceType": "Group",
                    "created": caret_usage::rfc3339(created),
                    "lastModified": caret_usage::rfc3339(modified),
                    "location": format!("{base}/Groups/{id}"),
                    "version": format!("W/\"{modified}\""),
                },
            });
            if let Some(x) = r.get::<Option<String>, _>(1) {
                v["externalId"] = x.into();
            }
            out.push(v);
        }
        Ok(out)
    }

    /// `tenant`'s group `id` as a SCIM Group.
    pub async fn scim_group(&self, tenant: &str, id: &str, base: &str) -> Result<Value> {
        self.scim_groups(tenant, base)
            .await?
            .into_iter()
            .find(|g| g["id"] == id)
            .ok_or_else(|| ScimError::new(404, None, format!("Group {id} not found")))
    }

    /// Makes (`id` none) or replaces a group from a SCIM Group: its name, external id and
    /// exactly its members.
    pub async fn scim_put_group(&self, tenant: &str, id: Option<&str>, body: &Value, base: &str) -> Result<Value> {
        if !body.is_object() {
            return Err(ScimError::new(400, Some("invalidSyntax"), "a Group is a JSON object"));
        }
        let name = text(body, "displayName").map(|s| s.trim().to_owned()).filter(|s| !s.is_empty());
        let name = name.ok_or_else(|| invalid("displayName is required"))?;
        if name.len() > 200 || name.chars().any(char::is_control) {
            return Err(invalid("displayName is over 200 characters or holds control characters"));
        }
        let external_id = text(body, "externalId").filter(|s| !s.is_empty());
        let people: std::collections::HashSet<String> = self.users(tenant).await?.into_iter().map(|u| u.id).collect();
        let mut members = Vec::new();
        for m in filter::values(body, "members").into_iter().take(10_000) {
            let value = m.get("value").and_then(Value::as_str).ok_or_else(|| invalid("a member needs its value"))?;
            if !people.contains(value) {
                return Err(invalid(format!("member {value:?} is not a person of this organisation")));
            }
            if !members.iter().any(|x| x == value) {
                members.push(value.to_owned());
            }
        }
        let now = now_ms();
        let id = match id {
            Some(id) => {
                let n = sqlx::query(
                    "UPDATE user_groups SET name = $1, external_id = $2, updated_at = $3 WHERE tenant_id = $4 AND id = $5",
                )
                .bind(&name)
                .bind(&external_id)
                .bind(now)
                .bind(tenant)
                .bind(id)
                .execute(&self.pool)
                .await
                .map_err(|e| conflict_if_duplicate(e, || format!("a group named {name} exists already")))?
                .rows_affected();
                if n == 0 {
                    return Err(ScimError::new(404, None, format!("Group {id} not found")));
                }
                id.to_owned()
            }
            None => {
                let id = new_id()?;
                sqlx::query(
                    "INSERT INTO user_groups (id, tenant_id, name, source, external_id, created_at, updated_at) \
                     VALUES ($1, $2, $3, 'scim', $4, $5, $5)",
                )
                .bind(&id)
                .bind(tenant)
                .bind(&name)
                .bind(&external_id)
                .bind(now)
                .execute(&self.pool)
                .await
                .map_err(|e| conflict_if_duplicate(e, || format!("a group named {name} exists already")))?;
                id
            }
        };
        let mut tx = self.pool.begin().await?;
        sqlx::query("DELETE FROM group_members WHERE group_id = $1").bind(&id).execute(&mut *tx).await?;
        for m in &members {
            sqlx::query("INSERT INTO group_members (group_id, user_id) VALUES ($1, $2)")
                .bind(&id)
                .bind(m)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        self.scim_group(tenant, &id, base).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_user_needs_a_name_and_an_email() {
        let f = user_fields(&json!({ "userName": "Ada@Acme.example" })).unwrap();
        assert_eq!((f.email.as_str(), f.active), ("ada@acme.example", true));
        let f = user_fields(&json!({
            "userName": "ada", "active": "False",
            "emails": [{ "value": "x@acme.example" }, { "value": "Ada@acme.example", "primary": true, "type": "work" }],
        }))
        .unwrap();
        assert_eq!((f.email.as_str(), f.active), ("ada@acme.example", false));
        assert_eq!(f.emails[1], json!({ "value": "Ada@acme.example", "primary": true }));
        for bad in
            [json!({}), json!({ "userName": "ada" }), json!({ "userName": "a@b.example", "active": 3 }), json!([1])]
        {
            assert!(user_fields(&bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn lists_filter_and_page() {
        let items: Vec<Value> = (1..=5).map(|i| json!({ "userName": format!("u{i}") })).collect();
        let all = list(items.clone(), None, None, None).unwrap();
        assert_eq!((all["totalResults"].as_u64(), all["itemsPerPage"].as_u64()), (Some(5), Some(5)));
        let page = list(items.clone(), Some(r#"userName sw "u""#), Some(2), Some(2)).unwrap();
        assert_eq!(page["Resources"], json!([{ "userName": "u2" }, { "userName": "u3" }]));
        assert_eq!(page["totalResults"], 5);
        let one = list(items.clone(), Some(r#"userName eq "U4""#), None, None).unwrap();
        assert_eq!(one["totalResults"], 1);
        assert_eq!(list(items, Some("bad filter"), None, None).unwrap_err().scim_type, Some("invalidFilter"));
    }
}
