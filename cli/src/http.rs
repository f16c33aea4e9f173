//! The CLI's client of one server (the Concierge or kube-apiserver, an issuer): selkie-oidc's
//! HTTPS client bound to a base URL and, optionally, an `Authorization` header sent on every
//! request. Responses are bounded; redirects are not followed.

use std::time::Duration;

use bytes::Bytes;
pub use selkie_oidc::https::{
    is_retryable_status, retrying, ClientIdentity, HttpError, Response, TlsOptions, RETRY_DELAYS,
};

/// The largest response body read.
pub const MAX_RESPONSE_BYTES: usize = 4 << 20;

/// An HTTPS client bound to one server.
pub struct HttpsClient {
    https: selkie_oidc::https::HttpsClient,
    base: String,
    authorization: Option<http::HeaderValue>,
}

impl std::fmt::Debug for HttpsClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpsClient")
            .field("base", &self.base)
            .finish_non_exhaustive()
    }
}

impl HttpsClient {
    /// A client for `base_url` (`https://host[:port][/prefix]`; request paths are appended to
    /// it), with `tls`, sending `authorization` (a full `Authorization` header value, e.g.
    /// `Bearer …`) on every request if given. Fails on a URL that is not https with a host, or
    /// TLS settings that cannot be used.
    pub fn new(
        base_url: &str,
        tls: &TlsOptions,
        authorization: Option<http::HeaderValue>,
    ) -> Result<Self, HttpError> {
        selkie_oidc::https::https_url(base_url)?;
        Ok(Self {
            https: selkie_oidc::https::HttpsClient::new(tls)?,
            base: base_url.trim_end_matches('/').to_string(),
            authorization,
        })
    }

    /// The URL of `path` on this server.
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// `POST`s `body` as JSON to `path` and returns the answer, whatever its status. `timeout`
    /// bounds connecting, sending and reading the whole answer; `None` waits indefinitely.
    pub async fn post_json(
        &self,
        path: &str,
        body: Vec<u8>,
        timeout: Option<Duration>,
    ) -> Result<Response, HttpError> {
        self.send(
            http::Method::POST,
            &self.url(path),
            &[
                (http::header::CONTENT_TYPE, "application/json".into()),
                (http::header::ACCEPT, "application/json".into()),
            ],
            body,
            timeout,
        )
        .await
    }

    /// Sends one request to `url` (absolute; any https URL, not only this client's base, with
    /// this client's TLS settings and authorization) with `headers` and `body` (empty for none),
    /// and returns the answer whatever its status, headers included. `timeout` bounds the whole
    /// exchange; `None` waits indefinitely. Header values are never part of an error (they may
    /// hold credentials).
    pub async fn send(
        &self,
        method: http::Method,
        url: &str,
        headers: &[(http::HeaderName, String)],
        body: Vec<u8>,
        timeout: Option<Duration>,
    ) -> Result<Response, HttpError> {
        let mut values = Vec::with_capacity(headers.len() + 1);
        if let Some(authorization) = &self.authorization {
            values.push((http::header::AUTHORIZATION, authorization.clone()));
        }
        for (name, value) in headers {
            let value = http::HeaderValue::from_str(value).map_err(|_| HttpError::BadUrl {
                url: url.to_string(),
                reason: format!("the {name} header value is not valid in HTTP"),
            })?;
            values.push((name.clone(), value));
        }
        self.https
            .send(
                method,
                url,
                &values,
                Bytes::from(body),
                MAX_RESPONSE_BYTES,
                timeout,
            )
            .await
    }
}
