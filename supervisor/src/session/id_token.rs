//! The Supervisor's ID tokens: ES256 JWTs signed with a FederationDomain's active key, with the
//! claims Pinniped's Supervisor puts in them — `iss`, `sub` (see [`crate::idp::subject`]), `aud`,
//! `azp`, `iat`, `exp`, `auth_time`, `rat`, `jti`, `nonce` and `at_hash` when there are any, and
//! the Supervisor's own `username`, `groups` and `additionalClaims`.

use std::collections::BTreeMap;

use base64::{engine::general_purpose::URL_SAFE_NO_PAD as B64URL, Engine as _};
use selkie_oidc::jose::{sign::SigningKey, JoseError};
use serde_json::{json, Map, Value};
use sha2::{Digest as _, Sha256};
use time::OffsetDateTime;

/// How long ID tokens live by default (authorization code, refresh and token exchange alike; an
/// OIDCClient may set its own for the first two).
pub(crate) const LIFETIME: time::Duration = time::Duration::minutes(2);

/// Who the token is about and for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct IdTokenClaims {
    /// The FederationDomain's issuer.
    pub issuer: String,
    /// The downstream subject.
    pub subject: String,
    /// The audience: the client, or the cluster of a token exchange.
    pub audience: String,
    /// The client that asked (`azp`).
    pub authorized_party: String,
    /// When the user logged in upstream.
    pub auth_time: OffsetDateTime,
    /// When the authorization was requested.
    pub requested_at: OffsetDateTime,
    /// The client's nonce, in tokens of an authorization code.
    pub nonce: Option<String>,
    /// The access token issued beside it, whose hash becomes `at_hash`.
    pub access_token: Option<String>,
    /// `username`, when the `username` scope was granted.
    pub username: Option<String>,
    /// `groups`, when the `groups` scope was granted.
    pub groups: Option<Vec<String>>,
    /// `additionalClaims`, when the upstream's mappings produced any.
    pub additional_claims: BTreeMap<String, Value>,
    /// How long it lives ([`LIFETIME`] unless the client's configuration says otherwise).
    pub lifetime: time::Duration,
}

impl IdTokenClaims {
    /// The JSON claims of a token issued at `now`, with a fresh `jti`.
    pub(crate) fn to_json(&self, now: OffsetDateTime) -> Result<Value, JoseError> {
        let jti = crate::session::new_request_id().ok_or(JoseError::Signing)?;
        let mut claims = Map::new();
        let mut put = |name: &str, value: Value| {
            claims.insert(name.to_string(), value);
        };
        put("iss", json!(self.issuer));
        put("sub", json!(self.subject));
        put("aud", json!([self.audience]));
        put("azp", json!(self.authorized_party));
        put("iat", json!(now.unix_timestamp()));
        put("exp", json!((now + self.lifetime).unix_timestamp()));
        put("auth_time", json!(self.auth_time.unix_timestamp()));
        put("rat", json!(self.requested_at.unix_timestamp()));
        put("jti", json!(jti));
        if let Some(nonce) = &self.nonce {
            put("nonce", json!(nonce));
        }
        if let Some(access_token) = &self.access_token {
            put("at_hash", json!(at_hash(access_token)));
        }
        if let Some(username) = &self.username {
            put("username", json!(username));
        }
        if let Some(groups) = &self.groups {
            put("groups", json!(groups));
        }
        if !self.additional_claims.is_empty() {
            put("additionalClaims", json!(self.additional_claims));
        }
        Ok(Value::Object(claims))
    }

    /// The signed token, issued at `now`.
    pub(crate) fn sign(&self, key: &SigningKey, now: OffsetDateTime) -> Result<String, JoseError> {
        key.sign(&self.to_json(now)?)
    }
}

/// OIDC's `at_hash`: the left half of the SHA-256 of the access token, base64url.
pub(crate) fn at_hash(access_token: &str) -> String {
    let digest = Sha256::digest(access_token.as_bytes());
    B64URL.encode(&digest[..16])
}

#[cfg(test)]
mod tests {
    use selkie_oidc::jose::{parse_jwks, Jws};

    use super::*;

    #[test]
    fn tokens_carry_pinnipeds_claims_and_verify_with_the_published_key() {
        let key = SigningKey::generate("k1").unwrap();
        let now = OffsetDateTime::from_unix_timestamp(1_800_000_000).unwrap();
        let claims = IdTokenClaims {
            issuer: "https://sso.example.com/a".into(),
            subject: "https://dex.example.com?idpName=Dex&sub=abc".into(),
            audience: "pinniped-cli".into(),
            authorized_party: "pinniped-cli".into(),
            auth_time: now,
            requested_at: now,
            nonce: Some("nonce-0123456789".into()),
            access_token: Some("pin_at_x.y".into()),
            username: Some("pinny@example.com".into()),
            groups: Some(vec!["seals".into()]),
            additional_claims: BTreeMap::new(),
            lifetime: LIFETIME,
        };
        let token = claims.sign(&key, now).unwrap();
        let jws = Jws::parse(&token).unwrap();
        let keys = parse_jwks(json!({"keys": [key.public_jwk()]}).to_string().as_bytes()).unwrap();
        jws.verify(&keys).unwrap();
        let c = &jws.claims;
        assert_eq!(c["aud"], json!(["pinniped-cli"]));
        assert_eq!(c["exp"], json!(1_800_000_120));
        assert_eq!(c["username"], "pinny@example.com");
        assert_eq!(c["groups"], json!(["seals"]));
        assert_eq!(c["at_hash"], json!(at_hash("pin_at_x.y")));
        assert!(c.get("additionalClaims").is_none());
        assert_eq!(c["jti"].as_str().unwrap().len(), 36);
        assert_eq!(jws.header.alg, "ES256");
    }

    #[test]
    fn at_hash_is_the_left_half_of_sha256() {
        // Computed independently: base64url(sha256(token)[:16]) with Python's hashlib.
        assert_eq!(
            at_hash("jHkWEdUXMU1BwAsC4vtUsZwnNXdaldd0"),
            "AtevmlsiGtgtU5nAgvQocw"
        );
    }
}
