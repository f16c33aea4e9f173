//! DPoP (RFC 9449) at the token endpoint, for a FederationDomain with `spec.dpop.enabled`: the
//! server's half of a proof's check ([`RequestProof`]; what a proof says about itself is
//! [`selkie_oidc::dpop::check`]'s), its nonces ([`nonce`]) and its replay memory
//! ([`SeenProofs`]).
//!
//! * **Binding.** A login of the public `pinniped-cli` client must carry a proof, an OIDCClient's
//!   may; a login redeemed with one is bound to its key's thumbprint (stored with the login:
//!   [`crate::session::login::Login::dpop_jkt`]) and its tokens are of `token_type` `DPoP`.
//!   Every refresh and token exchange of a bound login needs a proof by that key — also once
//!   the FederationDomain stopped asking for DPoP: a binding holds for the session's life. A
//!   `pinniped-cli` session that is not bound (begun before DPoP was turned on) must log in
//!   again while DPoP is on.
//! * **Nonces** (RFC 9449 §8) are stateless, so that any replica takes any replica's:
//!   `base64url(period ‖ tag)`, where period is the number of [`NONCE_PERIOD`]s since the epoch
//!   (8 bytes, big-endian) and tag the first 16 bytes of the HMAC-SHA256 of the issuer URL and
//!   the period under the FederationDomain's token-signing key, which every replica reads from
//!   the same Secret ([`crate::session::tokens::TokenKey::mac`]). A nonce is taken in its period
//!   and the next, so for 5 to 10 minutes after it was handed out; it tells when it was made
//!   and nothing of the key. Every response of a DPoP-enabled token endpoint carries the current
//!   one in `DPoP-Nonce`.
//! * **Replay.** Each replica remembers the (thumbprint, `jti`) of every proof that passed
//!   until its `iat` leaves the [`WINDOW`], and refuses it a second time. The memory is
//!   bounded ([`SeenProofs::CAPACITY`]); when it is full of proofs still in their window, new
//!   proofs are refused (`temporarily_unavailable`) rather than old ones forgotten early.
//!   Replicas share no memory: across replicas, a proof could be presented once to each of
//!   them, only within its `iat` window (2 minutes) and with a nonce at most 10 minutes old —
//!   and only by someone who has it and the rest of the request (a proof is for one method and
//!   URL, and a bound session's proof is worthless without its token).
//!
//! No error or log line here quotes a proof, a key, a nonce or a `jti`.

use std::{collections::HashMap, sync::Mutex};

use base64::{engine::general_purpose::URL_SAFE_NO_PAD as B64URL, Engine as _};
use http::{HeaderMap, HeaderValue};
use selkie_oidc::dpop::{self, Window};
use sha2::Digest as _;
use subtle::ConstantTimeEq as _;
use time::OffsetDateTime;

use crate::endpoints::authorize;
use crate::endpoints::discovery::TOKEN_PATH;
use crate::endpoints::oauth::{Code, OAuthError};
use crate::endpoints::token::TokenClient;
use crate::issuer::Issuer;

/// How far a proof's `iat` may be from the server's clock: two minutes old, a minute ahead
/// (clock skew).
pub(crate) const WINDOW: Window = Window {
    past: 120,
    future: 60,
};
/// The length of a nonce's period, in seconds: a nonce is taken in its period and the next.
pub(crate) const NONCE_PERIOD: i64 = 300;
/// The purpose of a nonce's HMAC (21 bytes: see [`crate::session::tokens::TokenKey::mac`]).
const NONCE_PURPOSE: &str = "selkie.dev/dpop-nonce";
/// The bytes of the HMAC a nonce carries.
const NONCE_TAG_BYTES: usize = 16;

/// The `token_type` of the tokens of a login: `DPoP` when it is bound to a key, else `bearer`
/// (Pinniped's).
pub(crate) fn token_type(bound: bool) -> &'static str {
    if bound {
        dpop::TOKEN_TYPE
    } else {
        "bearer"
    }
}

/// The nonce `issuer` hands out at `now` (unix seconds): the same on every replica for a
/// [`NONCE_PERIOD`], taken until the end of the next one.
pub(crate) fn nonce(issuer: &Issuer, now: i64) -> String {
    let period = now.div_euclid(NONCE_PERIOD);
    let mut bytes = period.to_be_bytes().to_vec();
    bytes.extend_from_slice(&nonce_tag(issuer, period));
    B64URL.encode(bytes)
}

/// Whether `nonce` is one `issuer` handed out in the period of `now` or the one before.
fn nonce_is_current(issuer: &Issuer, nonce: &str, now: i64) -> bool {
    let Ok(bytes) = B64URL.decode(nonce) else {
        return false;
    };
    let Some((period, tag)) = bytes.split_first_chunk::<8>() else {
        return false;
    };
    let period = i64::from_be_bytes(*period);
    let current = now.div_euclid(NONCE_PERIOD);
    if period != current && Some(period) != current.checked_sub(1) {
        return false;
    }
    bool::from(nonce_tag(issuer, period).as_slice().ct_eq(tag))
}

/// The truncated HMAC of `issuer`'s nonce of `period`.
fn nonce_tag(issuer: &Issuer, period: i64) -> [u8; NONCE_TAG_BYTES] {
    let mut message = issuer.issuer.as_bytes().to_vec();
    message.extend_from_slice(&period.to_be_bytes());
    let tag = issuer.token_key.mac(NONCE_PURPOSE, &message);
    let mut truncated = [0u8; NONCE_TAG_BYTES];
    truncated.copy_from_slice(&tag.as_ref()[..NONCE_TAG_BYTES]);
    truncated
}

/// The (key thumbprint, `jti`) of the DPoP proofs this replica accepted, each until its `iat`
/// leaves the [`WINDOW`] (see the module's docs for what that bounds across replicas). At most
/// [`SeenProofs::CAPACITY`]: when it is full, the expired ones are dropped, and when it is full
/// of live ones, further proofs are refused (fail closed) until some expire.
#[derive(Debug)]
pub struct SeenProofs {
    capacity: usize,
    seen: Mutex<Seen>,
}

#[derive(Debug, Default)]
struct Seen {
    /// SHA-256 of the length-prefixed thumbprint and `jti` → until when (unix seconds) the proof
    /// could be presented again.
    until: HashMap<[u8; 32], i64>,
    /// The earliest of those times (`None` when empty): whether dropping expired entries can
    /// free anything.
    earliest: Option<i64>,
}

/// Why a proof was not recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Unrecorded {
    /// Its key and `jti` were seen before, and could still be presented.
    Replayed,
    /// The memory is full of proofs still in their window.
    Full,
}

impl Default for SeenProofs {
    fn default() -> Self {
        Self::with_capacity(Self::CAPACITY)
    }
}

impl SeenProofs {
    /// The most proofs remembered per replica (some 100 bytes each).
    pub const CAPACITY: usize = 100_000;

    /// An empty memory of at most `capacity` proofs.
    pub(crate) fn with_capacity(capacity: usize) -> Self {
        Self {
            capacity,
            seen: Mutex::default(),
        }
    }

    /// Records the proof of key `jkt` with `jti`, which could be presented again until `until`
    /// (unix seconds), at `now`. [`Unrecorded::Replayed`] when it was recorded before and is
    /// still in its window; [`Unrecorded::Full`] when there is no room for it.
    fn record(&self, jkt: &str, jti: &str, until: i64, now: i64) -> Result<(), Unrecorded> {
        let mut digest = sha2::Sha256::new();
        for part in [jkt, jti] {
            digest.update((part.len() as u64).to_be_bytes());
            digest.update(part.as_bytes());
        }
        let key: [u8; 32] = digest.finalize().into();
        let mut seen = self
            .seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match seen.until.get(&key) {
            Some(&expires) if expires >= now => return Err(Unrecorded::Replayed),
            Some(_) => {}
            None if seen.until.len() >= self.capacity => {
                if seen.earliest.is_some_and(|earliest| earliest < now) {
                    seen.until.retain(|_, expires| *expires >= now);
                    seen.earliest = seen.until.values().copied().min();
                }
                if seen.until.len() >= self.capacity {
                    return Err(Unrecorded::Full);
                }
            }
            None => {}
        }
        seen.until.insert(key, until);
        seen.earliest = Some(seen.earliest.map_or(until, |earliest| earliest.min(until)));
        Ok(())
    }
}

/// The `invalid_dpop_proof` error with `hint`.
fn invalid(hint: &str) -> OAuthError {
    OAuthError::new(Code::InvalidDpopProof, hint)
}

/// The DPoP proof of one token request, checked once: at once when the FederationDomain has
/// DPoP on ([`RequestProof::check_if_enabled`]), else only when a bound session asks for it
/// (a FederationDomain without DPoP ignores the `DPoP` header otherwise, as Pinniped's).
#[derive(Debug)]
pub(crate) struct RequestProof {
    /// The request's `DPoP` headers.
    headers: Vec<HeaderValue>,
    /// Once checked: the thumbprint of the proof's key, `None` when there was no proof.
    checked: Option<Option<String>>,
    /// Whether a check began (the response then hands out a nonce).
    attempted: bool,
}

impl RequestProof {
    /// The proof of a request with `headers`, unchecked.
    pub(crate) fn of(headers: &HeaderMap) -> Self {
        Self {
            headers: headers.get_all(dpop::HEADER).iter().cloned().collect(),
            checked: None,
            attempted: false,
        }
    }

    /// When `issuer` has DPoP on, checks the proof now (before any grant runs), as
    /// [`RequestProof::thumbprint`]; else does nothing.
    pub(crate) fn check_if_enabled(&mut self, seen: &SeenProofs, issuer: &Issuer) -> Result<(), OAuthError> {
        if issuer.dpop {
            self.thumbprint(seen, issuer)?;
        }
        Ok(())
    }

    /// The thumbprint of the key of the request's proof, `None` when it has none; checked the
    /// first time: one `DPoP` header at most, a proof [`dpop::check`] accepts for a `POST` to
    /// `issuer`'s token endpoint within [`WINDOW`], with a current nonce of `issuer`'s, and not
    /// seen before (then recorded in `seen`). Fails with `invalid_dpop_proof` (saying which
    /// check failed), `use_dpop_nonce` (no nonce, or not a current one: the response's
    /// `DPoP-Nonce` has one), or `temporarily_unavailable` (`seen` is full).
    pub(crate) fn thumbprint(
        &mut self,
        seen: &SeenProofs,
        issuer: &Issuer,
    ) -> Result<Option<String>, OAuthError> {
        if let Some(checked) = &self.checked {
            return Ok(checked.clone());
        }
        self.attempted = true;
        let jkt = match self.headers.as_slice() {
            [] => None,
            [proof] => Some(check_one(proof, seen, issuer)?),
            _ => return Err(invalid("The request has more than one DPoP header.")),
        };
        self.checked = Some(jkt.clone());
        Ok(jkt)
    }

    /// What a login (the authorization code or device code grant) of `client` is bound to: the
    /// proof's key thumbprint when `issuer` has DPoP on and the request has a proof; `None`
    /// when DPoP is off or an OIDCClient sent none. A `pinniped-cli` login without a proof is
    /// refused (`invalid_dpop_proof`) when DPoP is on; so is a bad proof.
    pub(crate) fn login_binding(
        &mut self,
        seen: &SeenProofs,
        issuer: &Issuer,
        client: &TokenClient,
    ) -> Result<Option<String>, OAuthError> {
        if !issuer.dpop {
            return Ok(None);
        }
        match self.thumbprint(seen, issuer)? {
            Some(jkt) => Ok(Some(jkt)),
            None if client.id == authorize::PINNIPED_CLI => Err(invalid(
                "This FederationDomain binds sessions to a key the client holds (DPoP, RFC 9449), and the request has no DPoP proof. The selkie CLI sends one; the pinniped CLI cannot log in here.",
            )),
            None => Ok(None),
        }
    }

    /// Whether `client` may continue (refresh, or exchange a token of) a session bound to the
    /// key thumbprint `bound`, or to none: a bound session needs a proof by its key, whatever
    /// `issuer` says now (`invalid_dpop_proof` without a proof, `invalid_grant` with another
    /// key's); an unbound session of `pinniped-cli` is refused (`invalid_grant`, log in again)
    /// while `issuer` has DPoP on; any other unbound session may continue. Changes nothing but
    /// the replay memory: call it before anything of the session changes.
    pub(crate) fn continue_session(
        &mut self,
        seen: &SeenProofs,
        issuer: &Issuer,
        client: &TokenClient,
        bound: Option<&str>,
    ) -> Result<(), OAuthError> {
        match bound {
            Some(bound) => match self.thumbprint(seen, issuer)? {
                None => Err(invalid(
                    "The session is bound to a DPoP key; the request has no proof.",
                )),
                Some(jkt) if !bool::from(jkt.as_bytes().ct_eq(bound.as_bytes())) => Err(OAuthError::new(
                    Code::InvalidGrant,
                    "The session is bound to another key than the DPoP proof's.",
                )),
                Some(_) => Ok(()),
            },
            None if issuer.dpop && client.id == authorize::PINNIPED_CLI => Err(OAuthError::new(
                Code::InvalidGrant,
                "This FederationDomain binds sessions to a key the client holds (DPoP, RFC 9449), and this session began before it did; log in again.",
            )),
            None => Ok(()),
        }
    }

    /// The `DPoP-Nonce` the response carries: the current nonce when `issuer` has DPoP on or
    /// the request's proof was checked (a bound session's, on a FederationDomain without DPoP),
    /// else none.
    pub(crate) fn nonce_header(&self, issuer: &Issuer) -> Option<HeaderValue> {
        if !issuer.dpop && !self.attempted {
            return None;
        }
        HeaderValue::from_str(&nonce(issuer, OffsetDateTime::now_utc().unix_timestamp())).ok()
    }
}

/// Checks the one `DPoP` header `value` (see [`RequestProof::thumbprint`]); its key's
/// thumbprint.
fn check_one(value: &HeaderValue, seen: &SeenProofs, issuer: &Issuer) -> Result<String, OAuthError> {
    let now = OffsetDateTime::now_utc().unix_timestamp();
    let text = value
        .to_str()
        .map_err(|_| invalid("The DPoP header is not a JWT."))?;
    let url = format!("{}{TOKEN_PATH}", issuer.issuer);
    let proof = dpop::check(text, "POST", &url, now, WINDOW).map_err(|error| {
        let error = error.to_string();
        let mut chars = error.chars();
        let sentence: String = chars
            .next()
            .map(|first| first.to_uppercase().chain(chars).collect())
            .unwrap_or_default();
        invalid(&format!("{sentence}."))
    })?;
    match proof.nonce.as_deref() {
        None => {
            return Err(OAuthError::new(
                Code::UseDpopNonce,
                "The DPoP proof has no nonce.",
            ))
        }
        Some(nonce) if !nonce_is_current(issuer, nonce, now) => {
            return Err(OAuthError::new(
                Code::UseDpopNonce,
                "The DPoP proof's nonce is not one of this FederationDomain's, or has expired.",
            ))
        }
        Some(_) => {}
    }
    match seen.record(&proof.jkt, &proof.jti, proof.iat.saturating_add(WINDOW.past), now) {
        Ok(()) => Ok(proof.jkt),
        Err(Unrecorded::Replayed) => Err(invalid(
            "The DPoP proof was replayed: a proof by its key with its jti was presented before.",
        )),
        Err(Unrecorded::Full) => {
            tracing::warn!(
                capacity = seen.capacity,
                "the memory of recent DPoP proofs is full; refusing proofs until some expire"
            );
            Err(OAuthError::new(
                Code::TemporarilyUnavailable,
                "Too many recent DPoP proofs are remembered to check this one for replay; try again shortly.",
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use bytes::Bytes;
    use selkie_oidc::jose::sign::SigningKey;

    use super::*;
    use crate::sealed::Sealer;
    use crate::session::tokens::TokenKey;

    fn issuer(url: &str, key: u8) -> Issuer {
        Issuer::new(
            url.into(),
            url.into(),
            Arc::new(SigningKey::generate("k").unwrap()),
            Bytes::new(),
            Arc::new(TokenKey::new(&[key; 32])),
            Arc::new(Sealer::new(&[2; 32], url).unwrap()),
            Vec::new(),
            Default::default(),
            Default::default(),
        )
        .unwrap()
        .with_dpop(true)
    }

    /// A nonce is taken in its period and the next (5 to 10 minutes), on any replica (the same
    /// key), by its FederationDomain only; it is 32 characters and reveals no key.
    #[test]
    fn nonces_live_two_periods_and_belong_to_their_issuer() {
        let fd = issuer("https://sso.example.com/fd", 7);
        let start = 1_800_000_000 - 1_800_000_000 % NONCE_PERIOD;
        let handed = nonce(&fd, start + 10);
        assert_eq!(handed.len(), 32);
        assert_eq!(handed, nonce(&fd, start + NONCE_PERIOD - 1), "one per period");
        let replica = issuer("https://sso.example.com/fd", 7);
        for at in [start, start + NONCE_PERIOD - 1, start + 2 * NONCE_PERIOD - 1] {
            assert!(nonce_is_current(&replica, &handed, at), "{}", at - start);
        }
        assert!(
            !nonce_is_current(&fd, &handed, start + 2 * NONCE_PERIOD),
            "expired"
        );
        assert!(!nonce_is_current(&fd, &handed, start - 1), "from the future");
        assert!(!nonce_is_current(
            &issuer("https://sso.example.com/other", 7),
            &handed,
            start
        ));
        assert!(!nonce_is_current(
            &issuer("https://sso.example.com/fd", 8),
            &handed,
            start
        ));
        let mut forged = B64URL.decode(&handed).unwrap();
        forged[20] ^= 1;
        assert!(!nonce_is_current(&fd, &B64URL.encode(&forged), start));
        for junk in ["", "!!", "AAAA", &handed[..31]] {
            assert!(!nonce_is_current(&fd, junk, start), "{junk}");
        }
    }

    /// A proof is refused a second time while in its window, and forgotten after; a full memory
    /// drops only expired proofs, and refuses new ones while all are live.
    #[test]
    fn the_replay_memory_is_bounded_and_fails_closed() {
        let seen = SeenProofs::with_capacity(2);
        assert_eq!(seen.record("k1", "a", 100, 0), Ok(()));
        assert_eq!(seen.record("k1", "a", 100, 50), Err(Unrecorded::Replayed));
        assert_eq!(seen.record("k2", "a", 200, 50), Ok(()), "another key");
        assert_eq!(seen.record("k1", "b", 150, 60), Err(Unrecorded::Full));
        assert_eq!(seen.record("k2", "a", 200, 100), Err(Unrecorded::Replayed));
        // At 101 the first proof is out of its window: its room is taken again.
        assert_eq!(seen.record("k1", "b", 150, 101), Ok(()));
        assert_eq!(seen.record("k1", "c", 150, 102), Err(Unrecorded::Full));
        assert_eq!(seen.record("k2", "a", 250, 120), Err(Unrecorded::Replayed));
        // Length prefixes: a thumbprint and jti cannot be shifted into one another.
        let seen = SeenProofs::with_capacity(10);
        assert_eq!(seen.record("ab", "c", 100, 0), Ok(()));
        assert_eq!(seen.record("a", "bc", 100, 0), Ok(()));
    }
}
