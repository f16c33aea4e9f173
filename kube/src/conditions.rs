//! Pinniped's status conventions: a `phase` summarising a list of `metav1.Condition`s, one per
//! type, with a synthesized `Ready` condition.
//!
//! A reconciler computes the [`Check`]s of one pass, in its own order, and [`merge`]s them into
//! the conditions the object already has: a condition whose status did not change keeps its
//! `lastTransitionTime`, every condition gets the object's current `observedGeneration`, types
//! the pass did not compute are kept, and the list is sorted by type (as Pinniped does). The
//! result is compared with what is stored, so a status is written only when something changed.

use k8s_openapi::{
    apimachinery::pkg::apis::meta::v1::{Condition, Time},
    jiff::Timestamp,
};

/// An object's overall state as its `status.phase` says it: what [`ready`] sets it to. Every
/// Pinniped CRD with conditions has a phase of its own type (authenticators: `Pending`, `Ready`,
/// `Error`; FederationDomains and identity providers add their own words).
pub trait ReadyPhase {
    /// The phase when every condition is true.
    fn ready() -> Self;
    /// The phase when some condition is not.
    fn error() -> Self;
}

impl ReadyPhase for selkie_api::authentication::Phase {
    fn ready() -> Self {
        Self::Ready
    }

    fn error() -> Self {
        Self::Error
    }
}

/// `Ready`: the synthesized summary condition.
pub const TYPE_READY: &str = "Ready";
/// `TLSConfigurationValid`: the `spec.tls` CA bundle could be read and holds certificates.
pub const TYPE_TLS_CONFIGURATION_VALID: &str = "TLSConfigurationValid";
/// `AuthenticatorValid`: the authenticator could be built from the spec.
pub const TYPE_AUTHENTICATOR_VALID: &str = "AuthenticatorValid";

/// The reason of every healthy condition.
pub const REASON_SUCCESS: &str = "Success";
/// The reason of a `Ready` condition that is not true.
pub const REASON_NOT_READY: &str = "NotReady";
/// The reason of a condition that could not be evaluated because an earlier one failed.
pub const REASON_UNABLE_TO_VALIDATE: &str = "UnableToValidate";
/// The reason of an unparsable issuer URL.
pub const REASON_INVALID_ISSUER_URL: &str = "InvalidIssuerURL";
/// The reason of a `TLSConfigurationValid` condition that is false.
pub const REASON_INVALID_TLS_CONFIG: &str = "InvalidTLSConfig";
/// The message of a condition that could not be evaluated.
pub const MESSAGE_UNABLE_TO_VALIDATE: &str = "unable to validate; see other conditions for details";

/// A condition's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Healthy.
    True,
    /// Unhealthy.
    False,
    /// Could not be evaluated.
    Unknown,
}

impl Status {
    /// The wire form: `True`, `False` or `Unknown`.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::True => "True",
            Status::False => "False",
            Status::Unknown => "Unknown",
        }
    }
}

/// One condition computed by a reconcile pass, before it gets its times and generation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Check {
    /// The condition type, e.g. `IssuerURLValid`.
    pub type_: &'static str,
    /// Its status.
    pub status: Status,
    /// A CamelCase reason.
    pub reason: String,
    /// A human-readable message.
    pub message: String,
}

impl Check {
    /// A true condition with reason `Success`.
    pub fn success(type_: &'static str, message: impl Into<String>) -> Self {
        Self {
            type_,
            status: Status::True,
            reason: REASON_SUCCESS.into(),
            message: message.into(),
        }
    }

    /// A true condition with another reason than `Success` (e.g. Pinniped's
    /// `LegacyConfigurationSuccess`).
    pub fn success_with_reason(type_: &'static str, reason: &str, message: impl Into<String>) -> Self {
        Self {
            type_,
            status: Status::True,
            reason: reason.into(),
            message: message.into(),
        }
    }

    /// A false condition.
    pub fn failure(type_: &'static str, reason: &str, message: impl Into<String>) -> Self {
        Self {
            type_,
            status: Status::False,
            reason: reason.into(),
            message: message.into(),
        }
    }

    /// An unknown condition: not evaluated because an earlier one failed.
    pub fn unable_to_validate(type_: &'static str) -> Self {
        Self::unknown(type_, MESSAGE_UNABLE_TO_VALIDATE)
    }

    /// An unknown condition with reason `UnableToValidate` and `message`.
    pub fn unknown(type_: &'static str, message: impl Into<String>) -> Self {
        Self {
            type_,
            status: Status::Unknown,
            reason: REASON_UNABLE_TO_VALIDATE.into(),
            message: message.into(),
        }
    }

    /// Whether the condition is true.
    pub fn is_true(&self) -> bool {
        self.status == Status::True
    }
}

/// Whether any of `checks` is not true (Pinniped's `HadErrorCondition`).
pub fn had_error(checks: &[Check]) -> bool {
    checks.iter().any(|check| !check.is_true())
}

/// The synthesized `Ready` condition and the phase for `checks` of an object of `kind` (e.g.
/// `JWTAuthenticator`): `Ready` and phase `Ready` when every check is true, else `NotReady` and
/// phase `Error`.
pub fn ready<P: ReadyPhase>(kind: &str, checks: &[Check]) -> (Check, P) {
    if had_error(checks) {
        (
            Check::failure(
                TYPE_READY,
                REASON_NOT_READY,
                format!("the {kind} is not ready: see other conditions for details"),
            ),
            P::error(),
        )
    } else {
        (
            Check::success(TYPE_READY, format!("the {kind} is ready")),
            P::ready(),
        )
    }
}

/// An object's phase and conditions once `checks` and their `Ready` summary for `kind` ([`ready`])
/// are merged into its `existing` conditions ([`merge`], now) for `generation`.
pub fn with_ready<P: ReadyPhase>(
    kind: &str,
    checks: &[Check],
    existing: &[Condition],
    generation: Option<i64>,
) -> (P, Vec<Condition>) {
    let (ready, phase) = ready::<P>(kind, checks);
    let all: Vec<Check> = checks.iter().cloned().chain([ready]).collect();
    (phase, merge(existing, &all, generation, &now()))
}

/// The current time at the precision `metav1.Time` is stored with (whole seconds), so that a
/// merged status compares equal to what the apiserver hands back.
pub fn now() -> Time {
    Time(Timestamp::from_second(Timestamp::now().as_second()).unwrap_or(Timestamp::UNIX_EPOCH))
}

/// Merges `checks` into `existing`: see the module documentation. `now` becomes the
/// `lastTransitionTime` of every new condition and of every condition whose status changed.
pub fn merge(
    existing: &[Condition],
    checks: &[Check],
    observed_generation: Option<i64>,
    now: &Time,
) -> Vec<Condition> {
    let mut merged = existing.to_vec();
    for check in checks {
        let mut condition = Condition {
            type_: check.type_.to_string(),
            status: check.status.as_str().to_string(),
            reason: check.reason.clone(),
            message: check.message.clone(),
            last_transition_time: now.clone(),
            observed_generation,
        };
        match merged.iter_mut().find(|c| c.type_ == check.type_) {
            Some(previous) => {
                if previous.status == condition.status {
                    condition.last_transition_time = previous.last_transition_time.clone();
                }
                *previous = condition;
            }
            None => merged.push(condition),
        }
    }
    merged.sort_by(|a, b| a.type_.cmp(&b.type_));
    merged
}

#[cfg(test)]
mod tests {
    use selkie_api::authentication::Phase;

    use super::*;

    fn at(second: i64) -> Time {
        Time(Timestamp::from_second(second).unwrap())
    }

    #[test]
    fn unchanged_statuses_keep_their_transition_time_and_take_the_generation() {
        let first = merge(
            &[],
            &[
                Check::success("IssuerURLValid", "issuer is a valid URL"),
                Check::failure("DiscoveryURLValid", "InvalidDiscoveryProbe", "down"),
            ],
            Some(1),
            &at(100),
        );
        assert_eq!(
            first.iter().map(|c| c.type_.as_str()).collect::<Vec<_>>(),
            ["DiscoveryURLValid", "IssuerURLValid"],
            "sorted by type"
        );
        assert!(first.iter().all(|c| c.last_transition_time == at(100)));

        let second = merge(
            &first,
            &[
                Check::success("IssuerURLValid", "issuer is a valid URL"),
                Check::success("DiscoveryURLValid", "discovery performed successfully"),
            ],
            Some(2),
            &at(200),
        );
        let find = |t: &str| second.iter().find(|c| c.type_ == t).unwrap().clone();
        assert_eq!(find("IssuerURLValid").last_transition_time, at(100));
        assert_eq!(find("IssuerURLValid").observed_generation, Some(2));
        assert_eq!(find("DiscoveryURLValid").last_transition_time, at(200));
        assert_eq!(find("DiscoveryURLValid").status, "True");
        assert_eq!(find("DiscoveryURLValid").reason, "Success");

        // The same checks again change nothing at all.
        let third = merge(
            &second,
            &[
                Check::success("IssuerURLValid", "issuer is a valid URL"),
                Check::success("DiscoveryURLValid", "discovery performed successfully"),
            ],
            Some(2),
            &at(300),
        );
        assert_eq!(third, second);
    }

    #[test]
    fn conditions_of_other_types_are_kept() {
        let existing = merge(&[], &[Check::success("Other", "kept")], Some(1), &at(1));
        let merged = merge(&existing, &[Check::success("Ready", "r")], Some(1), &at(2));
        assert_eq!(merged.len(), 2);
    }

    #[test]
    fn ready_summarises_the_checks() {
        let ok = [Check::success("A", "a")];
        let (condition, phase): (_, Phase) = ready("JWTAuthenticator", &ok);
        assert_eq!(phase, Phase::Ready);
        assert_eq!(condition.message, "the JWTAuthenticator is ready");
        assert_eq!(condition.reason, "Success");

        let unknown = [Check::success("A", "a"), Check::unable_to_validate("B")];
        let (condition, phase): (_, Phase) = ready("WebhookAuthenticator", &unknown);
        assert_eq!(phase, Phase::Error);
        assert_eq!(condition.status, Status::False);
        assert_eq!(condition.reason, "NotReady");
        assert_eq!(
            condition.message,
            "the WebhookAuthenticator is not ready: see other conditions for details"
        );
        assert_eq!(unknown[1].reason, "UnableToValidate");
        assert_eq!(unknown[1].message, MESSAGE_UNABLE_TO_VALIDATE);
    }

    #[test]
    fn now_has_whole_seconds() {
        assert_eq!(now().0.subsec_nanosecond(), 0);
    }
}
