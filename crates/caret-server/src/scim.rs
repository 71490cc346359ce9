//! SCIM 2.0 (`/scim/v2/…`): the identity provider creates, updates, deactivates and removes
//! the organisation's people and groups with the organisation's SCIM token (made by an admin:
//! `POST /v1/admin/tokens` with `"kind": "scim"`), which opens nothing else. Discovery
//! (`ServiceProviderConfig`, `ResourceTypes`, `Schemas`) holds no data and needs no token.
//! Bodies are `application/scim+json` (or JSON), at most 1 MiB; errors are SCIM's. Every
//! change is written to the audit trail before the answer.

use axum::Extension;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use caret_identity::scim::{self, ScimError};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::state::{AppState, Caller, Path, Query};

/// The largest SCIM body.
const BODY_LIMIT: usize = 1 << 20;

fn answer(status: StatusCode, body: &Value) -> Response {
    let mut r = (status, body.to_string()).into_response();
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/scim+json"));
    r
}

fn failure(e: ScimError) -> Response {
    let status = StatusCode::from_u16(e.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    if status.is_server_error() && status != StatusCode::NOT_IMPLEMENTED {
        tracing::warn!(detail = %e.detail, "a SCIM request failed");
        return answer(status, &ScimError::new(e.status, None, "internal error; see the server log").body());
    }
    answer(status, &e.body())
}

/// Where resources live, for their `meta.location`.
fn base(state: &AppState, headers: &HeaderMap) -> String {
    let root = match state.sign_in.as_ref() {
        Some(s) => s.public_url.trim_end_matches('/').to_owned(),
        None => {
            let host = headers.get(header::HOST).and_then(|h| h.to_str().ok()).unwrap_or("localhost");
            format!("http://{host}")
        }
    };
    format!("{root}/scim/v2")
}

fn body_json(body: &Bytes) -> Result<Value, ScimError> {
    if body.len() > BODY_LIMIT {
        return Err(ScimError::new(413, None, format!("the body is over {BODY_LIMIT} bytes")));
    }
    serde_json::from_slice(body).map_err(|e| ScimError::new(400, Some("invalidSyntax"), format!("malformed JSON: {e}")))
}

/// A list request's query.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ListQuery {
    filter: Option<String>,
    start_index: Option<i64>,
    count: Option<i64>,
    attributes: Option<String>,
    excluded_attributes: Option<String>,
}

/// `attributes` and `excludedAttributes` (RFC 7644, 3.4.2.5) of a read.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Projection {
    attributes: Option<String>,
    excluded_attributes: Option<String>,
}

/// Keeps only the `attributes` asked for (with those always returned), or drops the
/// `excluded` ones.
fn project(resource: &mut Value, attributes: Option<&str>, excluded: Option<&str>) {
    let names = |list: Option<&str>| -> Vec<String> {
        list.unwrap_or_default()
            .split(',')
            .map(|a| {
                let a = a.trim();
                let a = a.rsplit_once(':').map_or(a, |(_, attr)| attr);
                a.split('.').next().unwrap_or_default().to_ascii_lowercase()
            })
            .filter(|a| !a.is_empty())
            .collect()
    };
    let Value::Object(map) = resource else { return };
    let always = ["id", "schemas", "meta"];
    let keep = names(attributes);
    if !keep.is_empty() {
        map.retain(|k, _| always.contains(&k.as_str()) || keep.contains(&k.to_ascii_lowercase()));
    }
    let drop = names(excluded);
    map.retain(|k, _| always.contains(&k.as_str()) || !drop.contains(&k.to_ascii_lowercase()));
}

/// Which resources.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Users,
    Groups,
}

impl Kind {
    fn of(uri: &axum::http::Uri) -> Kind {
        if uri.path().contains("/Groups") { Kind::Groups } else { Kind::Users }
    }

    fn name(self) -> &'static str {
        match self {
            Kind::Users => "user",
            Kind::Groups => "group",
        }
    }
}

/// The identity store, or SCIM's 503.
fn identity(state: &AppState) -> Result<&std::sync::Arc<caret_identity::Identity>, ScimError> {
    state.identity().map_err(|e| ScimError::new(503, None, e.to_string()))
}

async fn all(state: &AppState, caller: &Caller, kind: Kind, base: &str) -> Result<Vec<Value>, ScimError> {
    let identity = identity(state)?;
    match kind {
        Kind::Users => identity.scim_users(&caller.tenant.id, base).await,
        Kind::Groups => identity.scim_groups(&caller.tenant.id, base).await,
    }
}

async fn one(state: &AppState, caller: &Caller, kind: Kind, id: &str, base: &str) -> Result<Value, ScimError> {
    let identity = identity(state)?;
    match kind {
        Kind::Users => identity.scim_user(&caller.tenant.id, id, base).await,
        Kind::Groups => identity.scim_group(&caller.tenant.id, id, base).await,
    }
}

/// Runs `change` and records it (`scim.user.create`, …) with its outcome, before the answer.
async fn recorded(
    state: &AppState,
    caller: &Caller,
    action: String,
    target: &str,
    change: impl std::future::Future<Output = Result<Value, ScimError>>,
) -> Result<Value, ScimError> {
    let result = change.await;
    let outcome = match &result {
        Ok(_) => "ok".to_owned(),
        Err(e) => format!("failed: {}", e.scim_type.unwrap_or("error")),
    };
    state
        .audit(caller, &action, target, &outcome)
        .await
        .map_err(|e| ScimError::new(500, None, format!("recording: {e}")))?;
    result
}

/// `GET /scim/v2/Users` and `/Groups`: filtered, paged.
pub async fn list(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    uri: axum::http::Uri,
    headers: HeaderMap,
    Query(q): Query<ListQuery>,
) -> Response {
    let base = base(&state, &headers);
    let listed = async {
        let items = all(&state, &caller, Kind::of(&uri), &base).await?;
        let mut page = scim::list(items, q.filter.as_deref(), q.start_index, q.count)?;
        if let Some(Value::Array(items)) = page.get_mut("Resources") {
            for item in items {
                project(item, q.attributes.as_deref(), q.excluded_attributes.as_deref());
            }
        }
        Ok::<_, ScimError>(page)
    };
    match listed.await {
        Ok(v) => answer(StatusCode::OK, &v),
        Err(e) => failure(e),
    }
}

/// `GET /scim/v2/Users/{id}` and `/Groups/{id}`.
pub async fn get(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    uri: axum::http::Uri,
    headers: HeaderMap,
    Path(id): Path<String>,
    Query(q): Query<Projection>,
) -> Response {
    match one(&state, &caller, Kind::of(&uri), &id, &base(&state, &headers)).await {
        Ok(mut v) => {
            project(&mut v, q.attributes.as_deref(), q.excluded_attributes.as_deref());
            answer(StatusCode::OK, &v)
        }
        Err(e) => failure(e),
    }
}

/// `POST /scim/v2/Users` and `/Groups`.
pub async fn create(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    uri: axum::http::Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let (kind, base) = (Kind::of(&uri), base(&state, &headers));
    let made = async {
        let body = body_json(&body)?;
        let identity = identity(&state)?.clone();
        let tenant = caller.tenant.id.clone();
        recorded(&state, &caller, format!("scim.{}.create", kind.name()), "-", async {
            match kind {
                Kind::Users => identity.scim_create_user(&tenant, &body, &base).await,
                Kind::Groups => identity.scim_put_group(&tenant, None, &body, &base).await,
            }
        })
        .await
    };
    match made.await {
        Ok(v) => {
            let mut r = answer(StatusCode::CREATED, &v);
            if let Some(l) = v["meta"]["location"].as_str().and_then(|l| HeaderValue::from_str(l).ok()) {
                r.headers_mut().insert(header::LOCATION, l);
            }
            r
        }
        Err(e) => failure(e),
    }
}

/// `PUT` (a replacement) and `PATCH` (operations on the current resource, stored as its
/// replacement) of `/scim/v2/Users/{id}` and `/Groups/{id}`.
pub async fn change(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    method: axum::http::Method,
    uri: axum::http::Uri,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Bytes,
) -> Response {
    let (kind, base) = (Kind::of(&uri), base(&state, &headers));
    let patching = method == axum::http::Method::PATCH;
    let changed = async {
        let body = body_json(&body)?;
        let identity = identity(&state)?.clone();
        let tenant = caller.tenant.id.clone();
        let action = format!("scim.{}.{}", kind.name(), if patching { "patch" } else { "replace" });
        recorded(&state, &caller, action, &id, async {
            let replacement = if patching {
                let mut current = one(&state, &caller, kind, &id, &base).await?;
                scim::patch::apply(&mut current, &body)?;
                current
            } else {
                body
            };
            match kind {
                Kind::Users => identity.scim_replace_user(&tenant, &id, &replacement, &base).await,
                Kind::Groups => identity.scim_put_group(&tenant, Some(&id), &replacement, &base).await,
            }
        })
        .await
    };
    match changed.await {
        Ok(v) => answer(StatusCode::OK, &v),
        Err(e) => failure(e),
    }
}

/// `DELETE /scim/v2/Users/{id}` and `/Groups/{id}`.
pub async fn delete(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    uri: axum::http::Uri,
    Path(id): Path<String>,
) -> Response {
    let kind = Kind::of(&uri);
    let removed = async {
        let identity = identity(&state)?.clone();
        let tenant = caller.tenant.id.clone();
        recorded(&state, &caller, format!("scim.{}.delete", kind.name()), &id, async {
            match kind {
                Kind::Users => identity.scim_delete_user(&tenant, &id).await?,
                Kind::Groups => identity.delete_group(&tenant, &id).await.map_err(ScimError::from)?,
            }
            Ok(Value::Null)
        })
        .await
    };
    match removed.await {
        Ok(_) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => failure(e),
    }
}

fn attribute(name: &str, kind: &str, required: bool, mutability: &str, uniqueness: &str) -> Value {
    json!({
        "name": name, "type": kind, "multiValued": false, "required": required, "caseExact": false,
        "mutability": mutability, "returned": "default", "uniqueness": uniqueness,
    })
}

fn schemas() -> Vec<Value> {
    let email_value = attribute("value", "string", true, "readWrite", "none");
    let primary = attribute("primary", "boolean", false, "readWrite", "none");
    // A person is known by their email: at least one is required (or a userName that is one).
    let mut emails = attribute("emails", "complex", true, "readWrite", "none");
    emails["multiValued"] = true.into();
    emails["subAttributes"] = json!([email_value, primary]);
    let user = json!({
        "schemas": ["urn:ietf:params:scim:schemas:core:2.0:Schema"],
        "id": scim::USER_SCHEMA, "name": "User", "description": "A person of the organisation",
        "attributes": [
            attribute("userName", "string", true, "readWrite", "server"),
            attribute("displayName", "string", false, "readWrite", "none"),
            attribute("active", "boolean", true, "readWrite", "none"),
            emails,
        ],
        "meta": { "resourceType": "Schema", "location": format!("/scim/v2/Schemas/{}", scim::USER_SCHEMA) },
    });
    let mut members = attribute("members", "complex", false, "readWrite", "none");
    members["multiValued"] = true.into();
    let mut member_ref = attribute("$ref", "reference", false, "readOnly", "none");
    member_ref["referenceTypes"] = json!(["User"]);
    members["subAttributes"] = json!([
        attribute("value", "string", true, "immutable", "none"),
        attribute("display", "string", false, "readOnly", "none"),
        member_ref,
    ]);
    let group = json!({
        "schemas": ["urn:ietf:params:scim:schemas:core:2.0:Schema"],
        "id": scim::GROUP_SCHEMA, "name": "Group", "description": "A group of the organisation's people",
        "attributes": [attribute("displayName", "string", true, "readWrite", "server"), members],
        "meta": { "resourceType": "Schema", "location": format!("/scim/v2/Schemas/{}", scim::GROUP_SCHEMA) },
    });
    vec![user, group]
}

fn resource_types() -> Vec<Value> {
    [("User", "/Users", scim::USER_SCHEMA), ("Group", "/Groups", scim::GROUP_SCHEMA)]
        .into_iter()
        .map(|(name, endpoint, schema)| {
            json!({
                "schemas": ["urn:ietf:params:scim:schemas:core:2.0:ResourceType"],
                "id": name, "name": name, "endpoint": endpoint, "schema": schema,
                "meta": { "resourceType": "ResourceType", "location": format!("/scim/v2/ResourceTypes/{name}") },
            })
        })
        .collect()
}

/// Answers a refusal made before a SCIM handler (authentication, scopes, rate limits) in
/// SCIM's error body, its status and message kept.
pub async fn errors(req: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let response = next.run(req).await;
    let scim_body = response.headers().get(header::CONTENT_TYPE).is_some_and(|c| c == "application/scim+json");
    if response.status().is_success() || scim_body || response.status() == StatusCode::NO_CONTENT {
        return response;
    }
    let (parts, body) = response.into_parts();
    let bytes = axum::body::to_bytes(body, 64 * 1024).await.unwrap_or_default();
    let message = serde_json::from_slice::<caret_protocol::ErrorBody>(&bytes)
        .map(|b| b.error.message)
        .unwrap_or_else(|_| String::from_utf8_lossy(&bytes).into_owned());
    let mut out = answer(parts.status, &ScimError::new(parts.status.as_u16(), None, message).body());
    for name in [header::WWW_AUTHENTICATE, header::RETRY_AFTER, header::ALLOW] {
        if let Some(v) = parts.headers.get(&name) {
            out.headers_mut().insert(name, v.clone());
        }
    }
    out
}

/// What an unknown path under `/scim/v2` answers: a SCIM error (501 for a search across
/// resource types, which is not offered).
pub fn unknown(method: &axum::http::Method, path: &str) -> Response {
    if path.trim_end_matches('/') == "/scim/v2/.search" && method == axum::http::Method::POST {
        return failure(ScimError::new(501, None, "searching several resource types at once is not offered"));
    }
    failure(ScimError::new(404, None, format!("{path} is not a SCIM endpoint here")))
}

/// `GET /scim/v2/ServiceProviderConfig`.
pub async fn service_provider_config() -> Response {
    answer(
        StatusCode::OK,
        &json!({
            "schemas": ["urn:ietf:params:scim:schemas:core:2.0:ServiceProviderConfig"],
            "documentationUri": "https://github.com/caret-dev/caret/blob/main/docs/security.md",
            "patch": { "supported": true },
            "bulk": { "supported": false, "maxOperations": 0, "maxPayloadSize": 0 },
            "filter": { "supported": true, "maxResults": 1000 },
            "changePassword": { "supported": false },
            "sort": { "supported": false },
            "etag": { "supported": false },
            "authenticationSchemes": [{
                "type": "oauthbearertoken", "name": "Bearer token",
                "description": "The organisation's SCIM token (POST /v1/admin/tokens with kind scim)",
            }],
            "meta": { "resourceType": "ServiceProviderConfig", "location": "/scim/v2/ServiceProviderConfig" },
        }),
    )
}

/// `GET /scim/v2/Schemas`.
pub async fn schema_list() -> Response {
    answer(StatusCode::OK, &scim::list(schemas(), None, None, None).unwrap_or_default())
}

/// `GET /scim/v2/Schemas/{id}`.
pub async fn schema(Path(id): Path<String>) -> Response {
    match schemas().into_iter().find(|s| s["id"] == id.as_str()) {
        Some(s) => answer(StatusCode::OK, &s),
        None => failure(ScimError::new(404, None, format!("schema {id} not found"))),
    }
}

/// `GET /scim/v2/ResourceTypes`.
pub async fn resource_type_list() -> Response {
    answer(StatusCode::OK, &scim::list(resource_types(), None, None, None).unwrap_or_default())
}

/// `GET /scim/v2/ResourceTypes/{id}`.
pub async fn resource_type(Path(id): Path<String>) -> Response {
    match resource_types().into_iter().find(|s| s["id"] == id.as_str()) {
        Some(s) => answer(StatusCode::OK, &s),
        None => failure(ScimError::new(404, None, format!("resource type {id} not found"))),
    }
}
