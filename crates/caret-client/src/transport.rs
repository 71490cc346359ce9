//! How the client reaches a server: over HTTP, or in-process calling the same service the
//! HTTP routes call. Both count the bytes that would cross the wire.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use caret_crypto::ServerKey;
use caret_index::db::Tenant;
use caret_index::service::Service;
use caret_protocol::{
    CommitRequest, CommitResponse, CreateWorkspace, EmbedRequest, EmbedResponse, ErrorBody, MissingVectors,
    PlanRequest, PlanResponse, SERVER_KEY_HEADER, SearchRequest, SearchResponse, TreeRequest, TreeResponse,
    WorkspaceInfo,
};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::{Error, Result};

/// An error with its sources, on one line (reqwest hides the cause in `source`).
fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

/// Bytes sent and received.
#[derive(Debug, Default)]
pub struct WireCounter {
    sent: AtomicU64,
    received: AtomicU64,
    requests: AtomicU64,
}

impl WireCounter {
    /// `(sent, received, requests)` so far.
    pub fn get(&self) -> (u64, u64, u64) {
        (
            self.sent.load(Ordering::Relaxed),
            self.received.load(Ordering::Relaxed),
            self.requests.load(Ordering::Relaxed),
        )
    }

    fn add(&self, sent: usize, received: usize) {
        self.sent.fetch_add(sent as u64, Ordering::Relaxed);
        self.received.fetch_add(received as u64, Ordering::Relaxed);
        self.requests.fetch_add(1, Ordering::Relaxed);
    }
}

/// The server operations the sync engine needs.
#[async_trait::async_trait]
pub trait Transport: Send + Sync {
    /// Creates the workspace or confirms it.
    async fn create_workspace(&self, id: &str, req: &CreateWorkspace) -> Result<WorkspaceInfo>;
    /// The workspace's state.
    async fn workspace(&self, id: &str) -> Result<WorkspaceInfo>;
    /// Directory listings.
    async fn tree(&self, id: &str, req: &TreeRequest) -> Result<TreeResponse>;
    /// Which chunks are missing.
    async fn plan(&self, id: &str, req: &PlanRequest) -> Result<PlanResponse>;
    /// Commits files, deletions and chunk texts (taken by value: it can be megabytes).
    async fn commit(&self, id: &str, key: &ServerKey, req: CommitRequest) -> Result<CommitResponse>;
    /// Chunks that lack vectors (up to `limit`).
    async fn missing_vectors(&self, id: &str, limit: usize) -> Result<MissingVectors>;
    /// Sends chunk texts to embed.
    async fn embed(&self, id: &str, key: &ServerKey, req: EmbedRequest) -> Result<EmbedResponse>;
    /// Searches.
    async fn search(&self, id: &str, key: &ServerKey, req: &SearchRequest) -> Result<SearchResponse>;
    /// After a burst of writes: lets an in-process server fold its log tail into a segment
    /// before the process exits (a remote server does this in the background).
    async fn settle(&self, id: &str) -> Result<()>;
    /// Bytes on the wire so far.
    fn wire(&self) -> &WireCounter;
    /// Where it goes, for messages.
    fn describe(&self) -> String;
}

/// A `caret serve` over HTTP(S).
#[derive(Debug)]
pub struct HttpTransport {
    base: String,
    token: String,
    client: reqwest::Client,
    wire: WireCounter,
    label: Option<String>,
    /// Whether a refused or cut connection is retried (a balancer's replica restarting).
    reconnect: bool,
    /// Whether the server said it takes zstd request bodies (its answers' `Accept-Encoding`):
    /// until one says so, bodies go plain (an older server).
    zstd_bodies: std::sync::atomic::AtomicBool,
    /// Whether the server said it speaks sync version 2 (chunk texts without their ids).
    implied_ids: std::sync::atomic::AtomicBool,
}

/// Request bodies at least this long are compressed (when the server takes it).
const COMPRESS_FROM: usize = 1024;

/// The most a compressed answer may grow to.
const MAX_ANSWER_BYTES: u64 = 1 << 30;

/// An answer's body as sent (`zstd`-encoded or plain).
fn decoded(bytes: &[u8], encoding: Option<&str>) -> std::result::Result<Vec<u8>, String> {
    match encoding {
        None | Some("identity") => Ok(bytes.to_vec()),
        Some("zstd") => {
            use std::io::Read as _;
            let mut out = Vec::new();
            zstd::stream::read::Decoder::new(bytes)
                .map_err(|e| e.to_string())?
                .take(MAX_ANSWER_BYTES)
                .read_to_end(&mut out)
                .map_err(|e| format!("decompressing the answer: {e}"))?;
            Ok(out)
        }
        Some(other) => Err(format!("an answer in an encoding not asked for: {other}")),
    }
}

impl HttpTransport {
    /// A transport to `base` (e.g. `https://caret.example.com`) authenticating with `token`,
    /// trusting `ca_pem` in addition to the public roots.
    pub fn new(base: &str, token: &str, ca_pem: Option<&[u8]>) -> Result<Self> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut builder = reqwest::Client::builder().timeout(std::time::Duration::from_secs(300));
        if base.starts_with("http://") {
            // Plain HTTP (the local daemon, a server on loopback): no certificate store to
            // load, which is most of a short `caret search` process's start.
            builder = builder.tls_built_in_root_certs(false);
        }
        if let Some(pem) = ca_pem {
            let cert = reqwest::Certificate::from_pem(pem)
                .map_err(|e| Error::Transport(format!("reading the CA certificate: {e}")))?;
            builder = builder.add_root_certificate(cert);
        }
        let client = builder.build().map_err(|e| Error::Transport(format!("building the HTTP client: {e}")))?;
        Ok(HttpTransport {
            base: base.trim_end_matches('/').to_owned(),
            token: token.to_owned(),
            client,
            wire: WireCounter::default(),
            label: None,
            reconnect: true,
            zstd_bodies: std::sync::atomic::AtomicBool::new(false),
            implied_ids: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// The same, described as `label` in messages (a local daemon rather than its URL).
    pub fn labelled(mut self, label: &str) -> Self {
        self.label = Some(label.to_owned());
        self
    }

    /// The same, giving up at once when the server cannot be reached (a local daemon that is
    /// gone: its caller starts another rather than wait for it).
    pub fn without_reconnects(mut self) -> Self {
        self.reconnect = false;
        self
    }

    /// Reports an editor's usage events (`POST /v1/usage`); the answer says whether the
    /// server keeps them.
    pub async fn report_usage(
        &self,
        report: &caret_protocol::usage::UsageReport,
    ) -> Result<caret_protocol::usage::UsageReply> {
        self.call(reqwest::Method::POST, "/v1/usage", Some(report), None).await
    }

    /// A route outside the sync protocol (the local daemon's own): `POST path` with a JSON body.
    pub async fn post<B: Serialize, R: DeserializeOwned>(&self, path: &str, body: &B) -> Result<R> {
        self.call(reqwest::Method::POST, path, Some(body), None).await
    }

    async fn call<B: Serialize, R: DeserializeOwned>(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&B>,
        key: Option<&ServerKey>,
    ) -> Result<R> {
        let url = format!("{}{path}", self.base);
        let mut req =
            self.client.request(method, &url).bearer_auth(&self.token).header(reqwest::header::ACCEPT_ENCODING, "zstd");
        let mut sent = path.len() + 64;
        if let Some(b) = body {
            let mut bytes = serde_json::to_vec(b).map_err(|e| Error::Transport(e.to_string()))?;
            if bytes.len() >= COMPRESS_FROM && self.zstd_bodies.load(Ordering::Relaxed) {
                bytes = zstd::bulk::compress(&bytes, 3).map_err(|e| Error::Transport(format!("compressing: {e}")))?;
                req = req.header(reqwest::header::CONTENT_ENCODING, "zstd");
            }
            sent += bytes.len();
            req = req.header(reqwest::header::CONTENT_TYPE, "application/json").body(bytes);
        }
        if let Some(k) = key {
            req = req.header(SERVER_KEY_HEADER, k.encode());
        }
        if let Some(parent) = caret_trace::traceparent() {
            req = req.header(caret_trace::TRACEPARENT, parent);
        }
        // Rate limited, the server's storage failing for a moment, a balancer that found no
        // replica (502, 504), or a connection refused or cut before the answer (a replica
        // restarting): wait as told (doubling from a tenth of a second when it does not say), a
        // few times. Every request of the sync protocol can be sent again.
        let mut last = String::new();
        for attempt in 0..6u32 {
            let Some(r) = req.try_clone() else { break };
            let backoff = std::time::Duration::from_millis(100 << attempt);
            let response = match r.send().await {
                Ok(response) => response,
                Err(e) if self.reconnect && attempt < 5 && (e.is_connect() || e.is_request()) && !e.is_timeout() => {
                    tracing::debug!(%url, error = %chain(&e), "no answer; retrying");
                    last = chain(&e);
                    tokio::time::sleep(backoff).await;
                    continue;
                }
                Err(e) => return Err(Error::Transport(format!("{url}: {}", chain(&e)))),
            };
            let status = response.status();
            let retry_after =
                response.headers().get(reqwest::header::RETRY_AFTER).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
            let header =
                |name| response.headers().get(name).and_then(|v: &reqwest::header::HeaderValue| v.to_str().ok());
            if header(reqwest::header::ACCEPT_ENCODING).is_some_and(|v| v.split(',').any(|e| e.trim() == "zstd")) {
                self.zstd_bodies.store(true, Ordering::Relaxed);
            }
            if header(reqwest::header::HeaderName::from_static(caret_protocol::SYNC_VERSION_HEADER))
                .and_then(|v| v.trim().parse::<u32>().ok())
                .is_some_and(|v| v >= 2)
            {
                self.implied_ids.store(true, Ordering::Relaxed);
            }
            let encoding = header(reqwest::header::CONTENT_ENCODING).map(str::to_owned);
            let bytes = match response.bytes().await {
                Ok(bytes) => bytes,
                Err(e) if attempt < 5 && !e.is_timeout() => {
                    last = chain(&e);
                    tokio::time::sleep(backoff).await;
                    continue;
                }
                Err(e) => return Err(Error::Transport(format!("{url}: {}", chain(&e)))),
            };
            self.wire.add(sent, bytes.len());
            let bytes = decoded(&bytes, encoding.as_deref()).map_err(|e| Error::Transport(format!("{url}: {e}")))?;
            let retry = status == reqwest::StatusCode::TOO_MANY_REQUESTS
                || status == reqwest::StatusCode::SERVICE_UNAVAILABLE && retry_after.is_some()
                || status == reqwest::StatusCode::BAD_GATEWAY
                || status == reqwest::StatusCode::GATEWAY_TIMEOUT;
            if retry && attempt < 5 {
                let wait = retry_after.map_or(backoff, |s| std::time::Duration::from_secs(s.min(30)));
                tracing::debug!(%url, %status, ?wait, "the server asks to retry");
                last = status.to_string();
                tokio::time::sleep(wait).await;
                continue;
            }
            if !status.is_success() {
                let body: Option<ErrorBody> = serde_json::from_slice(&bytes).ok();
                return Err(Error::Server {
                    status: status.as_u16(),
                    code: body.as_ref().map_or_else(|| "unknown".to_owned(), |b| b.error.code.clone()),
                    message: body.map_or_else(|| String::from_utf8_lossy(&bytes).into_owned(), |b| b.error.message),
                });
            }
            return serde_json::from_slice(&bytes)
                .map_err(|e| Error::Transport(format!("{url}: unexpected response: {e}")));
        }
        Err(Error::Transport(format!("{url}: rate limited or unavailable too many times (last: {last})")))
    }
}

#[async_trait::async_trait]
impl Transport for HttpTransport {
    async fn create_workspace(&self, id: &str, req: &CreateWorkspace) -> Result<WorkspaceInfo> {
        self.call(reqwest::Method::PUT, &format!("/v1/workspaces/{id}"), Some(req), None).await
    }
    async fn workspace(&self, id: &str) -> Result<WorkspaceInfo> {
        self.call::<(), _>(reqwest::Method::GET, &format!("/v1/workspaces/{id}"), None, None).await
    }
    async fn tree(&self, id: &str, req: &TreeRequest) -> Result<TreeResponse> {
        self.call(reqwest::Method::POST, &format!("/v1/workspaces/{id}/tree"), Some(req), None).await
    }
    async fn plan(&self, id: &str, req: &PlanRequest) -> Result<PlanResponse> {
        self.call(reqwest::Method::POST, &format!("/v1/workspaces/{id}/plan"), Some(req), None).await
    }
    async fn commit(&self, id: &str, key: &ServerKey, mut req: CommitRequest) -> Result<CommitResponse> {
        if self.implied_ids.load(Ordering::Relaxed) {
            // Each id is in the files' chunk lists already; the server derives it from the text.
            req.chunks.iter_mut().for_each(|c| c.id.clear());
        }
        self.call(reqwest::Method::POST, &format!("/v1/workspaces/{id}/commit"), Some(&req), Some(key)).await
    }
    async fn missing_vectors(&self, id: &str, limit: usize) -> Result<MissingVectors> {
        let path = format!("/v1/workspaces/{id}/vectors/missing?limit={limit}");
        self.call::<(), _>(reqwest::Method::GET, &path, None, None).await
    }
    async fn embed(&self, id: &str, key: &ServerKey, req: EmbedRequest) -> Result<EmbedResponse> {
        self.call(reqwest::Method::POST, &format!("/v1/workspaces/{id}/embed"), Some(&req), Some(key)).await
    }
    async fn search(&self, id: &str, key: &ServerKey, req: &SearchRequest) -> Result<SearchResponse> {
        self.call(reqwest::Method::POST, &format!("/v1/workspaces/{id}/search"), Some(req), Some(key)).await
    }
    async fn settle(&self, _id: &str) -> Result<()> {
        Ok(())
    }
    fn wire(&self) -> &WireCounter {
        &self.wire
    }
    fn describe(&self) -> String {
        self.label.clone().unwrap_or_else(|| self.base.clone())
    }
}

/// The embedded server, called in-process: the same service as over HTTP, no daemon.
#[derive(Debug)]
pub struct InProcessTransport {
    service: Arc<Service>,
    tenant: Tenant,
    wire: WireCounter,
    label: String,
}

impl InProcessTransport {
    /// A transport into `service` as `tenant`.
    pub fn new(service: Arc<Service>, tenant: Tenant, label: &str) -> Self {
        InProcessTransport { service, tenant, wire: WireCounter::default(), label: label.to_owned() }
    }

    /// Counts the JSON sizes the request and response would have on the wire.
    fn count<T: Serialize, R: Serialize>(&self, req: &T, resp: &R) {
        self.wire.add(json_len(req), json_len(resp));
    }
}

/// The length of a value's JSON, measured without building it.
fn json_len<T: Serialize>(value: &T) -> usize {
    struct Counter(usize);
    impl std::io::Write for Counter {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut c = Counter(0);
    let _ = serde_json::to_writer(&mut c, value);
    c.0
}

fn server(e: caret_index::Error) -> Error {
    let (status, code) = e.code();
    Error::Server { status, code: code.to_owned(), message: error_chain(&e) }
}

/// An error and its causes as one line.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        out.push_str(": ");
        out.push_str(&c.to_string());
        cause = c.source();
    }
    out
}

#[async_trait::async_trait]
impl Transport for InProcessTransport {
    async fn create_workspace(&self, id: &str, req: &CreateWorkspace) -> Result<WorkspaceInfo> {
        let r = self.service.create_workspace(&self.tenant, id, req).await.map_err(server)?;
        self.count(req, &r);
        Ok(r)
    }
    async fn workspace(&self, id: &str) -> Result<WorkspaceInfo> {
        let r = self.service.workspace_info(&self.tenant, id).await.map_err(server)?;
        self.count(&(), &r);
        Ok(r)
    }
    async fn tree(&self, id: &str, req: &TreeRequest) -> Result<TreeResponse> {
        let r = self.service.tree(&self.tenant, id, req).await.map_err(server)?;
        self.count(req, &r);
        Ok(r)
    }
    async fn plan(&self, id: &str, req: &PlanRequest) -> Result<PlanResponse> {
        let r = self.service.plan(&self.tenant, id, req).await.map_err(server)?;
        self.count(req, &r);
        Ok(r)
    }
    async fn commit(&self, id: &str, key: &ServerKey, mut req: CommitRequest) -> Result<CommitResponse> {
        // The same service version: the ids are left for it to derive, as over HTTP.
        req.chunks.iter_mut().for_each(|c| c.id.clear());
        let sent = json_len(&req);
        let r = self.service.commit(&self.tenant, id, key, req).await.map_err(server)?;
        self.wire.add(sent, json_len(&r));
        Ok(r)
    }
    async fn missing_vectors(&self, id: &str, limit: usize) -> Result<MissingVectors> {
        let r = self.service.missing_vectors(&self.tenant, id, limit).await.map_err(server)?;
        self.count(&limit, &r);
        Ok(r)
    }
    async fn embed(&self, id: &str, key: &ServerKey, req: EmbedRequest) -> Result<EmbedResponse> {
        let sent = json_len(&req);
        let r = self.service.embed(&self.tenant, id, key, req).await.map_err(server)?;
        self.wire.add(sent, json_len(&r));
        Ok(r)
    }
    async fn search(&self, id: &str, key: &ServerKey, req: &SearchRequest) -> Result<SearchResponse> {
        let r = self.service.search(&self.tenant, id, key, req).await.map_err(server)?;
        self.count(req, &r);
        Ok(r)
    }
    async fn settle(&self, id: &str) -> Result<()> {
        // Any tail at all: the next process then loads one segment instead of replaying.
        self.service.compact(&self.tenant, id, 1).await.map_err(server)?;
        Ok(())
    }
    fn wire(&self) -> &WireCounter {
        &self.wire
    }
    fn describe(&self) -> String {
        self.label.clone()
    }
}
