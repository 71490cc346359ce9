//! Sandbox figures: a bubblewrap launch, the same with the allow-list's forwarder, a fetch
//! through the proxy, and the Firecracker backend's per-command workspace exchange (the guest
//! agent over a Unix socket, as in the VM minus the boot) on a tree of N files.
//!
//! `cargo bench -p caret-sandbox --bench sandbox [-- FILES]` (default 10,000 files of 1 KiB).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use caret_sandbox::firecracker::GuestLink;
use caret_sandbox::{Bwrap, Policy, Sandbox, Spec};

fn p(sorted: &[Duration], q: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

fn report(label: &str, mut t: Vec<Duration>) {
    t.sort();
    println!("{label:<52} p50 {:>9.2?}  p99 {:>9.2?}  (n={})", p(&t, 0.5), p(&t, 0.99), t.len());
}

async fn timed(label: &str, n: usize, sandbox: &dyn Sandbox, spec: &Spec) {
    let mut t = Vec::with_capacity(n);
    for _ in 0..n {
        let start = Instant::now();
        let out = sandbox.run(spec).await.unwrap();
        t.push(start.elapsed());
        assert!(out.success(), "{label}: {out:?}");
    }
    report(label, t);
}

#[tokio::main]
async fn main() {
    let files: usize =
        std::env::args().skip(1).find(|a| !a.starts_with('-')).and_then(|a| a.parse().ok()).unwrap_or(10_000);
    let helper = env!("CARGO_BIN_EXE_caret-landlock");

    // bubblewrap: plain, and with the forwarder of an allow-list.
    let ws = tempfile::tempdir().unwrap();
    let plain = Bwrap::new(Policy::new(ws.path()).unwrap().with_landlock(helper.into())).unwrap();
    timed("bwrap + Landlock launch (`true`)", 50, &plain, &Spec::new("true", ws.path())).await;
    let port = caret_test_support::http_server("ok");
    let mut policy = Policy::new(ws.path()).unwrap().with_landlock(helper.into());
    policy.hosts = caret_sandbox::netproxy::AllowList::parse(&[format!("127.0.0.1:{port}")]).unwrap();
    let proxied = Bwrap::new(policy).unwrap();
    timed("bwrap + Landlock + forwarder launch (`true`)", 50, &proxied, &Spec::new("true", ws.path())).await;
    let fetch = format!("curl -sS --noproxy '' -x \"$HTTP_PROXY\" http://127.0.0.1:{port}/ >/dev/null");
    timed("fetch through the proxy (curl, whole command)", 30, &proxied, &Spec::new(&fetch, ws.path())).await;
    let mut open = Policy::new(ws.path()).unwrap().with_landlock(helper.into());
    open.network = true;
    let direct = Bwrap::new(open).unwrap();
    let fetch = format!("curl -sS http://127.0.0.1:{port}/ >/dev/null");
    timed("fetch with the whole network (curl, whole command)", 30, &direct, &Spec::new(&fetch, ws.path())).await;

    // The Firecracker backend's exchange around each command.
    let tree = tempfile::tempdir().unwrap();
    let body = vec![b'x'; 1024];
    for i in 0..files {
        let dir = tree.path().join(format!("d{:03}", i % 100));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(format!("f{i}.txt")), &body).unwrap();
    }
    let copy = tempfile::tempdir().unwrap();
    let cp = std::process::Command::new("cp")
        .args(["-a", &format!("{}/.", tree.path().display()), copy.path().to_str().unwrap()])
        .status()
        .unwrap();
    assert!(cp.success());
    let sockets = tempfile::tempdir().unwrap();
    let socket = sockets.path().join("guest.sock");
    let link = GuestLink::listen(Policy::new(tree.path()).unwrap(), &socket).unwrap();
    let mut agent = std::process::Command::new(env!("CARGO_BIN_EXE_caret-guest"))
        .arg("--unix")
        .arg(&socket)
        .arg(copy.path())
        .spawn()
        .unwrap();
    link.wait_ready(Duration::from_secs(10), || Ok(())).unwrap();
    println!("workspace mirror (Firecracker's exchange), {files} files of 1 KiB:");
    timed("  `true`, nothing changed", 20, &link, &Spec::new("true", tree.path())).await;
    let mut t = Vec::new();
    for i in 0..20 {
        std::fs::write(tree.path().join("d000/f0.txt"), format!("edit {i}")).unwrap();
        let start = Instant::now();
        link.run(&Spec::new("true", tree.path())).await.unwrap();
        t.push(start.elapsed());
    }
    report("  `true` after one file edited on the host", t);
    let start = Instant::now();
    let script = "mkdir -p out && for i in $(seq 1000); do echo $i > out/$i; done";
    let out = link.run(&Spec::new(script, tree.path())).await.unwrap();
    assert!(out.success());
    let round = start.elapsed();
    let scratch = tempfile::tempdir().unwrap();
    let start = Instant::now();
    let alone = std::process::Command::new("bash").args(["-c", script]).current_dir(scratch.path()).status().unwrap();
    assert!(alone.success());
    let alone = start.elapsed();
    println!(
        "{:<52} {round:>9.2?}  (the script alone on the host {alone:.2?})",
        "  a command writing 1,000 files, whole round"
    );
    let _ = agent.kill();
    let _ = agent.wait();
}
