//! The TokenReview authenticators against the real kube-apiserver: as a Pinniped-style webhook
//! (no credential, v1beta1 first) and as the pass-through reviewer with the proxy's own
//! credential. Tokens are real service-account tokens from the TokenRequest API (`kubectl create
//! token`).

use std::time::Duration;

use selkie_e2e::Cluster;
use selkie_filters::{
    chain::{Chain, Decision, TokenAuthenticator},
    identity::{Credential, Forwarding},
    outcome::{Outcome, RejectReason},
    review_cache::CacheConfig,
    tokenreview::{ClientAuth, ReviewVersion, TokenReviewAuthenticator, TokenReviewConfig, UidHandling},
};

fn review_endpoint(cluster: &Cluster) -> String {
    format!(
        "{}/apis/authentication.k8s.io/v1/tokenreviews",
        cluster.server_url()
    )
}

/// A fresh service account in `ns` and a real token for it.
pub(crate) async fn service_account_token(
    cluster: &Cluster,
    ns: &str,
    name: &str,
) -> anyhow::Result<(String, String)> {
    let kubectl = cluster.kubectl();
    kubectl.run(&["create", "serviceaccount", name, "-n", ns]).await?;
    let token = kubectl
        .run(&["create", "token", name, "-n", ns, "--duration=10m"])
        .await?
        .trim()
        .to_string();
    let uid = kubectl
        .run(&[
            "get",
            "serviceaccount",
            name,
            "-n",
            ns,
            "-o",
            "jsonpath={.metadata.uid}",
        ])
        .await?;
    Ok((token, uid))
}

/// The same token with its signature damaged.
fn forge(token: &str) -> String {
    let (signed, signature) = token.rsplit_once('.').unwrap_or((token, ""));
    let flipped: String = signature.chars().rev().collect();
    format!("{signed}.{flipped}")
}

#[tokio::test]
async fn webhook_authenticator_accepts_a_real_service_account_token_and_refuses_a_forged_one(
) -> anyhow::Result<()> {
    let cluster = Cluster::shared().await?;
    let client = cluster.client().await?;
    let ns = cluster.create_namespace(&client, "webhook").await?;
    let (token, uid) = service_account_token(cluster, &ns, "robot").await?;
    // Pinniped's WebhookAuthenticator has no credential of its own: let anonymous callers review.
    let binding = format!("{ns}-anonymous-tokenreview");
    cluster
        .kubectl()
        .run(&[
            "create",
            "clusterrolebinding",
            &binding,
            "--clusterrole=system:auth-delegator",
            "--group=system:unauthenticated",
        ])
        .await?;

    let mut config = TokenReviewConfig::new("apiserver-as-webhook", review_endpoint(cluster));
    config.ca_bundle_pem = Some(cluster.pki().server_ca.cert_pem());
    assert_eq!(
        config.version,
        ReviewVersion::Auto,
        "the Pinniped-compatible default"
    );
    let webhook = TokenReviewAuthenticator::new(config)?;

    let outcome = webhook.authenticate(&token).await;
    let Outcome::Authenticated(identity) = outcome else {
        anyhow::bail!("expected success, got {outcome:?}")
    };
    assert_eq!(
        identity.user.username,
        format!("system:serviceaccount:{ns}:robot")
    );
    assert_eq!(identity.user.uid.as_deref(), Some(uid.as_str()));
    for group in [
        "system:serviceaccounts",
        &format!("system:serviceaccounts:{ns}"),
        "system:authenticated",
    ] {
        assert!(
            identity.user.groups.iter().any(|g| g == group),
            "{group} missing: {:?}",
            identity.user.groups
        );
    }
    assert_eq!(
        identity.forwarding,
        Forwarding::Impersonate,
        "a webhook identity is impersonated"
    );

    assert_eq!(
        webhook.authenticate(&forge(&token)).await,
        Outcome::Rejected(RejectReason::NotAuthenticated)
    );
    assert_eq!(
        webhook.authenticate("not-a-token").await,
        Outcome::Rejected(RejectReason::NotAuthenticated)
    );

    // Through the chain, as the proxy will call it.
    let chain = Chain::new(vec![TokenAuthenticator::TokenReview(std::sync::Arc::new(
        webhook,
    ))]);
    match chain.authenticate(Credential::BearerToken(&token)).await {
        Decision::Authenticated(identity) => assert_eq!(&*identity.authenticator, "apiserver-as-webhook"),
        other => anyhow::bail!("the chain refused a valid token: {other:?}"),
    }
    cluster
        .kubectl()
        .run(&["delete", "clusterrolebinding", &binding])
        .await?;
    Ok(())
}

#[tokio::test]
async fn pass_through_reviewer_marks_uid_tokens_and_sees_revocation() -> anyhow::Result<()> {
    let cluster = Cluster::shared().await?;
    let client = cluster.client().await?;
    let ns = cluster.create_namespace(&client, "passthrough").await?;
    let (token, uid) = service_account_token(cluster, &ns, "builder").await?;

    // The proxy's own identity: a user allowed to create TokenReviews, nothing more.
    let proxy_user = format!("selkie-proxy-{ns}");
    cluster
        .kubectl()
        .run(&[
            "create",
            "clusterrolebinding",
            &proxy_user,
            "--clusterrole=system:auth-delegator",
            &format!("--user={proxy_user}"),
        ])
        .await?;
    let credential = cluster.pki().client_ca.issue_client(&proxy_user, &[])?;
    let mut config = TokenReviewConfig::new("kube-apiserver", review_endpoint(cluster));
    config.ca_bundle_pem = Some(cluster.pki().server_ca.cert_pem());
    config.client_auth = ClientAuth::Certificate {
        cert_pem: credential.cert_pem,
        key_pem: credential.key_pem,
    };
    config.version = ReviewVersion::V1;
    config.uid_handling = UidHandling::PassThroughToken;
    // Reuse results only briefly, so the revocation below is seen.
    config.cache = CacheConfig {
        positive_ttl: Duration::from_millis(200),
        ..CacheConfig::default()
    };
    let reviewer = TokenReviewAuthenticator::new(config)?;

    let Outcome::Authenticated(identity) = reviewer.authenticate(&token).await else {
        anyhow::bail!("the apiserver's own token was refused")
    };
    assert_eq!(identity.forwarding, Forwarding::PassThroughToken);
    assert_eq!(identity.user.uid.as_deref(), Some(uid.as_str()));

    // Deleting the service account revokes its tokens; once the cached result expires the
    // reviewer refuses the token.
    cluster
        .kubectl()
        .run(&["delete", "serviceaccount", "builder", "-n", &ns])
        .await?;
    crate::eventually(Duration::from_secs(15), || async {
        let outcome = reviewer.authenticate(&token).await;
        anyhow::ensure!(
            outcome == Outcome::Rejected(RejectReason::NotAuthenticated),
            "still {outcome:?}"
        );
        Ok(())
    })
    .await?;

    // A reviewer whose credential may not create TokenReviews is forbidden by the apiserver: that
    // is an upstream failure, never a refusal of the token and never a success.
    let nobody = cluster
        .pki()
        .client_ca
        .issue_client(&format!("nobody-{ns}"), &[])?;
    let mut unprivileged = TokenReviewConfig::new("unprivileged", review_endpoint(cluster));
    unprivileged.ca_bundle_pem = Some(cluster.pki().server_ca.cert_pem());
    unprivileged.client_auth = ClientAuth::Certificate {
        cert_pem: nobody.cert_pem,
        key_pem: nobody.key_pem,
    };
    unprivileged.version = ReviewVersion::V1;
    let forbidden = TokenReviewAuthenticator::new(unprivileged)?;
    let (other_token, _) = service_account_token(cluster, &ns, "other").await?;
    assert_eq!(
        forbidden.authenticate(&other_token).await,
        Outcome::Rejected(RejectReason::UpstreamUnavailable)
    );
    cluster
        .kubectl()
        .run(&["delete", "clusterrolebinding", &proxy_user])
        .await?;
    Ok(())
}
