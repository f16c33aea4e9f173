//! Login authorization (Selkie's extension for Pinniped #557): an authenticator's
//! `spec.loginAuthorization` names an action; a TokenCredentialRequest through that authenticator
//! is answered with a certificate only when kube-apiserver's authorizers allow the authenticated
//! user that action ([`selkie_filters::issuing::login_api`] asks and audits).
//!
//! [`attributes`] turns the spec into the review's resource attributes; [`KubeLoginAuthorizer`]
//! asks kube-apiserver with a SubjectAccessReview, with the control plane's own credential (the
//! install grants `create` on `subjectaccessreviews`). Nothing is cached: a login is once per
//! certificate lifetime per user, and a revoked grant takes effect at the next login.

use async_trait::async_trait;
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes as KubeResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::{api::PostParams, Api, Client};
use selkie_api::authentication::LoginAuthorization;
use selkie_filters::{
    access_review::{AccessDecision, ResourceAttributes},
    identity::UserInfo,
    issuing::login_api::LoginAuthorizer,
};

/// How long a login waits for kube-apiserver's answer before it is refused (the same bound as
/// the proxy's SubjectAccessReviews, `AccessReviewConfig`'s default); without it a hanging
/// kube-apiserver would hold the TokenCredentialRequest for the client's read timeout.
const REVIEW_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// The review's resource attributes for `spec` (cluster-wide: no namespace).
pub(crate) fn attributes(spec: &LoginAuthorization) -> ResourceAttributes {
    ResourceAttributes {
        namespace: None,
        verb: spec.verb.clone(),
        group: spec.group.clone(),
        resource: spec.resource.clone(),
        subresource: None,
        name: spec.name.clone().unwrap_or_default(),
    }
}

/// Asks kube-apiserver with the control plane's client.
#[derive(Clone)]
pub struct KubeLoginAuthorizer {
    reviews: Api<SubjectAccessReview>,
}

impl std::fmt::Debug for KubeLoginAuthorizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KubeLoginAuthorizer")
    }
}

impl KubeLoginAuthorizer {
    /// An authorizer sending its reviews with `client`.
    pub fn new(client: Client) -> Self {
        Self {
            reviews: Api::all(client),
        }
    }
}

#[async_trait]
impl LoginAuthorizer for KubeLoginAuthorizer {
    /// `POST /apis/authorization.k8s.io/v1/subjectaccessreviews` for `user` (username, UID,
    /// groups, extras, as given) and `attributes`; fails when kube-apiserver cannot be asked or
    /// refuses, or does not answer within [`REVIEW_TIMEOUT`].
    async fn review(
        &self,
        user: &UserInfo,
        attributes: &ResourceAttributes,
    ) -> Result<AccessDecision, String> {
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(user.username.clone()),
                uid: user.uid.clone(),
                groups: Some(user.groups.clone()),
                extra: (!user.extra.is_empty()).then(|| user.extra.clone().into_iter().collect()),
                resource_attributes: Some(KubeResourceAttributes {
                    namespace: attributes.namespace.clone(),
                    verb: Some(attributes.verb.clone()),
                    group: Some(attributes.group.clone()),
                    resource: Some(attributes.resource.clone()),
                    subresource: attributes.subresource.clone(),
                    name: Some(attributes.name.clone()).filter(|n| !n.is_empty()),
                    ..KubeResourceAttributes::default()
                }),
                ..SubjectAccessReviewSpec::default()
            },
            ..SubjectAccessReview::default()
        };
        let answer = tokio::time::timeout(
            REVIEW_TIMEOUT,
            self.reviews.create(&PostParams::default(), &review),
        )
        .await
        .map_err(|_| format!("no answer within {REVIEW_TIMEOUT:?}"))?
        .map_err(|e| e.to_string())?;
        let status = answer.status.ok_or("kube-apiserver's answer has no status")?;
        Ok(if status.allowed && !status.denied.unwrap_or(false) {
            AccessDecision::Allowed
        } else {
            AccessDecision::Denied {
                reason: status.reason.unwrap_or_default(),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_spec_becomes_cluster_wide_resource_attributes() {
        let spec = LoginAuthorization {
            verb: "login".into(),
            group: "login.concierge.pinniped.dev".into(),
            resource: "tokencredentialrequests".into(),
            name: Some("dex".into()),
        };
        assert_eq!(
            attributes(&spec),
            ResourceAttributes {
                namespace: None,
                verb: "login".into(),
                group: "login.concierge.pinniped.dev".into(),
                resource: "tokencredentialrequests".into(),
                subresource: None,
                name: "dex".into(),
            }
        );
        let unnamed = LoginAuthorization { name: None, ..spec };
        assert_eq!(attributes(&unnamed).name, "");
    }
}
