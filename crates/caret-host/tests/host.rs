//! The host layer through its own API: the editor's documents as Tab sees them, the
//! configuration file and its units, and the embedded server a front end opens in-process.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::Duration;

use caret_host::config::{Config, parse_duration, parse_size};
use caret_host::documents::{Docs, offset_at, path_to_uri, relative, uri_to_path};
use caret_test_support::TempDir;

#[test]
fn positions_count_utf16_units_and_clamp_to_their_line() {
    let text = "a😀b\nsecond\n";
    assert_eq!(offset_at(text, 0, 1), 1);
    assert_eq!(offset_at(text, 0, 3), 5, "the emoji is two UTF-16 units");
    assert_eq!(offset_at(text, 0, 99), 6, "clamped to the line");
    assert_eq!(offset_at(text, 1, 3), 10);
    assert_eq!(offset_at(text, 9, 0), text.len());
}

#[test]
fn uris_round_trip_and_paths_are_shown_relative_to_the_workspace() {
    let p = Path::new("/w/my dir/é.py");
    assert_eq!(path_to_uri(p), "file:///w/my%20dir/%C3%A9.py");
    assert_eq!(uri_to_path(&path_to_uri(p)).unwrap(), p);
    assert_eq!(uri_to_path("untitled:1"), None);
    assert_eq!(relative("file:///w/src/a.rs", Some(Path::new("/w"))), "src/a.rs");
    assert_eq!(relative("file:///elsewhere/b.rs", Some(Path::new("/w"))), "b.rs", "outside: its file name");
}

#[test]
fn other_documents_that_resemble_the_file_go_along_and_closed_ones_still_count() {
    let mut docs = Docs::default();
    let floor = Duration::from_millis(25);
    docs.open("file:///w/cart.py", "def total(items):\n    return sum(i.price for i in items)\n", floor);
    docs.open("file:///w/colors.css", "body { color: red; }\n", floor);
    docs.open("file:///w/main.py", "from cart import total\nitems = load_items()\nprint(total(items))\n", floor);
    let (text, snippets, wait) = docs.prepare("file:///w/main.py", Some(Path::new("/w"))).unwrap();
    assert!(text.starts_with("from cart import total"));
    assert!(wait >= floor);
    let paths: Vec<&str> = snippets.iter().map(|s| s.path.as_str()).collect();
    assert!(paths.contains(&"cart.py"), "the file that defines what the cursor uses: {paths:?}");
    assert!(!paths.contains(&"main.py"), "never the document itself: {paths:?}");
    // Closed, its last text is still a source.
    docs.close("file:///w/cart.py");
    assert!(!docs.open.contains_key("file:///w/cart.py"));
    let (_, snippets, _) = docs.prepare("file:///w/main.py", Some(Path::new("/w"))).unwrap();
    assert!(snippets.iter().any(|s| s.path == "cart.py"), "{snippets:?}");
    assert!(docs.prepare("file:///w/cart.py", None).is_none(), "a closed document is not open");
}

#[test]
fn durations_and_sizes_read_as_people_write_them() {
    assert_eq!(parse_duration("90s").unwrap(), Duration::from_secs(90));
    assert_eq!(parse_duration("3m").unwrap(), Duration::from_secs(180));
    assert_eq!(parse_duration("7d").unwrap(), Duration::from_secs(7 * 86_400));
    assert!(parse_duration("0s").is_err() && parse_duration("5w").is_err() && parse_duration("soon").is_err());
    assert_eq!(parse_size("1M").unwrap(), 1 << 20);
    assert_eq!(parse_size("512").unwrap(), 512);
    assert!(parse_size("lots").is_err());
}

#[test]
fn a_config_file_names_models_and_limits_and_a_bad_one_says_where() {
    let dir = TempDir::new();
    let file = dir.write(
        "config.toml",
        "[scan]\nmax_file_size = \"2M\"\n\n[[models]]\nalias = \"agent\"\n\
         deployments = [{ provider = \"openai\", url = \"http://127.0.0.1:9\", model = \"m\", context_tokens = 4096 }]\n",
    );
    let config = Config::load(Some(&file)).unwrap();
    assert_eq!(config.scan.max_file_size.0, 2 << 20);
    assert_eq!(config.context_window("agent"), Some(4096));
    let gateway = config.gateway().unwrap().expect("a gateway for the configured alias");
    assert_eq!(gateway.aliases(), vec!["agent".to_owned()]);
    let bad = dir.write("bad.toml", "[scan]\nmax_file_size = \"huge\"\n");
    let err = format!("{:#}", Config::load(Some(&bad)).unwrap_err());
    assert!(err.contains("bad.toml") || err.contains("max_file_size"), "{err}");
}

/// With no `[[models]]`, the installed default code model is served as `local` (what Tab,
/// the agent and runs use first on a fresh machine); nothing when it is not installed or when
/// models are configured.
#[test]
fn the_installed_default_code_model_serves_when_nothing_is_configured() {
    use caret_host::config::{DEFAULT_CODE_ALIAS, DEFAULT_CODE_MODEL, ProviderKind};
    let dir = TempDir::new();
    let mut config = Config::load(Some(&dir.write("config.toml", ""))).unwrap();
    config.home = dir.join("home");
    config.models.clear();
    config.use_installed_code_model();
    assert!(config.models.is_empty(), "not installed: no model");
    dir.write(format!("home/models/{DEFAULT_CODE_MODEL}/model.gguf"), "GGUF");
    config.use_installed_code_model();
    assert_eq!(config.models.len(), 1);
    let m = &config.models[0];
    assert_eq!((m.alias.as_str(), m.deployments[0].provider), (DEFAULT_CODE_ALIAS, ProviderKind::Local));
    assert_eq!(m.deployments[0].model, DEFAULT_CODE_MODEL);
    config.use_installed_code_model();
    assert_eq!(config.models.len(), 1, "configured models are left as they are");
}

/// A documentation source is due a refresh once its interval has passed since its last
/// complete update; one without an interval, or updated recently, is not.
#[test]
fn docs_sources_fall_due_by_their_refresh_interval() {
    use caret_docs::pages::{Origin, Source, SourceDir, State};
    let dir = TempDir::new();
    let file = dir.write("config.toml", "");
    let mut config = Config::load(Some(&file)).unwrap();
    config.home = dir.join("home");
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    for (name, refresh, finished) in
        [("old", Some("7d"), now - 8 * 86_400), ("fresh", Some("7d"), now - 3_600), ("never", None, 0)]
    {
        let d = SourceDir::new(caret_host::docs::root(&config).join(name));
        let origin = Origin::Folder { path: dir.path().to_path_buf() };
        d.save_source(&Source { name: name.into(), origin, refresh: refresh.map(str::to_owned) }).unwrap();
        d.save_state(&State { finished_at: Some(finished), ..State::default() }).unwrap();
    }
    let never_updated = SourceDir::new(caret_host::docs::root(&config).join("new"));
    let origin = Origin::Folder { path: dir.path().to_path_buf() };
    never_updated.save_source(&Source { name: "new".into(), origin, refresh: Some("1h".into()) }).unwrap();
    assert_eq!(caret_host::docs::due(&config).unwrap(), ["new", "old"]);
    assert_eq!(caret_host::docs::source_names(&config), ["fresh", "never", "new", "old"]);
}
