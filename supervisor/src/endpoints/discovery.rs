//! What a FederationDomain publishes about itself: its endpoint paths, its OpenID Connect
//! discovery document (the members and values Pinniped's Supervisor publishes, so the pinniped
//! CLI and any OIDC library find what they look for, plus `revocation_endpoint` for Selkie's
//! RFC 7009 endpoint, which clients that do not know it ignore), and its identity-provider
//! discovery document.

use selkie_api::supervisor_oidc::{IDPDiscoveryResponse, IDPType, PinnipedIDP, PinnipedSupportedIDPType};
use serde_json::{json, Value};

/// `/.well-known/openid-configuration`.
pub(crate) const WELL_KNOWN_PATH: &str = "/.well-known/openid-configuration";
/// `/oauth2/authorize`.
pub(crate) const AUTHORIZE_PATH: &str = "/oauth2/authorize";
/// `/oauth2/token`.
pub(crate) const TOKEN_PATH: &str = "/oauth2/token";
/// `/oauth2/revoke` (RFC 7009; Pinniped has none).
pub(crate) const REVOKE_PATH: &str = "/oauth2/revoke";
/// `/callback`: where upstream identity providers send the browser back.
pub(crate) const CALLBACK_PATH: &str = "/callback";
/// `/choose_identity_provider`.
pub(crate) const CHOOSE_IDP_PATH: &str = "/choose_identity_provider";
/// `/jwks.json`.
pub(crate) const JWKS_PATH: &str = "/jwks.json";
/// `/v1alpha1/pinniped_identity_providers`.
pub(crate) const IDP_DISCOVERY_PATH: &str = "/v1alpha1/pinniped_identity_providers";
/// `/saml/metadata`: the SAML service provider's metadata, and its entity ID (Selkie's, for
/// SAMLIdentityProviders).
pub(crate) const SAML_METADATA_PATH: &str = "/saml/metadata";
/// `/saml/acs`: the SAML assertion consumer service (HTTP-POST binding).
pub(crate) const SAML_ACS_PATH: &str = "/saml/acs";
/// `/login`: the Supervisor's own login form (LDAP and Active Directory in a browser).
pub(crate) const LOGIN_PATH: &str = "/login";
/// `/oauth2/device_authorization` (RFC 8628 §3.1; Selkie's, when enabled).
pub(crate) const DEVICE_AUTHORIZATION_PATH: &str = "/oauth2/device_authorization";
/// `/device`: the verification page where a user enters a device login's user code.
pub(crate) const DEVICE_PATH: &str = "/device";
/// `/device/callback`: where a device login's authorization request sends its code.
pub(crate) const DEVICE_CALLBACK_PATH: &str = "/device/callback";
/// The device authorization grant's type at the token endpoint (RFC 8628 §3.4).
pub(crate) const DEVICE_CODE_GRANT: &str = "urn:ietf:params:oauth:grant-type:device_code";

/// The scopes a FederationDomain supports.
pub(crate) const SCOPES: [&str; 5] = [
    "openid",
    "offline_access",
    "pinniped:request-audience",
    "username",
    "groups",
];
/// The custom claims of its ID tokens.
pub(crate) const CLAIMS: [&str; 3] = ["username", "groups", "additionalClaims"];

/// The discovery document of `issuer` (as configured, without a trailing slash); with
/// `device_authorization`, also its `device_authorization_endpoint` (RFC 8628 §4) and the grant
/// types it offers; with `dpop`, also the algorithms of the DPoP proofs it takes
/// (`dpop_signing_alg_values_supported`, RFC 9449 §5.1). Without either, Pinniped's document.
pub(crate) fn openid_configuration(issuer: &str, device_authorization: bool, dpop: bool) -> Value {
    let mut document = json!({
        "issuer": issuer,
        "authorization_endpoint": format!("{issuer}{AUTHORIZE_PATH}"),
        "token_endpoint": format!("{issuer}{TOKEN_PATH}"),
        "revocation_endpoint": format!("{issuer}{REVOKE_PATH}"),
        "jwks_uri": format!("{issuer}{JWKS_PATH}"),
        "response_types_supported": ["code"],
        "response_modes_supported": ["query", "form_post"],
        "subject_types_supported": ["public"],
        "id_token_signing_alg_values_supported": ["ES256"],
        "token_endpoint_auth_methods_supported": ["client_secret_basic"],
        "scopes_supported": SCOPES,
        "claims_supported": CLAIMS,
        "code_challenge_methods_supported": ["S256"],
        selkie_api::supervisor_oidc::SUPERVISOR_DISCOVERY_MEMBER: {
            "pinniped_identity_providers_endpoint": format!("{issuer}{IDP_DISCOVERY_PATH}"),
        },
    });
    if device_authorization {
        document["device_authorization_endpoint"] = json!(format!("{issuer}{DEVICE_AUTHORIZATION_PATH}"));
        document["grant_types_supported"] = json!([
            "authorization_code",
            "refresh_token",
            "urn:ietf:params:oauth:grant-type:token-exchange",
            DEVICE_CODE_GRANT,
        ]);
    }
    if dpop {
        document["dpop_signing_alg_values_supported"] = json!([selkie_oidc::dpop::ALGORITHM]);
    }
    document
}

/// The identity-provider discovery document: the FederationDomain's providers (sorted by name, as
/// Pinniped sorts them) and the types this Supervisor supports.
pub(crate) fn identity_providers(idps: &[PinnipedIDP]) -> IDPDiscoveryResponse {
    let mut sorted = idps.to_vec();
    sorted.sort_by(|a, b| a.name.cmp(&b.name));
    IDPDiscoveryResponse {
        pinniped_idps: sorted,
        pinniped_supported_idp_types: IDPType::ALL
            .iter()
            .map(|kind| PinnipedSupportedIDPType { r#type: *kind })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use selkie_api::supervisor_oidc::{IDPFlow, IDPSessions};

    use super::*;

    #[test]
    fn the_discovery_document_is_what_clients_read() {
        let document = openid_configuration("https://sso.example.com/team-a", false, false);
        assert_eq!(
            document["authorization_endpoint"],
            "https://sso.example.com/team-a/oauth2/authorize"
        );
        assert_eq!(
            document["token_endpoint"],
            "https://sso.example.com/team-a/oauth2/token"
        );
        assert_eq!(document["jwks_uri"], "https://sso.example.com/team-a/jwks.json");
        assert_eq!(
            document["revocation_endpoint"],
            "https://sso.example.com/team-a/oauth2/revoke"
        );
        assert_eq!(document["code_challenge_methods_supported"], json!(["S256"]));
        assert_eq!(
            document["id_token_signing_alg_values_supported"],
            json!(["ES256"])
        );
        assert_eq!(
            document["discovery.supervisor.pinniped.dev/v1alpha1"]["pinniped_identity_providers_endpoint"],
            "https://sso.example.com/team-a/v1alpha1/pinniped_identity_providers"
        );
        // The relying party of selkie-oidc (and so the CLI) reads it as a Supervisor's.
        let parsed: selkie_oidc::discovery::Discovery = serde_json::from_value(document.clone()).unwrap();
        assert!(parsed.is_supervisor());
        assert!(parsed.supports_form_post());
        assert!(document.get("device_authorization_endpoint").is_none());

        let device = openid_configuration("https://sso.example.com/team-a", true, false);
        assert_eq!(
            device["device_authorization_endpoint"],
            "https://sso.example.com/team-a/oauth2/device_authorization"
        );
        assert!(device["grant_types_supported"]
            .as_array()
            .unwrap()
            .contains(&json!(DEVICE_CODE_GRANT)));
        assert!(device.get("dpop_signing_alg_values_supported").is_none());
    }

    /// With DPoP on, the document says which proofs the token endpoint takes (RFC 9449 §5.1);
    /// off, it has no such member (Pinniped's document).
    #[test]
    fn the_discovery_document_lists_dpop_algorithms_only_when_enabled() {
        let off = openid_configuration("https://sso.example.com/team-a", false, false);
        assert!(off.get("dpop_signing_alg_values_supported").is_none());
        let on = openid_configuration("https://sso.example.com/team-a", false, true);
        assert_eq!(on["dpop_signing_alg_values_supported"], json!(["ES256"]));
        let mut without = on.clone();
        without
            .as_object_mut()
            .unwrap()
            .remove("dpop_signing_alg_values_supported");
        assert_eq!(without, off, "nothing else changes");
    }

    #[test]
    fn identity_providers_are_sorted_with_their_flows() {
        let document = serde_json::to_value(identity_providers(&[
            PinnipedIDP {
                name: "Okta".into(),
                r#type: IDPType::OIDC,
                flows: vec![IDPFlow::BrowserAuthcode, IDPFlow::CliPassword],
                sessions: None,
            },
            PinnipedIDP {
                name: "Corp LDAP".into(),
                r#type: IDPType::LDAP,
                flows: vec![IDPFlow::CliPassword, IDPFlow::BrowserAuthcode],
                sessions: Some(IDPSessions {
                    max_lifetime: "120h".into(),
                    idle_timeout: Some("8h".into()),
                }),
            },
        ]))
        .unwrap();
        assert_eq!(
            document["pinniped_identity_providers"],
            json!([
                {"name": "Corp LDAP", "type": "ldap", "flows": ["cli_password", "browser_authcode"],
                 "sessions": {"max_lifetime": "120h", "idle_timeout": "8h"}},
                {"name": "Okta", "type": "oidc", "flows": ["browser_authcode", "cli_password"]},
            ])
        );
        assert_eq!(
            document["pinniped_supported_identity_provider_types"],
            json!([{"type": "activedirectory"}, {"type": "github"}, {"type": "ldap"}, {"type": "oidc"}, {"type": "saml"}])
        );
    }
}
