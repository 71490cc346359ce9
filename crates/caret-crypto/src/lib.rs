//! Keys and keyed hashing for Caret's privacy model.
//!
//! A 256-bit [`WorkspaceKey`] lives on the client. Sub-keys are derived from it with
//! HKDF-SHA256, one per purpose:
//! - the **path** key obfuscates every path segment with HMAC-SHA256 ([`PathObfuscator`]);
//! - the **leaf** key turns a file's content hash into the Merkle leaf the server sees, so a
//!   stored leaf cannot be used to confirm a guess of a file's content ([`LeafKey`]);
//! - the **server** key travels with each request ([`ServerKey`]); the server derives from it
//!   the keys for chunk ids and lexical token hashes, uses them in memory and never stores
//!   them. The path and leaf keys never leave the client.
//!
//! Also here: API tokens (random, shown once, stored as SHA-256 hashes), and authenticated
//! encryption for what the server keeps of background runs ([`seal`]).
//! This crate does no IO beyond the key file and the operating system's random source.

use std::fmt;
use std::io::Write as _;
use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

use data_encoding::{BASE32_NOPAD, HEXLOWER};
use hmac::{Hmac, Mac as _};
use sha2::{Digest as _, Sha256};

/// Errors of this crate.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The operating system's random source failed.
    #[error("reading random bytes: {0}")]
    Random(String),
    /// A key string could not be parsed.
    #[error("invalid workspace key: {0}")]
    InvalidKey(&'static str),
    /// A key file could not be read or written.
    #[error("{action} key file {}: {source}", path.display())]
    Io {
        /// What was being done.
        action: &'static str,
        /// The key file.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A key file is readable by other users.
    #[error("key file {} is readable by other users (mode {mode:o}); run: chmod 600 {}", path.display(), path.display())]
    Permissions {
        /// The key file.
        path: PathBuf,
        /// Its mode bits.
        mode: u32,
    },
}

/// Result alias of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

const EXPORT_PREFIX: &str = "caret-key-v1-";
const HKDF_SALT: &[u8] = b"caret-workspace-key-v1";

fn random<const N: usize>() -> Result<[u8; N]> {
    let mut buf = [0u8; N];
    getrandom::fill(&mut buf).map_err(|e| Error::Random(e.to_string()))?;
    Ok(buf)
}

fn hkdf(ikm: &[u8], info: &[u8]) -> [u8; 32] {
    let mut out = [0u8; 32];
    // 32 bytes is far below HKDF-SHA256's 8160-byte limit, so expand cannot fail.
    let _ = hkdf::Hkdf::<Sha256>::new(Some(HKDF_SALT), ikm).expand(info, &mut out);
    out
}

fn hmac(key: &[u8; 32], parts: &[&[u8]]) -> [u8; 32] {
    // HMAC accepts keys of any length, so this cannot fail.
    let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(key) else { return [0; 32] };
    for p in parts {
        mac.update(p);
    }
    mac.finalize().into_bytes().into()
}

/// A workspace's 256-bit secret key. Its `Debug` output never shows the key.
#[derive(Clone, PartialEq, Eq)]
pub struct WorkspaceKey([u8; 32]);

impl fmt::Debug for WorkspaceKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "WorkspaceKey(id {})", self.key_id())
    }
}

impl WorkspaceKey {
    /// A new random key.
    pub fn generate() -> Result<Self> {
        random().map(WorkspaceKey)
    }

    /// A key from raw bytes (tests, imports).
    pub fn from_bytes(bytes: [u8; 32]) -> Self {
        WorkspaceKey(bytes)
    }

    /// The key as a string to share with a team out of band: a prefix, then base32 of the key
    /// and a 4-byte checksum that catches typos.
    pub fn export(&self) -> String {
        let mut payload = self.0.to_vec();
        payload.extend_from_slice(&Sha256::digest(self.0)[..4]);
        format!("{EXPORT_PREFIX}{}", BASE32_NOPAD.encode(&payload).to_ascii_lowercase())
    }

    /// Parses [`WorkspaceKey::export`]'s format (surrounding whitespace allowed).
    pub fn import(text: &str) -> Result<Self> {
        let body =
            text.trim().strip_prefix(EXPORT_PREFIX).ok_or(Error::InvalidKey("it does not start with caret-key-v1-"))?;
        let bytes = BASE32_NOPAD
            .decode(body.to_ascii_uppercase().as_bytes())
            .map_err(|_| Error::InvalidKey("it is not base32"))?;
        let (key, sum) = bytes.split_at_checked(32).ok_or(Error::InvalidKey("it is too short"))?;
        if sum.len() != 4 {
            return Err(Error::InvalidKey("it has the wrong length"));
        }
        if Sha256::digest(key)[..4] != *sum {
            return Err(Error::InvalidKey("its checksum does not match (a typo?)"));
        }
        let mut k = [0u8; 32];
        k.copy_from_slice(key);
        Ok(WorkspaceKey(k))
    }

    /// Loads a key file written by [`WorkspaceKey::save_new`]; refuses one readable by others.
    pub fn load(path: &Path) -> Result<Self> {
        let io = |action, source| Error::Io { action, path: path.to_path_buf(), source };
        let meta = std::fs::metadata(path).map_err(|e| io("reading", e))?;
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(Error::Permissions { path: path.to_path_buf(), mode });
        }
        let text = std::fs::read_to_string(path).map_err(|e| io("reading", e))?;
        Self::import(&text)
    }

    /// Writes the key to a new file with mode 0600 (parents created with mode 0700); fails if
    /// the file exists.
    pub fn save_new(&self, path: &Path) -> Result<()> {
        let io = |action, source| Error::Io { action, path: path.to_path_buf(), source };
        if let Some(dir) = path.parent() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(|e| io("creating the directory of", e))?;
        }
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .map_err(|e| io("creating", e))?;
        f.write_all(format!("{}\n", self.export()).as_bytes()).map_err(|e| io("writing", e))?;
        f.sync_all().map_err(|e| io("writing", e))
    }

    /// A public identifier of the key (hex, 32 characters): partitions caches by key without
    /// revealing it.
    pub fn key_id(&self) -> String {
        HEXLOWER.encode(&hkdf(&self.0, b"key-id")[..16])
    }

    /// The path obfuscator.
    pub fn paths(&self) -> PathObfuscator {
        PathObfuscator { key: hkdf(&self.0, b"path") }
    }

    /// The key for sync leaves.
    pub fn leaves(&self) -> LeafKey {
        LeafKey { key: hkdf(&self.0, b"leaf") }
    }

    /// The key sent with requests.
    pub fn server_key(&self) -> ServerKey {
        ServerKey(hkdf(&self.0, b"server"))
    }

    /// A key of its own for one purpose (a tenant's documentation index, say), derived from
    /// this one: the same purpose always gives the same key, distinct purposes independent ones.
    pub fn derive(&self, purpose: &str) -> WorkspaceKey {
        WorkspaceKey(hkdf(&self.0, format!("derive:{purpose}").as_bytes()))
    }

    /// An encryption key for one purpose (a tenant's stored runs, say): distinct purposes
    /// get independent keys.
    pub fn sealer(&self, purpose: &str) -> seal::Sealer {
        seal::Sealer::new(hkdf(&self.0, format!("seal:{purpose}").as_bytes()))
    }
}

/// Obfuscates path segments with a keyed MAC; equal names give equal segments, so the tree
/// shape is kept.
#[derive(Clone)]
pub struct PathObfuscator {
    key: [u8; 32],
}

impl fmt::Debug for PathObfuscator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("PathObfuscator(..)")
    }
}

impl PathObfuscator {
    /// One segment: HMAC-SHA256 truncated to 128 bits, lowercase base32 (26 characters).
    pub fn segment(&self, name: &[u8]) -> String {
        BASE32_NOPAD.encode(&hmac(&self.key, &[name])[..16]).to_ascii_lowercase()
    }

    /// A `/`-separated path, segment by segment.
    pub fn path(&self, path: &[u8]) -> String {
        let mut out = String::with_capacity(path.len() * 2);
        for seg in path.split(|b| *b == b'/').filter(|s| !s.is_empty()) {
            if !out.is_empty() {
                out.push('/');
            }
            out.push_str(&self.segment(seg));
        }
        out
    }
}

/// Turns content hashes into keyed sync leaves.
#[derive(Clone)]
pub struct LeafKey {
    key: [u8; 32],
}

impl LeafKey {
    /// The leaf for a file: HMAC over its content hash and what decides its chunks.
    pub fn leaf(&self, content_hash: &[u8; 32], fingerprint: &str) -> [u8; 32] {
        hmac(&self.key, &[b"leaf-v1\0", content_hash, fingerprint.as_bytes()])
    }
}

/// The key that travels with each request; the server derives what it needs from it and
/// never stores it.
#[derive(Clone, PartialEq, Eq)]
pub struct ServerKey([u8; 32]);

impl fmt::Debug for ServerKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ServerKey(..)")
    }
}

impl ServerKey {
    /// Base32 for an HTTP header.
    pub fn encode(&self) -> String {
        BASE32_NOPAD.encode(&self.0).to_ascii_lowercase()
    }

    /// Parses [`ServerKey::encode`]'s format.
    pub fn decode(text: &str) -> Result<Self> {
        let bytes = BASE32_NOPAD
            .decode(text.trim().to_ascii_uppercase().as_bytes())
            .map_err(|_| Error::InvalidKey("the server key is not base32"))?;
        let key: [u8; 32] = bytes.try_into().map_err(|_| Error::InvalidKey("the server key is not 32 bytes"))?;
        Ok(ServerKey(key))
    }

    /// The key for chunk ids.
    pub fn chunk_ids(&self) -> ChunkIdKey {
        ChunkIdKey { key: hkdf(&self.0, b"chunk-id") }
    }

    /// The keyed rotation for vectors of dimension `dim`.
    pub fn vectors(&self, dim: usize) -> VectorRotation {
        VectorRotation::new(&hkdf(&self.0, b"vector"), dim)
    }

    /// The key for lexical token hashes.
    pub fn tokens(&self) -> TokenHasher {
        let k = hkdf(&self.0, b"token");
        let mut k0 = [0u8; 16];
        k0.copy_from_slice(&k[..16]);
        TokenHasher { hasher: siphasher::sip::SipHasher13::new_with_key(&k0) }
    }
}

/// Keyed chunk ids: what the server stores and caches by, instead of a plain content hash.
#[derive(Clone)]
pub struct ChunkIdKey {
    key: [u8; 32],
}

impl ChunkIdKey {
    /// The id of a chunk with the given content hash.
    pub fn id(&self, content_hash: &[u8; 32]) -> [u8; 32] {
        hmac(&self.key, &[b"chunk-v1\0", content_hash])
    }
}

/// Keyed 64-bit hashes of lexical tokens (SipHash-1-3, a keyed PRF fast enough for every
/// token of a large index).
#[derive(Clone, Debug)]
pub struct TokenHasher {
    hasher: siphasher::sip::SipHasher13,
}

impl TokenHasher {
    /// The hash of one token.
    pub fn hash(&self, token: &str) -> u64 {
        use std::hash::Hasher as _;
        let mut h = self.hasher;
        h.write(token.as_bytes());
        h.finish()
    }
}

/// A keyed orthogonal transform of vectors: stored vectors are `R·v`, not in the public
/// model's space, while dot products (so cosine similarity of unit vectors) are exactly kept,
/// as long as queries are rotated the same way.
///
/// `R` is three rounds of: flip signs, permute coordinates, then an orthonormal Walsh–Hadamard
/// transform on each block of the largest power of two dividing the dimension (and, for a
/// remainder, sign flips only). Every step is orthogonal, so `R` is.
#[derive(Clone)]
pub struct VectorRotation {
    rounds: Vec<(Vec<f32>, Vec<usize>)>,
    block: usize,
}

impl fmt::Debug for VectorRotation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "VectorRotation(dim {}, block {})", self.rounds.first().map_or(0, |r| r.0.len()), self.block)
    }
}

impl VectorRotation {
    fn new(key: &[u8; 32], dim: usize) -> Self {
        // A deterministic stream of keyed bytes: HMAC(key, counter).
        let mut counter = 0u64;
        let mut pool: Vec<u8> = Vec::new();
        let mut next = move || -> u64 {
            if pool.len() < 8 {
                pool.extend_from_slice(&hmac(key, &[b"vector-stream\0", &counter.to_le_bytes()]));
                counter += 1;
            }
            let bytes: Vec<u8> = pool.drain(..8).collect();
            u64::from_le_bytes(bytes.try_into().unwrap_or([0; 8]))
        };
        let rounds = (0..3)
            .map(|_| {
                let signs: Vec<f32> = (0..dim).map(|_| if next() & 1 == 0 { 1.0 } else { -1.0 }).collect();
                // Fisher–Yates with keyed randomness.
                let mut perm: Vec<usize> = (0..dim).collect();
                for i in (1..dim).rev() {
                    let j = (next() % (i as u64 + 1)) as usize;
                    perm.swap(i, j);
                }
                (signs, perm)
            })
            .collect();
        let block = if dim == 0 { 1 } else { 1usize << dim.trailing_zeros().min(12) };
        VectorRotation { rounds, block }
    }

    /// `R·v`, in place. The length must be the dimension given at construction.
    pub fn apply(&self, v: &mut [f32]) {
        let mut tmp = vec![0.0f32; v.len()];
        for (signs, perm) in &self.rounds {
            for ((x, s), p) in v.iter_mut().zip(signs).zip(perm) {
                tmp[*p] = *x * s;
            }
            v.copy_from_slice(&tmp);
            if self.block > 1 {
                for chunk in v.chunks_exact_mut(self.block) {
                    hadamard(chunk);
                }
            }
        }
    }
}

/// In-place orthonormal fast Walsh–Hadamard transform (length a power of two).
fn hadamard(v: &mut [f32]) {
    let n = v.len();
    let mut h = 1;
    while h < n {
        for i in (0..n).step_by(h * 2) {
            for j in i..i + h {
                let (a, b) = (v[j], v[j + h]);
                v[j] = a + b;
                v[j + h] = a - b;
            }
        }
        h *= 2;
    }
    let scale = 1.0 / (n as f32).sqrt();
    v.iter_mut().for_each(|x| *x *= scale);
}

/// A new API token (`caret_` and 52 base32 characters, 256 random bits). Shown once.
pub fn new_api_token() -> Result<String> {
    let bytes: [u8; 32] = random()?;
    Ok(format!("caret_{}", BASE32_NOPAD.encode(&bytes).to_ascii_lowercase()))
}

/// What the server stores for an API token: SHA-256, hex. Tokens carry 256 random bits, so a
/// fast hash is enough.
pub fn hash_api_token(token: &str) -> String {
    HEXLOWER.encode(&Sha256::digest(token.as_bytes()))
}

/// A random identifier (128 bits, lowercase base32, 26 characters).
pub fn random_id() -> Result<String> {
    let bytes: [u8; 16] = random()?;
    Ok(BASE32_NOPAD.encode(&bytes).to_ascii_lowercase())
}

pub mod seal;

#[cfg(test)]
mod tests;

/// The content hash of a chunk as it is embedded: each context line and a newline, a NUL,
/// then the text (BLAKE3). Client and server compute it the same way; the server checks a
/// chunk's claimed id against it.
pub fn chunk_content_hash<S: AsRef<str>>(context: &[S], text: &str) -> [u8; 32] {
    let mut hasher = blake3::Hasher::new();
    for c in context {
        hasher.update(c.as_ref().as_bytes());
        hasher.update(b"\n");
    }
    hasher.update(b"\0");
    hasher.update(text.as_bytes());
    *hasher.finalize().as_bytes()
}
