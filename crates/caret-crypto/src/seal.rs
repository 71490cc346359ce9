//! Authenticated encryption of data at rest (XChaCha20-Poly1305, a random 192-bit nonce per
//! message). Each message is bound to a label (associated data: the run and the kind of
//! object, say), so a stored object moved under another name fails to open.

use chacha20poly1305::aead::{Aead as _, KeyInit as _, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};

use crate::{Error, Result, random};

/// The first byte of every sealed message: the format's version.
const VERSION: u8 = 1;
const NONCE: usize = 24;

/// Why a sealed message could not be opened.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("sealed data could not be opened: {0}")]
pub struct OpenError(&'static str);

/// A key that seals and opens messages.
#[derive(Clone)]
pub struct Sealer {
    key: [u8; 32],
}

impl std::fmt::Debug for Sealer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Sealer(..)")
    }
}

impl Sealer {
    pub(crate) fn new(key: [u8; 32]) -> Sealer {
        Sealer { key }
    }

    /// Encrypts `plaintext`, bound to `label`: version, nonce, ciphertext and tag.
    pub fn seal(&self, label: &str, plaintext: &[u8]) -> Result<Vec<u8>> {
        let nonce: [u8; NONCE] = random()?;
        let cipher = XChaCha20Poly1305::new((&self.key).into());
        let sealed = cipher
            .encrypt(XNonce::from_slice(&nonce), Payload { msg: plaintext, aad: label.as_bytes() })
            .map_err(|_| Error::Random("encryption failed".into()))?;
        let mut out = Vec::with_capacity(1 + NONCE + sealed.len());
        out.push(VERSION);
        out.extend_from_slice(&nonce);
        out.extend_from_slice(&sealed);
        Ok(out)
    }

    /// Decrypts what [`Sealer::seal`] made with the same key and label.
    pub fn open(&self, label: &str, sealed: &[u8]) -> Result<Vec<u8>, OpenError> {
        if sealed.len() < 1 + NONCE + 16 {
            return Err(OpenError("too short"));
        }
        if sealed[0] != VERSION {
            return Err(OpenError("unknown format version"));
        }
        let cipher = XChaCha20Poly1305::new((&self.key).into());
        cipher
            .decrypt(
                XNonce::from_slice(&sealed[1..1 + NONCE]),
                Payload { msg: &sealed[1 + NONCE..], aad: label.as_bytes() },
            )
            .map_err(|_| OpenError("wrong key or label, or the data was altered"))
    }
}

#[cfg(test)]
mod tests {
    use crate::WorkspaceKey;

    #[test]
    fn sealed_data_opens_only_with_its_key_and_label() {
        let key = WorkspaceKey::generate().unwrap();
        let a = key.sealer("tenant-a");
        let sealed = a.seal("run-1/bundle", b"fn main() {}").unwrap();
        assert!(!sealed.windows(4).any(|w| w == b"main"));
        assert_eq!(a.open("run-1/bundle", &sealed).unwrap(), b"fn main() {}");
        assert!(a.open("run-2/bundle", &sealed).is_err(), "another label");
        assert!(key.sealer("tenant-b").open("run-1/bundle", &sealed).is_err(), "another purpose");
        let mut altered = sealed.clone();
        *altered.last_mut().unwrap() ^= 1;
        assert!(a.open("run-1/bundle", &altered).is_err());
        assert!(a.open("run-1/bundle", &sealed[..10]).is_err());
        assert_ne!(a.seal("x", b"same").unwrap(), a.seal("x", b"same").unwrap(), "fresh nonces");
    }
}
