//! The rows: every system under test (D, N, H, S0, SX, SJ, SW, SR and the K rows), its id on the
//! command line and in the results, its description, and the steps and groups it belongs to.

use anyhow::Context as _;
use serde::Serialize;

use crate::{PATH, PODS_PATH};

/// The JWT signature algorithm of an SJ row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum JwtAlg {
    /// RSA PKCS#1 v1.5 with SHA-256, 2048-bit key.
    Rs256,
    /// ECDSA P-256 with SHA-256.
    Es256,
}

impl JwtAlg {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Rs256 => "RS256",
            Self::Es256 => "ES256",
        }
    }
}

/// One system under test.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum System {
    /// Straight to the backend.
    D,
    /// nginx.
    N,
    /// haproxy.
    H,
    /// Selkie, static identity.
    S0,
    /// Selkie, client certificates.
    SX,
    /// Selkie, bearer JWTs.
    SJ {
        /// The signature algorithm.
        alg: JwtAlg,
        /// How many distinct tokens the client rotates over.
        tokens: u32,
        /// Selkie's result cache on (`false`: `cache: {enabled: false}`, every token verified).
        cache: bool,
    },
    /// Selkie, TokenReview webhook: `miss` = a token never seen before on every request.
    SW {
        /// Every request a new token (cache miss) instead of one token (cache hit).
        miss: bool,
    },
    /// S0 while its configuration file is rewritten 10 times a second.
    SR,
    /// The real kube-apiserver, directly (admin certificate + `Impersonate-*`).
    KD {
        /// List the pods instead of GETting the ConfigMap.
        list: bool,
    },
    /// Selkie (static identity) in front of the real kube-apiserver.
    KS0 {
        /// List the pods instead of GETting the ConfigMap.
        list: bool,
    },
}

impl System {
    pub(crate) fn parse(text: &str) -> anyhow::Result<Self> {
        let known = "D, N, H, S0, SX, SJ-<RS256|ES256>-<count, e.g. 1, 100, 10k>[-nocache], SW-hit, \
                     SW-miss, SR, K-D, K-S0, K-D-list, K-S0-list";
        Ok(match text {
            "D" => Self::D,
            "N" => Self::N,
            "H" => Self::H,
            "S0" => Self::S0,
            "SX" => Self::SX,
            "SW-hit" => Self::SW { miss: false },
            "SW-miss" => Self::SW { miss: true },
            "SR" => Self::SR,
            "K-D" => Self::KD { list: false },
            "K-S0" => Self::KS0 { list: false },
            "K-D-list" => Self::KD { list: true },
            "K-S0-list" => Self::KS0 { list: true },
            _ => {
                let Some(rest) = text.strip_prefix("SJ-") else {
                    anyhow::bail!("unknown system {text:?} ({known})");
                };
                let (rest, cache) = match rest.strip_suffix("-nocache") {
                    Some(rest) => (rest, false),
                    None => (rest, true),
                };
                let (alg, count) = rest
                    .split_once('-')
                    .with_context(|| format!("unknown system {text:?} ({known})"))?;
                let alg = match alg {
                    "RS256" => JwtAlg::Rs256,
                    "ES256" => JwtAlg::Es256,
                    _ => anyhow::bail!("unknown JWT algorithm in {text:?} ({known})"),
                };
                let tokens = match count.strip_suffix('k') {
                    Some(thousands) => thousands.parse::<u32>().map(|k| k.saturating_mul(1000)),
                    None => count.parse::<u32>(),
                }
                .ok()
                .filter(|n| (1..=1_000_000).contains(n))
                .with_context(|| format!("{text:?}: the token count must be 1 to 1000k"))?;
                Self::SJ { alg, tokens, cache }
            }
        })
    }

    /// The row id, as given on the command line.
    pub(crate) fn id(self) -> String {
        match self {
            Self::D => "D".into(),
            Self::N => "N".into(),
            Self::H => "H".into(),
            Self::S0 => "S0".into(),
            Self::SX => "SX".into(),
            Self::SJ { alg, tokens, cache } => {
                let count = if tokens >= 1000 && tokens % 1000 == 0 {
                    format!("{}k", tokens / 1000)
                } else {
                    tokens.to_string()
                };
                let suffix = if cache { "" } else { "-nocache" };
                format!("SJ-{}-{count}{suffix}", alg.name())
            }
            Self::SW { miss: false } => "SW-hit".into(),
            Self::SW { miss: true } => "SW-miss".into(),
            Self::SR => "SR".into(),
            Self::KD { list: false } => "K-D".into(),
            Self::KS0 { list: false } => "K-S0".into(),
            Self::KD { list: true } => "K-D-list".into(),
            Self::KS0 { list: true } => "K-S0-list".into(),
        }
    }

    pub(crate) fn describe(self) -> String {
        match self {
            Self::D => "direct: client → backend".into(),
            Self::N => "nginx, TLS reverse proxy adding Impersonate-User/-Group".into(),
            Self::H => "haproxy, TLS reverse proxy adding Impersonate-User/-Group".into(),
            Self::S0 => "Selkie, static identity".into(),
            Self::SX => "Selkie, client certificate → identity".into(),
            Self::SJ { alg, tokens, cache } => {
                let tokens = match tokens {
                    1 => "1 token".to_string(),
                    n => format!("{n} tokens in turn"),
                };
                let cache = if cache { "" } else { ", cache off" };
                format!("Selkie, bearer JWT {}, {tokens}{cache}", alg.name())
            }
            Self::SW { miss: false } => "Selkie, TokenReview webhook, 1 token (cache hit)".into(),
            Self::SW { miss: true } => "Selkie, TokenReview webhook, a new token every request (miss)".into(),
            Self::SR => "Selkie, static identity, configuration rewritten 10×/s".into(),
            Self::KD { list: false } => {
                "direct: client → kube-apiserver (admin certificate + Impersonate-*), GET a ConfigMap".into()
            }
            Self::KS0 { list: false } => {
                "Selkie, static identity → kube-apiserver (admin certificate), GET a ConfigMap".into()
            }
            Self::KD { list: true } => {
                "direct: client → kube-apiserver (admin certificate + Impersonate-*), list pods".into()
            }
            Self::KS0 { list: true } => {
                "Selkie, static identity → kube-apiserver (admin certificate), list pods".into()
            }
        }
    }

    pub(crate) fn is_selkie(self) -> bool {
        !matches!(self, Self::D | Self::N | Self::H | Self::KD { .. })
    }

    /// Its maximum throughput is bounded by a wait (the webhook's answer), not by CPU.
    pub(crate) fn latency_bound(self) -> bool {
        self == Self::SW { miss: true }
    }

    /// In front of the real kube-apiserver rather than `selkie-perf-backend`.
    pub(crate) fn is_kube(self) -> bool {
        matches!(self, Self::KD { .. } | Self::KS0 { .. })
    }

    /// Needs the identity provider (JWKS, TokenReview).
    pub(crate) fn uses_idp(self) -> bool {
        matches!(self, Self::SJ { .. } | Self::SW { .. })
    }

    /// The row this one's added latency is measured against, and whose rate group it is in.
    pub(crate) fn direct(self) -> Self {
        match self {
            Self::KD { list } | Self::KS0 { list } => Self::KD { list },
            _ => Self::D,
        }
    }

    /// The request path of its load steps.
    pub(crate) fn path(self) -> &'static str {
        match self {
            Self::KD { list: true } | Self::KS0 { list: true } => PODS_PATH,
            _ => PATH,
        }
    }

    /// Part of the handshake step (new TLS connection per request).
    pub(crate) fn in_handshake_step(self) -> bool {
        matches!(self, Self::D | Self::N | Self::H | Self::S0)
    }

    /// Part of the watch step (a ConfigMap watch while the ConfigMap is updated).
    pub(crate) fn in_watch_step(self) -> bool {
        matches!(self, Self::KD { list: false } | Self::KS0 { list: false })
    }
}

/// Printed as its row id.
impl std::fmt::Debug for System {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.id())
    }
}

impl Serialize for System {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.id())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn system_ids_parse_and_print_back() {
        for id in [
            "D",
            "N",
            "H",
            "S0",
            "SX",
            "SJ-RS256-1",
            "SJ-ES256-100",
            "SJ-RS256-10k",
            "SJ-ES256-50k",
            "SJ-RS256-1-nocache",
            "SJ-ES256-10k-nocache",
            "SW-hit",
            "SW-miss",
            "SR",
            "K-D",
            "K-S0",
            "K-D-list",
            "K-S0-list",
        ] {
            assert_eq!(System::parse(id).unwrap().id(), id);
        }
        assert_eq!(
            System::parse("SJ-RS256-10k").unwrap(),
            System::SJ {
                alg: JwtAlg::Rs256,
                tokens: 10_000,
                cache: true
            }
        );
        assert_eq!(
            System::parse("SJ-ES256-1-nocache").unwrap(),
            System::SJ {
                alg: JwtAlg::Es256,
                tokens: 1,
                cache: false
            }
        );
        assert_eq!(
            System::parse("K-S0-list").unwrap().direct(),
            System::KD { list: true }
        );
        assert_eq!(System::parse("K-S0-list").unwrap().path(), PODS_PATH);
        assert_eq!(System::parse("SJ-ES256-1500").unwrap().id(), "SJ-ES256-1500");
        for bad in [
            "SJ-HS256-1",
            "SJ-RS256-0",
            "SJ-RS256",
            "SJ-RS256-x",
            "SW",
            "K",
            "K-SX",
            "SJ-RS256-nocache",
            "SJ-RS256-1-cache",
            "K-D-watch",
        ] {
            assert!(System::parse(bad).is_err(), "{bad}");
        }
    }
}
