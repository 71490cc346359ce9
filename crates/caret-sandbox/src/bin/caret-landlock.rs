//! The Landlock helper on its own (see `caret_sandbox::landlock`): `caret-landlock
//! __caret-landlock --write DIR... [--no-net] -- COMMAND...`. The `caret` binary is the same
//! helper when called so; this one serves this crate's tests and installs without `caret`.

fn main() {
    caret_sandbox::landlock::enter_helper_if_asked();
    eprintln!("usage: caret-landlock {} --write DIR... [--no-net] -- COMMAND...", caret_sandbox::landlock::HELPER_ARG);
    std::process::exit(2);
}
