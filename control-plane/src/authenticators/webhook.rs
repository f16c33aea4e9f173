//! One WebhookAuthenticator pass: Pinniped's conditions in Pinniped's order
//! (`TLSConfigurationValid`, `EndpointURLValid`, `WebhookConnectionValid`, `AuthenticatorValid`).
//! The connection probe is a TCP connection and a TLS handshake with the configured CA bundle
//! (or the system roots); nothing is sent.

use std::{sync::Arc, time::Duration};

use http::Uri;
use rustls_pki_types::{pem::PemObject, CertificateDer, ServerName};
use selkie_api::authentication::{CertificateIdentity, WebhookAuthenticatorSpec};
use selkie_filters::{
    chain::TokenAuthenticator,
    identity,
    tokenreview::{TokenReviewAuthenticator, TokenReviewConfig},
};

use selkie_kube::tls_spec::TlsOutcome;

use super::Evaluation;
use selkie_kube::conditions::{Check, TYPE_AUTHENTICATOR_VALID};

/// `EndpointURLValid`.
pub(crate) const TYPE_ENDPOINT_URL_VALID: &str = "EndpointURLValid";
/// `WebhookConnectionValid`.
pub(crate) const TYPE_WEBHOOK_CONNECTION_VALID: &str = "WebhookConnectionValid";

/// How long the connection probe may take (Pinniped: 30 s).
const DIAL_TIMEOUT: Duration = Duration::from_secs(30);

/// Checks `endpoint`: an https URL with a host (and a valid port). Returns the condition and
/// the host and port to dial.
pub(crate) fn check_endpoint(endpoint: &str) -> (Check, Option<(String, u16)>) {
    let failure =
        |reason: &str, message: String| (Check::failure(TYPE_ENDPOINT_URL_VALID, reason, message), None);
    let uri: Uri = match endpoint.split('#').next().unwrap_or_default().parse() {
        Ok(uri) => uri,
        Err(e) => {
            return failure(
                "InvalidEndpointURL",
                format!("spec.endpoint URL cannot be parsed: {e}"),
            )
        }
    };
    if uri.scheme_str() != Some("https") {
        return failure(
            "InvalidEndpointURLScheme",
            format!("spec.endpoint URL {endpoint} has invalid scheme, require 'https'"),
        );
    }
    let Some(host) = uri.host().filter(|host| !host.is_empty()) else {
        return failure(
            "InvalidEndpointURL",
            "spec.endpoint URL is not valid: host is empty".into(),
        );
    };
    let host = host.trim_start_matches('[').trim_end_matches(']').to_string();
    let port = uri.port_u16().unwrap_or(443);
    (
        Check::success(TYPE_ENDPOINT_URL_VALID, "spec.endpoint is a valid URL"),
        Some((host, port)),
    )
}

/// Connects to `host:port` and completes a TLS handshake trusting `ca_bundle_pem` (or the
/// system roots). The error is one line for the condition's message.
pub(crate) async fn dial(host: &str, port: u16, ca_bundle_pem: Option<&str>) -> Result<(), String> {
    let mut roots = rustls::RootCertStore::empty();
    match ca_bundle_pem {
        Some(pem) => {
            let certificates = CertificateDer::pem_slice_iter(pem.as_bytes()).flatten();
            roots.add_parsable_certificates(certificates);
        }
        None => {
            roots.add_parsable_certificates(rustls_native_certs::load_native_certs().certs);
        }
    }
    let config =
        rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_root_certificates(roots)
            .with_no_client_auth();
    let server_name = ServerName::try_from(host.to_string()).map_err(|e| format!("{host}: {e}"))?;
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let address = if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    };
    let attempt = async {
        let tcp = tokio::net::TcpStream::connect(&address)
            .await
            .map_err(|e| format!("dial tcp {address}: {e}"))?;
        connector
            .connect(server_name, tcp)
            .await
            .map_err(|e| format!("tls handshake with {address}: {e}"))?;
        Ok::<(), String>(())
    };
    tokio::time::timeout(DIAL_TIMEOUT, attempt)
        .await
        .map_err(|_| format!("dial tcp {address}: no connection within {DIAL_TIMEOUT:?}"))?
}

fn connection_ok() -> Check {
    Check::success(
        TYPE_WEBHOOK_CONNECTION_VALID,
        "successfully dialed webhook server",
    )
}

fn authenticator_ok() -> Check {
    Check::success(TYPE_AUTHENTICATOR_VALID, "authenticator initialized")
}

/// Evaluates the CR `name`. See [`super::jwt::evaluate`] for `tls` and `already_serving`.
pub(crate) async fn evaluate(
    name: &str,
    spec: &WebhookAuthenticatorSpec,
    tls: &TlsOutcome,
    already_serving: bool,
) -> Evaluation {
    let (endpoint, target) = check_endpoint(&spec.endpoint);
    let mut checks = vec![tls.check.clone(), endpoint];
    let target = target.filter(|_| tls.ok());
    let Some((host, port)) = target else {
        checks
            .extend([TYPE_WEBHOOK_CONNECTION_VALID, TYPE_AUTHENTICATOR_VALID].map(Check::unable_to_validate));
        return Evaluation::invalid(checks);
    };
    if already_serving {
        checks.extend([connection_ok(), authenticator_ok()]);
        return Evaluation::unchanged(checks);
    }
    if let Err(error) = dial(&host, port, tls.ca_bundle_pem.as_deref()).await {
        checks.push(Check::failure(
            TYPE_WEBHOOK_CONNECTION_VALID,
            "UnableToDialServer",
            format!("cannot dial server: {error}"),
        ));
        checks.push(Check::unable_to_validate(TYPE_AUTHENTICATOR_VALID));
        return Evaluation {
            checks,
            built: None,
            retry: true,
        };
    }
    checks.push(connection_ok());
    let mut config = TokenReviewConfig::new(name, &spec.endpoint);
    config.ca_bundle_pem = tls.ca_bundle_pem.clone();
    config.certificate_identity = match spec.certificate_identity.unwrap_or_default() {
        CertificateIdentity::Exact => identity::CertificateIdentity::Exact,
        CertificateIdentity::UsernameAndGroups => identity::CertificateIdentity::UsernameAndGroups,
    };
    config.login_authorization = spec
        .login_authorization
        .as_ref()
        .map(crate::login_authorization::attributes);
    match TokenReviewAuthenticator::new(config) {
        Ok(authenticator) => {
            checks.push(authenticator_ok());
            Evaluation {
                checks,
                built: Some(TokenAuthenticator::TokenReview(Arc::new(authenticator))),
                retry: false,
            }
        }
        Err(error) => {
            checks.push(Check::failure(
                TYPE_AUTHENTICATOR_VALID,
                "UnableToCreateClient",
                format!("unable to create client for this webhook: {error}"),
            ));
            Evaluation::invalid(checks)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use selkie_kube::conditions::Status;

    #[test]
    fn endpoints_are_checked_like_pinniped() {
        let (check, target) = check_endpoint("https://webhook.example.com:8443/authenticate");
        assert!(check.is_true());
        assert_eq!(check.message, "spec.endpoint is a valid URL");
        assert_eq!(target, Some(("webhook.example.com".into(), 8443)));
        assert_eq!(check_endpoint("https://[::1]/x").1, Some(("::1".into(), 443)));

        let (check, target) = check_endpoint("http://webhook.example.com");
        assert_eq!(check.reason, "InvalidEndpointURLScheme");
        assert_eq!(
            check.message,
            "spec.endpoint URL http://webhook.example.com has invalid scheme, require 'https'"
        );
        assert_eq!(target, None);
        assert_eq!(check_endpoint("https://bad host").0.reason, "InvalidEndpointURL");
    }

    #[tokio::test]
    async fn an_endpoint_nobody_listens_on_cannot_be_dialed_and_is_retried() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        drop(listener);
        let tls = selkie_kube::tls_spec::validate(None, "ns", &super::super::NoSources);
        let spec = WebhookAuthenticatorSpec {
            endpoint: format!("https://127.0.0.1:{port}/authenticate"),
            tls: None,
            certificate_identity: None,
            login_authorization: None,
        };
        let evaluation = evaluate("w", &spec, &tls, false).await;
        let connection = &evaluation.checks[2];
        assert_eq!(connection.type_, "WebhookConnectionValid");
        assert_eq!(connection.status, Status::False);
        assert_eq!(connection.reason, "UnableToDialServer");
        assert!(
            connection
                .message
                .starts_with(&format!("cannot dial server: dial tcp 127.0.0.1:{port}: ")),
            "{connection:?}"
        );
        assert_eq!(evaluation.checks[3].status, Status::Unknown);
        assert!(evaluation.retry);
        assert!(evaluation.built.is_none());
    }
}
