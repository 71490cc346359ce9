//! The gateway end to end against scripted upstreams (test doubles from
//! `caret-test-support`): answers, retries, failover, breakers, shedding, deadlines, quotas.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use caret_models::openai::OpenAiProvider;
use caret_models::{
    BreakerState, CallContext, Class, Deployment, DeploymentLimits, Error, Gateway, GatewaySettings, collect_chat,
    collect_completion,
};
use caret_protocol::llm::{
    ChatMessage, ChatRequest, CompletionRequest, EmbeddingInput, EmbeddingsRequest, FinishReason, Prompt, Role,
};
use caret_test_support::scripted::{Behaviour, ScriptedUpstream};
use futures::StreamExt as _;

fn deployment(name: &str, up: &ScriptedUpstream, order: u32, limits: DeploymentLimits) -> Deployment {
    let provider = Arc::new(OpenAiProvider::new(&up.url, Some("k".into())).unwrap());
    Deployment::new(name, provider, format!("{name}-model"), order, 1, limits)
}

fn gateway(deployments: Vec<Deployment>) -> Gateway {
    let mut g = Gateway::new(GatewaySettings::default());
    g.add_alias("chat", deployments);
    g
}

fn chat_request() -> ChatRequest {
    serde_json::from_value(serde_json::json!({"model": "chat", "messages": [{"role": "user", "content": "hi"}]}))
        .unwrap()
}

fn ctx(class: Class, ms: u64) -> CallContext {
    CallContext::new(class, Duration::from_millis(ms), "acme")
}

async fn ask(g: &Gateway, class: Class, ms: u64) -> Result<String, Error> {
    let stream = g.chat(chat_request(), ctx(class, ms)).await?;
    Ok(collect_chat(stream).await?.message.content_text())
}

#[tokio::test]
async fn answers_chat_tools_completions_and_embeddings_through_an_alias() {
    let up = ScriptedUpstream::start("a").await;
    let g = gateway(vec![deployment("a", &up, 0, DeploymentLimits::default())]);
    let c = collect_chat(g.chat(chat_request(), ctx(Class::Interactive, 5000)).await.unwrap()).await.unwrap();
    assert_eq!(c.message.content_text(), "hello from a");
    assert_eq!(c.finish, Some(FinishReason::Stop));
    assert_eq!(c.usage.map(|u| u.total_tokens), Some(13));

    up.set(Behaviour { tool_call: Some("read_file".into()), ..Behaviour::default() });
    let c = collect_chat(g.chat(chat_request(), ctx(Class::Agent, 5000)).await.unwrap()).await.unwrap();
    assert_eq!(c.message.role, Role::Assistant);
    assert_eq!(c.message.tool_calls[0].function.name, "read_file");
    assert_eq!(c.message.tool_calls[0].function.arguments, r#"{"path":"src/lib.rs"}"#);
    assert_eq!(c.finish, Some(FinishReason::ToolCalls));

    let fim = CompletionRequest {
        model: "chat".into(),
        prompt: Prompt::One("fn main() {".into()),
        suffix: Some("}".into()),
        max_tokens: Some(8),
        temperature: None,
        top_p: None,
        stop: None,
        stream: false,
        stream_options: None,
        seed: None,
    };
    let (text, finish, _) =
        collect_completion(g.complete(fim, ctx(Class::Interactive, 5000)).await.unwrap()).await.unwrap();
    assert_eq!((text.as_str(), finish), ("<fim a>", Some(FinishReason::Stop)));

    let e = g
        .embed(
            EmbeddingsRequest {
                model: "chat".into(),
                input: EmbeddingInput::Many(vec!["ab".into(), "abcd".into()]),
                encoding_format: None,
            },
            ctx(Class::Background, 5000),
        )
        .await
        .unwrap();
    assert_eq!(e.model, "chat", "the alias, not the upstream's name");
    assert_eq!(e.data[1].embedding[0], 4.0);

    let err = g.chat(ChatRequest { model: "nope".into(), ..chat_request() }, ctx(Class::Interactive, 100)).await;
    assert!(matches!(err, Err(Error::UnknownModel(_))));
    let text = g.metrics_text();
    assert!(text.contains("caret_model_requests_total{deployment=\"a\",class=\"interactive\"} 2"), "{text}");
}

#[tokio::test]
async fn fails_over_and_the_breaker_keeps_traffic_off_a_dead_deployment() {
    let (bad, good) = (ScriptedUpstream::start("bad").await, ScriptedUpstream::start("good").await);
    bad.set(Behaviour { status: Some(503), ..Behaviour::default() });
    let limits =
        DeploymentLimits { breaker_threshold: 3, breaker_cooldown: Duration::from_secs(60), ..Default::default() };
    let g = gateway(vec![deployment("bad", &bad, 0, limits.clone()), deployment("good", &good, 1, limits)]);
    for _ in 0..10 {
        assert_eq!(ask(&g, Class::Interactive, 5000).await.unwrap(), "hello from good");
    }
    assert_eq!(bad.requests(), 3, "after three failures the breaker opened");
    assert_eq!(g.breaker_state("bad"), Some(BreakerState::Open));
    assert!(g.metrics_text().contains("caret_model_breaker_state{deployment=\"bad\"} 2"));
}

#[tokio::test]
async fn a_throttling_upstream_is_left_alone_for_its_retry_after() {
    let (busy, other) = (ScriptedUpstream::start("busy").await, ScriptedUpstream::start("other").await);
    busy.set(Behaviour { throttle: Some(30), ..Behaviour::default() });
    let g = gateway(vec![
        deployment("busy", &busy, 0, DeploymentLimits::default()),
        deployment("other", &other, 0, DeploymentLimits::default()),
    ]);
    for _ in 0..10 {
        assert_eq!(ask(&g, Class::Interactive, 5000).await.unwrap(), "hello from other");
    }
    assert!(busy.requests() <= 1, "one 429 with Retry-After: 30 keeps it cooling: {}", busy.requests());
    assert_eq!(g.breaker_state("busy"), Some(BreakerState::Closed), "429 is not a failure");
}

#[tokio::test]
async fn half_failing_primary_with_a_healthy_second_keeps_interactive_success_above_99_percent() {
    let (flaky, steady) = (ScriptedUpstream::start("flaky").await, ScriptedUpstream::start("steady").await);
    flaky.set(Behaviour { fail_every: Some(2), ..Behaviour::default() });
    let limits = DeploymentLimits { breaker_threshold: 1000, ..Default::default() };
    let g = Arc::new(gateway(vec![
        deployment("flaky", &flaky, 0, limits.clone()),
        deployment("steady", &steady, 0, limits),
    ]));
    let started = Instant::now();
    let results: Vec<Result<String, Error>> = futures::stream::iter(0..400)
        .map(|_| {
            let g = g.clone();
            async move { ask(&g, Class::Interactive, 2000).await }
        })
        .buffer_unordered(16)
        .collect()
        .await;
    let ok = results.iter().filter(|r| r.is_ok()).count();
    assert!(ok as f64 / 400.0 > 0.99, "{ok} of 400 succeeded: {:?}", results.iter().find(|r| r.is_err()));
    assert!(flaky.requests() > 50, "the flaky one kept its share: {}", flaky.requests());
    assert!(started.elapsed() < Duration::from_secs(30));
}

#[tokio::test]
async fn nothing_waits_past_its_deadline() {
    let slow = ScriptedUpstream::start("slow").await;
    slow.set(Behaviour { delay: Duration::from_secs(5), ..Behaviour::default() });
    let g = gateway(vec![deployment("slow", &slow, 0, DeploymentLimits::default())]);
    let t = Instant::now();
    let err = ask(&g, Class::Interactive, 300).await.unwrap_err();
    assert!(t.elapsed() < Duration::from_millis(600), "waited {:?}", t.elapsed());
    // The caller's budget ran out, not the deployment: a deadline (408), not an upstream
    // failure (502) counted against the deployment's health.
    assert!(matches!(err, Error::Deadline(_)) && err.status() == 408, "{err}");
}

#[tokio::test]
async fn a_stream_that_stalls_midway_ends_with_an_error() {
    let up = ScriptedUpstream::start("stall").await;
    up.set(Behaviour { stall_mid_stream: true, ..Behaviour::default() });
    let limits = DeploymentLimits { attempt_timeout: Duration::from_millis(300), ..Default::default() };
    let g = gateway(vec![deployment("stall", &up, 0, limits)]);
    let t = Instant::now();
    let mut stream = g.chat(chat_request(), ctx(Class::Interactive, 5000)).await.unwrap();
    let mut items = Vec::new();
    while let Some(item) = stream.next().await {
        items.push(item);
    }
    assert!(matches!(items.last(), Some(Err(Error::Upstream { .. }))), "{items:?}");
    assert!(t.elapsed() < Duration::from_secs(2));
}

#[tokio::test]
async fn a_full_queue_sheds_background_work_before_interactive() {
    let up = ScriptedUpstream::start("one").await;
    up.set(Behaviour { delay: Duration::from_millis(400), ..Behaviour::default() });
    let limits = DeploymentLimits { max_concurrency: 1, max_queue: 2, ..Default::default() };
    let g = Arc::new(gateway(vec![deployment("one", &up, 0, limits)]));
    let spawn = |class: Class, after: u64| {
        let g = g.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(after)).await;
            ask(&g, class, 10_000).await
        })
    };
    let running = spawn(Class::Background, 0);
    let queued = [spawn(Class::Background, 50), spawn(Class::Background, 60)];
    let urgent = spawn(Class::Interactive, 150);
    assert!(running.await.unwrap().is_ok());
    assert!(urgent.await.unwrap().is_ok(), "interactive got in");
    let outcomes: Vec<Result<String, Error>> =
        futures::future::join_all(queued).await.into_iter().map(|r| r.unwrap()).collect();
    let shed = outcomes.iter().filter(|r| matches!(r, Err(Error::Shed { .. }))).count();
    assert_eq!(shed, 1, "exactly one background request made room: {outcomes:?}");
    assert_eq!(g.metrics().shed_total(), 1);
}

#[tokio::test]
async fn an_open_breaker_closes_after_a_health_probe_and_a_good_trial() {
    let up = ScriptedUpstream::start("flap").await;
    up.set(Behaviour { status: Some(500), ..Behaviour::default() });
    let limits = DeploymentLimits {
        breaker_threshold: 2,
        breaker_cooldown: Duration::from_secs(3600),
        max_concurrency: 4,
        ..Default::default()
    };
    let g = Arc::new(gateway(vec![deployment("flap", &up, 0, limits)]));
    let _probes = g.spawn_health_probes(Duration::from_millis(50));
    assert!(ask(&g, Class::Interactive, 2000).await.is_err());
    assert_eq!(g.breaker_state("flap"), Some(BreakerState::Open));
    assert!(matches!(ask(&g, Class::Interactive, 500).await, Err(Error::Shed { .. })), "open: nothing is sent");
    up.set(Behaviour::default());
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(g.breaker_state("flap"), Some(BreakerState::HalfOpen), "the probe saw it answer");
    assert_eq!(ask(&g, Class::Interactive, 2000).await.unwrap(), "hello from flap");
    assert_eq!(g.breaker_state("flap"), Some(BreakerState::Closed));
}

#[tokio::test]
async fn tenant_quotas_answer_with_when_to_retry() {
    let up = ScriptedUpstream::start("q").await;
    let mut g = Gateway::new(GatewaySettings { tenant_rpm: Some(2), ..GatewaySettings::default() });
    g.add_alias("chat", vec![deployment("q", &up, 0, DeploymentLimits::default())]);
    assert!(ask(&g, Class::Interactive, 2000).await.is_ok());
    assert!(ask(&g, Class::Interactive, 2000).await.is_ok());
    let err = ask(&g, Class::Interactive, 2000).await.unwrap_err();
    assert_eq!(err.status(), 429);
    let after = err.retry_after().unwrap();
    assert!(after > Duration::from_secs(20) && after <= Duration::from_secs(30), "{after:?}");
    // Another tenant is not affected.
    let other = g.chat(chat_request(), CallContext::new(Class::Interactive, Duration::from_secs(2), "globex")).await;
    assert!(other.is_ok());
    let _ = ChatMessage::text(Role::User, "unused");
}

#[tokio::test]
async fn an_anthropic_deployment_streams_text_and_tool_calls_and_fails_over_to_openai() {
    let (claude, backup) = (ScriptedUpstream::start("claude").await, ScriptedUpstream::start("backup").await);
    let anthropic =
        Arc::new(caret_models::anthropic::AnthropicProvider::new(&claude.url, Some("sk-test".into())).unwrap());
    let g = gateway(vec![
        Deployment::new("claude", anthropic, "claude-x", 0, 1, DeploymentLimits::default()),
        deployment("backup", &backup, 1, DeploymentLimits::default()),
    ]);
    let mut req = chat_request();
    req.messages.insert(0, ChatMessage::text(Role::System, "be brief"));
    let c = collect_chat(g.chat(req, ctx(Class::Interactive, 5000)).await.unwrap()).await.unwrap();
    assert_eq!(c.message.content_text(), "hello from claude");
    assert_eq!(c.finish, Some(FinishReason::Stop));
    assert_eq!(c.usage.map(|u| (u.prompt_tokens, u.completion_tokens)), Some((10, 3)));
    let (headers, body) = claude.last_request().unwrap();
    assert_eq!(headers["x-api-key"], "sk-test");
    assert!(headers.contains_key("anthropic-version"));
    assert_eq!(body["model"], "claude-x");
    assert_eq!(body["system"], "be brief");
    assert_eq!(body["messages"], serde_json::json!([{"role": "user", "content": [{"type": "text", "text": "hi"}]}]));
    assert_eq!(body["stream"], true);
    assert!(body["max_tokens"].as_u64().is_some_and(|n| n > 0), "Anthropic requires max_tokens: {body}");

    claude.set(Behaviour { tool_call: Some("read_file".into()), ..Behaviour::default() });
    let c = collect_chat(g.chat(chat_request(), ctx(Class::Agent, 5000)).await.unwrap()).await.unwrap();
    assert_eq!(c.finish, Some(FinishReason::ToolCalls));
    let call = &c.message.tool_calls[0];
    assert_eq!((call.id.as_str(), call.function.name.as_str()), ("toolu_1", "read_file"));
    assert_eq!(call.function.arguments, "{\"path\":\"src/lib.rs\"}");

    // Anthropic overloaded (529): the OpenAI-compatible backup answers.
    claude.set(Behaviour { status: Some(529), ..Behaviour::default() });
    let c = collect_chat(g.chat(chat_request(), ctx(Class::Interactive, 5000)).await.unwrap()).await.unwrap();
    assert_eq!(c.message.content_text(), "hello from backup");
}

#[tokio::test]
async fn a_recovered_deployment_takes_load_gradually() {
    let up = ScriptedUpstream::start("ramp").await;
    up.set(Behaviour { status: Some(500), ..Behaviour::default() });
    let limits = DeploymentLimits {
        breaker_threshold: 2,
        breaker_cooldown: Duration::from_millis(100),
        max_concurrency: 8,
        slow_start: Duration::from_secs(3),
        ..Default::default()
    };
    let g = Arc::new(gateway(vec![deployment("ramp", &up, 0, limits)]));
    assert!(ask(&g, Class::Interactive, 2000).await.is_err());
    assert_eq!(g.breaker_state("ramp"), Some(BreakerState::Open));
    // It recovers, and answers slowly enough for the concurrency it sees to be counted.
    up.set(Behaviour { delay: Duration::from_millis(300), ..Behaviour::default() });
    // The cool-down has passed when the breaker reads half-open: 100 ms, or 200 ms when the
    // request's last retry came late enough to be a half-open trial itself and failed.
    let waited = Instant::now();
    while g.breaker_state("ramp") == Some(BreakerState::Open) {
        assert!(waited.elapsed() < Duration::from_secs(5), "the breaker never half-opened");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(g.breaker_state("ramp"), Some(BreakerState::HalfOpen));
    assert_eq!(ask(&g, Class::Interactive, 5000).await.unwrap(), "hello from ramp", "the half-open trial");
    assert_eq!(g.breaker_state("ramp"), Some(BreakerState::Closed));
    let burst = |g: Arc<Gateway>| async move {
        let all = (0..8).map(|_| {
            let g = g.clone();
            async move { ask(&g, Class::Interactive, 10_000).await }
        });
        futures::future::join_all(all).await.into_iter().filter(Result::is_ok).count()
    };
    up.take_most_concurrent();
    assert_eq!(burst(g.clone()).await, 8, "nobody is refused: they queue");
    let early = up.take_most_concurrent();
    assert!(early <= 4, "right after recovering it took {early} of 8 at once");
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(burst(g.clone()).await, 8);
    let late = up.take_most_concurrent();
    assert!(late >= 6, "after the ramp it takes its full concurrency, saw {late}");
}
