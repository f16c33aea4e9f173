//! Arbitrary JWKS documents into `JwtAuthenticator::install_keys`, which parses them as the key
//! refresh does. It must never panic. When a document is accepted, tokens signed by keys that
//! are not in it (ES256, ES384, EdDSA, and RS256/PS256 with a signature of the right size) are
//! verified against its keys: nothing may be authenticated, and no key fetch may start (the
//! tokens name no `kid`, so every installed key is a candidate and none is unknown).

#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use selkie_filters::{
    jwt::JwtAuthenticator,
    outcome::{Outcome, RejectReason},
};

struct Fixture {
    authenticator: JwtAuthenticator,
    tokens: Vec<String>,
}

fn fixture() -> &'static Fixture {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    FIXTURE.get_or_init(|| Fixture {
        authenticator: selkie_fuzz::jwt_authenticator(),
        tokens: selkie_fuzz::reference_tokens(),
    })
}

fuzz_target!(|data: &[u8]| {
    let fixture = fixture();
    let Ok(count) = fixture.authenticator.install_keys(data) else {
        return;
    };
    assert!(count > 0, "install_keys accepted a key set with no usable key");
    for token in &fixture.tokens {
        match selkie_fuzz::runtime().block_on(fixture.authenticator.authenticate(token)) {
            Outcome::Authenticated(identity) => {
                panic!(
                    "a fuzzed key set verified a token it did not sign, as {:?}",
                    identity.user
                )
            }
            Outcome::Rejected(RejectReason::UpstreamUnavailable) => {
                panic!("a token without a kid made the authenticator fetch keys")
            }
            Outcome::NotMine => panic!("a token with the configured issuer was NotMine"),
            Outcome::Rejected(_) => {}
        }
    }
});
