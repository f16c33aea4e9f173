//! `selkie-perf-idp`: the identity services the SJ and SW rows of the side-by-side benchmark talk
//! to, over HTTPS on one port:
//!
//! * `GET /.well-known/openid-configuration`: OIDC discovery for `--issuer` (its `jwks_uri` is
//!   `<issuer>/jwks`);
//! * `GET /jwks`: the key set read from `--jwks` (written by `selkie-perf-run`, which holds the
//!   private keys and mints the tokens);
//! * `POST /tokenreview`: a TokenReview webhook (Pinniped's WebhookAuthenticator; `v1beta1` or `v1`).
//!   A token starting with `--accept-prefix` is answered `authenticated` as `--user` in the
//!   `--group`s after `--delay` (the webhook's own latency); any other token is answered
//!   `authenticated: false`, which the proxy turns into a 401 the load client counts.
//!
//! Counters (discovery, key set and review requests, and refused tokens) are served as JSON at
//! `GET /counters` on the plain-HTTP `--admin-listen` port and printed on stdout at SIGTERM.
//! Single-threaded, like the backend; the runner pins it to core 0.

use std::{
    convert::Infallible,
    net::SocketAddr,
    path::PathBuf,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::Duration,
};

use anyhow::Context as _;
use bytes::Bytes;
use clap::Parser;
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt as _, Full, Limited};
use hyper::{body::Incoming, service::service_fn};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::{version::TLS13, ServerConfig};
use selkie_perf::{
    parse_duration,
    tls::{certificates, private_key, ALPN_H2, ALPN_HTTP11},
};
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

/// Largest TokenReview request read.
const MAX_REVIEW_BYTES: usize = 64 * 1024;

/// Command-line arguments.
#[derive(Debug, Parser)]
#[command(name = "selkie-perf-idp", about)]
struct Args {
    /// HTTPS address.
    #[arg(long)]
    listen: SocketAddr,
    /// Plain-HTTP address of `GET /counters`.
    #[arg(long)]
    admin_listen: SocketAddr,
    /// Serving certificate (PEM).
    #[arg(long)]
    cert: PathBuf,
    /// Its private key.
    #[arg(long)]
    key: PathBuf,
    /// The issuer URL announced by discovery (`https://127.0.0.1:PORT`).
    #[arg(long)]
    issuer: String,
    /// The JWKS document to serve.
    #[arg(long)]
    jwks: PathBuf,
    /// TokenReview: tokens with this prefix are authenticated.
    #[arg(long, default_value = "perf-")]
    accept_prefix: String,
    /// TokenReview: the user of accepted tokens.
    #[arg(long)]
    user: String,
    /// TokenReview: the groups of accepted tokens, in order.
    #[arg(long)]
    group: Vec<String>,
    /// TokenReview: how long to wait before answering (the webhook's own latency).
    #[arg(long, default_value = "1ms", value_parser = parse_duration)]
    delay: Duration,
}

/// What the identity services served.
#[derive(Debug, Default, Serialize)]
struct Counters {
    discovery: u64,
    jwks: u64,
    reviews: u64,
    refused_reviews: u64,
    bad_requests: u64,
}

struct State {
    args: Args,
    discovery: Bytes,
    jwks: Bytes,
    discovery_count: AtomicU64,
    jwks_count: AtomicU64,
    reviews: AtomicU64,
    refused: AtomicU64,
    bad: AtomicU64,
}

impl State {
    fn counters(&self) -> Counters {
        Counters {
            discovery: self.discovery_count.load(Ordering::Relaxed),
            jwks: self.jwks_count.load(Ordering::Relaxed),
            reviews: self.reviews.load(Ordering::Relaxed),
            refused_reviews: self.refused.load(Ordering::Relaxed),
            bad_requests: self.bad.load(Ordering::Relaxed),
        }
    }

    async fn handle(&self, request: Request<Incoming>) -> Response<Full<Bytes>> {
        let path = request.uri().path().to_string();
        match (request.method(), path.as_str()) {
            (&Method::GET, "/.well-known/openid-configuration") => {
                self.discovery_count.fetch_add(1, Ordering::Relaxed);
                json_response(StatusCode::OK, self.discovery.clone())
            }
            (&Method::GET, "/jwks") => {
                self.jwks_count.fetch_add(1, Ordering::Relaxed);
                json_response(StatusCode::OK, self.jwks.clone())
            }
            (&Method::POST, "/tokenreview") => self.review(request).await,
            _ => {
                self.bad.fetch_add(1, Ordering::Relaxed);
                json_response(StatusCode::NOT_FOUND, Bytes::from_static(b"{}"))
            }
        }
    }

    async fn review(&self, request: Request<Incoming>) -> Response<Full<Bytes>> {
        let body = match Limited::new(request.into_body(), MAX_REVIEW_BYTES)
            .collect()
            .await
        {
            Ok(body) => body.to_bytes(),
            Err(_) => {
                self.bad.fetch_add(1, Ordering::Relaxed);
                return json_response(StatusCode::BAD_REQUEST, Bytes::from_static(b"{}"));
            }
        };
        let Ok(review) = serde_json::from_slice::<Review>(&body) else {
            self.bad.fetch_add(1, Ordering::Relaxed);
            return json_response(StatusCode::BAD_REQUEST, Bytes::from_static(b"{}"));
        };
        self.reviews.fetch_add(1, Ordering::Relaxed);
        if !self.args.delay.is_zero() {
            tokio::time::sleep(self.args.delay).await;
        }
        let accepted = review.spec.token.starts_with(&self.args.accept_prefix);
        let status = if accepted {
            json!({"authenticated": true,
                   "user": {"username": self.args.user, "groups": self.args.group}})
        } else {
            self.refused.fetch_add(1, Ordering::Relaxed);
            json!({"authenticated": false})
        };
        let answer = json!({
            "apiVersion": review.api_version,
            "kind": "TokenReview",
            "status": status,
        });
        json_response(StatusCode::OK, Bytes::from(answer.to_string()))
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Review {
    api_version: String,
    spec: ReviewSpec,
}

#[derive(Deserialize)]
struct ReviewSpec {
    token: String,
}

fn json_response(status: StatusCode, body: Bytes) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(body));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

async fn serve_tls(listener: TcpListener, acceptor: TlsAcceptor, state: Arc<State>) {
    let builder = Arc::new(hyper_util::server::conn::auto::Builder::new(TokioExecutor::new()));
    loop {
        let Ok((tcp, _)) = listener.accept().await else {
            continue;
        };
        let _ = tcp.set_nodelay(true);
        let (acceptor, state, builder) = (acceptor.clone(), state.clone(), builder.clone());
        tokio::spawn(async move {
            let Ok(tls) = acceptor.accept(tcp).await else {
                return;
            };
            let service = service_fn(|request: Request<Incoming>| {
                let state = state.clone();
                async move { Ok::<_, Infallible>(state.handle(request).await) }
            });
            let _ = builder.serve_connection(TokioIo::new(tls), service).await;
        });
    }
}

async fn serve_admin(listener: TcpListener, state: Arc<State>) {
    loop {
        let Ok((tcp, _)) = listener.accept().await else {
            continue;
        };
        let state = state.clone();
        tokio::spawn(async move {
            let service = service_fn(|_request: Request<Incoming>| {
                let json = serde_json::to_vec(&state.counters()).unwrap_or_default();
                async move { Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(json)))) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(tcp), service)
                .await;
        });
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&TLS13])
        .context("TLS 1.3 with ring")?
        .with_no_client_auth()
        .with_single_cert(certificates(&args.cert)?, private_key(&args.key)?)
        .context("the serving certificate and key")?;
    config.alpn_protocols = vec![ALPN_H2.to_vec(), ALPN_HTTP11.to_vec()];
    let jwks = std::fs::read(&args.jwks).with_context(|| format!("reading {}", args.jwks.display()))?;
    let issuer = args.issuer.trim_end_matches('/').to_string();
    let discovery = json!({
        "issuer": args.issuer,
        "jwks_uri": format!("{issuer}/jwks"),
        "response_types_supported": ["id_token"],
        "subject_types_supported": ["public"],
        "id_token_signing_alg_values_supported": ["RS256", "ES256"],
    });
    let (listen, admin_listen) = (args.listen, args.admin_listen);
    let state = Arc::new(State {
        args,
        discovery: Bytes::from(discovery.to_string()),
        jwks: Bytes::from(jwks),
        discovery_count: AtomicU64::new(0),
        jwks_count: AtomicU64::new(0),
        reviews: AtomicU64::new(0),
        refused: AtomicU64::new(0),
        bad: AtomicU64::new(0),
    });
    let listener = TcpListener::bind(listen)
        .await
        .with_context(|| format!("listening on {listen}"))?;
    let admin = TcpListener::bind(admin_listen)
        .await
        .with_context(|| format!("listening on {admin_listen}"))?;
    tokio::spawn(serve_tls(
        listener,
        TlsAcceptor::from(Arc::new(config)),
        state.clone(),
    ));
    tokio::spawn(serve_admin(admin, state.clone()));
    eprintln!("selkie-perf-idp: https://{listen} (admin http://{admin_listen}/counters)");

    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    println!("{}", serde_json::to_string(&state.counters())?);
    Ok(())
}
