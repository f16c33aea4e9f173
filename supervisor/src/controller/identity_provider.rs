//! The one reconciler of every identity-provider kind: what differs between OIDC, LDAP, Active
//! Directory and GitHub is a [`Provider`] (how an object is checked and its upstream built, what
//! its status looks like, which Secrets and CA sources it names); the rest is here — the typed
//! object, the build kept per object with what it was built from, the [`Upstreams`] served
//! (a build that fails leaves the last working one serving; a deleted object's is dropped), the
//! status written by the leader, and the error policy (a server that did not answer is retried
//! with backoff).

use std::{
    collections::{HashMap, HashSet},
    future::Future,
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use kube::{api::DynamicObject, runtime::controller::Action, ResourceExt as _};
use selkie_kube::{
    conditions::Check,
    reconcile::{Reconciler, SourceEvent},
};

use crate::controller::kind::Kind;
use crate::controller::sources::{names_source, still_there, typed, ReconcileError, Sources};
use crate::controller::upstreams::Upstreams;
use crate::idp::Upstream;

/// How often a working identity provider is looked at again without an event.
const RESYNC: Duration = Duration::from_secs(300);

/// What one check of an identity provider found.
pub(crate) struct Evaluation<B> {
    /// Its conditions, in Pinniped's order, without `Ready`.
    pub(crate) checks: Vec<Check>,
    /// A new build to serve (`None`: nothing new — invalid, failed, or built in this form
    /// already).
    pub(crate) built: Option<B>,
    /// Why a server it needs did not answer, when one did not (worth a retry).
    pub(crate) unavailable: Option<String>,
}

impl<B> Evaluation<B> {
    /// Nothing new to serve, nothing to retry.
    pub(crate) fn settled(checks: Vec<Check>) -> Self {
        Self {
            checks,
            built: None,
            unavailable: None,
        }
    }
}

/// One identity-provider kind.
pub(crate) trait Provider: Send + Sync + 'static {
    /// The kind's name.
    const KIND: &'static str;
    /// JSON pointers to the names of Secrets its objects read.
    const SECRET_NAMES: &'static [&'static str];
    /// JSON pointers to the `tls` specs of its objects (their `certificateAuthorityDataSource`).
    const TLS_SPECS: &'static [&'static str];
    /// The typed object.
    type Object: serde::de::DeserializeOwned + Send + Sync + 'static;
    /// What a working configuration builds.
    type Built: Clone + Send + Sync + 'static;

    /// Checks `object` (named `name`) against `sources`; `previous` is what it last built, to
    /// be reused when nothing it was built from changed. Before it asks another server (a
    /// discovery, a connection probe), it reports the checks so far with that one `Unknown`
    /// through `interim`, so the status of an object that serves nothing yet says what is going
    /// on while it waits (one that serves keeps its status until the check ends).
    fn evaluate(
        &self,
        sources: &Sources,
        name: &str,
        object: &Self::Object,
        previous: Option<Self::Built>,
        interim: &Interim<'_, Self>,
    ) -> impl Future<Output = Evaluation<Self::Built>> + Send
    where
        Self: Sized;

    /// The upstream a build serves.
    fn upstream(built: &Self::Built) -> Arc<Upstream>;

    /// The status of `object` with `checks` (its conditions merged, `Ready` where the kind has
    /// one, the phase).
    fn status(object: &Self::Object, checks: &[Check]) -> serde_json::Value;
}

/// Writes the status of an object whose check waits for another server (see
/// [`Provider::evaluate`]).
pub(crate) struct Interim<'a, P: Provider> {
    kind: &'a Kind,
    object: &'a DynamicObject,
    typed: &'a P::Object,
    /// Whether to write at all: not while an earlier working form serves (its status stands
    /// until the check ends, rather than flapping to not-ready meanwhile).
    enabled: bool,
}

impl<P: Provider> Interim<'_, P> {
    /// Writes the status of `checks` (leader only, when it changed). A failure is logged: the
    /// final status is written (and retried) when the check ends.
    pub(crate) async fn report(&self, checks: &[Check]) {
        if !self.enabled {
            return;
        }
        let status = P::status(self.typed, checks);
        if let Err(error) = self.kind.write_status(self.object, &status).await {
            tracing::info!(kind = P::KIND, %error, "writing an interim status failed");
        }
    }
}

/// See the module documentation.
pub(crate) struct IdentityProviderReconciler<P: Provider> {
    pub(crate) kind: Kind,
    provider: P,
    sources: Sources,
    upstreams: Arc<Upstreams>,
    /// What each object last built, by name.
    built: Mutex<HashMap<String, P::Built>>,
}

impl<P: Provider> IdentityProviderReconciler<P> {
    pub(crate) fn new(kind: Kind, provider: P, sources: Sources, upstreams: Arc<Upstreams>) -> Self {
        Self {
            kind,
            provider,
            sources,
            upstreams,
            built: Mutex::default(),
        }
    }

    fn built(&self) -> std::sync::MutexGuard<'_, HashMap<String, P::Built>> {
        // Every change is one insert or remove: a poisoned lock still holds consistent data.
        self.built.lock().unwrap_or_else(PoisonError::into_inner)
    }

    async fn reconcile_one(self: Arc<Self>, object: Arc<DynamicObject>) -> Result<Action, ReconcileError> {
        self.sources.ready().await;
        let typed_object: P::Object = typed(&object)?;
        let name = object.name_any();
        if self.kind.first_seen(&name) {
            self.upstreams.appeared();
        }
        let previous = self.built().get(&name).cloned();
        let interim = Interim::<P> {
            kind: &self.kind,
            object: &object,
            typed: &typed_object,
            enabled: previous.is_none(),
        };
        let evaluation = self
            .provider
            .evaluate(&self.sources, &name, &typed_object, previous, &interim)
            .await;
        if let Some(built) = evaluation.built {
            // A check that took long (a probe) must not serve an object deleted meanwhile.
            if still_there(&self.kind.store, &object) {
                self.upstreams.serve(P::KIND, &name, P::upstream(&built));
                self.built().insert(name, built);
            }
        }
        let status = P::status(&typed_object, &evaluation.checks);
        self.kind.write_status(&object, &status).await?;
        match evaluation.unavailable {
            Some(reason) => Err(ReconcileError::Unavailable(reason)),
            None => Ok(Action::requeue(RESYNC)),
        }
    }
}

/// The first check of `object` as a replica that does not lead makes it (nothing built before,
/// no status written): its typed form read as a reconcile reads it, `provider`'s evaluation
/// against `sources`, and the status it would write. Fails as the typed reading does (fuzz
/// targets only; they never give `sources` what would make the check ask another server).
#[cfg(feature = "fuzzing")]
pub(crate) async fn evaluate_once<P: Provider>(
    provider: &P,
    kind: &Kind,
    sources: &Sources,
    object: &DynamicObject,
) -> Result<(Evaluation<P::Built>, serde_json::Value), ReconcileError> {
    let typed_object: P::Object = typed(object)?;
    let interim = Interim::<P> {
        kind,
        object,
        typed: &typed_object,
        enabled: false,
    };
    let evaluation = provider
        .evaluate(sources, &object.name_any(), &typed_object, None, &interim)
        .await;
    let status = P::status(&typed_object, &evaluation.checks);
    Ok((evaluation, status))
}

impl<P: Provider> Reconciler for IdentityProviderReconciler<P> {
    type Error = ReconcileError;

    fn kind(&self) -> &'static str {
        P::KIND
    }

    fn reconcile(
        self: Arc<Self>,
        object: Arc<DynamicObject>,
    ) -> impl Future<Output = Result<Action, ReconcileError>> + Send + 'static {
        self.reconcile_one(object)
    }

    fn waits_for_change(&self, error: &ReconcileError) -> bool {
        matches!(error, ReconcileError::Spec(_))
    }

    fn uses_source(&self, object: &DynamicObject, event: &SourceEvent) -> bool {
        names_source(object, event, P::SECRET_NAMES, P::TLS_SPECS)
    }

    fn forget(&self, name: &str, uid: Option<&str>) {
        self.built().remove(name);
        self.kind.unseen(name);
        self.upstreams.forget(P::KIND, name, uid);
    }

    fn retain(&self, names: &HashSet<String>) {
        self.built().retain(|name, _| names.contains(name));
        self.kind.retain_seen(names);
        self.upstreams.retain(P::KIND, names);
    }
}
