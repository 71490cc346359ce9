//! Documentation sources over HTTP (@Docs on a team server): thin adapters over a
//! [`DocsLibrary`], which the binary provides (crawling and indexing live above this crate).
//!
//! - `POST /v1/docs/sources` `AddDocsSource` → 201 `DocsSource` (queued; the server crawls it);
//!   `GET /v1/docs/sources`; `DELETE /v1/docs/sources/{name}`;
//!   `POST /v1/docs/sources/{name}/refresh` → 202 `DocsSource`.
//! - `POST /v1/docs/search` `DocsSearch` → `DocsHits` (the query in the body: never in a URL,
//!   so never in an access log).
//!
//! Another tenant's source answers exactly like a missing one.

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json as AxumJson};
use caret_index::db::Tenant;
use caret_protocol::docs::{AddDocsSource, DocsSearch, DocsSourceList};

use crate::docs_library::DocsLibrary;
use crate::state::{AppState, Caller, Json, Path};
use crate::{Error, Result};

fn library(s: &AppState) -> Result<&Arc<dyn DocsLibrary>> {
    s.docs.as_ref().ok_or_else(|| Error::Unavailable("documentation sources are not enabled on this server".into()))
}

pub(crate) async fn add(
    State(s): State<AppState>,
    Extension(t): Extension<Tenant>,
    Extension(caller): Extension<Caller>,
    Json(req): Json<AddDocsSource>,
) -> Result<Response> {
    let docs = library(&s)?;
    let name = req.name.clone();
    let source = s
        .audited(&caller, "docs.add", &name, async {
            caller.at_least(crate::settings::docs_managed_by(&s, &caller, docs.managed_by()).await?)?;
            Ok(docs.add(&t, req).await?)
        })
        .await?;
    Ok((StatusCode::CREATED, AxumJson(source)).into_response())
}

pub(crate) async fn list(State(s): State<AppState>, Extension(t): Extension<Tenant>) -> Result<Response> {
    Ok(AxumJson(DocsSourceList { sources: library(&s)?.list(&t).await? }).into_response())
}

pub(crate) async fn remove(
    State(s): State<AppState>,
    Extension(t): Extension<Tenant>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
) -> Result<Response> {
    let docs = library(&s)?;
    s.audited(&caller, "docs.remove", &name, async {
        caller.at_least(crate::settings::docs_managed_by(&s, &caller, docs.managed_by()).await?)?;
        Ok(docs.remove(&t, &name).await?)
    })
    .await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

pub(crate) async fn refresh(
    State(s): State<AppState>,
    Extension(t): Extension<Tenant>,
    Path(name): Path<String>,
) -> Result<Response> {
    let source = library(&s)?.refresh(&t, &name).await?;
    Ok((StatusCode::ACCEPTED, AxumJson(source)).into_response())
}

pub(crate) async fn search(
    State(s): State<AppState>,
    Extension(t): Extension<Tenant>,
    Json(req): Json<DocsSearch>,
) -> Result<Response> {
    if req.query.trim().is_empty() || !(1..=100).contains(&req.k) {
        return Err(Error::BadRequest("a docs search needs a query and 1 ≤ k ≤ 100".into()));
    }
    let hits = library(&s)?.search(&t, &req).await?;
    Ok(AxumJson(caret_protocol::docs::DocsHits { hits }).into_response())
}
