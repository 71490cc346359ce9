//! Keys, obfuscation, keyed hashes and tokens: round trips, and what must differ between keys.

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

#[test]
fn vector_rotation_keeps_dot_products_and_hides_the_vectors() {
    let mut rng = 12345u64;
    let mut rand = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        (rng % 2000) as f32 / 1000.0 - 1.0
    };
    for dim in [384usize, 768, 100, 7] {
        let r = key(5).server_key().vectors(dim);
        let a: Vec<f32> = (0..dim).map(|_| rand()).collect();
        let b: Vec<f32> = (0..dim).map(|_| rand()).collect();
        let (mut ra, mut rb) = (a.clone(), b.clone());
        r.apply(&mut ra);
        r.apply(&mut rb);
        let dot = |x: &[f32], y: &[f32]| x.iter().zip(y).map(|(p, q)| p * q).sum::<f32>();
        assert!((dot(&a, &b) - dot(&ra, &rb)).abs() < 1e-3, "dim {dim}: dot products kept");
        assert!((dot(&a, &a) - dot(&ra, &ra)).abs() < 1e-3, "dim {dim}: norms kept");
        assert!(dot(&a, &ra).abs() / dot(&a, &a) < 0.5, "dim {dim}: the rotated vector is not the vector");
        let mut other = a.clone();
        key(6).server_key().vectors(dim).apply(&mut other);
        assert_ne!(other, ra, "another key, another rotation");
    }
}

#[test]
fn derived_keys_are_stable_per_purpose_and_independent() {
    let master = key(7);
    let a = master.derive("docs/t1/sqlite");
    assert_eq!(a.export(), master.derive("docs/t1/sqlite").export(), "same purpose, same key");
    assert_ne!(a.export(), master.derive("docs/t2/sqlite").export(), "another purpose, another key");
    assert_ne!(a.export(), master.export(), "not the master itself");
    assert_ne!(a.export(), key(8).derive("docs/t1/sqlite").export(), "another master, another key");
    assert_ne!(a.paths().path(b"x.md"), master.paths().path(b"x.md"));
}
