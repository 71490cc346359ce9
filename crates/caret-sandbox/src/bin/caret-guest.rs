//! The guest agent of the Firecracker backend (see `caret_sandbox::guest`): the microVM's
//! init when it runs as process 1, its command server with `--serve`, and — for tests on the
//! host — a server over a Unix socket: `caret-guest --unix SOCKET ROOT`.

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let result = match args.get(1).map(String::as_str) {
        Some("--serve") => caret_sandbox::guest::serve_main(),
        Some("--unix") if args.len() == 4 => {
            let dial = caret_sandbox::guest::Dial::Unix(args[2].clone().into());
            caret_sandbox::guest::Guest::new(std::path::Path::new(&args[3]), dial)
                .and_then(|g| std::sync::Arc::new(g).serve())
        }
        _ if std::process::id() == 1 => caret_sandbox::guest::init_main(),
        _ => {
            eprintln!("usage: caret-guest (as a microVM's init) | --serve | --unix SOCKET ROOT");
            std::process::exit(2);
        }
    };
    if let Err(e) = result {
        eprintln!("caret-guest: {e}");
        std::process::exit(1);
    }
}
