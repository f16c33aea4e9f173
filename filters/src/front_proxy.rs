//! Who is calling the aggregated API, decided the way a Kubernetes extension API server decides it
//! from `kube-system/extension-apiserver-authentication`:
//!
//! 1. a client certificate that chains to `requestheader-client-ca-file` (with the clientAuth
//!    usage) and whose CN is in `requestheader-allowed-names` (an empty list allows any CN) is
//!    kube-apiserver's front proxy: only then are the `requestheader-*-headers`
//!    (`X-Remote-User`, `X-Remote-Uid`, `X-Remote-Group`, `X-Remote-Extra-*`) read, and the user
//!    they name is the caller;
//! 2. otherwise a client certificate that chains to `client-ca-file` is a user by itself (`CN` is
//!    the name, every `O` a group);
//! 3. anything else — no certificate, an untrusted one, a front-proxy certificate without a user
//!    header — is `system:anonymous` in `system:unauthenticated`.
//!
//! Authenticated users get `system:authenticated` unless they already carry it (or
//! `system:unauthenticated`), as kube-apiserver's authenticated-group adder does.
//!
//! The TLS layer asks for a client certificate but only checks that the peer holds its key
//! ([`crate::possession::PossessionVerifier`]); the chain is verified here, against the trust anchors of the
//! current ConfigMap, so a rotated front-proxy or client CA takes effect without a restart.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use crate::{identity::UserInfo, outcome::Outcome, x509::X509Authenticator};
use http::{HeaderMap, HeaderName};
use rustls_pki_types::{CertificateDer, UnixTime};

/// The namespace of the ConfigMap kube-apiserver publishes its client authentication settings in.
pub const AUTHENTICATION_CONFIG_MAP_NAMESPACE: &str = "kube-system";
/// Its name.
pub const AUTHENTICATION_CONFIG_MAP_NAME: &str = "extension-apiserver-authentication";

/// The anonymous user's name.
pub const ANONYMOUS_USER: &str = "system:anonymous";
/// The anonymous user's group.
pub const UNAUTHENTICATED_GROUP: &str = "system:unauthenticated";
/// The group of every authenticated user.
pub const AUTHENTICATED_GROUP: &str = "system:authenticated";

/// Tolerance for clocks that disagree about a client certificate's validity: none, as
/// kube-apiserver and every extension API server built on its libraries.
const CLOCK_SKEW: Duration = crate::x509::DEFAULT_CLOCK_SKEW;

/// The front proxy's trust and the headers it names the user in.
#[derive(Debug)]
struct FrontProxy {
    verifier: X509Authenticator,
    allowed_names: Vec<String>,
    username_headers: Vec<HeaderName>,
    uid_headers: Vec<HeaderName>,
    group_headers: Vec<HeaderName>,
    /// Lower-cased.
    extra_prefixes: Vec<String>,
}

/// The client authentication settings of one version of the ConfigMap.
#[derive(Debug, Default)]
pub struct Authentication {
    front_proxy: Option<FrontProxy>,
    client_ca: Option<X509Authenticator>,
}

/// What a connection's client certificate is worth under one [`Authentication`], until
/// `recheck_at`; computed once per connection and settings, and again once a certificate of the
/// chain has expired.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CertificateVerdict {
    /// The certificate is the front proxy's: the request headers name the user.
    front_proxy: bool,
    /// The certificate is a user's of `client-ca-file`.
    client_user: Option<UserInfo>,
    /// From this moment on the verdict must be computed again (see
    /// [`crate::x509::Verdict::recheck_at`]); `None`: not before the settings change.
    recheck_at: Option<UnixTime>,
}

impl CertificateVerdict {
    /// Whether the verdict still holds at `now`.
    fn holds_at(&self, now: UnixTime) -> bool {
        self.recheck_at.is_none_or(|at| now.as_secs() < at.as_secs())
    }
}

impl Authentication {
    /// Reads the ConfigMap's `data`. Missing keys disable what they configure (no
    /// `requestheader-client-ca-file`: no header is ever trusted; no `client-ca-file`: client
    /// certificates are not users). Fails, naming the key, if a CA bundle or a list is unreadable.
    pub fn from_config_map(data: &BTreeMap<String, String>) -> Result<Self, String> {
        let list = |key: &str| -> Result<Vec<String>, String> {
            match data.get(key).map(|value| value.trim()) {
                None | Some("") => Ok(Vec::new()),
                Some(value) => serde_json::from_str::<Vec<String>>(value)
                    .map_err(|e| format!("{key} is not a JSON list of strings: {e}")),
            }
        };
        let header_names = |key: &str| -> Result<Vec<HeaderName>, String> {
            list(key)?
                .iter()
                .filter(|name| !name.is_empty())
                .map(|name| {
                    HeaderName::from_bytes(name.trim().as_bytes())
                        .map_err(|_| format!("{key} holds an invalid header name {name:?}"))
                })
                .collect()
        };
        let bundle = |key: &str| -> Result<Option<X509Authenticator>, String> {
            match data.get(key).map(|value| value.trim()) {
                None | Some("") => Ok(None),
                Some(pem) => X509Authenticator::new(key.to_string(), &[pem], CLOCK_SKEW)
                    .map(Some)
                    .map_err(|e| format!("{key}: {e}")),
            }
        };
        let front_proxy = match bundle("requestheader-client-ca-file")? {
            Some(verifier) => Some(FrontProxy {
                verifier,
                allowed_names: list("requestheader-allowed-names")?,
                username_headers: header_names("requestheader-username-headers")?,
                uid_headers: header_names("requestheader-uid-headers")?,
                group_headers: header_names("requestheader-group-headers")?,
                extra_prefixes: list("requestheader-extra-headers-prefix")?
                    .into_iter()
                    .filter(|prefix| !prefix.is_empty())
                    .map(|prefix| prefix.to_ascii_lowercase())
                    .collect(),
            }),
            None => None,
        };
        Ok(Self {
            front_proxy,
            client_ca: bundle("client-ca-file")?,
        })
    }

    /// What the peer's certificate chain (leaf first; empty when none was presented) is worth now.
    pub fn verdict(&self, chain: &[CertificateDer<'_>]) -> CertificateVerdict {
        self.verdict_at(chain, UnixTime::now())
    }

    /// What the peer's certificate chain is worth at `now`, and until when.
    pub fn verdict_at(&self, chain: &[CertificateDer<'_>], now: UnixTime) -> CertificateVerdict {
        if chain.is_empty() {
            return CertificateVerdict::default();
        }
        let mut recheck_at: Option<UnixTime> = None;
        let mut verify = |x509: &X509Authenticator| {
            let verdict = x509.verdict_at(chain, now);
            if let Some(at) = verdict.recheck_at {
                recheck_at = Some(recheck_at.map_or(at, |earlier| earlier.min(at)));
            }
            verdict.outcome
        };
        let front_proxy = self.front_proxy.as_ref().is_some_and(|front_proxy| {
            match verify(&front_proxy.verifier) {
                Outcome::Authenticated(identity) => {
                    let allowed = front_proxy.allowed_names.is_empty()
                        || front_proxy
                            .allowed_names
                            .iter()
                            .any(|name| *name == identity.user.username);
                    if !allowed {
                        tracing::debug!(
                            common_name = %identity.user.username,
                            "a front-proxy CA certificate whose name is not in requestheader-allowed-names"
                        );
                    }
                    allowed
                }
                _ => false,
            }
        });
        let client_user = match self.client_ca.as_ref().map(&mut verify) {
            Some(Outcome::Authenticated(identity)) => Some(identity.user.clone()),
            _ => None,
        };
        CertificateVerdict {
            front_proxy,
            client_user,
            recheck_at,
        }
    }

    /// The caller of a request with `headers` on a connection whose certificate got `verdict`.
    pub fn user(&self, verdict: &CertificateVerdict, headers: &HeaderMap) -> UserInfo {
        let from_headers = match (&self.front_proxy, verdict.front_proxy) {
            (Some(front_proxy), true) => front_proxy.user(headers),
            _ => None,
        };
        match from_headers.or_else(|| verdict.client_user.clone()) {
            Some(user) => with_authenticated_group(user),
            None => anonymous(),
        }
    }
}

impl FrontProxy {
    /// The user the front proxy names, or `None` when no user header has a value.
    fn user(&self, headers: &HeaderMap) -> Option<UserInfo> {
        let first = |names: &[HeaderName]| {
            names.iter().find_map(|name| {
                headers
                    .get(name)
                    .and_then(|value| value.to_str().ok())
                    .filter(|value| !value.is_empty())
                    .map(str::to_string)
            })
        };
        let username = first(&self.username_headers)?;
        let groups = self
            .group_headers
            .iter()
            .flat_map(|name| headers.get_all(name))
            .filter_map(|value| value.to_str().ok())
            .filter(|value| !value.is_empty())
            .map(str::to_string)
            .collect();
        let mut extra: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for prefix in &self.extra_prefixes {
            for (name, value) in headers {
                let Some(key) = name.as_str().strip_prefix(prefix.as_str()) else {
                    continue;
                };
                if key.is_empty() {
                    continue;
                }
                let Ok(value) = value.to_str() else { continue };
                extra
                    .entry(percent_decode(key))
                    .or_default()
                    .push(value.to_string());
            }
        }
        Some(UserInfo {
            username,
            uid: first(&self.uid_headers),
            groups,
            extra,
        })
    }
}

/// `system:anonymous` in `system:unauthenticated`.
pub fn anonymous() -> UserInfo {
    UserInfo {
        username: ANONYMOUS_USER.into(),
        groups: vec![UNAUTHENTICATED_GROUP.into()],
        ..UserInfo::default()
    }
}

fn with_authenticated_group(mut user: UserInfo) -> UserInfo {
    let has_marker = user
        .groups
        .iter()
        .any(|group| group == AUTHENTICATED_GROUP || group == UNAUTHENTICATED_GROUP);
    if !has_marker {
        user.groups.push(AUTHENTICATED_GROUP.into());
    }
    user
}

/// `%XX` sequences decoded (extra keys are path-escaped by kube-apiserver); the key as it is
/// when it is not valid escaping or not UTF-8, as Kubernetes keeps malformed keys.
fn percent_decode(key: &str) -> String {
    selkie_api::percent::decode(key).unwrap_or_else(|| key.to_string())
}

/// The verdict cache of one connection: recomputed when the settings change and when a
/// certificate of the chain expires, so that every request is judged by a certificate valid now
/// under the settings it runs with.
#[derive(Debug, Default)]
pub struct ConnectionVerdict {
    cached: std::sync::Mutex<Option<(Arc<Authentication>, CertificateVerdict)>>,
}

impl ConnectionVerdict {
    /// The verdict of `chain` under `authentication` now; see [`ConnectionVerdict::get_at`].
    pub fn get(
        &self,
        authentication: &Arc<Authentication>,
        chain: &[CertificateDer<'_>],
    ) -> CertificateVerdict {
        self.get_at(authentication, chain, UnixTime::now())
    }

    /// The verdict of `chain` under `authentication` at `now`, from the cache when the settings
    /// are the ones it was computed for and it still holds.
    pub fn get_at(
        &self,
        authentication: &Arc<Authentication>,
        chain: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> CertificateVerdict {
        let mut cached = self
            .cached
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some((settings, verdict)) = cached.as_ref() {
            if Arc::ptr_eq(settings, authentication) && verdict.holds_at(now) {
                return verdict.clone();
            }
        }
        let verdict = authentication.verdict_at(chain, now);
        *cached = Some((authentication.clone(), verdict.clone()));
        verdict
    }
}

#[cfg(test)]
mod tests {
    use crate::issuing::signer::ClientCertificateSigner;
    use http::HeaderValue;
    use rcgen::{
        BasicConstraints, CertificateParams, CertifiedIssuer, DistinguishedName as Dn, DnType, IsCa, KeyPair,
        KeyUsagePurpose,
    };
    use rustls_pki_types::pem::PemObject;

    use super::*;

    struct Ca {
        pem: String,
        signer: ClientCertificateSigner,
    }

    fn ca(name: &str) -> Ca {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::default();
        params.distinguished_name = Dn::new();
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::DigitalSignature];
        let issuer = CertifiedIssuer::self_signed(params, key).unwrap();
        let signer = ClientCertificateSigner::from_pem(&issuer.pem(), &issuer.key().serialize_pem()).unwrap();
        Ca {
            pem: issuer.pem(),
            signer,
        }
    }

    fn client_cert(ca: &Ca, user: &str, groups: &[&str]) -> Vec<CertificateDer<'static>> {
        let now = std::time::SystemTime::now();
        let issued = ca
            .signer
            .issue(
                user,
                groups,
                now - Duration::from_secs(60),
                now + Duration::from_secs(600),
            )
            .unwrap();
        vec![CertificateDer::from_pem_slice(issued.cert_pem.as_bytes()).unwrap()]
    }

    fn config_map(front_proxy_ca: &Ca, client_ca: &Ca, allowed: &str) -> BTreeMap<String, String> {
        [
            ("client-ca-file", client_ca.pem.as_str()),
            ("requestheader-client-ca-file", front_proxy_ca.pem.as_str()),
            ("requestheader-allowed-names", allowed),
            ("requestheader-username-headers", r#"["X-Remote-User"]"#),
            ("requestheader-uid-headers", r#"["X-Remote-Uid"]"#),
            ("requestheader-group-headers", r#"["X-Remote-Group"]"#),
            ("requestheader-extra-headers-prefix", r#"["X-Remote-Extra-"]"#),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
    }

    fn forged_headers() -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert("x-remote-user", HeaderValue::from_static("mallory"));
        headers.append("x-remote-group", HeaderValue::from_static("system:masters"));
        headers.append("x-remote-group", HeaderValue::from_static("devs"));
        headers.insert("x-remote-uid", HeaderValue::from_static("42"));
        headers.insert(
            "x-remote-extra-acme.com%2fproject",
            HeaderValue::from_static("blue"),
        );
        headers
    }

    #[test]
    fn headers_are_trusted_only_from_an_allowed_front_proxy_certificate() {
        let (front, client) = (ca("front-proxy-ca"), ca("client-ca"));
        let auth = Authentication::from_config_map(&config_map(&front, &client, r#"["front-proxy-client"]"#))
            .unwrap();
        let headers = forged_headers();

        let proxy = auth.verdict(&client_cert(&front, "front-proxy-client", &[]));
        let user = auth.user(&proxy, &headers);
        assert_eq!(user.username, "mallory");
        assert_eq!(user.uid.as_deref(), Some("42"));
        assert_eq!(user.groups, ["system:masters", "devs", "system:authenticated"]);
        assert_eq!(user.extra["acme.com/project"], ["blue"]);

        // The front-proxy CA, but a name that is not allowed: the headers mean nothing.
        let other = auth.verdict(&client_cert(&front, "someone-else", &[]));
        assert_eq!(auth.user(&other, &headers), anonymous());
        // No certificate, or one of an unknown CA: anonymous.
        assert_eq!(auth.user(&auth.verdict(&[]), &headers), anonymous());
        let stranger = auth.verdict(&client_cert(&ca("evil"), "front-proxy-client", &[]));
        assert_eq!(auth.user(&stranger, &headers), anonymous());

        // A user of the client CA is that user, whatever the headers say.
        let alice = auth.verdict(&client_cert(&client, "alice", &["ops"]));
        let user = auth.user(&alice, &headers);
        assert_eq!(user.username, "alice");
        assert_eq!(user.groups, ["ops", "system:authenticated"]);

        // The front proxy without a user header is nobody.
        assert_eq!(auth.user(&proxy, &HeaderMap::new()), anonymous());
    }

    #[test]
    fn an_empty_allowed_names_list_allows_any_front_proxy_name() {
        let (front, client) = (ca("front-proxy-ca"), ca("client-ca"));
        let auth = Authentication::from_config_map(&config_map(&front, &client, "[]")).unwrap();
        let verdict = auth.verdict(&client_cert(&front, "anything", &[]));
        assert_eq!(auth.user(&verdict, &forged_headers()).username, "mallory");
    }

    #[test]
    fn without_requestheader_settings_no_header_is_trusted() {
        let client = ca("client-ca");
        let mut data = BTreeMap::new();
        data.insert("client-ca-file".to_string(), client.pem.clone());
        let auth = Authentication::from_config_map(&data).unwrap();
        let verdict = auth.verdict(&client_cert(&client, "bob", &[]));
        assert_eq!(auth.user(&verdict, &forged_headers()).username, "bob");
        let auth = Authentication::default();
        assert_eq!(
            auth.user(
                &auth.verdict(&client_cert(&client, "bob", &[])),
                &forged_headers()
            ),
            anonymous()
        );
    }

    #[test]
    fn unreadable_settings_name_their_key() {
        let mut data = BTreeMap::new();
        data.insert(
            "requestheader-client-ca-file".to_string(),
            "not a pem".to_string(),
        );
        let error = Authentication::from_config_map(&data).unwrap_err();
        assert!(error.starts_with("requestheader-client-ca-file"), "{error}");
        let front = ca("front");
        let mut data = config_map(&front, &ca("client"), "front-proxy-client");
        let error = Authentication::from_config_map(&data).unwrap_err();
        assert!(error.starts_with("requestheader-allowed-names"), "{error}");
        data.insert("requestheader-allowed-names".into(), "[]".into());
        data.insert(
            "requestheader-username-headers".into(),
            r#"["bad header"]"#.into(),
        );
        let error = Authentication::from_config_map(&data).unwrap_err();
        assert!(error.contains("invalid header name"), "{error}");
    }

    #[test]
    fn extra_keys_are_unescaped_like_kubernetes() {
        assert_eq!(percent_decode("acme.com%2fproject"), "acme.com/project");
        assert_eq!(percent_decode("plain"), "plain");
        assert_eq!(percent_decode("bad%zz"), "bad%zz");
        assert_eq!(percent_decode("cut%2"), "cut%2");
    }

    #[test]
    fn authenticated_users_get_the_group_once() {
        let user = with_authenticated_group(UserInfo {
            username: "a".into(),
            groups: vec![AUTHENTICATED_GROUP.into()],
            ..UserInfo::default()
        });
        assert_eq!(user.groups, [AUTHENTICATED_GROUP]);
    }

    #[test]
    fn a_connection_verdict_ends_when_its_certificate_expires() {
        let (front, client) = (ca("front"), ca("client"));
        let auth = Arc::new(
            Authentication::from_config_map(&config_map(&front, &client, r#"["front-proxy-client"]"#))
                .unwrap(),
        );
        // Valid from a minute ago for ten minutes (see `client_cert`).
        let chain = client_cert(&front, "front-proxy-client", &[]);
        let now = UnixTime::now();
        let later = |seconds: u64| UnixTime::since_unix_epoch(Duration::from_secs(now.as_secs() + seconds));
        let mut headers = HeaderMap::new();
        headers.insert("x-remote-user", HeaderValue::from_static("alice"));

        let connection = ConnectionVerdict::default();
        let at_start = connection.get_at(&auth, &chain, now);
        assert_eq!(auth.user(&at_start, &headers).username, "alice");
        let before_expiry = connection.get_at(&auth, &chain, later(590));
        assert_eq!(auth.user(&before_expiry, &headers).username, "alice");
        // The same connection, once notAfter has passed: the front proxy is nobody.
        let after_expiry = connection.get_at(&auth, &chain, later(602));
        assert_eq!(auth.user(&after_expiry, &headers), anonymous());
    }
}
