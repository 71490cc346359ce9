use super::*;

fn key(b: u8) -> WorkspaceKey {
    WorkspaceKey::from_bytes([b; 32])
}

#[test]
fn export_import_round_trips_and_catches_typos() {
    let k = WorkspaceKey::generate().unwrap();
    let text = k.export();
    assert!(text.starts_with("caret-key-v1-"));
    assert_eq!(WorkspaceKey::import(&format!("  {text}\n")).unwrap(), k);
    let mut typo = text.clone().into_bytes();
    let last = typo.len() - 3;
    typo[last] = if typo[last] == b'a' { b'b' } else { b'a' };
    let err = WorkspaceKey::import(std::str::from_utf8(&typo).unwrap()).unwrap_err().to_string();
    assert!(err.contains("checksum") || err.contains("base32"), "{err}");
    assert!(WorkspaceKey::import("nonsense").is_err());
}

#[test]
fn key_files_are_private_and_never_overwritten() {
    let dir = caret_test_support::TempDir::new();
    let path = dir.join("keys/ws.key");
    let k = key(7);
    k.save_new(&path).unwrap();
    assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
    assert_eq!(WorkspaceKey::load(&path).unwrap(), k);
    assert!(k.save_new(&path).is_err(), "an existing key is never overwritten");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    let err = WorkspaceKey::load(&path).unwrap_err().to_string();
    assert!(err.contains("readable by other users") && err.contains("chmod 600"), "{err}");
}

#[test]
fn obfuscation_keeps_shape_and_depends_on_the_key() {
    let p = key(1).paths();
    let a = p.path(b"src/lib.rs");
    let b = p.path(b"src/main.rs");
    assert_eq!(a.split('/').count(), 2);
    assert_eq!(a.split('/').next(), b.split('/').next(), "same directory, same segment");
    assert_ne!(a, b);
    assert_eq!(p.segment(b"lib.rs").len(), 26);
    assert!(!a.contains("lib") && !a.contains("src"));
    assert_ne!(key(2).paths().path(b"src/lib.rs"), a, "another key, other names");
    assert_eq!(p.path(b"src//lib.rs"), a);
}

#[test]
fn sub_keys_are_separate_and_stable() {
    let k = key(3);
    let h = [9u8; 32];
    assert_eq!(k.server_key().chunk_ids().id(&h), key(3).server_key().chunk_ids().id(&h));
    assert_ne!(k.server_key().chunk_ids().id(&h), key(4).server_key().chunk_ids().id(&h));
    assert_ne!(k.leaves().leaf(&h, "fp"), k.leaves().leaf(&h, "other fp"));
    let t = k.server_key().tokens();
    assert_eq!(t.hash("retry"), k.server_key().tokens().hash("retry"));
    assert_ne!(t.hash("retry"), key(4).server_key().tokens().hash("retry"));
    assert_eq!(ServerKey::decode(&k.server_key().encode()).unwrap(), k.server_key());
    assert_eq!(k.key_id().len(), 32);
    assert!(!format!("{k:?}").contains(&k.export()[13..]), "Debug never shows the key");
}

#[test]
fn api_tokens_are_random_and_hashed() {
    let a = new_api_token().unwrap();
    let b = new_api_token().unwrap();
    assert_ne!(a, b);
    assert!(a.starts_with("caret_") && a.len() == 6 + 52);
    assert_eq!(hash_api_token(&a), hash_api_token(&a));
    assert_ne!(hash_api_token(&a), hash_api_token(&b));
    assert_eq!(random_id().unwrap().len(), 26);
}
