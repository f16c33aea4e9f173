//! Objects into the Supervisor controllers' checks (`selkie_supervisor::fuzzing`): OIDCClients
//! with their client-secret storage (`oidc_client`), FederationDomains (`federation_domain`) and
//! the four identity-provider kinds (`IdentityProviders::check`, in a fixed namespace where no
//! check gets as far as asking a server).
//!
//! Input: `selector, JSON` (an input that is no JSON is skipped). The selector's low three bits
//! pick the kind: 0 OIDCClient, 1 FederationDomain, 2 OIDC, 3 LDAP, 4 Active Directory, 5-7
//! GitHub identity provider. With bit 7 the JSON is the whole object, else its `spec` (the rest
//! of the object is fixed). For an OIDCClient, bits 3-4 pick its storage Secret: none, one holding
//! a real bcrypt hash of cost 12, one holding the hashes the JSON's `hashes` member lists (the JSON
//! being `{"spec": …, "hashes": […]}`), or one whose stored data is the JSON's `storage` member's
//! text; bit 5 gives that Secret another type, bit 6 another storage version. For a
//! FederationDomain, bit 3 adds a second one with the same issuer, bit 4 one on the same host with
//! another TLS Secret.
//!
//! Invariants (a violation panics): nothing panics; an object that does not parse is an error;
//! every check has a type given once and a reason (and a message when it is not true); an
//! OIDCClient is usable exactly when its three conditions hold, then with its spec's redirect
//! URIs, grant types and scopes, which satisfy Pinniped's rules; a FederationDomain is served
//! only when every condition holds, then with a subset of its identity providers' display names
//! in order, and transforms only for those; an identity provider is never built and never waits
//! for a server, its connection condition is never true, and its status has a phase and its
//! conditions.

#![no_main]

use std::{collections::HashSet, sync::OnceLock};

use k8s_openapi::ByteString;
use libfuzzer_sys::fuzz_target;
use selkie_api::supervisor_config::{FederationDomain, OIDCClientSpec};
use selkie_fuzz::runtime;
use selkie_supervisor::fuzzing::{
    client_secret_storage, federation_domain, hash_client_secret, oidc_client, Check, IdentityProviderKind,
    IdentityProviders,
};
use serde_json::{json, Value};

/// The OIDCClient's name.
const CLIENT: &str = "client.oauth.pinniped.dev-fuzz";

struct Fixture {
    /// A bcrypt hash of cost 12 (of a fixture secret).
    hash: String,
    identity_providers: IdentityProviders,
}

fn fixture() -> &'static Fixture {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        selkie_fuzz::install_crypto_provider();
        let identity_providers = runtime()
            .block_on(async { IdentityProviders::new() })
            .expect("building the namespace");
        Fixture {
            hash: hash_client_secret("fuzz-client-secret").expect("hashing a client secret"),
            identity_providers,
        }
    })
}

fuzz_target!(|data: &[u8]| {
    let fixture = fixture();
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    let Ok(input) = serde_json::from_slice::<Value>(rest) else {
        return;
    };
    let whole = selector & 0x80 != 0;
    match selector & 0b111 {
        0 => client(fixture, selector, input),
        1 => federation(selector, input, whole),
        kind => {
            let (kind, name) = match kind {
                2 => (IdentityProviderKind::Oidc, "OIDCIdentityProvider"),
                3 => (IdentityProviderKind::Ldap, "LDAPIdentityProvider"),
                4 => (
                    IdentityProviderKind::ActiveDirectory,
                    "ActiveDirectoryIdentityProvider",
                ),
                _ => (IdentityProviderKind::GitHub, "GitHubIdentityProvider"),
            };
            let object = if whole {
                input
            } else {
                json!({
                    "apiVersion": "idp.supervisor.pinniped.dev/v1alpha1",
                    "kind": name,
                    "metadata": {"name": "fuzz", "namespace": "supervisor", "uid": "fuzz-uid", "generation": 2},
                    "spec": input,
                })
            };
            identity_provider(fixture, kind, object);
        }
    }
});

/// Checks what every check list must be: each type once, a reason, a message unless true.
fn well_formed(checks: &[Check]) {
    let mut seen = HashSet::new();
    for check in checks {
        assert!(
            seen.insert(check.type_),
            "the condition {} is given twice",
            check.type_
        );
        assert!(
            !check.reason.is_empty(),
            "the condition {} has no reason",
            check.type_
        );
        assert!(
            check.is_true() || !check.message.is_empty(),
            "the failed condition {} says nothing",
            check.type_
        );
    }
}

fn client(fixture: &Fixture, selector: u8, input: Value) {
    let (spec, hashes, stored) = match (selector >> 3) & 0b11 {
        2 => (
            input.get("spec").cloned().unwrap_or_default(),
            input.get("hashes").cloned(),
            None,
        ),
        3 => (
            input.get("spec").cloned().unwrap_or_default(),
            None,
            Some(input.get("storage").map(Value::to_string).unwrap_or_default()),
        ),
        _ => (input, None, None),
    };
    let Ok(spec) = serde_json::from_value::<OIDCClientSpec>(spec) else {
        return;
    };
    let storage = match (selector >> 3) & 0b11 {
        0 => None,
        1 => Some(client_secret_storage(CLIENT, "fuzz-uid", &[fixture.hash.clone()])),
        2 => {
            let Ok(hashes) = serde_json::from_value::<Vec<String>>(hashes.unwrap_or_default()) else {
                return;
            };
            Some(client_secret_storage(CLIENT, "fuzz-uid", &hashes))
        }
        _ => {
            let mut secret = client_secret_storage(CLIENT, "fuzz-uid", &[]);
            let data = secret.data.get_or_insert_with(Default::default);
            data.insert(
                "pinniped-storage-data".into(),
                ByteString(stored.unwrap_or_default().into_bytes()),
            );
            Some(secret)
        }
    };
    let storage = storage.map(|mut secret| {
        if selector & 0x20 != 0 {
            secret.type_ = Some("storage.pinniped.dev/oidc-client-secret-v2".into());
        }
        if selector & 0x40 != 0 {
            if let Some(data) = secret.data.as_mut() {
                data.insert("pinniped-storage-version".into(), ByteString(b"2".to_vec()));
            }
        }
        secret
    });
    let (checks, client) = oidc_client(CLIENT, &spec, storage.as_ref());
    well_formed(&checks);
    let types: Vec<&str> = checks.iter().map(|check| check.type_).collect();
    assert_eq!(
        types,
        [
            "ClientSecretExists",
            "AllowedGrantTypesValid",
            "AllowedScopesValid"
        ],
        "the OIDCClient's conditions"
    );
    let valid = checks.iter().all(|check| check.is_true());
    assert_eq!(client.is_some(), valid, "usable exactly when valid: {checks:?}");
    if checks[0].is_true() {
        assert!(
            selector & 0x60 == 0,
            "a storage Secret of another type or version was read: {checks:?}"
        );
    }
    let Some(client) = client else {
        return;
    };
    let client = &client.client;
    assert_eq!(client.id, CLIENT);
    assert_eq!(client.redirect_uris, spec.allowed_redirect_uris);
    let has = |list: &[String], item: &str| list.iter().any(|value| value == item);
    let (grants, scopes) = (&client.grant_types, &client.scopes);
    assert!(
        has(grants, "authorization_code") && has(scopes, "openid"),
        "{client:?}"
    );
    assert_eq!(
        has(grants, "refresh_token"),
        has(scopes, "offline_access"),
        "{client:?}"
    );
    assert_eq!(
        has(grants, "urn:ietf:params:oauth:grant-type:token-exchange"),
        has(scopes, "pinniped:request-audience"),
        "{client:?}"
    );
    if has(scopes, "pinniped:request-audience") {
        assert!(has(scopes, "username") && has(scopes, "groups"), "{client:?}");
    }
    assert!(!client.form_post, "an OIDCClient may not use form_post");
}

fn federation(selector: u8, input: Value, whole: bool) {
    let object_of = |spec: Value, name: &str| {
        json!({
            "apiVersion": "config.supervisor.pinniped.dev/v1alpha1",
            "kind": "FederationDomain",
            "metadata": {"name": name, "namespace": "supervisor", "uid": format!("{name}-uid"), "generation": 1},
            "spec": spec,
        })
    };
    let object = if whole { input } else { object_of(input, "fuzz") };
    let Ok(fd) = serde_json::from_value::<FederationDomain>(object) else {
        return;
    };
    let mut all = vec![fd.clone()];
    let issuer = fd.spec.issuer.clone();
    let host_only = issuer
        .strip_prefix("https://")
        .and_then(|rest| rest.split('/').next())
        .unwrap_or("sso.fuzz.test")
        .to_string();
    for (bit, spec, name) in [
        (0x08, json!({"issuer": issuer}), "same-issuer"),
        (
            0x10,
            json!({"issuer": format!("https://{host_only}/other"), "tls": {"secretName": "another-tls"}}),
            "same-host",
        ),
    ] {
        if selector & bit != 0 {
            if let Ok(other) = serde_json::from_value::<FederationDomain>(object_of(spec, name)) {
                all.push(other);
            }
        }
    }
    let checked = federation_domain(&fd, &all).expect("the namespace of identity providers");
    well_formed(&checked.checks);
    let mut types: Vec<&str> = checked.checks.iter().map(|check| check.type_).collect();
    types.sort_unstable();
    assert_eq!(
        types,
        [
            "IdentityProvidersDisplayNamesUnique",
            "IdentityProvidersFound",
            "IdentityProvidersObjectRefAPIGroupSuffixValid",
            "IdentityProvidersObjectRefKindValid",
            "IssuerIsUnique",
            "IssuerURLValid",
            "OneTLSSecretPerIssuerHostname",
            "SessionsValid",
            "TransformsExamplesPassed",
            "TransformsExpressionsValid",
        ],
        "the FederationDomain's conditions"
    );
    let names: Vec<&str> = fd
        .spec
        .identity_providers
        .iter()
        .map(|idp| idp.display_name.as_str())
        .collect();
    for transformed in &checked.transformed {
        assert!(
            names.contains(&transformed.as_str()),
            "transforms for {transformed:?}"
        );
    }
    let Some(served) = checked.served else {
        return;
    };
    assert!(
        checked.checks.iter().all(|check| check.is_true()),
        "served despite a failed condition: {:?}",
        checked.checks
    );
    assert!(
        fd.spec.issuer.starts_with("https://"),
        "served at {:?}",
        fd.spec.issuer
    );
    if names.is_empty() {
        assert!(served.len() <= 1, "{served:?}");
        return;
    }
    let mut rest = names.iter();
    for name in &served {
        assert!(
            rest.any(|listed| listed == name),
            "served {name:?}, not listed (in that order) in {names:?}"
        );
    }
}

fn identity_provider(fixture: &Fixture, kind: IdentityProviderKind, object: Value) {
    let checked = runtime().block_on(fixture.identity_providers.check(kind, object));
    let Ok(checked) = checked else {
        return;
    };
    well_formed(&checked.checks);
    assert!(
        !checked.built,
        "an identity provider was built without asking its server"
    );
    assert_eq!(checked.unavailable, None, "a server was asked");
    for check in &checked.checks {
        if [
            "OIDCDiscoverySucceeded",
            "LDAPConnectionValid",
            "GitHubConnectionValid",
            "SearchBaseFound",
            "ClientCredentialsSecretValid",
            "BindSecretValid",
        ]
        .contains(&check.type_)
        {
            assert!(
                !check.is_true(),
                "{} holds without a server or credentials",
                check.type_
            );
        }
    }
    let status = &checked.status;
    assert!(status["phase"].is_string(), "a status without phase: {status}");
    let conditions = status["conditions"].as_array().expect("a status has conditions");
    for check in &checked.checks {
        assert!(
            conditions
                .iter()
                .any(|condition| condition["type"] == check.type_),
            "the status lacks {}: {status}",
            check.type_
        );
    }
}
