//! The JWT authenticator against Dex, a real OIDC provider: real discovery, real JWKS, real RS256
//! ID tokens from the password grant, and key rotation by restarting Dex (in-memory storage gives
//! it new keys).

use std::time::Duration;

use selkie_e2e::dex::{Dex, DexUser, CLIENT_ID};
use selkie_filters::{
    jwt::{ClaimMapping, ClaimValidationRule, JwtAuthenticator, JwtConfig, Mapping, UserValidationRule},
    outcome::{Outcome, RejectReason},
    review_cache::CacheConfig,
};

/// Pinniped's documented JWTAuthenticator settings for Dex: audience = client id, username from
/// `email`, groups from `groups`.
fn config(dex: &Dex, audience: &str) -> JwtConfig {
    let mut config = JwtConfig::new("dex", dex.issuer(), audience);
    config.username = ClaimMapping::claim("email").into();
    config.ca_bundle_pem = Some(dex.ca_pem());
    config
}

#[tokio::test]
async fn dex_id_tokens_authenticate_with_user_and_groups() -> anyhow::Result<()> {
    let user = DexUser::pinny();
    let dex = Dex::start(std::slice::from_ref(&user)).await?;
    let jwt = JwtAuthenticator::new(config(&dex, CLIENT_ID))?;
    assert_eq!(jwt.load_keys().await?, 1, "Dex publishes one signing key");

    let tokens = dex.password_grant(&user.email, &user.password).await?;
    let outcome = jwt.authenticate(&tokens.id_token).await;
    let Outcome::Authenticated(identity) = outcome else {
        anyhow::bail!("Dex's ID token was refused: {outcome:?}")
    };
    assert_eq!(identity.user.username, user.email);
    assert_eq!(identity.user.groups, user.groups);
    assert_eq!(identity.audiences, vec![CLIENT_ID]);

    // The same token for an authenticator expecting another audience.
    let elsewhere = JwtAuthenticator::new(config(&dex, "another-cluster"))?;
    assert_eq!(
        elsewhere.authenticate(&tokens.id_token).await,
        Outcome::Rejected(RejectReason::WrongAudience)
    );

    // A token whose signature was damaged in transit is refused.
    let (signed, signature) = tokens.id_token.rsplit_once('.').unwrap_or_default();
    let damaged = format!("{signed}.{}", signature.chars().rev().collect::<String>());
    assert!(
        matches!(
            jwt.authenticate(&damaged).await,
            Outcome::Rejected(RejectReason::BadSignature | RejectReason::Malformed)
        ),
        "a damaged signature must be refused"
    );
    assert!(
        dex.password_grant(&user.email, "wrong").await.is_err(),
        "Dex refuses a wrong password"
    );
    Ok(())
}

/// Structured-authentication rules over a real ID token: CEL mappings for user, groups, uid and
/// extra, and validation rules that accept this user and refuse another configuration.
#[tokio::test]
async fn cel_claim_mappings_and_rules_apply_to_dex_tokens() -> anyhow::Result<()> {
    let user = DexUser::pinny();
    let dex = Dex::start(std::slice::from_ref(&user)).await?;
    let tokens = dex.password_grant(&user.email, &user.password).await?;

    let mut config = config(&dex, CLIENT_ID);
    config.username = Mapping::Expression("claims.email_verified ? 'dex:' + claims.email : ''".into());
    config.groups = Some(Mapping::Expression("claims.groups.map(g, 'dex:' + g)".into()));
    config.uid = Some(Mapping::Expression("claims.sub".into()));
    config.extra = [("example.com/issuer".to_string(), "claims.iss".to_string())].into();
    config.claim_validation_rules = vec![ClaimValidationRule::Expression {
        expression: "claims.email.endsWith('@example.com')".into(),
        message: "only example.com accounts".into(),
    }];
    config.user_validation_rules = vec![UserValidationRule {
        expression: "'dex:ops' in user.groups".into(),
        message: "operators only".into(),
    }];
    let jwt = JwtAuthenticator::new(config.clone())?;
    let outcome = jwt.authenticate(&tokens.id_token).await;
    let Outcome::Authenticated(identity) = outcome else {
        anyhow::bail!("Dex's ID token was refused: {outcome:?}")
    };
    assert_eq!(identity.user.username, format!("dex:{}", user.email));
    assert_eq!(identity.user.groups, vec!["dex:ops", "dex:devs"]);
    assert!(
        identity.user.uid.as_deref().is_some_and(|uid| !uid.is_empty()),
        "Dex's sub is the uid"
    );
    assert_eq!(
        identity.user.extra.get("example.com/issuer"),
        Some(&vec![dex.issuer().to_string()])
    );

    config.user_validation_rules[0].expression = "'dex:admins' in user.groups".into();
    let admins_only = JwtAuthenticator::new(config)?;
    assert_eq!(
        admins_only.authenticate(&tokens.id_token).await,
        Outcome::Rejected(RejectReason::ValidationRuleFailed)
    );
    Ok(())
}

#[tokio::test]
async fn rotated_dex_keys_are_picked_up_and_the_old_key_is_refused() -> anyhow::Result<()> {
    let user = DexUser::pinny();
    let mut dex = Dex::start(std::slice::from_ref(&user)).await?;
    let mut config = config(&dex, CLIENT_ID);
    // Reuse no result, so every presentation is verified against the current keys.
    config.cache = CacheConfig {
        positive_ttl: Duration::ZERO,
        negative_ttl: Duration::ZERO,
        ..CacheConfig::default()
    };
    let jwt = JwtAuthenticator::new(config)?;

    let before = dex.password_grant(&user.email, &user.password).await?.id_token;
    assert!(matches!(
        jwt.authenticate(&before).await,
        Outcome::Authenticated(_)
    ));

    dex.restart().await?;
    let after = dex.password_grant(&user.email, &user.password).await?.id_token;
    let outcome = jwt.authenticate(&after).await;
    assert!(
        matches!(outcome, Outcome::Authenticated(_)),
        "a token signed by the new key: {outcome:?}"
    );
    assert_eq!(
        jwt.authenticate(&before).await,
        Outcome::Rejected(RejectReason::UnknownKey),
        "the old key is no longer published"
    );
    Ok(())
}
