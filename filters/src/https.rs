//! How authenticators reach the services they ask (TokenReview webhooks, kube-apiserver's
//! TokenReview and SubjectAccessReview): the credential they present ([`ClientAuth`]), a client
//! of selkie-oidc's one HTTPS client built from it, and the one request shape of every Kubernetes
//! review API.

use bytes::Bytes;
pub use selkie_oidc::https::TlsError as TlsConfigError;
use selkie_oidc::https::{accept_json, content_json, ClientIdentity, HttpError, HttpsClient, TlsOptions};

/// How an authenticator proves itself to the service it calls.
#[derive(Clone, Default)]
pub enum ClientAuth {
    /// No credential (Pinniped's WebhookAuthenticator).
    #[default]
    None,
    /// `Authorization: Bearer <token>`.
    BearerToken(String),
    /// A TLS client certificate and its private key, both PEM.
    Certificate {
        /// Certificate chain, PEM.
        cert_pem: String,
        /// Private key, PEM.
        key_pem: String,
    },
}

impl std::fmt::Debug for ClientAuth {
    // Credentials never appear in logs or debug output.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ClientAuth::None => "None",
            ClientAuth::BearerToken(_) => "BearerToken(<redacted>)",
            ClientAuth::Certificate { .. } => "Certificate(<redacted>)",
        })
    }
}

/// A client trusting `ca_bundle_pem` (or, when `None`, the system's roots) and presenting
/// `client_auth`'s certificate if it has one. Fails when either cannot be used.
pub(crate) fn client(
    ca_bundle_pem: Option<&str>,
    client_auth: &ClientAuth,
) -> Result<HttpsClient, TlsConfigError> {
    HttpsClient::new(&TlsOptions {
        ca_pem: ca_bundle_pem.map(|pem| pem.as_bytes().to_vec()),
        client_identity: match client_auth {
            ClientAuth::Certificate { cert_pem, key_pem } => Some(ClientIdentity {
                cert_pem: cert_pem.as_bytes().to_vec(),
                key_pem: key_pem.as_bytes().to_vec(),
            }),
            _ => None,
        },
        ..TlsOptions::default()
    })
}

/// POSTs the JSON `body` to `uri` (with `authorization` as the `Authorization` header, if any)
/// and reads at most `limit` bytes of a 2xx answer: the one request shape of every Kubernetes
/// review API. The caller bounds the time. A non-2xx answer is [`HttpError::Status`].
pub(crate) async fn post_json(
    client: &HttpsClient,
    uri: &http::Uri,
    body: Bytes,
    authorization: Option<&http::HeaderValue>,
    limit: usize,
) -> Result<Bytes, HttpError> {
    let mut headers = vec![content_json(), accept_json()];
    if let Some(value) = authorization {
        headers.push((http::header::AUTHORIZATION, value.clone()));
    }
    client
        .send(http::Method::POST, &uri.to_string(), &headers, body, limit, None)
        .await?
        .success()
}
