//! The header policy: what a client may not send upstream, and the headers that tell
//! kube-apiserver whom to act as.
//!
//! * [`strip_client_credentials`] removes every header through which a client could claim an
//!   identity (`Authorization`, `Impersonate-*`, `X-Remote-*`, `X-Forwarded-For`) and reports the
//!   impersonation the client asked for, so the caller can refuse or check it.
//! * [`impersonation_headers`] builds `Impersonate-User`, `Impersonate-Group` (repeated),
//!   `Impersonate-Uid` and `Impersonate-Extra-<key>` (key percent-encoded as Kubernetes expects)
//!   for an authenticated user. A name that cannot be a header value (control characters) is an
//!   error, never silently altered.

use std::sync::Arc;

use crate::identity::{Identity, UserInfo};
use http::{HeaderMap, HeaderName, HeaderValue};

/// Header-name prefixes a client may never send upstream (lower case).
const FORBIDDEN_PREFIXES: [&str; 2] = ["impersonate-", "x-remote-"];
/// Header names a client may never send upstream (lower case).
const FORBIDDEN_NAMES: [&str; 2] = ["authorization", "x-forwarded-for"];

/// What the client's own `Impersonate-*` headers asked for (`kubectl --as`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RequestedImpersonation {
    /// `Impersonate-User`.
    pub user: Option<String>,
    /// `Impersonate-Group` values.
    pub groups: Vec<String>,
    /// `Impersonate-Uid`.
    pub uid: Option<String>,
    /// `Impersonate-Extra-<key>` values, keys decoded.
    pub extra: Vec<(String, String)>,
}

impl RequestedImpersonation {
    /// Whether the client asked to impersonate anything at all.
    pub fn is_requested(&self) -> bool {
        self.user.is_some() || !self.groups.is_empty() || self.uid.is_some() || !self.extra.is_empty()
    }
}

/// A client header the policy cannot accept.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HeaderError {
    /// An `Impersonate-*` value or `Impersonate-Extra-` key is not valid UTF-8 or percent-encoding,
    /// `Impersonate-User` or `Impersonate-Uid` comes more than once, or an `Impersonate-` header
    /// is none of those kube-apiserver knows.
    #[error("the {0} header is malformed")]
    Malformed(String),
    /// An identity field cannot be sent as a header value: it holds control characters, or
    /// starts or ends with whitespace (which HTTP strips, so another name would arrive).
    #[error("the {0} cannot be expressed as an HTTP header value")]
    Unrepresentable(&'static str),
    /// An identity field is empty where kube-apiserver would read an empty value as absent (an
    /// empty `Impersonate-User` means no impersonation at all: the request would run as the
    /// proxy itself).
    #[error("an empty {0} cannot be impersonated")]
    Empty(&'static str),
}

/// Whether a header must not travel upstream from a client.
pub fn is_client_credential(name: &HeaderName) -> bool {
    let name = name.as_str();
    FORBIDDEN_NAMES.contains(&name) || FORBIDDEN_PREFIXES.iter().any(|prefix| name.starts_with(prefix))
}

/// The client's credential and identity headers (to be removed), and the impersonation they ask
/// for. Malformed `Impersonate-*` headers are an error; the names are returned either way, so they
/// are removed whatever happens next.
pub fn client_credentials(
    headers: &HeaderMap,
) -> (Vec<HeaderName>, Result<RequestedImpersonation, HeaderError>) {
    let names: Vec<HeaderName> = headers
        .keys()
        .filter(|name| is_client_credential(name))
        .cloned()
        .collect();
    let mut requested = RequestedImpersonation::default();
    let mut error = None;
    for name in &names {
        let Some(what) = name.as_str().strip_prefix("impersonate-") else {
            continue;
        };
        for value in headers.get_all(name) {
            // UTF-8, not only visible ASCII: kube-apiserver takes the bytes as they are, and
            // `impersonation_headers` writes non-ASCII names that way too.
            let Ok(value) = std::str::from_utf8(value.as_bytes()).map(str::to_string) else {
                error.get_or_insert(HeaderError::Malformed(name.to_string()));
                continue;
            };
            match what {
                // A second user or uid is ambiguous (kube-apiserver would take the first, a
                // careless reader the last): refused, like any other malformed header.
                "user" | "uid" => {
                    let field = if what == "user" {
                        &mut requested.user
                    } else {
                        &mut requested.uid
                    };
                    if field.replace(value).is_some() {
                        error.get_or_insert(HeaderError::Malformed(name.to_string()));
                    }
                }
                "group" => requested.groups.push(value),
                _ => match what.strip_prefix("extra-").map(selkie_api::percent::decode) {
                    Some(Some(key)) if !key.is_empty() => requested.extra.push((key, value)),
                    _ => {
                        error.get_or_insert(HeaderError::Malformed(name.to_string()));
                    }
                },
            }
        }
    }
    let requested = match error {
        Some(error) => Err(error),
        None => Ok(requested),
    };
    (names, requested)
}

/// [`client_credentials`], removing the headers from `headers`.
pub fn strip_client_credentials(headers: &mut HeaderMap) -> Result<RequestedImpersonation, HeaderError> {
    let (names, requested) = client_credentials(headers);
    for name in names {
        headers.remove(name);
    }
    requested
}

/// The `Impersonate-*` headers that make kube-apiserver act as `user`. Refuses a user that
/// would arrive as someone else: an empty name or extra key, or a field with control characters
/// or with whitespace at either end.
pub fn impersonation_headers(user: &UserInfo) -> Result<Vec<(HeaderName, HeaderValue)>, HeaderError> {
    let value = |text: &str, what: &'static str| {
        if text.starts_with([' ', '\t']) || text.ends_with([' ', '\t']) {
            return Err(HeaderError::Unrepresentable(what));
        }
        HeaderValue::from_bytes(text.as_bytes()).map_err(|_| HeaderError::Unrepresentable(what))
    };
    if user.username.is_empty() {
        return Err(HeaderError::Empty("user name"));
    }
    let mut headers = Vec::with_capacity(2 + user.groups.len() + user.extra.len());
    headers.push((
        HeaderName::from_static("impersonate-user"),
        value(&user.username, "user name")?,
    ));
    if let Some(uid) = &user.uid {
        headers.push((HeaderName::from_static("impersonate-uid"), value(uid, "uid")?));
    }
    for group in &user.groups {
        headers.push((
            HeaderName::from_static("impersonate-group"),
            value(group, "group")?,
        ));
    }
    for (key, values) in &user.extra {
        if key.is_empty() {
            return Err(HeaderError::Empty("extra key"));
        }
        let name = HeaderName::from_bytes(format!("impersonate-extra-{}", percent_encode(key)).as_bytes())
            .map_err(|_| HeaderError::Unrepresentable("extra key"))?;
        for extra in values {
            headers.push((name.clone(), value(extra, "extra value")?));
        }
    }
    Ok(headers)
}

/// `Impersonate-*` headers built once and shared by many requests.
pub type SharedHeaders = Arc<[(HeaderName, HeaderValue)]>;

/// An identity and its [`impersonation_headers`] (or the reason there are none), built once: per
/// configuration snapshot for the static identity, per connection for a client certificate's
/// identity. Requests acting as exactly this identity (the same `Arc`) reuse the headers instead
/// of rebuilding them.
#[derive(Debug, Clone)]
pub struct PreparedIdentity {
    /// The identity the headers were built from.
    identity: Arc<Identity>,
    /// `impersonation_headers(&identity.user)`, shared. Private, so the pair cannot disagree.
    headers: Result<SharedHeaders, HeaderError>,
}

impl PreparedIdentity {
    /// Builds the headers of `identity` now.
    pub fn new(identity: Arc<Identity>) -> Self {
        let headers = impersonation_headers(&identity.user).map(SharedHeaders::from);
        Self { identity, headers }
    }

    /// The headers, if `identity` is the very identity (same allocation) they were built from;
    /// `None` otherwise, so the caller builds them itself.
    pub fn headers_for(&self, identity: &Arc<Identity>) -> Option<&Result<SharedHeaders, HeaderError>> {
        Arc::ptr_eq(&self.identity, identity).then_some(&self.headers)
    }
}

/// The [`PreparedIdentity`] of every identity an authenticator hands out again and again: a JWT
/// or webhook identity comes from the authenticator's result cache as the same `Arc` for every
/// request with that token, so its headers are built once and reused, for up to `capacity`
/// identities (least recently used go first). A capacity of 0 keeps nothing: every call builds.
pub struct PreparedCache {
    /// The identity's address → its prepared headers. The entry holds the identity itself, so
    /// the address cannot be reused by another identity while the entry lives.
    prepared: Option<quick_cache::sync::Cache<usize, PreparedIdentity>>,
}

impl std::fmt::Debug for PreparedCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PreparedCache")
            .field("entries", &self.prepared.as_ref().map_or(0, |cache| cache.len()))
            .finish()
    }
}

impl PreparedCache {
    /// Keeps the headers of up to `capacity` identities.
    pub fn new(capacity: usize) -> Self {
        Self {
            prepared: (capacity > 0).then(|| quick_cache::sync::Cache::new(capacity)),
        }
    }

    /// The [`impersonation_headers`] of `identity`: those built before for this very identity
    /// (same `Arc`), else built now and remembered.
    pub fn headers(&self, identity: &Arc<Identity>) -> Result<SharedHeaders, HeaderError> {
        let Some(cache) = &self.prepared else {
            return impersonation_headers(&identity.user).map(SharedHeaders::from);
        };
        let key = Arc::as_ptr(identity) as usize;
        if let Some(headers) = cache
            .get(&key)
            .and_then(|prepared| prepared.headers_for(identity).cloned())
        {
            return headers;
        }
        let prepared = PreparedIdentity::new(identity.clone());
        let headers = prepared.headers.clone();
        cache.insert(key, prepared);
        headers
    }
}

/// Percent-encodes an extra key as kube-apiserver decodes it (`url.PathUnescape`): bytes outside
/// the RFC 3986 unreserved set are `%xx`, and so are upper-case letters, because header names are
/// lower-case on the wire (the hex digits too) and the key's case must survive.
fn percent_encode(key: &str) -> String {
    let mut out = String::with_capacity(key.len());
    for byte in key.bytes() {
        if byte.is_ascii_lowercase() || byte.is_ascii_digit() || matches!(byte, b'-' | b'_' | b'.' | b'~') {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02x}"));
        }
    }
    out
}

#[cfg(test)]
mod tests;
