use serde_json::json;

use super::*;

fn spec(grants: &[&str], scopes: &[&str]) -> OIDCClientSpec {
    serde_json::from_value(json!({
        "allowedRedirectURIs": ["https://app.example.com/callback"],
        "allowedGrantTypes": grants,
        "allowedScopes": scopes,
    }))
    .unwrap()
}

fn stored(hashes: &[String]) -> Secret {
    storage_secret(
        "client.oauth.pinniped.dev-app",
        "0b5c1f6e-1111-2222-3333-444455556666",
        "config.supervisor.pinniped.dev/v1alpha1",
        hashes,
    )
}

fn message<'a>(checks: &'a [Check], type_: &str) -> (&'a str, &'a str) {
    let check = checks.iter().find(|check| check.type_ == type_).unwrap();
    (check.reason.as_str(), check.message.as_str())
}

#[test]
fn the_storage_secret_is_pinnipeds() {
    let uid = "0b5c1f6e-1111-2222-3333-444455556666";
    // Pinniped: base64url(uid) is the signature, decoded again and base32-encoded for the name.
    assert_eq!(
        storage_name(uid),
        storage::secret_name(SECRET_LABEL, &URL_SAFE_NO_PAD.encode(uid))
    );
    // base32("0b5c1") = "gbrdkyzr"
    assert!(storage_name(uid).starts_with("pinniped-storage-oidc-client-secret-gbrdkyzr"));
    let secret = stored(&["$2a$12$abc".into()]);
    assert_eq!(
        secret.type_.as_deref(),
        Some("storage.pinniped.dev/oidc-client-secret")
    );
    let data = secret.data.as_ref().unwrap();
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&data[storage::DATA_KEY].0).unwrap(),
        json!({"hashes": ["$2a$12$abc"], "version": "1"})
    );
    let owner = &secret.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!((owner.kind.as_str(), owner.uid.as_str()), ("OIDCClient", uid));
    // Never garbage-collected.
    assert_eq!(storage::garbage_collect_after(&secret), None);
    assert_eq!(read_hashes(&secret).unwrap(), ["$2a$12$abc"]);
}

#[test]
fn a_valid_client_with_a_secret_is_ready_and_authenticates_its_secrets_only() {
    let hash = bcrypt::hash("the-secret", BCRYPT_COST).unwrap();
    let spec = spec(
        &["authorization_code", "refresh_token"],
        &["openid", "offline_access", "username", "groups"],
    );
    let (checks, hashes) = validate(&spec, Some(&stored(std::slice::from_ref(&hash))));
    assert!(checks.iter().all(Check::is_true), "{checks:?}");
    assert_eq!(
        message(&checks, "ClientSecretExists").1,
        "1 client secret(s) found"
    );
    assert_eq!(
        message(&checks, "AllowedGrantTypesValid").1,
        "\"allowedGrantTypes\" is valid"
    );
    assert_eq!(
        message(&checks, "AllowedScopesValid").1,
        "\"allowedScopes\" is valid"
    );
    let client = dynamic_client("client.oauth.pinniped.dev-app", &spec, hashes);
    assert_eq!(
        client.client.scopes,
        ["openid", "offline_access", "username", "groups"]
    );
    assert_eq!(client.client.grant_types, ["authorization_code", "refresh_token"]);
    assert!(!client.client.form_post);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        assert_eq!(client.authenticate("the-secret").await, Ok(true));
        // The second time from memory, still right; a wrong secret never.
        assert_eq!(client.authenticate("the-secret").await, Ok(true));
        assert_eq!(client.authenticate("the-secret ").await, Ok(false));
        assert_eq!(client.authenticate("").await, Ok(false));
    });
    assert!(!format!("{client:?}").contains(&hash));
}

/// A flood of wrong secrets for one client ID (IDs are public) runs bcrypt off the async
/// runtime, one check at a time for that client: another client's first check goes through while
/// the flood is still far from done. Before, every check ran bcrypt on the runtime's thread, in
/// arrival order, so the other client waited for the whole flood.
#[tokio::test(flavor = "current_thread")]
async fn a_wrong_secret_flood_for_one_client_does_not_hold_up_another() {
    let spec = spec(&["authorization_code"], &["openid"]);
    // Cost 10 instead of 12 only to keep the test short; the scheduling is the same.
    let hash = |secret: &str| bcrypt::hash(secret, 10).unwrap();
    let flooded = Arc::new(dynamic_client(
        "client.oauth.pinniped.dev-flooded",
        &spec,
        vec![hash("flooded-secret")],
    ));
    let other = dynamic_client(
        "client.oauth.pinniped.dev-other",
        &spec,
        vec![hash("other-secret")],
    );
    const FLOOD: usize = 24;
    let done = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let flood: Vec<_> = (0..FLOOD)
        .map(|i| {
            let (flooded, done) = (flooded.clone(), done.clone());
            tokio::spawn(async move {
                let verdict = flooded.authenticate(&format!("wrong-{i}")).await;
                done.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                verdict
            })
        })
        .collect();
    tokio::task::yield_now().await;
    assert_eq!(other.authenticate("other-secret").await, Ok(true));
    let finished = done.load(std::sync::atomic::Ordering::SeqCst);
    assert!(
        finished <= FLOOD / 2,
        "the other client waited for {finished} of {FLOOD} checks of the flooded client"
    );
    // A wrong secret is never accepted. On a loaded machine the flood's tail may wait past
    // BCRYPT_WAIT for its turn and be refused as Busy (the designed answer to a flood); the
    // first check always runs.
    let verdicts: Vec<_> = futures::future::join_all(flood)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    assert_eq!(verdicts[0], Ok(false));
    assert!(
        verdicts.iter().all(|v| matches!(v, Ok(false) | Err(Busy))),
        "{verdicts:?}"
    );
}

#[test]
fn missing_and_weak_secrets_are_named_and_leave_no_hashes() {
    let spec = spec(&["authorization_code"], &["openid"]);
    let (checks, hashes) = validate(&spec, None);
    assert!(hashes.is_empty());
    assert_eq!(
        message(&checks, "ClientSecretExists"),
        (
            "NoClientSecretFound",
            "no client secret found (no Secret storage found)"
        )
    );
    let (checks, _) = validate(&spec, Some(&stored(&[])));
    assert_eq!(
        message(&checks, "ClientSecretExists").1,
        "no client secret found (empty list in storage)"
    );
    let weak = bcrypt::hash("x", 4).unwrap();
    let unusable = stored(&[weak, "not-a-hash".into()]);
    let (checks, hashes) = validate(&spec, Some(&unusable));
    assert!(hashes.is_empty());
    // The status counts usable secrets only, as Pinniped's does.
    assert!(validate_secret(Some(&unusable)).1.is_empty());
    assert_eq!(
        message(&checks, "ClientSecretExists"),
        (
            "InvalidClientSecretFound",
            "2 stored client secrets found, but some were invalid, so none will be used: hashed client secret at index 0: bcrypt cost 4 is below the required minimum of 12; hashed client secret at index 1: not a bcrypt hash"
        )
    );
    let mut wrong_type = stored(&[]);
    wrong_type.type_ = Some("Opaque".into());
    let (checks, _) = validate(&spec, Some(&wrong_type));
    assert!(message(&checks, "ClientSecretExists")
        .1
        .starts_with("error reading client secret storage: "));
}

#[test]
fn grant_types_and_scopes_must_go_together_in_pinnipeds_words() {
    let hash = bcrypt::hash("s", BCRYPT_COST).unwrap();
    let storage = stored(&[hash]);
    let (checks, hashes) = validate(
        &spec(
            &["refresh_token"],
            &["offline_access", "pinniped:request-audience"],
        ),
        Some(&storage),
    );
    assert!(hashes.is_empty());
    assert_eq!(
        message(&checks, "AllowedGrantTypesValid"),
        (
            "MissingRequiredValue",
            "\"authorization_code\" must always be included in \"allowedGrantTypes\"; \"urn:ietf:params:oauth:grant-type:token-exchange\" must be included in \"allowedGrantTypes\" when \"pinniped:request-audience\" is included in \"allowedScopes\""
        )
    );
    assert_eq!(
        message(&checks, "AllowedScopesValid").1,
        "\"openid\" must always be included in \"allowedScopes\"; \"username\" and \"groups\" must be included in \"allowedScopes\" when \"pinniped:request-audience\" is included in \"allowedScopes\""
    );
    let (checks, _) = validate(
        &spec(
            &[
                "authorization_code",
                "urn:ietf:params:oauth:grant-type:token-exchange",
            ],
            &["openid", "offline_access"],
        ),
        Some(&storage),
    );
    assert_eq!(
        message(&checks, "AllowedGrantTypesValid").1,
        "\"refresh_token\" must be included in \"allowedGrantTypes\" when \"offline_access\" is included in \"allowedScopes\""
    );
    assert_eq!(
        message(&checks, "AllowedScopesValid").1,
        "\"pinniped:request-audience\" must be included in \"allowedScopes\" when \"urn:ietf:params:oauth:grant-type:token-exchange\" is included in \"allowedGrantTypes\""
    );
}
