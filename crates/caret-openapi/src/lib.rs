//! The HTTP API described in OpenAPI 3.1, built from the wire types themselves (their JSON
//! Schemas come from `caret-protocol`'s derives): served at `/openapi.json`, printed by
//! `caret openapi`, kept as `docs/openapi.json`. A test holds the description to the router's
//! routes and methods, and the property-based API run generates its requests from it.
//!
//! It is also the rule book of access: each operation's [`Access`] (who may call it) and, by
//! [`scope`], the token scope a tenant's route needs; the server's router and its
//! authorization matrix test are held to both.
//!
//! Request bodies are described as the server reads them (what it accepts), answers as it
//! writes them (what it sends); a type whose two descriptions differ appears twice, the
//! answer's named `…Answer`.

use std::collections::BTreeSet;

use caret_protocol::{agent, apply, complete, docs, envs, llm, runs, usage};
use schemars::JsonSchema;
use schemars::generate::{Contract, SchemaGenerator, SchemaSettings};
use serde_json::{Map, Value, json};

use caret_protocol::agent::{CreateSession, SessionCreated};

mod people;
mod scim;

/// Who may call an operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Anyone: the operation answers no tenant's data.
    Public,
    /// A tenant's API token.
    Tenant,
    /// A tenant's token with the `admin` scope (an admin's or an owner's).
    Admin,
    /// An operator's token (workers, the fleet view).
    Operator,
    /// The organisation's SCIM token (the identity provider).
    Scim,
}

/// One operation: a method on a path.
struct Operation {
    method: &'static str,
    path: &'static str,
    id: &'static str,
    summary: &'static str,
    access: Access,
    parameters: Vec<Value>,
    body: Option<Value>,
    /// Status → its description and content (by media type).
    answers: Vec<(u16, &'static str, Map<String, Value>)>,
    /// The shape of an error answer.
    errors: Errors,
}

/// The error body of an operation.
#[derive(Clone, Copy)]
enum Errors {
    /// Caret's own (`{"error": {"code", "message"}}`).
    Caret,
    /// OpenAI's, on the model routes; the routes' authentication and body checks still answer
    /// Caret's.
    OpenAi,
    /// Plain text (`/readyz`).
    Text,
    /// SCIM's (`{"schemas": [...Error], "status", "scimType", "detail"}`).
    Scim,
}

/// The generators: requests described as read, answers as written.
struct Schemas {
    read: SchemaGenerator,
    written: SchemaGenerator,
}

fn settings(contract: Contract) -> SchemaSettings {
    SchemaSettings::draft2020_12().with(|s| {
        s.definitions_path = "/components/schemas".into();
        s.contract = contract;
    })
}

impl Schemas {
    fn new() -> Self {
        Schemas {
            read: settings(Contract::Deserialize).into_generator(),
            written: settings(Contract::Serialize).into_generator(),
        }
    }

    /// A request body of type `T`.
    fn read<T: JsonSchema>(&mut self) -> Value {
        json!({ "required": true, "content": { "application/json": { "schema": self.read.subschema_for::<T>() } } })
    }

    /// The schema of an answer of type `T`.
    fn written<T: JsonSchema>(&mut self) -> Value {
        self.written.subschema_for::<T>().to_value()
    }

    /// An `application/json` answer of type `T`.
    fn json<T: JsonSchema>(&mut self) -> Map<String, Value> {
        content("application/json", self.written::<T>())
    }

    /// The definitions of both, merged: a written one that differs from the read one of the
    /// same name is renamed `…Answer` (and every reference to it in the answers follows).
    fn definitions(mut self, answers: &mut [&mut Value]) -> Map<String, Value> {
        let mut merged = self.read.take_definitions(true);
        let written = self.written.take_definitions(true);
        let renamed: BTreeSet<String> = written
            .iter()
            .filter(|(name, schema)| merged.get(*name).is_some_and(|read| read != *schema))
            .map(|(name, _)| name.clone())
            .collect();
        for (name, mut schema) in written {
            rename_refs(&mut schema, &renamed);
            let name = if renamed.contains(&name) { format!("{name}Answer") } else { name };
            merged.insert(name, schema);
        }
        for answer in answers {
            rename_refs(answer, &renamed);
        }
        merged
    }
}

const REF_PREFIX: &str = "#/components/schemas/";

/// Points every `$ref` to a renamed definition at its new name.
fn rename_refs(value: &mut Value, renamed: &BTreeSet<String>) {
    match value {
        Value::Object(map) => {
            if let Some(Value::String(r)) = map.get_mut("$ref")
                && let Some(name) = r.strip_prefix(REF_PREFIX)
                && renamed.contains(name)
            {
                *r = format!("{REF_PREFIX}{name}Answer");
            }
            map.values_mut().for_each(|v| rename_refs(v, renamed));
        }
        Value::Array(items) => items.iter_mut().for_each(|v| rename_refs(v, renamed)),
        _ => {}
    }
}

fn content(media: &str, schema: Value) -> Map<String, Value> {
    let mut map = Map::new();
    map.insert(media.to_owned(), json!({ "schema": schema }));
    map
}

fn text(media: &str) -> Map<String, Value> {
    content(media, json!({ "type": "string" }))
}

/// A server-sent event stream, each event's `data` a JSON payload of one of `payloads` (or
/// `[DONE]`, the end of a model's stream, when `done`).
fn events(payloads: Vec<Value>, done: bool) -> Map<String, Value> {
    let json =
        |schema: Value| json!({ "type": "string", "contentMediaType": "application/json", "contentSchema": schema });
    let mut data: Vec<Value> = payloads.into_iter().map(json).collect();
    if done {
        data.push(json!({ "const": "[DONE]" }));
    }
    let data = if data.len() == 1 { data.remove(0) } else { json!({ "anyOf": data }) };
    content(
        "text/event-stream",
        json!({
            "type": "object",
            "description": "One event of the stream.",
            "properties": { "data": data, "id": { "type": "string" }, "event": { "type": "string" } },
            "required": ["data"],
        }),
    )
}

fn path_param(name: &str, description: &str, schema: Value) -> Value {
    json!({ "name": name, "in": "path", "required": true, "description": description, "schema": schema })
}

fn query(name: &str, description: &str, schema: Value) -> Value {
    json!({ "name": name, "in": "query", "required": false, "description": description, "schema": schema })
}

fn header(name: &str, required: bool, description: &str, schema: Value) -> Value {
    json!({ "name": name, "in": "header", "required": required, "description": description, "schema": schema })
}

fn workspace_id() -> Value {
    path_param(
        "id",
        "The workspace's id (the client derives it from the workspace's root and its key).",
        json!({ "type": "string", "pattern": "^[a-z0-9]{1,64}$" }),
    )
}

fn id(what: &str) -> Value {
    path_param("id", what, json!({ "type": "string", "minLength": 1, "maxLength": 128 }))
}

fn server_key() -> Value {
    header(
        caret_protocol::SERVER_KEY_HEADER,
        true,
        "The workspace's server key (32 bytes in unpadded base32): used in memory for this request, never stored.",
        json!({ "type": "string", "pattern": "^[A-Za-z2-7]{51}[AaQq]$" }),
    )
}

fn model_headers() -> Vec<Value> {
    vec![
        header(
            caret_protocol::llm::PRIORITY_HEADER,
            false,
            "The request's priority class.",
            json!({ "type": "string", "enum": ["interactive", "agent", "background"] }),
        ),
        header(
            caret_protocol::llm::DEADLINE_HEADER,
            false,
            "The request's deadline, in milliseconds from now.",
            json!({ "type": "integer", "minimum": 1 }),
        ),
    ]
}

fn limit(default: u32) -> Value {
    query("limit", &format!("At most this many (default {default})."), json!({ "type": "integer", "minimum": 0 }))
}

/// Every operation of the router.
/// An operation with no parameters, body or answers yet, answering Caret's errors.
fn op(method: &'static str, path: &'static str, id: &'static str, summary: &'static str, access: Access) -> Operation {
    Operation {
        method,
        path,
        id,
        summary,
        access,
        parameters: Vec::new(),
        body: None,
        answers: Vec::new(),
        errors: Errors::Caret,
    }
}

/// A 200 answer.
fn ok(content: Map<String, Value>) -> Vec<(u16, &'static str, Map<String, Value>)> {
    vec![(200, "OK", content)]
}

/// A 204 answer.
fn no_content() -> Vec<(u16, &'static str, Map<String, Value>)> {
    vec![(204, "Done", Map::new())]
}

fn operations(s: &mut Schemas) -> Vec<Operation> {
    use Access::{Operator, Public, Tenant};
    use Errors::OpenAi;
    let none = Map::new;
    let secret_name = path_param(
        "name",
        "The secret's name: an environment variable's.",
        json!({ "type": "string", "pattern": "^[A-Za-z_][A-Za-z0-9_]{0,127}$" }),
    );
    let docs_name = path_param(
        "name",
        "The documentation source's name.",
        json!({ "type": "string", "pattern": "^[A-Za-z0-9_-][A-Za-z0-9._-]{0,63}$" }),
    );
    let run_id = id("The run's id.");
    let env_id = id("The episode's id.");
    let session_id = id("The session's id.");
    // A model's stream ends with `[DONE]`, or with an error payload when it fails midway.
    let model_events = |s: &mut Schemas, chunk: Value| events(vec![chunk, s.written::<llm::ApiError>()], true);
    let chat_answers = |s: &mut Schemas| {
        let mut answer = s.json::<llm::ChatResponse>();
        let chunk = s.written::<llm::ChatChunk>();
        answer.extend(model_events(s, chunk));
        ok(answer)
    };
    let mut ops = vec![
        Operation { answers: ok(text("text/plain")), ..op("get", "/healthz", "healthz", "The process is up.", Public) },
        Operation {
            answers: vec![(200, "Ready", text("text/plain"))],
            errors: Errors::Text,
            ..op(
                "get",
                "/readyz",
                "readyz",
                "The database and the object store answer (503 says which does not).",
                Public,
            )
        },
        Operation {
            answers: ok(text("text/plain")),
            ..op("get", "/metrics", "metrics", "Prometheus metrics.", Public)
        },
        Operation {
            answers: ok(s.json::<Value>()),
            ..op("get", "/openapi.json", "openapi", "This description.", Public)
        },
        Operation {
            answers: ok(text("text/html")),
            ..op(
                "get",
                "/fleet",
                "fleet_page",
                "The fleet dashboard's page (it reads /v1/fleet with an operator token).",
                Public,
            )
        },
        Operation {
            answers: ok(text("text/javascript")),
            ..op("get", "/fleet/app.js", "fleet_script", "The fleet dashboard's script.", Public)
        },
        Operation {
            answers: ok(text("text/css")),
            ..op("get", "/fleet/style.css", "fleet_style", "The fleet dashboard's style sheet.", Public)
        },
        Operation {
            answers: ok(text("text/html")),
            ..op("get", "/admin", "admin_page", "The admin page (it reads /v1/admin with an admin's token).", Public)
        },
        Operation {
            answers: ok(text("text/javascript")),
            ..op("get", "/admin/app.js", "admin_script", "The admin page's script.", Public)
        },
        // Codebase index.
        Operation {
            answers: ok(s.json::<Vec<caret_protocol::WorkspaceInfo>>()),
            ..op("get", "/v1/workspaces", "list_workspaces", "The tenant's workspaces.", Tenant)
        },
        Operation {
            parameters: vec![workspace_id()],
            body: Some(s.read::<caret_protocol::CreateWorkspace>()),
            answers: ok(s.json::<caret_protocol::WorkspaceInfo>()),
            ..op(
                "put",
                "/v1/workspaces/{id}",
                "create_workspace",
                "Creates a workspace, or answers the one there.",
                Tenant,
            )
        },
        Operation {
            parameters: vec![workspace_id()],
            answers: ok(s.json::<caret_protocol::WorkspaceInfo>()),
            ..op("get", "/v1/workspaces/{id}", "workspace", "A workspace's counts and state.", Tenant)
        },
        Operation {
            parameters: vec![workspace_id()],
            answers: no_content(),
            ..op("delete", "/v1/workspaces/{id}", "delete_workspace", "Deletes a workspace and its index.", Tenant)
        },
        Operation {
            parameters: vec![workspace_id()],
            body: Some(s.read::<caret_protocol::TreeRequest>()),
            answers: ok(s.json::<caret_protocol::TreeResponse>()),
            ..op(
                "post",
                "/v1/workspaces/{id}/tree",
                "tree",
                "The server's Merkle tree nodes under the given paths.",
                Tenant,
            )
        },
        Operation {
            parameters: vec![workspace_id()],
            body: Some(s.read::<caret_protocol::PlanRequest>()),
            answers: ok(s.json::<caret_protocol::PlanResponse>()),
            ..op("post", "/v1/workspaces/{id}/plan", "plan", "Which of the given chunks the server lacks.", Tenant)
        },
        Operation {
            parameters: vec![workspace_id(), server_key()],
            body: Some(s.read::<caret_protocol::CommitRequest>()),
            answers: ok(s.json::<caret_protocol::CommitResponse>()),
            ..op(
                "post",
                "/v1/workspaces/{id}/commit",
                "commit",
                "Commits changed files and the chunks they need.",
                Tenant,
            )
        },
        Operation {
            parameters: vec![workspace_id(), limit(1000)],
            answers: ok(s.json::<caret_protocol::MissingVectors>()),
            ..op(
                "get",
                "/v1/workspaces/{id}/vectors/missing",
                "missing_vectors",
                "Chunks still without an embedding.",
                Tenant,
            )
        },
        Operation {
            parameters: vec![workspace_id(), server_key()],
            body: Some(s.read::<caret_protocol::EmbedRequest>()),
            answers: ok(s.json::<caret_protocol::EmbedResponse>()),
            ..op("post", "/v1/workspaces/{id}/embed", "embed", "Stores embeddings the client computed.", Tenant)
        },
        Operation {
            parameters: vec![workspace_id(), server_key()],
            body: Some(s.read::<caret_protocol::SearchRequest>()),
            answers: ok(s.json::<caret_protocol::SearchResponse>()),
            ..op(
                "post",
                "/v1/workspaces/{id}/search",
                "search",
                "Hybrid search: obfuscated locations, best first.",
                Tenant,
            )
        },
        // Model gateway (OpenAI's shapes).
        Operation {
            parameters: model_headers(),
            body: Some(s.read::<llm::ChatRequest>()),
            answers: chat_answers(s),
            errors: OpenAi,
            ..op(
                "post",
                "/v1/chat/completions",
                "chat_completions",
                "A chat completion (streamed when `stream`).",
                Tenant,
            )
        },
        Operation {
            parameters: model_headers(),
            body: Some(s.read::<llm::CompletionRequest>()),
            answers: {
                let mut answer = s.json::<llm::CompletionResponse>();
                let chunk = s.written::<llm::CompletionResponse>();
                answer.extend(model_events(s, chunk));
                ok(answer)
            },
            errors: OpenAi,
            ..op("post", "/v1/completions", "completions", "A text completion (streamed when `stream`).", Tenant)
        },
        Operation {
            parameters: model_headers(),
            body: Some(s.read::<llm::EmbeddingsRequest>()),
            answers: ok(s.json::<llm::EmbeddingsResponse>()),
            errors: OpenAi,
            ..op("post", "/v1/embeddings", "embeddings", "Embeddings of texts.", Tenant)
        },
        Operation {
            answers: ok(s.json::<llm::ModelList>()),
            ..op("get", "/v1/models", "models", "The gateway's model aliases.", Tenant)
        },
        // Apply and Tab.
        Operation {
            parameters: model_headers(),
            body: Some(s.read::<apply::ApplyRequest>()),
            answers: ok(s.json::<apply::ApplyResponse>()),
            ..op("post", "/v1/apply", "apply", "Applies an edit to a text in memory (nothing is stored).", Tenant)
        },
        Operation {
            parameters: model_headers(),
            body: Some(s.read::<complete::CompleteRequest>()),
            answers: ok(s.json::<complete::CompleteResponse>()),
            ..op("post", "/v1/complete", "complete", "A Tab completion at the cursor.", Tenant)
        },
        Operation {
            body: Some(s.read::<usage::UsageReport>()),
            answers: ok(s.json::<usage::UsageReply>()),
            ..op(
                "post",
                "/v1/usage",
                "report_usage",
                "An editor's usage counts (Tab shown and accepted), kept when the server collects usage.",
                Tenant,
            )
        },
        // Agent sessions.
        Operation {
            body: Some(s.read::<CreateSession>()),
            answers: vec![(201, "Started", s.json::<SessionCreated>())],
            ..op(
                "post",
                "/v1/agent/sessions",
                "create_session",
                "Starts an agent session on a configured workspace.",
                Tenant,
            )
        },
        Operation {
            parameters: vec![session_id.clone()],
            body: Some(s.read::<agent::Op>()),
            answers: vec![(202, "Queued", none())],
            ..op("post", "/v1/agent/sessions/{id}/ops", "session_op", "Sends an operation to a session.", Tenant)
        },
        Operation {
            parameters: vec![session_id],
            answers: ok(events(vec![s.written::<agent::Event>()], false)),
            ..op(
                "get",
                "/v1/agent/sessions/{id}/events",
                "session_events",
                "A session's events, as they happen.",
                Tenant,
            )
        },
        // Background runs.
        Operation {
            body: Some(s.read::<runs::CreateRun>()),
            answers: vec![(201, "Queued", s.json::<runs::RunInfo>())],
            ..op("post", "/v1/runs", "create_run", "Queues a background run.", Tenant)
        },
        Operation {
            parameters: vec![limit(50)],
            answers: ok(s.json::<runs::RunList>()),
            ..op("get", "/v1/runs", "list_runs", "The tenant's runs, newest first.", Tenant)
        },
        Operation {
            parameters: vec![run_id.clone()],
            answers: ok(s.json::<runs::RunInfo>()),
            ..op("get", "/v1/runs/{id}", "run", "A run.", Tenant)
        },
        Operation {
            parameters: vec![run_id.clone()],
            answers: no_content(),
            ..op("delete", "/v1/runs/{id}", "delete_run", "Deletes an ended run and what it left.", Tenant)
        },
        Operation {
            parameters: vec![run_id.clone()],
            body: Some(s.read::<runs::ShareRun>()),
            answers: ok(s.json::<runs::RunInfo>()),
            ..op(
                "post",
                "/v1/runs/{id}/share",
                "share_run",
                "Shares a person's run with the organisation (its owner's or an admin's to change).",
                Tenant,
            )
        },
        Operation {
            parameters: vec![run_id.clone()],
            answers: ok(s.json::<runs::RunInfo>()),
            ..op("post", "/v1/runs/{id}/cancel", "cancel_run", "Cancels a run.", Tenant)
        },
        Operation {
            parameters: vec![
                run_id.clone(),
                query("after", "Events after this number.", json!({ "type": "integer", "minimum": 0 })),
                query(
                    "follow",
                    "Stream events as they come (default); `false` answers one JSON page.",
                    json!({ "type": "boolean" }),
                ),
                header("last-event-id", false, "Resume a stream after this event.", json!({ "type": "string" })),
            ],
            answers: {
                let mut answer = s.json::<Vec<runs::NumberedEvent>>();
                answer.extend(events(vec![s.written::<runs::RunEvent>()], false));
                ok(answer)
            },
            ..op("get", "/v1/runs/{id}/events", "run_events", "A run's events.", Tenant)
        },
        Operation {
            parameters: vec![run_id.clone()],
            answers: ok(s.json::<runs::RunResult>()),
            ..op("get", "/v1/runs/{id}/result", "run_result", "An ended run's result: patch, tests, usage.", Tenant)
        },
        // Environments for rollouts and training.
        Operation {
            body: Some(s.read::<envs::CreateEnv>()),
            answers: vec![(201, "Opened", s.json::<envs::Observation>())],
            ..op("post", "/v1/envs", "create_env", "Opens an episode in a sandbox.", Tenant)
        },
        Operation {
            answers: ok(s.json::<envs::EnvList>()),
            ..op("get", "/v1/envs", "list_envs", "The tenant's open episodes.", Tenant)
        },
        Operation {
            parameters: vec![env_id.clone()],
            answers: no_content(),
            ..op("delete", "/v1/envs/{id}", "close_env", "Closes an episode.", Tenant)
        },
        Operation {
            parameters: vec![env_id.clone()],
            body: Some(s.read::<envs::Step>()),
            answers: ok(s.json::<envs::Observation>()),
            ..op("post", "/v1/envs/{id}/step", "step_env", "One step: the policy's message, its tools run.", Tenant)
        },
        Operation {
            parameters: vec![env_id],
            answers: ok(s.json::<envs::Graded>()),
            ..op("post", "/v1/envs/{id}/grade", "grade_env", "Runs the episode's grader.", Tenant)
        },
        Operation {
            answers: ok(s.json::<runs::SecretList>()),
            ..op(
                "get",
                "/v1/secrets",
                "list_secrets",
                "The names of the tenant's secrets (never their values).",
                Tenant,
            )
        },
        Operation {
            parameters: vec![secret_name.clone()],
            body: Some(s.read::<runs::PutSecret>()),
            answers: no_content(),
            ..op("put", "/v1/secrets/{name}", "put_secret", "Sets a secret for runs (stored encrypted).", Tenant)
        },
        Operation {
            parameters: vec![secret_name],
            answers: no_content(),
            ..op("delete", "/v1/secrets/{name}", "delete_secret", "Deletes a secret.", Tenant)
        },
        Operation {
            body: Some(s.read::<docs::AddDocsSource>()),
            answers: vec![(201, "Added; its first crawl is queued", s.json::<docs::DocsSource>())],
            ..op(
                "post",
                "/v1/docs/sources",
                "add_docs_source",
                "Adds a documentation site for the server to crawl.",
                Tenant,
            )
        },
        Operation {
            answers: ok(s.json::<docs::DocsSourceList>()),
            ..op("get", "/v1/docs/sources", "list_docs_sources", "The tenant's documentation sources.", Tenant)
        },
        Operation {
            parameters: vec![docs_name.clone()],
            answers: no_content(),
            ..op("delete", "/v1/docs/sources/{name}", "remove_docs_source", "Removes a documentation source.", Tenant)
        },
        Operation {
            parameters: vec![docs_name],
            answers: vec![(202, "Its crawl is queued", s.json::<docs::DocsSource>())],
            ..op(
                "post",
                "/v1/docs/sources/{name}/refresh",
                "refresh_docs_source",
                "Crawls a documentation source again.",
                Tenant,
            )
        },
        Operation {
            body: Some(s.read::<docs::DocsSearch>()),
            answers: ok(s.json::<docs::DocsHits>()),
            ..op("post", "/v1/docs/search", "search_docs", "Searches the tenant's documentation sources.", Tenant)
        },
        // Workers and operators.
        Operation {
            body: Some(s.read::<runs::LeaseRequest>()),
            answers: vec![(200, "A run to do", s.json::<runs::Lease>()), (204, "Nothing queued", none())],
            ..op("post", "/v1/workers/lease", "lease", "A worker leases the next run it fits.", Operator)
        },
        Operation {
            parameters: vec![
                run_id.clone(),
                json!({ "name": "token", "in": "query", "required": true, "description": "The lease's fencing token.",
                        "schema": { "type": "integer", "minimum": 0 } }),
            ],
            answers: ok(content(
                "application/octet-stream",
                json!({ "type": "string", "contentMediaType": "application/octet-stream" }),
            )),
            ..op("get", "/v1/workers/runs/{id}/bundle", "bundle", "The leased run's input bundle.", Operator)
        },
        Operation {
            parameters: vec![run_id.clone()],
            body: Some(s.read::<runs::Heartbeat>()),
            answers: ok(s.json::<runs::HeartbeatAnswer>()),
            ..op(
                "post",
                "/v1/workers/runs/{id}/heartbeat",
                "heartbeat",
                "Keeps a lease; answers whether to cancel.",
                Operator,
            )
        },
        Operation {
            parameters: vec![run_id.clone()],
            body: Some(s.read::<runs::EventBatch>()),
            answers: no_content(),
            ..op("post", "/v1/workers/runs/{id}/events", "append_events", "Appends a leased run's events.", Operator)
        },
        Operation {
            parameters: vec![run_id.clone()],
            body: Some(s.read::<runs::CheckpointBody>()),
            answers: no_content(),
            ..op(
                "post",
                "/v1/workers/runs/{id}/checkpoint",
                "checkpoint",
                "Stores a leased run's checkpoint.",
                Operator,
            )
        },
        Operation {
            parameters: vec![run_id.clone()],
            body: Some(s.read::<runs::Completion>()),
            answers: ok(s.json::<runs::RunInfo>()),
            ..op(
                "post",
                "/v1/workers/runs/{id}/complete",
                "complete_run",
                "Ends a leased run with its result.",
                Operator,
            )
        },
        Operation {
            parameters: vec![
                run_id,
                path_param("token", "The lease's fencing token.", json!({ "type": "integer", "minimum": 0 })),
            ],
            body: Some(s.read::<llm::ChatRequest>()),
            answers: ok({
                let chunk = s.written::<llm::ChatChunk>();
                model_events(s, chunk)
            }),
            errors: OpenAi,
            ..op(
                "post",
                "/v1/workers/runs/{id}/{token}/v1/chat/completions",
                "run_chat",
                "A leased run's model call, under its tenant's quotas (always streamed).",
                Operator,
            )
        },
        Operation {
            answers: ok(s.json::<runs::Fleet>()),
            ..op("get", "/v1/fleet", "fleet", "Workers, queues, running and recently ended runs.", Operator)
        },
    ];
    ops.extend(people::operations(s));
    ops.extend(scim::operations());
    ops
}

/// The description, as JSON.
pub fn document() -> Value {
    let mut schemas = Schemas::new();
    let ops = operations(&mut schemas);
    let mut error_caret = schemas.written::<caret_protocol::ErrorBody>();
    let mut error_openai = schemas.written::<llm::ApiError>();
    let mut bodies: Vec<Value> =
        ops.iter().map(|o| json!(o.answers.iter().map(|a| &a.2).collect::<Vec<_>>())).collect();
    let mut refs: Vec<&mut Value> = bodies.iter_mut().collect();
    refs.push(&mut error_caret);
    refs.push(&mut error_openai);
    let definitions = schemas.definitions(&mut refs);
    let mut paths = Map::new();
    for (op, answers) in ops.iter().zip(bodies) {
        let Value::Array(answers) = answers else { continue };
        let mut responses = Map::new();
        for ((status, description, _), content) in op.answers.iter().zip(answers) {
            let mut answer = json!({ "description": description });
            if content.as_object().is_some_and(|c| !c.is_empty()) {
                answer["content"] = content;
            }
            responses.insert(status.to_string(), answer);
        }
        let error = match op.errors {
            Errors::Caret => error_caret.clone(),
            Errors::OpenAi => json!({ "anyOf": [error_openai, error_caret] }),
            Errors::Text => Value::Null,
            Errors::Scim => json!({ "type": "object", "required": ["schemas", "status"], "properties": {
                "schemas": { "type": "array", "items": { "type": "string" } },
                "status": { "type": "string" }, "scimType": { "type": "string" }, "detail": { "type": "string" } } }),
        };
        let media = if matches!(op.errors, Errors::Scim) { "application/scim+json" } else { "application/json" };
        let error_content = if error.is_null() { text("text/plain") } else { content(media, error) };
        responses.insert(
            "default".into(),
            json!({ "description": "An error: 4xx for the request, 503 with Retry-After when a part is down for a moment, 503 `disabled` (no Retry-After) when an operator switched the capability off.",
                    "content": error_content }),
        );
        let mut operation = json!({
            "operationId": op.id,
            "summary": op.summary,
            "tags": [tag(op.path)],
            "responses": responses,
        });
        if !op.parameters.is_empty() {
            operation["parameters"] = json!(op.parameters);
        }
        if let Some(body) = &op.body {
            operation["requestBody"] = body.clone();
        }
        // A tenant's route names the scope its token needs.
        let scopes: Vec<&str> = scope(op.path).map(caret_identity::Scope::name).into_iter().collect();
        operation["security"] = match op.access {
            Access::Public => json!([]),
            Access::Tenant | Access::Admin => json!([{ "tenant": scopes }]),
            Access::Operator => json!([{ "operator": [] }]),
            Access::Scim => json!([{ "scim": [] }]),
        };
        let entry = paths.entry(op.path.to_owned()).or_insert_with(|| json!({}));
        entry[op.method] = operation;
    }
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "Caret server",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "The API of `caret serve`: the codebase index (obfuscated paths and keyed \
                hashes only), search, the model gateway, Apply, Tab, agent sessions, background runs \
                and environments, and the workers' and operators' routes. Every `/v1` request bears \
                a bearer token: a tenant's, or an operator's for `/v1/workers` and `/v1/fleet`. \
                Another tenant's resources answer exactly as absent ones do (404). The team pages \
                under `/ui/{workspace}/` (when agent workspaces are configured) and their API are \
                the bundled page's own, versioned with it, and not described here.",
            "license": { "name": "Apache-2.0" },
        },
        "jsonSchemaDialect": "https://json-schema.org/draft/2020-12/schema",
        "paths": paths,
        "components": {
            "schemas": definitions,
            "securitySchemes": {
                "tenant": { "type": "http", "scheme": "bearer", "description": "An organisation's token: a person's personal access token or sign-in, a service account's, or a tenant token (`caret admin token create`); an operation names the scope it needs, and `admin` is held only by admins and owners." },
                "operator": { "type": "http", "scheme": "bearer", "description": "An operator's token (`caret admin operator-token create`)." },
                "scim": { "type": "http", "scheme": "bearer", "description": "The organisation's SCIM token (`POST /v1/admin/tokens` with kind `scim`), for its identity provider: it opens /scim/v2 only." },
            },
        },
    })
}

fn tag(path: &str) -> &'static str {
    if path.starts_with("/scim/") {
        return "scim";
    }
    let rest = path.strip_prefix("/v1/").unwrap_or("");
    match rest.split('/').next().unwrap_or("") {
        "workspaces" => "index",
        "chat" | "completions" | "embeddings" | "models" => "models",
        "apply" | "complete" => "editing",
        "agent" => "agent",
        "runs" | "secrets" => "runs",
        "me" | "admin" | "invitations" | "auth" => "people",
        "docs" => "docs",
        "envs" => "envs",
        "workers" | "fleet" => "operators",
        _ => "server",
    }
}

/// The (method, path) of every operation the description holds.
pub fn operation_list() -> Vec<(&'static str, &'static str, Access)> {
    operations(&mut Schemas::new()).into_iter().map(|o| (o.method, o.path, o.access)).collect()
}

/// The scope a route needs (none: any live credential).
pub fn scope(path: &str) -> Option<caret_identity::Scope> {
    use caret_identity::Scope;
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    Some(match parts.as_slice() {
        ["v1", "workspaces", _, "search"] => Scope::Search,
        ["v1", "workspaces", ..] => Scope::Sync,
        ["v1", "chat" | "completions" | "embeddings" | "models", ..] => Scope::Chat,
        ["v1", "apply" | "complete"] => Scope::Complete,
        ["v1", "agent", ..] => Scope::Agent,
        ["v1", "runs" | "envs" | "secrets", ..] | ["mcp"] => Scope::Runs,
        ["v1", "docs", ..] => Scope::Docs,
        ["v1", "admin", ..] => Scope::Admin,
        _ => return None,
    })
}
