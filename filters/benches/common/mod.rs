//! What the benches share: the runtime they drive async code on, and the identity every bench
//! token must map to (so a bench never measures a refusal by mistake).

use selkie_filters::outcome::Outcome;

/// A current-thread runtime: criterion's `to_async` enters it once per sample.
pub(crate) fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// Panics unless `outcome` is `alice` in `devs` and `ops`.
pub(crate) fn assert_alice(outcome: &Outcome) {
    let Outcome::Authenticated(identity) = outcome else {
        panic!("the bench token must authenticate: {outcome:?}");
    };
    assert_eq!(identity.user.username, "alice");
    assert_eq!(identity.user.groups, ["devs", "ops"]);
}
