//! The in-process llama.cpp provider with real models. `CARET_TEST_LLM_DIR` names an installed
//! smollm2-135m-instruct-q4 (`caret models pull smollm2-135m-instruct-q4`; CI sets it); the
//! slow test is ignored unless asked for (`cargo test -- --ignored`, with
//! `CARET_TEST_CODE_MODEL_DIR` naming an installed qwen2.5-coder-1.5b-instruct-q4). Each test
//! says so when it has no model to run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use caret_llama::{KeyCache, LlamaProvider, LlamaSettings};
use caret_models::{
    CallContext, Class, Deployment, DeploymentLimits, Error, Gateway, GatewaySettings, Provider, collect_chat,
};
use caret_protocol::llm::{ChatMessage, ChatRequest, CompletionRequest, FinishReason, Role};
use caret_protocol::runs::{CallTokens, TokenView};
use caret_test_support::models::TestModel;
use futures::StreamExt as _;

fn small_model() -> Option<PathBuf> {
    TestModel::SmallLlm.dir_or_skip("the local model test")
}

fn code_model() -> PathBuf {
    TestModel::CodeLlm.dir().expect("CARET_TEST_CODE_MODEL_DIR names the code model, or it is installed")
}

fn chat(messages: Vec<ChatMessage>, max_tokens: u32) -> ChatRequest {
    let mut r: ChatRequest =
        serde_json::from_value(serde_json::json!({"model": "local", "messages": [], "temperature": 0.0})).unwrap();
    r.messages = messages;
    r.max_tokens = Some(max_tokens);
    r
}

fn completion(prompt: &str, suffix: Option<&str>, max_tokens: u32) -> CompletionRequest {
    serde_json::from_value(serde_json::json!({
        "model": "local", "prompt": prompt, "suffix": suffix, "max_tokens": max_tokens, "temperature": 0.0
    }))
    .unwrap()
}

fn settings() -> LlamaSettings {
    LlamaSettings { context_tokens: 2048, ..LlamaSettings::default() }
}

#[tokio::test]
async fn a_small_model_answers_a_conversation_deterministically_and_reuses_its_prefix() {
    let Some(dir) = small_model() else { return };
    let model = LlamaProvider::load(&dir, settings()).unwrap();
    assert!(model.info().chat.is_ok(), "SmolLM2 is a ChatML model");
    let first = vec![ChatMessage::text(Role::User, "What is the capital of France? Answer in one word.")];
    let a = collect_chat(model.chat(chat(first.clone(), 12)).await.unwrap()).await.unwrap();
    let text = a.message.content_text();
    assert!(text.contains("Paris"), "{text:?}");
    let usage = a.usage.unwrap();
    assert!(usage.prompt_tokens > 20 && usage.completion_tokens >= 1 && usage.completion_tokens <= 12, "{usage:?}");
    assert!(matches!(a.finish, Some(FinishReason::Stop | FinishReason::Length)));

    // The conversation goes on: everything up to the new turn is already in the KV cache.
    let before = model.stats();
    let mut longer = first.clone();
    longer.push(a.message.clone());
    longer.push(ChatMessage::text(Role::User, "And of Italy?"));
    let b = collect_chat(model.chat(chat(longer.clone(), 12)).await.unwrap()).await.unwrap();
    let after = model.stats();
    let reused = after.reused_tokens - before.reused_tokens;
    assert!(reused >= u64::from(usage.prompt_tokens), "reused {reused} of a {}-token prefix", usage.prompt_tokens);
    assert!(after.prompt_tokens - before.prompt_tokens > reused);

    // Reuse changes nothing: a fresh engine (nothing cached) gives the same greedy answer.
    let fresh = LlamaProvider::load(&dir, settings()).unwrap();
    let c = collect_chat(fresh.chat(chat(longer, 12)).await.unwrap()).await.unwrap();
    assert_eq!(b.message.content_text(), c.message.content_text());
    assert_eq!(fresh.stats().reused_tokens, 0);
}

#[tokio::test]
async fn a_warm_up_reads_a_prompt_ahead_and_any_request_pre_empts_it() {
    use futures::StreamExt as _;
    let Some(dir) = small_model() else { return };
    let model = LlamaProvider::load(&dir, settings()).unwrap();
    let drain = |mut s: caret_models::EventStream| async move {
        let mut events = Vec::new();
        while let Some(e) = s.next().await {
            events.push(e.unwrap());
        }
        events
    };
    let body: String = (0..60).map(|i| format!("def step_{i}(x):\n    return x * {i} + {}\n\n", i % 7)).collect();
    // A warm-up answers at once (nobody waits for it) and reads the prompt in the background.
    let warm = drain(model.complete(completion(&body, None, 0)).await.unwrap()).await;
    assert!(matches!(warm.first(), Some(caret_models::Event::Finish(FinishReason::Length))), "{warm:?}");
    let until = std::time::Instant::now() + Duration::from_secs(60);
    // (Counted when the warm-up ends.)
    while model.stats().warmed_tokens == 0 {
        assert!(std::time::Instant::now() < until, "the warm-up did not end");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let last = model.stats().warmed_tokens;
    assert_eq!((model.stats().warmups, model.stats().requests), (1, 0), "a warm-up is not a request");
    assert!(last > 500, "the prompt was read: {last} tokens");
    // The request for that prompt, one line further on, reads only the new line.
    let before = model.stats();
    let more = format!("{body}def step_60(x):\n");
    drain(model.complete(completion(&more, None, 4)).await.unwrap()).await;
    let after = model.stats();
    let read = (after.prompt_tokens - before.prompt_tokens) - (after.reused_tokens - before.reused_tokens);
    assert!(after.reused_tokens - before.reused_tokens >= last, "{before:?} → {after:?}");
    assert!(read < 20, "read {read} tokens at the request");

    // A long warm-up, then at once a request for something else: the request does not wait
    // for the warm-up, which stops reading within a batch.
    let other: String = (0..80).map(|i| format!("class Shape{i}:\n    sides = {i}\n\n")).collect();
    let before = model.stats();
    drain(model.complete(completion(&other, None, 0)).await.unwrap()).await;
    let answer = drain(model.complete(completion("fn main() {", None, 3)).await.unwrap()).await;
    assert!(answer.iter().any(|e| matches!(e, caret_models::Event::Finish(_))), "{answer:?}");
    let after = model.stats();
    assert_eq!(after.requests - before.requests, 1);
    assert!(after.warmed_tokens - before.warmed_tokens < 200, "the warm-up went on: {before:?} → {after:?}");
}

/// Two contexts are kept: a prompt unlike the cached one (a next edit's after Tab's) starts on
/// the other sequence, and the first context's next request reads only what is new in it —
/// also when the other request went away while its prompt was read.
#[tokio::test]
async fn a_prompt_unlike_the_cached_one_keeps_that_one_aside() {
    let Some(dir) = small_model() else { return };
    let model = LlamaProvider::load(&dir, settings()).unwrap();
    let drain = |mut s: caret_models::EventStream| async move { while s.next().await.is_some() {} };
    let read = |before: &caret_llama::LlamaStats, after: &caret_llama::LlamaStats| {
        (after.prompt_tokens - before.prompt_tokens) - (after.reused_tokens - before.reused_tokens)
    };
    let tab: String = (0..40).map(|i| format!("def step_{i}(x):\n    return x * {i}\n\n")).collect();
    let other: String = (0..40).map(|i| format!("class Shape{i}:\n    sides = {i}\n\n")).collect();
    drain(model.complete(completion(&tab, None, 2)).await.unwrap()).await;
    // Another context, answered in full; then the first one again, a line further on.
    drain(model.complete(completion(&other, None, 2)).await.unwrap()).await;
    let before = model.stats();
    drain(model.complete(completion(&format!("{tab}def step_40(x):\n"), None, 2)).await.unwrap()).await;
    let after = model.stats();
    assert!(read(&before, &after) < 20, "read {} tokens: {before:?} → {after:?}", read(&before, &after));
    // Another context again, dropped while its prompt is read: the first is still there.
    let longer: String = (0..90).map(|i| format!("struct Item{i} {{ weight: u32 }}\n")).collect();
    let stream = model.complete(completion(&longer, None, 2)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(30)).await;
    drop(stream);
    let before = model.stats();
    drain(model.complete(completion(&format!("{tab}def step_40(x):\n    return"), None, 2)).await.unwrap()).await;
    let after = model.stats();
    assert!(read(&before, &after) < 20, "read {} tokens: {before:?} → {after:?}", read(&before, &after));
}

/// A sampled (temperature 1, seeded) request asking for token ids and log probabilities.
fn sampled(messages: Vec<ChatMessage>, seed: u64) -> ChatRequest {
    let mut r = chat(messages, 24);
    r.temperature = Some(1.0);
    r.seed = Some(seed);
    r.logprobs = Some(true);
    r.return_token_ids = Some(true);
    r
}

/// Two turns of a seeded conversation, the first answer going back as the ids sampled (token
/// in, token out); what each call read and sampled.
async fn two_turns(model: &LlamaProvider, seed: u64) -> Vec<CallTokens> {
    let mut messages = vec![ChatMessage::text(Role::User, "Write a short poem about the sea.")];
    let mut calls = Vec::new();
    for turn in 0..2 {
        let c = collect_chat(model.chat(sampled(messages.clone(), seed + turn)).await.unwrap()).await.unwrap();
        let ids = c.message.token_ids.clone().expect("sampled ids");
        assert_eq!(c.logprobs.len(), ids.len(), "a log probability per sampled token");
        assert!(c.logprobs.iter().all(|l| l.logprob <= 0.0 && l.logprob.is_finite()), "{:?}", c.logprobs);
        calls.push(CallTokens {
            prompt_ids: c.prompt_ids.clone(),
            ids,
            logprobs: c.logprobs.iter().map(|l| l.logprob).collect(),
        });
        messages.push(c.message);
        messages.push(ChatMessage::text(Role::User, "Another one, about rivers."));
    }
    calls
}

#[tokio::test]
async fn tokens_go_out_and_back_in_and_a_seeded_conversation_is_reproducible() {
    let Some(dir) = small_model() else { return };
    let fresh = LlamaProvider::load(&dir, settings()).unwrap();
    let first = two_turns(&fresh, 7).await;
    // The second prompt continues the first prompt and answer token for token.
    let view = TokenView::assemble(&first).unwrap();
    assert_eq!(view.prompt_ids, first[0].prompt_ids);
    assert_eq!(view.response_ids.len(), view.response_mask.len());
    assert_eq!(view.response_mask.iter().filter(|m| **m == 1).count(), first[0].ids.len() + first[1].ids.len());
    assert!(view.response_mask.contains(&0), "the second user turn is template and text, masked 0");

    // A busy engine (its cache holding another conversation of the same start, read in other
    // batches) gives the same seeded conversation token for token.
    let busy = LlamaProvider::load(&dir, settings()).unwrap();
    let other = vec![ChatMessage::text(Role::User, "Write a short poem about the sea, please.")];
    collect_chat(busy.chat(chat(other, 8)).await.unwrap()).await.unwrap();
    let _ = two_turns(&busy, 1000).await;
    let again = two_turns(&busy, 7).await;
    assert_eq!(again, first);
    // Another seed samples another conversation.
    assert_ne!(two_turns(&busy, 8).await, first);

    // Ids outside the vocabulary are refused, not read.
    let mut bad = ChatMessage::text(Role::Assistant, "x");
    bad.token_ids = Some(vec![u32::MAX]);
    let refused = collect_chat(
        busy.chat(sampled(vec![ChatMessage::text(Role::User, "hi"), bad, ChatMessage::text(Role::User, "go")], 1))
            .await
            .unwrap(),
    )
    .await;
    assert!(matches!(refused, Err(Error::BadRequest(ref m)) if m.contains("vocabulary")), "{refused:?}");
}

#[tokio::test]
async fn limits_stops_and_streams_behave_as_the_api_says() {
    let Some(dir) = small_model() else { return };
    let model = LlamaProvider::load(&dir, settings()).unwrap();
    let count = "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13,";

    // The token limit.
    let (text, finish, usage) =
        caret_models::collect_completion(model.complete(completion(count, None, 5)).await.unwrap()).await.unwrap();
    assert_eq!(finish, Some(FinishReason::Length));
    assert_eq!(usage.unwrap().completion_tokens, 5);
    assert!(!text.is_empty());

    // A stop sequence is cut before it is sent.
    let mut req = completion(count, None, 40);
    req.stop = Some(caret_protocol::llm::Stop::One("17".to_owned()));
    let (text, finish, _) = caret_models::collect_completion(model.complete(req).await.unwrap()).await.unwrap();
    assert_eq!(finish, Some(FinishReason::Stop));
    assert!(text.contains("16") && !text.contains("17"), "{text:?}");

    // A caller that goes away mid-stream stops generation (cancellation reaches the engine,
    // well before the 200-token limit) and frees it for the next request.
    let before = model.stats();
    let mut stream = model.complete(completion(count, None, 200)).await.unwrap();
    let _ = stream.next().await.unwrap().unwrap();
    drop(stream);
    let (text, _, _) =
        caret_models::collect_completion(model.complete(completion("Hello", None, 3)).await.unwrap()).await.unwrap();
    assert!(!text.is_empty());
    let generated = model.stats().generated_tokens - before.generated_tokens;
    assert!(generated < 40, "{generated} tokens generated for a stream dropped after its first");
    assert!(model.health().await.is_ok());
}

/// A predicted output is verified as a speculative draft: most of the answer comes from it,
/// and the answer is exactly the one plain greedy decoding gives — with the default cache and
/// attention (flash attention off, keys as `q8_0`) and the other ones.
#[tokio::test]
async fn a_prediction_speeds_decoding_without_changing_the_answer() {
    let Some(dir) = small_model() else { return };
    for (flash_attention, key_cache) in [(false, KeyCache::Q8_0), (true, KeyCache::F16)] {
        let model = LlamaProvider::load(&dir, LlamaSettings { flash_attention, key_cache, ..settings() }).unwrap();
        assert_eq!((model.info().flash_attention, model.info().key_cache), (flash_attention, key_cache));
        let code = "def area(width, height):\n    return width * height\n\n\ndef perimeter(width, height):\n    return 2 * (width + height)\n";
        let ask = format!("Repeat this code exactly, in a python code block:\n```python\n{code}```");
        let plain =
            collect_chat(model.chat(chat(vec![ChatMessage::text(Role::User, &ask)], 80)).await.unwrap()).await.unwrap();
        let mut req = chat(vec![ChatMessage::text(Role::User, &ask)], 80);
        req.prediction = Some(caret_protocol::llm::Prediction::content(format!("```python\n{code}```")));
        let before = model.stats();
        let fast = collect_chat(model.chat(req).await.unwrap()).await.unwrap();
        let after = model.stats();
        assert_eq!(fast.message.content_text(), plain.message.content_text(), "{flash_attention} {key_cache:?}");
        assert_eq!(fast.usage.unwrap().completion_tokens, plain.usage.unwrap().completion_tokens);
        let details = fast.usage.unwrap().completion_tokens_details.expect("prediction details are reported");
        assert!(details.accepted_prediction_tokens >= 10, "{details:?} for {:?}", fast.message.content_text());
        assert_eq!(after.accepted_tokens - before.accepted_tokens, u64::from(details.accepted_prediction_tokens));
        assert!(plain.usage.unwrap().completion_tokens_details.is_none(), "no prediction, no details");
    }
}

/// Completions drafted from their own prompt (prompt lookup) give exactly the plain answer,
/// with drafted tokens accepted where the answer repeats the prompt.
#[tokio::test]
async fn prompt_lookup_drafts_keep_the_answer() {
    let Some(dir) = small_model() else { return };
    let prompt = "colors = ['red', 'green', 'blue', 'cyan', 'magenta', 'yellow']\n\
                  for color in colors:\n    print(color)\n\ncolors = ['red', 'green',";
    let mut answers = Vec::new();
    for prompt_lookup in [false, true] {
        let model = LlamaProvider::load(&dir, LlamaSettings { prompt_lookup, ..settings() }).unwrap();
        let (text, _, usage) =
            caret_models::collect_completion(model.complete(completion(prompt, None, 40)).await.unwrap())
                .await
                .unwrap();
        assert!(usage.unwrap().completion_tokens_details.is_none(), "no prediction was given");
        answers.push((text, model.stats().accepted_tokens));
    }
    assert_eq!(answers[0].0, answers[1].0);
    assert_eq!(answers[0].1, 0);
    assert!(answers[1].1 >= 5, "{answers:?}");
}

#[tokio::test]
async fn prompts_past_the_context_and_files_that_are_not_models_are_clear_errors() {
    let Some(dir) = small_model() else { return };
    let model = LlamaProvider::load(&dir, LlamaSettings { context_tokens: 256, ..LlamaSettings::default() }).unwrap();
    let long = "word ".repeat(400);
    let err = match model.complete(completion(&long, None, 4)).await.unwrap().next().await {
        Some(Err(e)) => e,
        other => panic!("expected an error, got {other:?}"),
    };
    assert!(matches!(err, Error::BadRequest(_)), "{err}");
    assert!(err.to_string().contains("context holds 256"), "{err}");
    // The engine is still fine afterwards.
    let (text, _, _) =
        caret_models::collect_completion(model.complete(completion("Hello", None, 2)).await.unwrap()).await.unwrap();
    assert!(!text.is_empty());

    let tmp = caret_test_support::TempDir::new();
    let bogus = tmp.join("model.gguf");
    std::fs::write(&bogus, b"not a model at all").unwrap();
    let err = LlamaProvider::load(&bogus, settings()).unwrap_err().to_string();
    assert!(err.contains("is it a GGUF file"), "{err}");
    let err = LlamaProvider::load(&tmp.join("missing"), settings()).unwrap_err().to_string();
    assert!(err.contains("caret models pull"), "{err}");
}

#[tokio::test]
async fn the_gateway_serves_an_alias_from_the_local_model() {
    let Some(dir) = small_model() else { return };
    let model: Arc<dyn Provider> = Arc::new(LlamaProvider::load(&dir, settings()).unwrap());
    let limits = DeploymentLimits { max_concurrency: 1, ..DeploymentLimits::default() };
    let mut gateway = Gateway::new(GatewaySettings::default());
    gateway.add_alias("small", vec![Deployment::new("smol", model, "smollm2", 0, 1, limits)]);
    let gateway = Arc::new(gateway);
    // Three at once: one runs, two queue in the gateway; all answer.
    let calls = (0..3).map(|i| {
        let gateway = gateway.clone();
        async move {
            let mut req = chat(vec![ChatMessage::text(Role::User, format!("Say the number {i}."))], 8);
            req.model = "small".to_owned();
            let ctx = CallContext::new(Class::Interactive, Duration::from_secs(60), "tenant");
            collect_chat(gateway.chat(req, ctx).await.unwrap()).await.unwrap()
        }
    });
    for answer in futures::future::join_all(calls).await {
        assert!(!answer.message.content_text().is_empty());
    }
}

#[tokio::test]
#[ignore = "slow: a 1.5B model (CARET_TEST_CODE_MODEL_DIR); cargo test -- --ignored"]
async fn the_code_model_calls_tools_and_fills_in_the_middle() {
    let dir = code_model();
    let model = LlamaProvider::load(&dir, settings()).unwrap();
    assert!(model.info().fim, "Qwen2.5-Coder has FIM tokens");

    let mut req = chat(vec![ChatMessage::text(Role::User, "Show me what is in the file src/main.rs.")], 64);
    req.tools = vec![
        serde_json::from_value(serde_json::json!({
            "type": "function",
            "function": {
                "name": "read_file",
                "description": "Read a file of the workspace",
                "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}
            }
        }))
        .unwrap(),
    ];
    let answer = collect_chat(model.chat(req).await.unwrap()).await.unwrap();
    assert_eq!(answer.finish, Some(FinishReason::ToolCalls), "{answer:?}");
    let call = &answer.message.tool_calls[0];
    assert_eq!(call.function.name, "read_file");
    let args: serde_json::Value = serde_json::from_str(&call.function.arguments).unwrap();
    assert_eq!(args["path"], "src/main.rs");
    assert!(call.id.starts_with("call_"));

    let (text, _, _) = caret_models::collect_completion(
        model.complete(completion("def add(a, b):\n    return ", Some("\n\nprint(add(1, 2))\n"), 16)).await.unwrap(),
    )
    .await
    .unwrap();
    assert!(text.replace(' ', "").starts_with("a+b"), "{text:?}");
}
