//! The `cli_password` flow: the Supervisor logs in at the upstream itself with the
//! `Pinniped-Username` / `Pinniped-Password` headers (LDAP and Active Directory: the directory
//! checks them; OIDC: the password grant, when the upstream allows it), slowed down by the password
//! throttle ([`crate::idp::throttle`]), and redirects straight back to the client with the code.

use std::{sync::Arc, time::Instant};

use http::Response;

use crate::endpoints::authorize::unreachable_upstream;
use crate::endpoints::authorize::{AuthorizeRequest, Refusal, ResponseMode};
use crate::endpoints::code::issue_code;
use crate::endpoints::html::refused;
use crate::endpoints::oauth::{Code, OAuthError};
use crate::endpoints::{Body, Endpoints};
use crate::idp::ldap::LdapError;
use crate::idp::throttle::{Account, IdpObject, MAX_USERNAME_BYTES};
use crate::idp::{LdapLoginError, LdapUpstream, OidcUpstream, Upstream};
use crate::issuer::Issuer;
use crate::session::{self, Identity};

/// The `cli_password` flow.
pub(crate) async fn password_login(
    endpoints: &Endpoints,
    issuer: &Arc<Issuer>,
    idp: &Arc<Upstream>,
    request: AuthorizeRequest,
    username: &str,
    password: &str,
) -> Response<Body> {
    let back = |error: OAuthError| {
        refused(Refusal::Redirect {
            error,
            redirect_uri: request.redirect_uri.clone(),
            response_mode: ResponseMode::Query,
            state: Some(request.state.clone()),
        })
    };
    let (identity, upstream) = match idp.as_ref() {
        Upstream::Oidc(oidc) => {
            // Nothing to resolve the username to without sending the password: the throttle
            // counts the typed username, normalised, at the OIDCIdentityProvider object.
            let account = Account::username(IdpObject::of(idp), username);
            if let Err(wait) = may_try_password(endpoints, issuer, idp, username, &account) {
                return back(must_wait(wait));
            }
            match oidc_password_login(issuer, oidc, username, password).await {
                Ok(found) => {
                    endpoints.passwords.succeeded(&account);
                    found
                }
                Err((error, wrong_password)) => {
                    if wrong_password {
                        endpoints.passwords.failed(&account, Instant::now());
                    }
                    return back(error);
                }
            }
        }
        // The directory resolves the user first; the throttle counts its entry.
        Upstream::Ldap(ldap) => match ldap.login(&endpoints.passwords, username, password).await {
            Ok(found) => found,
            Err(LdapLoginError::MustWait(wait)) => {
                audit_must_wait(endpoints, issuer, idp, username);
                return back(must_wait(wait));
            }
            Err(LdapLoginError::Directory(error)) => {
                return back(ldap_refusal(endpoints, issuer, ldap, username, &error));
            }
        },
        Upstream::GitHub(_) => {
            return back(OAuthError::new(
                Code::AccessDenied,
                "Reason: GitHub identity providers support only the browser_authcode flow; log in with a browser.",
            ))
        }
        Upstream::Saml(_) => {
            return back(OAuthError::new(
                Code::AccessDenied,
                "Reason: SAML identity providers support only the browser_authcode flow; log in with a browser.",
            ))
        }
    };
    let mut request = request;
    request.response_mode = ResponseMode::Query;
    issue_code(endpoints, issuer, &request, identity, upstream).await
}

/// `Ok` when `account` (typed as `username`) may try a password at `idp` of `issuer` now
/// ([`crate::idp::throttle`]); otherwise — audited — how long it must still wait. The count is
/// the identity provider object's, shared by every FederationDomain that lists it.
pub(crate) fn may_try_password(
    endpoints: &Endpoints,
    issuer: &Issuer,
    idp: &Upstream,
    username: &str,
    account: &Account,
) -> Result<(), std::time::Duration> {
    endpoints
        .passwords
        .check(account, Instant::now())
        .inspect_err(|_| audit_must_wait(endpoints, issuer, idp, username))
}

/// The audit event of a password not even checked: the account typed as `username` at `idp` of
/// `issuer` must wait ([`crate::idp::throttle`]).
pub(crate) fn audit_must_wait(endpoints: &Endpoints, issuer: &Issuer, idp: &Upstream, username: &str) {
    endpoints
        .audit
        .too_many_failed_passwords(&issuer.issuer, idp.display_name(), username);
}

/// The `cli_password` flow's refusal of a password attempt whose account must still `wait`.
pub(crate) fn must_wait(wait: std::time::Duration) -> OAuthError {
    OAuthError::new(
        Code::AccessDenied,
        &format!(
            "Reason: too many failed logins for this username; try again in {} seconds.",
            wait.as_secs()
        ),
    )
}

/// The OIDC `cli_password` flow: the upstream's password grant, when it is allowed. A refusal
/// comes with whether the upstream refused the username or password (a failure to count). A
/// username longer than [`MAX_USERNAME_BYTES`] is refused as the upstream would refuse it,
/// without asking it, and counts nothing.
pub(crate) async fn oidc_password_login(
    issuer: &Arc<Issuer>,
    oidc: &OidcUpstream,
    username: &str,
    password: &str,
) -> Result<(Identity, session::Upstream), (OAuthError, bool)> {
    if !oidc.allow_password_grant {
        return Err((
            OAuthError::new(
                Code::AccessDenied,
                "Resource owner password credentials grant is not allowed for this upstream provider according to its configuration.",
            ),
            false,
        ));
    }
    if username.len() > MAX_USERNAME_BYTES {
        return Err((
            OAuthError::new(
                Code::AccessDenied,
                "Reason: the upstream identity provider did not accept the username or password.",
            ),
            false,
        ));
    }
    let tokens = match oidc
        .provider
        .password_grant(&oidc.client, username, password)
        .await
    {
        Ok(tokens) => tokens,
        Err(error) if error.is_retryable() => {
            tracing::warn!(issuer = %issuer.issuer, idp = %oidc.display_name, %error, "the upstream password grant failed");
            return Err((unreachable_upstream(), false));
        }
        Err(error) => {
            tracing::info!(issuer = %issuer.issuer, idp = %oidc.display_name, %error, "upstream password grant refused");
            return Err((
                OAuthError::new(
                    Code::AccessDenied,
                    "Reason: the upstream identity provider did not accept the username or password.",
                ),
                true,
            ));
        }
    };
    oidc.login(tokens)
        .map_err(|reason| (OAuthError::new(Code::AccessDenied, &reason), false))
}

/// The OAuth error of a failed LDAP login (logged, without the password): the directory's
/// failures are `temporarily_unavailable`, the user's are `access_denied` in Pinniped's words,
/// the same for an unknown user and a wrong password.
pub(crate) fn ldap_refusal(
    endpoints: &Endpoints,
    issuer: &Arc<Issuer>,
    ldap: &LdapUpstream,
    username: &str,
    error: &LdapError,
) -> OAuthError {
    if error.is_unavailable() {
        tracing::warn!(issuer = %issuer.issuer, idp = %ldap.display_name, %error, "the LDAP login could not be checked");
        return unreachable_upstream();
    }
    tracing::info!(issuer = %issuer.issuer, idp = %ldap.display_name, %error, "LDAP login refused");
    if *error == LdapError::InvalidCredentials {
        endpoints
            .audit
            .incorrect_password(&issuer.issuer, &ldap.display_name, username);
    }
    OAuthError::new(
        Code::AccessDenied,
        "Username/password not accepted by LDAP provider.",
    )
}
