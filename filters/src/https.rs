//! How authenticators reach the services they ask (TokenReview webhooks, kube-apiserver's
//! TokenReview and SubjectAccessReview): the credential they present ([`ClientAuth`]), a bearer
//! token that may change while they run ([`BearerTokenSource`], such as a [`TokenFile`] the
//! kubelet rotates), a client of selkie-oidc's one HTTPS client built from it, and the one
//! request shape of every Kubernetes review API.

use std::{
    path::{Path, PathBuf},
    sync::Arc,
    time::SystemTime,
};

use arc_swap::ArcSwapOption;
use bytes::Bytes;
use http::HeaderValue;
pub use selkie_oidc::https::TlsError as TlsConfigError;
use selkie_oidc::https::{accept_json, content_json, ClientIdentity, HttpError, HttpsClient, TlsOptions};

/// How an authenticator proves itself to the service it calls.
#[derive(Clone, Default)]
pub enum ClientAuth {
    /// No credential (Pinniped's WebhookAuthenticator).
    #[default]
    None,
    /// `Authorization: Bearer <token>`, a token fixed for the authenticator's lifetime.
    BearerToken(String),
    /// `Authorization: Bearer <token>` with the token the source holds when each request is sent
    /// (a service-account token the kubelet rotates). A request is not sent while the source has
    /// no token: the authenticator then fails closed.
    BearerTokenSource(Arc<dyn BearerTokenSource>),
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
            ClientAuth::BearerTokenSource(_) => "BearerTokenSource(<redacted>)",
            ClientAuth::Certificate { .. } => "Certificate(<redacted>)",
        })
    }
}

/// A bearer token that may change while the authenticators presenting it run. Asked once for
/// every request sent with it (never for a cached answer), so it must be cheap.
pub trait BearerTokenSource: Send + Sync {
    /// The `Authorization` header value to send now (`Bearer <token>`, marked sensitive so that
    /// `http`'s Debug never prints it), or `None` when no token is available.
    fn authorization(&self) -> Option<HeaderValue>;
}

/// The `Authorization` header of an authenticator's requests, as its [`ClientAuth`] says.
#[derive(Clone)]
pub(crate) enum Authorization {
    /// No header (no credential, or a client certificate).
    None,
    /// The same header for every request.
    Fixed(HeaderValue),
    /// The header of the source's current token.
    Source(Arc<dyn BearerTokenSource>),
}

impl std::fmt::Debug for Authorization {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Authorization::None => "None",
            Authorization::Fixed(_) => "Fixed(<redacted>)",
            Authorization::Source(_) => "Source(<redacted>)",
        })
    }
}

/// A fixed bearer token that cannot be an HTTP header value.
#[derive(Debug, thiserror::Error)]
#[error("the bearer token contains characters not allowed in an HTTP header")]
pub(crate) struct InvalidBearerToken;

/// A [`BearerTokenSource`] that has no token now: the request must not be sent.
#[derive(Debug, thiserror::Error)]
#[error("the bearer token source has no token")]
pub(crate) struct NoCurrentToken;

impl Authorization {
    /// The header `client_auth` sends; fails when a fixed token cannot be a header value.
    pub(crate) fn of(client_auth: &ClientAuth) -> Result<Self, InvalidBearerToken> {
        Ok(match client_auth {
            ClientAuth::BearerToken(token) => Self::Fixed(bearer(token).ok_or(InvalidBearerToken)?),
            ClientAuth::BearerTokenSource(source) => Self::Source(source.clone()),
            ClientAuth::None | ClientAuth::Certificate { .. } => Self::None,
        })
    }

    /// The header for the request about to be sent (`None`: no header); fails when the
    /// credential is a token source that has no token now.
    pub(crate) fn current(&self) -> Result<Option<HeaderValue>, NoCurrentToken> {
        match self {
            Self::None => Ok(None),
            Self::Fixed(value) => Ok(Some(value.clone())),
            Self::Source(source) => source.authorization().map(Some).ok_or(NoCurrentToken),
        }
    }
}

/// `Bearer <token>`, marked sensitive; `None` when it cannot be a header value.
fn bearer(token: &str) -> Option<HeaderValue> {
    let mut value = HeaderValue::try_from(format!("Bearer {token}")).ok()?;
    value.set_sensitive(true);
    Some(value)
}

/// A file holding a bearer token (a projected service-account token, which the kubelet rewrites
/// before the old token expires) and the `Authorization` header built from its last good content.
///
/// [`TokenFile::refresh`] re-reads the file when its modification time changed; a failed re-read
/// keeps the previous token, so a file caught half-rewritten never leaves the holder without one.
/// As a [`BearerTokenSource`] it refreshes before answering, so every request sent with it
/// carries the file's current token (one `stat` per request; the file is read only when it
/// changed). Its Debug output names the path only.
pub struct TokenFile {
    path: PathBuf,
    header: ArcSwapOption<(SystemTime, HeaderValue)>,
}

impl std::fmt::Debug for TokenFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenFile")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

/// Why a token file could not be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TokenFileError {
    /// The file could not be read.
    #[error("reading the token file {path}: {error}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The IO error.
        error: std::io::Error,
    },
    /// The file is empty or holds characters a header cannot carry.
    #[error("the token file {0} is empty or holds characters a bearer token cannot have")]
    Invalid(PathBuf),
}

impl TokenFile {
    /// Reads `path` now; fails if it is missing or unusable.
    pub fn open(path: PathBuf) -> Result<Self, TokenFileError> {
        let file = Self {
            path,
            header: ArcSwapOption::empty(),
        };
        file.refresh()?;
        Ok(file)
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Re-reads the file if its modification time changed. A failed re-read keeps the previous
    /// token (and is reported), so a file being rewritten never leaves the holder without one.
    pub fn refresh(&self) -> Result<(), TokenFileError> {
        let read_error = |error| TokenFileError::Read {
            path: self.path.clone(),
            error,
        };
        let modified = std::fs::metadata(&self.path)
            .and_then(|m| m.modified())
            .map_err(read_error)?;
        if self
            .header
            .load()
            .as_ref()
            .is_some_and(|current| current.0 == modified)
        {
            return Ok(());
        }
        let token = std::fs::read_to_string(&self.path).map_err(read_error)?;
        let token = token.trim();
        let header = (!token.is_empty())
            .then(|| bearer(token))
            .flatten()
            .ok_or_else(|| TokenFileError::Invalid(self.path.clone()))?;
        self.header.store(Some(Arc::new((modified, header))));
        Ok(())
    }

    /// The current `Authorization` header value, as last read (no IO).
    pub fn header(&self) -> Option<HeaderValue> {
        self.header.load().as_ref().map(|current| current.1.clone())
    }
}

impl BearerTokenSource for TokenFile {
    /// Refreshes (keeping the previous token if the file cannot be read now; whoever watches the
    /// file reports that), then the current header.
    fn authorization(&self) -> Option<HeaderValue> {
        if let Err(error) = self.refresh() {
            tracing::debug!(%error, "the token file could not be re-read; using the previous token");
        }
        self.header()
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
    authorization: Option<&HeaderValue>,
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

#[cfg(test)]
pub(crate) mod tests {
    use std::time::Duration;

    use super::*;

    /// A directory of its own under the system's temporary directory, removed when dropped.
    pub(crate) struct TempDir(pub(crate) PathBuf);

    impl TempDir {
        pub(crate) fn new() -> Self {
            static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
            let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let path = std::env::temp_dir().join(format!("selkie-filters-https-{}-{n}", std::process::id()));
            let _ = std::fs::remove_dir_all(&path);
            std::fs::create_dir_all(&path).unwrap();
            Self(path)
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// Writes `contents` and moves the modification time forward, as a kubelet rotation would.
    pub(crate) fn rewrite(path: &Path, contents: &str, age: Duration) {
        std::fs::write(path, contents).unwrap();
        let file = std::fs::File::options().write(true).open(path).unwrap();
        file.set_modified(SystemTime::now() + age).unwrap();
    }

    #[test]
    fn the_token_file_is_reread_when_it_changes_and_a_bad_rewrite_keeps_the_last_token() {
        let dir = TempDir::new();
        let path = dir.0.join("token");
        rewrite(&path, "first\n", Duration::ZERO);
        let file = TokenFile::open(path.clone()).unwrap();
        assert_eq!(file.header().unwrap(), "Bearer first");
        assert!(
            file.header().unwrap().is_sensitive(),
            "never printed by http's Debug"
        );

        rewrite(&path, "second", Duration::from_secs(10));
        assert_eq!(file.header().unwrap(), "Bearer first", "header() does no IO");
        file.refresh().unwrap();
        assert_eq!(file.header().unwrap(), "Bearer second");

        rewrite(&path, "  \n", Duration::from_secs(20));
        assert!(matches!(file.refresh(), Err(TokenFileError::Invalid(_))));
        assert_eq!(
            file.header().unwrap(),
            "Bearer second",
            "the previous token stays"
        );

        std::fs::remove_file(&path).unwrap();
        assert!(matches!(file.refresh(), Err(TokenFileError::Read { .. })));
        assert_eq!(file.header().unwrap(), "Bearer second");

        assert!(TokenFile::open(dir.0.join("missing")).is_err());
    }

    #[test]
    fn as_a_token_source_the_file_answers_with_its_current_token() {
        let dir = TempDir::new();
        let path = dir.0.join("token");
        rewrite(&path, "first", Duration::ZERO);
        let file = TokenFile::open(path.clone()).unwrap();
        let source: &dyn BearerTokenSource = &file;
        assert_eq!(source.authorization().unwrap(), "Bearer first");
        rewrite(&path, "second\n", Duration::from_secs(10));
        assert_eq!(
            source.authorization().unwrap(),
            "Bearer second",
            "no refresh needed in between"
        );
        std::fs::remove_file(&path).unwrap();
        assert_eq!(
            source.authorization().unwrap(),
            "Bearer second",
            "a file that went away keeps the last token"
        );
    }

    #[test]
    fn tokens_never_show_in_debug_output() {
        let dir = TempDir::new();
        let path = dir.0.join("token");
        rewrite(&path, "s3cr3t-t0ken", Duration::ZERO);
        let file = Arc::new(TokenFile::open(path).unwrap());
        let shown = format!("{file:?}");
        assert!(shown.contains("token") && !shown.contains("s3cr3t"), "{shown}");
        let auth = ClientAuth::BearerTokenSource(file.clone());
        assert_eq!(format!("{auth:?}"), "BearerTokenSource(<redacted>)");
        let authorization = Authorization::of(&auth).unwrap();
        assert!(!format!("{authorization:?}").contains("s3cr3t"));
        assert!(!format!("{:?}", authorization.current().unwrap()).contains("s3cr3t"));
        let fixed = Authorization::of(&ClientAuth::BearerToken("s3cr3t-t0ken".into())).unwrap();
        assert!(!format!("{fixed:?}").contains("s3cr3t"));
    }

    #[test]
    fn a_fixed_token_that_cannot_be_a_header_is_refused_and_a_source_without_token_fails() {
        assert!(Authorization::of(&ClientAuth::BearerToken("bad\ntoken".into())).is_err());
        struct Empty;
        impl BearerTokenSource for Empty {
            fn authorization(&self) -> Option<HeaderValue> {
                None
            }
        }
        let empty = Authorization::of(&ClientAuth::BearerTokenSource(Arc::new(Empty))).unwrap();
        assert!(empty.current().is_err());
        assert_eq!(
            Authorization::of(&ClientAuth::None).unwrap().current().unwrap(),
            None
        );
    }
}
