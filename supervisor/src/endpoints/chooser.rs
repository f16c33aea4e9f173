//! `GET /choose_identity_provider`: the page a browser is sent to when a FederationDomain has
//! several identity providers and the authorization request named none (Pinniped's chooser).
//! Each identity provider is a link back to `oauth2/authorize` with the same request and
//! `pinniped_idp_name` added; the authorization endpoint checks the request again, so this page
//! only checks that it looks like one.

use http::{Response, StatusCode};

use super::{
    html::{html_escape, html_page},
    text, Body,
};
use crate::endpoints::discovery::AUTHORIZE_PATH;
use crate::idp::subject::query_escape;
use crate::issuer::Issuer;

/// The chooser page for the authorization request `query` (its raw query string): 400 when it
/// lacks `client_id`, `redirect_uri`, `scope` or `response_type`, 500 when the FederationDomain
/// has no identity provider to offer.
pub(super) fn choose(issuer: &Issuer, query: &str) -> Response<Body> {
    let has = |name: &str| form_urlencoded::parse(query.as_bytes()).any(|(key, _)| key == name);
    if !["client_id", "redirect_uri", "scope", "response_type"]
        .iter()
        .all(|name| has(name))
    {
        return text(
            StatusCode::BAD_REQUEST,
            "Bad Request: missing required query params (must include client_id, redirect_uri, scope, and response_type)",
        );
    }
    // The request as it came, less any pinniped_idp_name, which each link sets.
    let request: String = form_urlencoded::Serializer::new(String::new())
        .extend_pairs(form_urlencoded::parse(query.as_bytes()).filter(|(key, _)| key != "pinniped_idp_name"))
        .finish();
    let mut names: Vec<&str> = issuer.idps.iter().map(|idp| idp.display_name()).collect();
    if names.is_empty() {
        return text(
            StatusCode::INTERNAL_SERVER_ERROR,
            "Internal Server Error: please check the server's configuration: no valid identity providers found for this FederationDomain",
        );
    }
    names.sort_unstable();
    let links: String = names
        .iter()
        .map(|name| {
            let url = format!(
                "{}{AUTHORIZE_PATH}?{request}&pinniped_idp_name={}",
                issuer.issuer,
                query_escape(name)
            );
            format!(
                r#"<li><a class="idp" href="{}">{}</a></li>"#,
                html_escape(&url),
                html_escape(name)
            )
        })
        .collect();
    let page = format!(
        r#"<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1"><title>Choose Identity Provider</title><style>body{{font-family:system-ui,sans-serif;max-width:24rem;margin:4rem auto;padding:0 1rem;line-height:1.5}}ul{{list-style:none;padding:0}}li{{margin:.75rem 0}}a.idp{{display:block;padding:.6rem 1rem;border:1px solid #555;border-radius:4px;text-decoration:none;color:inherit}}a.idp:focus,a.idp:hover{{background:#eee}}</style></head><body><main aria-label="choose identity provider"><h1>Choose an identity provider to log in</h1><ul>{links}</ul></main></body></html>"#
    );
    html_page(
        page,
        "default-src 'none'; style-src 'unsafe-inline'; frame-ancestors 'none'",
    )
}

#[cfg(test)]
mod tests {
    use std::{sync::Arc, time::Duration};

    use bytes::Bytes;
    use selkie_api::supervisor_oidc::IDPType;

    use super::*;
    use selkie_oidc::jose::sign::SigningKey;

    use crate::idp::ldap::{Directory, DirectoryConfig, Flavor};
    use crate::idp::{LdapUpstream, Upstream};
    use crate::sealed::Sealer;
    use crate::session::tokens::TokenKey;

    fn issuer(names: &[&str]) -> Issuer {
        let url = "https://sso.example.com/fd";
        let tls = Arc::new(selkie_oidc::https::client_config(&Default::default()).unwrap());
        let idps = names
            .iter()
            .map(|name| {
                Arc::new(Upstream::Ldap(LdapUpstream {
                    display_name: name.to_string(),
                    resource_name: "ldap".into(),
                    resource_uid: String::new(),
                    kind: IDPType::LDAP,
                    directory: Arc::new(Directory::new(DirectoryConfig {
                        host: "ldap.example.com:636".into(),
                        tls: tls.clone(),
                        bind_dn: String::new(),
                        bind_password: String::new(),
                        user_search: Default::default(),
                        group_search: Default::default(),
                        timeout: Duration::from_secs(1),
                        flavor: Flavor::Ldap,
                    })),
                }))
            })
            .collect();
        Issuer::new(
            url.into(),
            url.into(),
            Arc::new(SigningKey::generate("k").unwrap()),
            Bytes::new(),
            Arc::new(TokenKey::new(&[1; 32])),
            Arc::new(Sealer::new(&[2; 32], url).unwrap()),
            idps,
            Default::default(),
            Default::default(),
        )
        .unwrap()
    }

    fn page(response: Response<Body>) -> String {
        let body =
            futures::executor::block_on(http_body_util::BodyExt::collect(response.into_body())).unwrap();
        String::from_utf8(body.to_bytes().to_vec()).unwrap()
    }

    const REQUEST: &str = "client_id=pinniped-cli&redirect_uri=http%3A%2F%2F127.0.0.1%3A1234%2Fcallback&scope=openid&response_type=code&state=s";

    #[test]
    fn every_identity_provider_links_back_to_the_authorization_request_sorted_by_name() {
        let response = choose(
            &issuer(&["Okta <corp>", "Corp LDAP"]),
            &format!("{REQUEST}&pinniped_idp_name=old"),
        );
        assert_eq!(response.status(), StatusCode::OK);
        let text = page(response);
        let ldap = text.find(">Corp LDAP<").expect("Corp LDAP listed");
        let okta = text.find(">Okta &lt;corp&gt;<").expect("Okta listed, escaped");
        assert!(ldap < okta, "{text}");
        assert!(
            text.contains(&format!(
                r#"href="https://sso.example.com/fd/oauth2/authorize?{}&amp;pinniped_idp_name=Corp+LDAP""#,
                REQUEST.replace('&', "&amp;")
            )),
            "{text}"
        );
        assert!(!text.contains("pinniped_idp_name=old"), "{text}");
        assert!(!text.contains("<script"), "{text}");
    }

    #[test]
    fn what_is_no_authorization_request_is_refused() {
        let response = choose(&issuer(&["a", "b"]), "client_id=pinniped-cli&scope=openid");
        assert_eq!(response.status(), StatusCode::BAD_REQUEST);
        assert_eq!(
            choose(&issuer(&[]), REQUEST).status(),
            StatusCode::INTERNAL_SERVER_ERROR
        );
    }
}
