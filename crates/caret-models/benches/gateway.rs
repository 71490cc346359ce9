//! Gateway overhead: the same paced load (default 1,000 requests/s for 5 s) of streamed chat
//! requests against a fast scripted upstream, once calling the provider directly and once
//! through the gateway (alias, admission, deployment choice, permit, metrics, stream watch).
//! Prints p50/p99/max latency of each and the difference.
//!
//!     cargo bench -p caret-models --bench gateway [-- RATE SECONDS]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use caret_models::openai::OpenAiProvider;
use caret_models::{
    CallContext, Class, Deployment, DeploymentLimits, Gateway, GatewaySettings, Provider, collect_chat,
};
use caret_protocol::llm::ChatRequest;
use caret_test_support::scripted::ScriptedUpstream;

fn request() -> ChatRequest {
    serde_json::from_value(serde_json::json!({"model": "chat", "messages": [{"role": "user", "content": "hi"}]}))
        .unwrap()
}

/// Fires `rate` requests a second for `seconds`, each on its own task, and returns the
/// sorted latencies of those that succeeded and the number that failed.
async fn paced<F, Fut>(rate: u64, seconds: u64, call: F) -> (Vec<Duration>, usize)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = bool> + Send + 'static,
{
    let total = rate * seconds;
    let gap = Duration::from_secs_f64(1.0 / rate as f64);
    let start = tokio::time::Instant::now();
    let mut tasks = Vec::with_capacity(total as usize);
    for i in 0..total {
        tokio::time::sleep_until(start + gap * i as u32).await;
        let fut = call();
        tasks.push(tokio::spawn(async move {
            let t = Instant::now();
            let ok = fut.await;
            (t.elapsed(), ok)
        }));
    }
    let mut lat = Vec::new();
    let mut failed = 0;
    for t in tasks {
        let (d, ok) = t.await.unwrap();
        if ok {
            lat.push(d);
        } else {
            failed += 1;
        }
    }
    lat.sort();
    (lat, failed)
}

fn pct(v: &[Duration], p: f64) -> Duration {
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn main() {
    let args: Vec<u64> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let rate = args.first().copied().unwrap_or(1000);
    let seconds = args.get(1).copied().unwrap_or(5);
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    rt.block_on(async move {
        let up = ScriptedUpstream::start("bench").await;
        let provider: Arc<dyn Provider> = Arc::new(OpenAiProvider::new(&up.url, None).unwrap());
        let mut g = Gateway::new(GatewaySettings::default());
        let limits = DeploymentLimits { max_concurrency: 512, max_queue: 4096, ..Default::default() };
        g.add_alias("chat", vec![Deployment::new("bench", provider.clone(), "m", 0, 1, limits)]);
        let g = Arc::new(g);
        println!(
            "caret-models bench gateway: {rate} streamed chat requests/s for {seconds} s against a scripted upstream"
        );
        // Warm the connection pools.
        for _ in 0..200 {
            let _ = collect_chat(provider.chat(request()).await.unwrap()).await;
            let _ = collect_chat(
                g.chat(request(), CallContext::new(Class::Interactive, Duration::from_secs(5), "t")).await.unwrap(),
            )
            .await;
        }
        let mut rows = Vec::new();
        for round in 0..2 {
            let p = provider.clone();
            let direct = paced(rate, seconds, move || {
                let p = p.clone();
                async move {
                    match p.chat(request()).await {
                        Ok(s) => collect_chat(s).await.is_ok(),
                        Err(_) => false,
                    }
                }
            })
            .await;
            let gw = g.clone();
            let via = paced(rate, seconds, move || {
                let gw = gw.clone();
                async move {
                    let ctx = CallContext::new(Class::Interactive, Duration::from_secs(5), "t");
                    match gw.chat(request(), ctx).await {
                        Ok(s) => collect_chat(s).await.is_ok(),
                        Err(_) => false,
                    }
                }
            })
            .await;
            rows.push((round, direct, via));
        }
        println!("{:<8} {:<10} {:>9} {:>9} {:>9} {:>7}", "round", "path", "p50 ms", "p99 ms", "max ms", "failed");
        for (round, direct, via) in &rows {
            for (name, (lat, failed)) in [("direct", direct), ("gateway", via)] {
                println!(
                    "{:<8} {:<10} {:>9.3} {:>9.3} {:>9.3} {:>7}",
                    round,
                    name,
                    ms(pct(lat, 0.5)),
                    ms(pct(lat, 0.99)),
                    ms(*lat.last().unwrap()),
                    failed
                );
            }
            println!(
                "{:<8} {:<10} {:>9.3} {:>9.3}",
                round,
                "overhead",
                ms(pct(&via.0, 0.5)) - ms(pct(&direct.0, 0.5)),
                ms(pct(&via.0, 0.99)) - ms(pct(&direct.0, 0.99))
            );
        }
    });
}
