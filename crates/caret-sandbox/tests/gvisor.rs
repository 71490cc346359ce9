//! Commands in the gVisor sandbox (`runsc`): the same promises as bubblewrap's, checked where
//! runsc is installed (CI installs Debian's `runsc`); elsewhere its absence must be said
//! plainly.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::Duration;

use caret_sandbox::{Error, Gvisor, Policy, Sandbox, Spec};
use caret_test_support::TempDir;

fn installed() -> bool {
    ["/usr/bin/runsc", "/usr/local/bin/runsc", "/usr/sbin/runsc"].iter().any(|p| Path::new(p).exists())
}

fn sandbox(ws: &TempDir, home: &TempDir, network: bool) -> caret_sandbox::Result<Gvisor> {
    let mut policy = Policy::new(ws.path()).unwrap();
    policy.hidden = vec![home.path().to_path_buf()];
    policy.network = network;
    Gvisor::new(policy)
}

fn spec(command: &str, ws: &TempDir) -> Spec {
    Spec { timeout: Duration::from_secs(30), ..Spec::new(command, ws.path()) }
}

#[tokio::test]
async fn gvisor_runs_commands_in_the_workspace_and_nowhere_else_or_says_why_not() {
    let (ws, home, outside) = (TempDir::new(), TempDir::new(), TempDir::new());
    home.write(".ssh/id_ed25519", "PRIVATE KEY\n");
    if !installed() {
        let err = sandbox(&ws, &home, false).unwrap_err();
        assert!(matches!(&err, Error::Unavailable(m) if m.contains("runsc") && m.contains("not installed")), "{err}");
        caret_test_support::skip("runsc is not installed: only its absence was checked");
        return;
    }
    let g = sandbox(&ws, &home, false).expect("runsc is installed and must start sandboxes here (as root)");
    ws.write("in.txt", "hello\n");
    let out = g.run(&spec("cat in.txt && echo made > out.txt && pwd && exit 3", &ws)).await.unwrap();
    assert_eq!(out.exit_code, Some(3), "{out:?}");
    assert_eq!(out.stdout, format!("hello\n{}\n", std::fs::canonicalize(ws.path()).unwrap().display()));
    assert_eq!(std::fs::read_to_string(ws.join("out.txt")).unwrap(), "made\n");

    // The system read-only, another directory and the home not written, the home's secret
    // not there, no capabilities.
    let target = outside.join("escaped");
    let cmd = format!(
        "echo x > {}; echo x > /usr/escaped; echo x > {}/escaped; cat {}/.ssh/id_ed25519; grep CapEff /proc/self/status",
        target.display(),
        home.path().display(),
        home.path().display()
    );
    let out = g.run(&spec(&cmd, &ws)).await.unwrap();
    assert!(out.stderr.contains("/usr/escaped: Read-only file system"), "{out:?}");
    assert!(!target.exists() && !Path::new("/usr/escaped").exists() && !home.join("escaped").exists(), "{out:?}");
    assert!(!out.stdout.contains("PRIVATE"), "{out:?}");
    assert!(out.stdout.contains("CapEff:\t0000000000000000"), "{out:?}");

    // No network unless allowed.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let connect = format!("exec 3<>/dev/tcp/127.0.0.1/{} && echo connected", listener.local_addr().unwrap().port());
    let out = g.run(&spec(&connect, &ws)).await.unwrap();
    assert!(!out.stdout.contains("connected"), "{out:?}");
    let open = sandbox(&ws, &home, true).unwrap();
    let out = open.run(&spec(&connect, &ws)).await.unwrap();
    assert!(out.stdout.contains("connected"), "{out:?}");

    // Bounded in time; the environment is the policy's and the command's.
    let mut slow = spec("sleep 30; echo never", &ws);
    slow.timeout = Duration::from_millis(500);
    let out = g.run(&slow).await.unwrap();
    assert!(out.timed_out && out.exit_code.is_none() && !out.stdout.contains("never"), "{out:?}");
    let mut env = spec("echo \"$EXTRA|$HOME\"", &ws);
    env.env.push(("EXTRA".into(), "yes".into()));
    assert_eq!(g.run(&env).await.unwrap().stdout, format!("yes|{}\n", home.path().display()));

    // Its live commands' use, from gVisor's own figures.
    let g = std::sync::Arc::new(g);
    let busy = {
        let (g, spec) = (g.clone(), spec("x=$(head -c 30000000 /dev/zero | tr '\\0' a); sleep 3", &ws));
        tokio::spawn(async move { g.run(&spec).await })
    };
    let mut seen = caret_sandbox::usage::Usage::default();
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let u = g.usage().await.unwrap();
        if u.memory_bytes > 30_000_000 {
            seen = u;
            break;
        }
    }
    assert!(seen.processes >= 1 && seen.cpu_ms > 0, "{seen:?}");
    assert!(busy.await.unwrap().unwrap().success());
    assert_eq!(g.usage().await, Some(caret_sandbox::usage::Usage::default()), "nothing live once it ended");

    // Outside the workspace is refused before anything runs.
    let err = g.run(&Spec::new("true", outside.path())).await.unwrap_err();
    assert!(err.to_string().contains("outside the workspace"), "{err}");
}

/// Allowed hosts without the network: reached through the proxy, others refused, and a direct
/// connection still fails.
#[tokio::test]
async fn gvisor_reaches_allowed_hosts_through_the_proxy_only() {
    if !installed() {
        caret_test_support::skip("runsc is not installed: skipped");
        return;
    }
    let port = caret_test_support::http_server("allowed");
    let (ws, home) = (TempDir::new(), TempDir::new());
    let mut policy = Policy::new(ws.path()).unwrap().with_landlock(env!("CARGO_BIN_EXE_caret-landlock").into());
    policy.hidden = vec![home.path().to_path_buf()];
    policy.hosts = caret_sandbox::netproxy::AllowList::parse(&[format!("127.0.0.1:{port}")]).unwrap();
    let g = Gvisor::new(policy).expect("runsc is installed and must start sandboxes here (as root)");
    let script = format!(
        "curl -sS --max-time 10 --noproxy '' -x \"$HTTP_PROXY\" http://127.0.0.1:{port}/; echo; \
         curl -sS --max-time 10 --noproxy '' -x \"$HTTP_PROXY\" http://127.0.0.1:1/; echo; \
         curl -sS --max-time 5 --noproxy '*' http://127.0.0.1:{port}/ || echo direct-refused"
    );
    let out = g.run(&spec(&script, &ws)).await.unwrap();
    let lines: Vec<&str> = out.stdout.lines().filter(|l| !l.is_empty()).collect();
    assert_eq!(lines.first(), Some(&"allowed"), "{out:?}");
    assert!(lines[1].contains("127.0.0.1:1 is not among the environment's allowed hosts"), "{out:?}");
    assert_eq!(lines.last(), Some(&"direct-refused"), "{out:?}");
}
