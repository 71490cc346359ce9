//! Signed JSON Web Tokens (compact JWS) as identity providers issue them: the header read,
//! the signature checked against a JSON Web Key with one of the asymmetric algorithms an
//! OpenID provider signs ID tokens with. `none` and the shared-secret (`HS*`) algorithms are
//! refused: a provider's public key must never be usable as an HMAC secret.

use data_encoding::BASE64URL_NOPAD;
use ring::signature;
use serde::Deserialize;

use crate::error::{Error, Result};

/// A JSON Web Key (RFC 7517): the public parts of RSA, EC and OKP keys.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Jwk {
    /// Key type: `RSA`, `EC` or `OKP`.
    pub kty: String,
    /// Key id, matched against a token's `kid`.
    #[serde(default)]
    pub kid: Option<String>,
    /// The algorithm the key is for, when the provider says.
    #[serde(default)]
    pub alg: Option<String>,
    /// `sig` or `enc`; an `enc` key never checks a signature.
    #[serde(default, rename = "use")]
    pub usage: Option<String>,
    /// RSA modulus.
    #[serde(default)]
    pub n: Option<String>,
    /// RSA exponent.
    #[serde(default)]
    pub e: Option<String>,
    /// Curve (`P-256`, `P-384`, `Ed25519`).
    #[serde(default)]
    pub crv: Option<String>,
    /// EC x coordinate, or the OKP public key.
    #[serde(default)]
    pub x: Option<String>,
    /// EC y coordinate.
    #[serde(default)]
    pub y: Option<String>,
}

/// A key set (`jwks_uri`'s document).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct JwkSet {
    /// The keys.
    pub keys: Vec<Jwk>,
}

/// A token's protected header.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Header {
    /// Signature algorithm.
    pub alg: String,
    /// Which key signed it.
    #[serde(default)]
    pub kid: Option<String>,
}

/// The signature algorithms accepted.
pub const ALGORITHMS: &[&str] = &["RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "EdDSA"];

fn bad(why: impl Into<String>) -> Error {
    Error::BadToken(why.into())
}

fn decode(part: &str, what: &str) -> Result<Vec<u8>> {
    BASE64URL_NOPAD.decode(part.as_bytes()).map_err(|_| bad(format!("the token's {what} is not base64url")))
}

/// A token's three parts.
struct Parts<'a> {
    signed: &'a str,
    header: &'a str,
    payload: &'a str,
    signature: &'a str,
}

fn parts(token: &str) -> Result<Parts<'_>> {
    if token.len() > 16 * 1024 {
        return Err(bad("the token is over 16 KiB"));
    }
    let mut it = token.split('.');
    let (Some(header), Some(payload), Some(signature), None) = (it.next(), it.next(), it.next(), it.next()) else {
        return Err(bad("not a signed JWT (three dot-separated parts)"));
    };
    Ok(Parts { signed: &token[..header.len() + 1 + payload.len()], header, payload, signature })
}

/// The token's header, unchecked (to pick the key).
pub fn header(token: &str) -> Result<Header> {
    let p = parts(token)?;
    serde_json::from_slice(&decode(p.header, "header")?).map_err(|e| bad(format!("the token's header: {e}")))
}

/// Whether `key` may check a token signed with `alg`.
pub fn fits(key: &Jwk, alg: &str) -> bool {
    let family = match alg {
        "RS256" | "RS384" | "RS512" | "PS256" | "PS384" | "PS512" => "RSA",
        "ES256" | "ES384" => "EC",
        "EdDSA" => "OKP",
        _ => return false,
    };
    key.kty == family && key.usage.as_deref().is_none_or(|u| u == "sig") && key.alg.as_deref().is_none_or(|a| a == alg)
}

/// Checks `token`'s signature with `key` and returns its claims. The algorithm is the
/// header's, but only one of [`ALGORITHMS`] and only with a key of its family.
pub fn verify(token: &str, key: &Jwk) -> Result<serde_json::Map<String, serde_json::Value>> {
    let p = parts(token)?;
    let header: Header =
        serde_json::from_slice(&decode(p.header, "header")?).map_err(|e| bad(format!("the token's header: {e}")))?;
    if !ALGORITHMS.contains(&header.alg.as_str()) {
        return Err(bad(format!("the signature algorithm {:?} is not accepted", header.alg)));
    }
    if !fits(key, &header.alg) {
        return Err(bad(format!("the key {:?} does not sign with {}", key.kid, header.alg)));
    }
    let sig = decode(p.signature, "signature")?;
    let field = |v: &Option<String>, name: &str| -> Result<Vec<u8>> {
        decode(v.as_deref().ok_or_else(|| bad(format!("the key lacks {name}")))?, name)
    };
    let message = p.signed.as_bytes();
    let checked = match header.alg.as_str() {
        alg @ ("RS256" | "RS384" | "RS512" | "PS256" | "PS384" | "PS512") => {
            let params: &signature::RsaParameters = match alg {
                "RS256" => &signature::RSA_PKCS1_2048_8192_SHA256,
                "RS384" => &signature::RSA_PKCS1_2048_8192_SHA384,
                "RS512" => &signature::RSA_PKCS1_2048_8192_SHA512,
                "PS256" => &signature::RSA_PSS_2048_8192_SHA256,
                "PS384" => &signature::RSA_PSS_2048_8192_SHA384,
                _ => &signature::RSA_PSS_2048_8192_SHA512,
            };
            let (n, e) = (field(&key.n, "n")?, field(&key.e, "e")?);
            signature::RsaPublicKeyComponents { n: &n, e: &e }.verify(params, message, &sig)
        }
        alg @ ("ES256" | "ES384") => {
            let (curve, verifier): (_, &signature::EcdsaVerificationAlgorithm) = if alg == "ES256" {
                ("P-256", &signature::ECDSA_P256_SHA256_FIXED)
            } else {
                ("P-384", &signature::ECDSA_P384_SHA384_FIXED)
            };
            if key.crv.as_deref() != Some(curve) {
                return Err(bad(format!("{alg} needs a {curve} key")));
            }
            let mut point = vec![4u8];
            point.extend(field(&key.x, "x")?);
            point.extend(field(&key.y, "y")?);
            signature::UnparsedPublicKey::new(verifier, point).verify(message, &sig)
        }
        _ => {
            if key.crv.as_deref() != Some("Ed25519") {
                return Err(bad("EdDSA needs an Ed25519 key"));
            }
            signature::UnparsedPublicKey::new(&signature::ED25519, field(&key.x, "x")?).verify(message, &sig)
        }
    };
    checked.map_err(|_| bad("the token's signature does not match the provider's key"))?;
    match serde_json::from_slice(&decode(p.payload, "payload")?) {
        Ok(serde_json::Value::Object(claims)) => Ok(claims),
        _ => Err(bad("the token's payload is not a JSON object")),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use ring::rand::SystemRandom;
    use ring::signature::{EcdsaKeyPair, Ed25519KeyPair, KeyPair as _};

    /// A P-256 key pair for tests: signs tokens, and its public JWK.
    pub(crate) struct TestKey {
        pair: EcdsaKeyPair,
        pub(crate) kid: String,
    }

    impl TestKey {
        pub(crate) fn new(kid: &str) -> TestKey {
            let rng = SystemRandom::new();
            let pkcs8 = EcdsaKeyPair::generate_pkcs8(&signature::ECDSA_P256_SHA256_FIXED_SIGNING, &rng).unwrap();
            let pair =
                EcdsaKeyPair::from_pkcs8(&signature::ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng).unwrap();
            TestKey { pair, kid: kid.into() }
        }

        pub(crate) fn jwk(&self) -> Jwk {
            let point = self.pair.public_key().as_ref();
            Jwk {
                kty: "EC".into(),
                kid: Some(self.kid.clone()),
                alg: None,
                usage: Some("sig".into()),
                n: None,
                e: None,
                crv: Some("P-256".into()),
                x: Some(BASE64URL_NOPAD.encode(&point[1..33])),
                y: Some(BASE64URL_NOPAD.encode(&point[33..])),
            }
        }

        pub(crate) fn sign(&self, claims: &serde_json::Value) -> String {
            let header = serde_json::json!({ "alg": "ES256", "kid": self.kid, "typ": "JWT" });
            let signed = format!(
                "{}.{}",
                BASE64URL_NOPAD.encode(header.to_string().as_bytes()),
                BASE64URL_NOPAD.encode(claims.to_string().as_bytes())
            );
            let sig = self.pair.sign(&SystemRandom::new(), signed.as_bytes()).unwrap();
            format!("{signed}.{}", BASE64URL_NOPAD.encode(sig.as_ref()))
        }
    }

    fn with_header(token: &str, header: serde_json::Value) -> String {
        let rest = token.split_once('.').unwrap().1;
        format!("{}.{rest}", BASE64URL_NOPAD.encode(header.to_string().as_bytes()))
    }

    #[test]
    fn a_signature_checks_with_its_key_and_nothing_else() {
        let key = TestKey::new("k1");
        let token = key.sign(&serde_json::json!({ "sub": "ada" }));
        assert_eq!(header(&token).unwrap().kid.as_deref(), Some("k1"));
        assert_eq!(verify(&token, &key.jwk()).unwrap()["sub"], "ada");
        // Another key, a changed payload, a cut token.
        assert!(verify(&token, &TestKey::new("k2").jwk()).unwrap_err().to_string().contains("does not match"));
        let (head, rest) = token.split_once('.').unwrap();
        let sig = rest.split_once('.').unwrap().1;
        let forged = format!("{head}.{}.{sig}", BASE64URL_NOPAD.encode(br#"{"sub":"eve"}"#));
        assert!(verify(&forged, &key.jwk()).is_err());
        assert!(verify(head, &key.jwk()).unwrap_err().to_string().contains("three"));
    }

    #[test]
    fn none_and_shared_secret_algorithms_are_refused() {
        let key = TestKey::new("k1");
        let token = key.sign(&serde_json::json!({ "sub": "ada" }));
        for alg in ["none", "HS256", "None", ""] {
            let t = with_header(&token, serde_json::json!({ "alg": alg, "kid": "k1" }));
            let e = verify(&t, &key.jwk()).unwrap_err().to_string();
            assert!(e.contains("not accepted"), "{alg}: {e}");
        }
        // An unsigned token (empty signature) with alg none.
        let unsigned = format!(
            "{}.{}.",
            BASE64URL_NOPAD.encode(br#"{"alg":"none"}"#),
            BASE64URL_NOPAD.encode(br#"{"sub":"eve"}"#)
        );
        assert!(verify(&unsigned, &key.jwk()).is_err());
        // An EC key never checks an RSA or EdDSA signature.
        let t = with_header(&token, serde_json::json!({ "alg": "RS256", "kid": "k1" }));
        assert!(verify(&t, &key.jwk()).unwrap_err().to_string().contains("does not sign with RS256"));
        let mut enc = key.jwk();
        enc.usage = Some("enc".into());
        assert!(verify(&token, &enc).is_err(), "an encryption key checks nothing");
    }

    #[test]
    fn ed25519_signatures_check() {
        let rng = SystemRandom::new();
        let pkcs8 = Ed25519KeyPair::generate_pkcs8(&rng).unwrap();
        let pair = Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).unwrap();
        let signed = format!(
            "{}.{}",
            BASE64URL_NOPAD.encode(br#"{"alg":"EdDSA"}"#),
            BASE64URL_NOPAD.encode(br#"{"sub":"ada"}"#)
        );
        let token = format!("{signed}.{}", BASE64URL_NOPAD.encode(pair.sign(signed.as_bytes()).as_ref()));
        let jwk = Jwk {
            kty: "OKP".into(),
            kid: None,
            alg: None,
            usage: None,
            n: None,
            e: None,
            crv: Some("Ed25519".into()),
            x: Some(BASE64URL_NOPAD.encode(pair.public_key().as_ref())),
            y: None,
        };
        assert_eq!(verify(&token, &jwk).unwrap()["sub"], "ada");
    }
}
