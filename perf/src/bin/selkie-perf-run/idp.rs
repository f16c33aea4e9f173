//! The identity provider of the SJ and SW rows: the JWT keys and tokens the runner mints,
//! starting `selkie-perf-idp`, and the counters it reports.

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::Context as _;
use base64::{engine::general_purpose::URL_SAFE_NO_PAD as B64URL, Engine as _};
use ring::{
    rand::SystemRandom,
    signature::{
        EcdsaKeyPair, KeyPair as _, RsaKeyPair, RsaPublicKeyComponents, ECDSA_P256_SHA256_FIXED_SIGNING,
        RSA_PKCS1_SHA256,
    },
};
use rustls_pki_types::{pem::PemObject as _, PrivatePkcs8KeyDer};
use selkie_perf::{
    pki::PerfPki,
    process::{free_port, wait_for_port},
};
use serde::{Deserialize, Serialize};

use crate::{systems::JwtAlg, Runner, GROUPS, USER};

/// The identity provider's counters (`selkie-perf-idp`, `GET /counters`).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct IdpCounters {
    pub(crate) discovery: u64,
    pub(crate) jwks: u64,
    pub(crate) reviews: u64,
    pub(crate) refused_reviews: u64,
    pub(crate) bad_requests: u64,
}

impl IdpCounters {
    pub(crate) fn minus(&self, before: &Self) -> Self {
        Self {
            discovery: self.discovery.saturating_sub(before.discovery),
            jwks: self.jwks.saturating_sub(before.jwks),
            reviews: self.reviews.saturating_sub(before.reviews),
            refused_reviews: self.refused_reviews.saturating_sub(before.refused_reviews),
            bad_requests: self.bad_requests.saturating_sub(before.bad_requests),
        }
    }
}

/// The keys the runner mints JWTs with; the identity provider serves their public halves.
struct JwtKeys {
    rsa: RsaKeyPair,
    ec: EcdsaKeyPair,
    rng: SystemRandom,
}

/// Audience of every minted token and of Selkie's JWT authenticators.
pub(crate) const AUDIENCE: &str = "selkie-perf";

impl JwtKeys {
    /// A fresh 2048-bit RSA key (from `openssl genpkey`: ring cannot generate RSA keys) and a
    /// fresh P-256 key; writes their JWKS to `dir/jwks.json`.
    fn generate(dir: &Path) -> anyhow::Result<(Self, PathBuf)> {
        let rsa_path = dir.join("jwt-rs256.key");
        let status = Command::new("openssl")
            .args([
                "genpkey",
                "-algorithm",
                "RSA",
                "-pkeyopt",
                "rsa_keygen_bits:2048",
                "-out",
            ])
            .arg(&rsa_path)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .context("running openssl genpkey (apt-get install -y openssl)")?;
        anyhow::ensure!(status.success(), "openssl genpkey failed ({status})");
        let der = PrivatePkcs8KeyDer::from_pem_file(&rsa_path)
            .with_context(|| format!("reading {}", rsa_path.display()))?;
        let rsa = RsaKeyPair::from_pkcs8(der.secret_pkcs8_der())
            .map_err(|e| anyhow::anyhow!("the RSA key: {e}"))?;
        let rng = SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng)
            .map_err(|_| anyhow::anyhow!("generating a P-256 key failed"))?;
        let ec = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng)
            .map_err(|e| anyhow::anyhow!("the P-256 key: {e}"))?;
        let public = RsaPublicKeyComponents::<Vec<u8>>::from(rsa.public());
        let point = ec.public_key().as_ref();
        anyhow::ensure!(point.len() == 65, "unexpected P-256 public key encoding");
        let jwks = serde_json::json!({"keys": [
            {"kty": "RSA", "kid": "perf-rs256", "use": "sig", "alg": "RS256",
             "n": B64URL.encode(&public.n), "e": B64URL.encode(&public.e)},
            {"kty": "EC", "crv": "P-256", "kid": "perf-es256", "use": "sig", "alg": "ES256",
             "x": B64URL.encode(&point[1..33]), "y": B64URL.encode(&point[33..65])},
        ]});
        let jwks_path = dir.join("jwks.json");
        std::fs::write(&jwks_path, jwks.to_string())?;
        Ok((Self { rsa, ec, rng }, jwks_path))
    }

    /// A token from `issuer` for [`USER`] in [`GROUPS`], valid for two hours; `jti` makes each
    /// one distinct.
    fn token(&self, alg: JwtAlg, issuer: &str, jti: u32) -> anyhow::Result<String> {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_secs();
        let kid = match alg {
            JwtAlg::Rs256 => "perf-rs256",
            JwtAlg::Es256 => "perf-es256",
        };
        let header = serde_json::json!({"alg": alg.name(), "kid": kid, "typ": "JWT"});
        let claims = serde_json::json!({
            "iss": issuer, "aud": AUDIENCE, "sub": format!("perf-{jti}"),
            "username": USER, "groups": GROUPS,
            "iat": now, "nbf": now, "exp": now + 7200, "jti": jti.to_string(),
        });
        let signed = format!(
            "{}.{}",
            B64URL.encode(header.to_string()),
            B64URL.encode(claims.to_string())
        );
        let signature = match alg {
            JwtAlg::Rs256 => {
                let mut signature = vec![0; self.rsa.public().modulus_len()];
                self.rsa
                    .sign(&RSA_PKCS1_SHA256, &self.rng, signed.as_bytes(), &mut signature)
                    .map_err(|_| anyhow::anyhow!("RS256 signing failed"))?;
                signature
            }
            JwtAlg::Es256 => self
                .ec
                .sign(&self.rng, signed.as_bytes())
                .map_err(|_| anyhow::anyhow!("ES256 signing failed"))?
                .as_ref()
                .to_vec(),
        };
        Ok(format!("{signed}.{}", B64URL.encode(signature)))
    }
}

/// The running `selkie-perf-idp` (OIDC discovery, JWKS, TokenReview).
pub(crate) struct Idp {
    pub(crate) issuer: String,
    pub(crate) admin: SocketAddr,
    pub(crate) pid: u32,
    keys: JwtKeys,
}

impl Runner {
    /// Writes `count` tokens for `alg` (one a line) and returns the file.
    pub(crate) fn token_file(&self, alg: JwtAlg, count: u32) -> anyhow::Result<PathBuf> {
        let idp = self.idp.as_ref().context("no identity provider running")?;
        let path = self.dir.join(format!("tokens-{}-{count}.txt", alg.name()));
        if path.exists() {
            return Ok(path);
        }
        let started = Instant::now();
        // RS256 signing is slow (about 1.5 ms a token here): both cores share the work.
        let half = count / 2;
        let mint = |range: std::ops::Range<u32>| -> anyhow::Result<String> {
            let mut text = String::new();
            for jti in range {
                text.push_str(&idp.keys.token(alg, &idp.issuer, jti)?);
                text.push('\n');
            }
            Ok(text)
        };
        let (first, second) = std::thread::scope(|scope| {
            let first = scope.spawn(|| mint(0..half));
            let second = mint(half..count);
            (first.join(), second)
        });
        let mut text = first.map_err(|_| anyhow::anyhow!("a minting thread panicked"))??;
        text.push_str(&second?);
        std::fs::write(&path, text)?;
        eprintln!(
            "minted {count} {} tokens in {:.1} s",
            alg.name(),
            started.elapsed().as_secs_f64()
        );
        Ok(path)
    }
}

impl Idp {
    /// Generates the JWT keys and starts `selkie-perf-idp` on core 0 (its TokenReview webhook
    /// answering after `webhook_delay`); returns it and its process.
    pub(crate) fn start(
        bin_dir: &Path,
        dir: &Path,
        pki: &PerfPki,
        webhook_delay: Duration,
    ) -> anyhow::Result<(Self, Child)> {
        let (keys, jwks) = JwtKeys::generate(dir)?;
        let port = free_port()?;
        let admin = SocketAddr::from(([127, 0, 0, 1], free_port()?));
        let issuer = format!("https://127.0.0.1:{port}");
        let mut command = Command::new("taskset");
        command
            .args(["-c", "0"])
            .arg(bin_dir.join("selkie-perf-idp"))
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .args(["--admin-listen", &admin.to_string()])
            .arg("--cert")
            .arg(&pki.backend.cert)
            .arg("--key")
            .arg(&pki.backend.key)
            .args(["--issuer", &issuer])
            .arg("--jwks")
            .arg(&jwks)
            .args(["--user", USER])
            .args(["--delay", &format!("{}ms", webhook_delay.as_millis())]);
        for group in GROUPS {
            command.args(["--group", group]);
        }
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .context("starting selkie-perf-idp")?;
        wait_for_port(
            SocketAddr::from(([127, 0, 0, 1], port)),
            &mut child,
            "selkie-perf-idp",
        )?;
        let pid = child.id();
        Ok((
            Self {
                issuer,
                admin,
                pid,
                keys,
            },
            child,
        ))
    }
}
