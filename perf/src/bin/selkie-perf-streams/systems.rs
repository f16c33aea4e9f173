//! The systems under test (D, N, S0) and the HTTP versions: starting and configuring nginx and
//! Selkie, their processes' memory and CPU time, and how this client connects to each system.

use std::{
    net::SocketAddr,
    path::Path,
    process::{Child, Command, Stdio},
    sync::Arc,
    time::Duration,
};

use anyhow::Context as _;
use http::{HeaderName, HeaderValue};
use nix::sys::signal::Signal;
use rustls_pki_types::ServerName;
use selkie_perf::{
    process::{free_port, start_nginx, stop, wait_for_port},
    procstat::{process_tree, rss_kib, total_cpu_time},
    tls::{client_config, ALPN_H2, ALPN_HTTP11},
};
use serde::Serialize;
use tokio_rustls::{client::TlsStream, TlsConnector};

use crate::{open_files_limit, Env, GROUPS, USER};

/// One system under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub(crate) enum System {
    /// Straight to the backend.
    D,
    /// nginx.
    N,
    /// Selkie, static identity.
    S0,
}

impl System {
    pub(crate) fn parse(text: &str) -> anyhow::Result<Self> {
        Ok(match text {
            "D" => Self::D,
            "N" => Self::N,
            "S0" => Self::S0,
            _ => anyhow::bail!("unknown system {text:?} (D, N, S0)"),
        })
    }

    pub(crate) fn describe(self) -> &'static str {
        match self {
            Self::D => "direct: client → backend",
            Self::N => "nginx, TLS reverse proxy adding Impersonate-User/-Group",
            Self::S0 => "Selkie, static identity",
        }
    }
}

/// HTTP version client → system.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Protocol {
    H1,
    H2,
}

impl Protocol {
    pub(crate) fn parse(text: &str) -> anyhow::Result<Self> {
        match text {
            "h1" => Ok(Self::H1),
            "h2" => Ok(Self::H2),
            _ => anyhow::bail!("unknown protocol {text:?} (h1, h2)"),
        }
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::H1 => "h1",
            Self::H2 => "h2",
        }
    }
}

/// A running system under test; stopped when dropped.
pub(crate) struct Sut {
    child: Option<Child>,
    signal: Signal,
    what: String,
}

impl Sut {
    /// The system's processes (nginx: master and worker), empty for D.
    fn pids(&self) -> Vec<u32> {
        self.child
            .as_ref()
            .map(|child| process_tree(child.id()))
            .unwrap_or_default()
    }

    pub(crate) fn rss_kib(&self) -> u64 {
        self.pids().iter().filter_map(|pid| rss_kib(*pid).ok()).sum()
    }

    pub(crate) fn cpu(&self) -> Duration {
        total_cpu_time(&self.pids()).unwrap_or_default()
    }
}

impl Drop for Sut {
    fn drop(&mut self) {
        if let Some(child) = self.child.take() {
            let _ = stop(child, self.signal, &self.what);
        }
    }
}

/// How this client reaches a system.
#[derive(Clone)]
pub(crate) struct Target {
    pub(crate) port: u16,
    h1: TlsConnector,
    h2: TlsConnector,
    /// Headers every request carries (D: the `Impersonate-*` headers a proxy would add).
    pub(crate) headers: Vec<(HeaderName, HeaderValue)>,
}

impl Target {
    pub(crate) async fn tls(&self, protocol: Protocol) -> anyhow::Result<TlsStream<tokio::net::TcpStream>> {
        let tcp = tokio::net::TcpStream::connect(("127.0.0.1", self.port)).await?;
        tcp.set_nodelay(true)?;
        let connector = match protocol {
            Protocol::H1 => &self.h1,
            Protocol::H2 => &self.h2,
        };
        Ok(connector
            .connect(ServerName::try_from("localhost")?.to_owned(), tcp)
            .await?)
    }
}

impl Env {
    /// Starts `system`, sized (nginx's `worker_connections`) for `connections` client connections
    /// plus as many upstream.
    pub(crate) fn start(&self, system: System, connections: usize) -> anyhow::Result<(Sut, Target)> {
        let client = |identity: Option<(&Path, &Path)>, alpn: &[&[u8]]| -> anyhow::Result<TlsConnector> {
            Ok(TlsConnector::from(Arc::new(client_config(
                &self.pki.ca,
                identity,
                alpn,
            )?)))
        };
        let (sut, port, identity, headers) = match system {
            System::D => {
                let mut headers = vec![(
                    HeaderName::from_static("impersonate-user"),
                    HeaderValue::from_static(USER),
                )];
                for group in GROUPS {
                    headers.push((
                        HeaderName::from_static("impersonate-group"),
                        HeaderValue::from_static(group),
                    ));
                }
                let sut = Sut {
                    child: None,
                    signal: Signal::SIGTERM,
                    what: "D".into(),
                };
                let identity = Some((
                    self.pki.upstream_client.cert.as_path(),
                    self.pki.upstream_client.key.as_path(),
                ));
                (sut, self.backend_port, identity, headers)
            }
            System::N => {
                let (sut, port) = self.start_nginx(connections)?;
                (sut, port, None, Vec::new())
            }
            System::S0 => {
                let (sut, port) = self.start_selkie()?;
                (sut, port, None, Vec::new())
            }
        };
        let target = Target {
            port,
            h1: client(identity, &[ALPN_HTTP11])?,
            h2: client(identity, &[ALPN_H2])?,
            headers,
        };
        Ok((sut, target))
    }

    fn start_nginx(&self, connections: usize) -> anyhow::Result<(Sut, u16)> {
        let port = free_port()?;
        // nginx allocates (and touches) every connection slot when its worker starts: size them
        // to the step rather than to the largest, so that the idle RSS stays comparable.
        let worker_connections = connections * 4 + 1024;
        let rlimit = open_files_limit().unwrap_or(1024);
        let dir = &self.dir;
        let p = |path: &Path| path.display().to_string();
        let conf = format!(
            r#"# Generated by selkie-perf-streams.
user root;
worker_processes 1;
worker_rlimit_nofile {rlimit};
error_log {dir}/nginx-error.log info;
daemon off;
master_process on;
pid {dir}/nginx.pid;
events {{ worker_connections {worker_connections}; }}
http {{
    access_log /dev/null;
    client_body_temp_path {dir}/nginx-body;
    proxy_temp_path {dir}/nginx-proxy;
    keepalive_requests 100000000;
    keepalive_timeout 3600s;
    http2_max_concurrent_streams 128;
    proxy_headers_hash_bucket_size 128;
    map $http_upgrade $connection_upgrade {{
        default upgrade;
        '' '';
    }}
    upstream backend {{
        server 127.0.0.1:{backend};
        keepalive 1024;
        keepalive_requests 100000000;
        keepalive_timeout 300s;
    }}
    server {{
        listen 127.0.0.1:{port} ssl http2;
        ssl_certificate {cert};
        ssl_certificate_key {key};
        ssl_protocols TLSv1.3;
        location / {{
            proxy_pass https://backend;
            proxy_http_version 1.1;
            # Watches and exec streams: no buffering, no read timeout within a run.
            proxy_buffering off;
            proxy_request_buffering off;
            proxy_read_timeout 3600s;
            proxy_send_timeout 3600s;
            proxy_set_header Upgrade $http_upgrade;
            proxy_set_header Connection $connection_upgrade;
            proxy_set_header Authorization "";
            proxy_set_header Impersonate-User {user};
            proxy_set_header Impersonate-Group {group0};
            proxy_set_header Impersonate-Group {group1};
            proxy_ssl_certificate {client_cert};
            proxy_ssl_certificate_key {client_key};
            proxy_ssl_trusted_certificate {ca};
            proxy_ssl_verify on;
            proxy_ssl_name localhost;
            proxy_ssl_server_name on;
            proxy_ssl_protocols TLSv1.3;
            proxy_ssl_session_reuse on;
        }}
    }}
}}
"#,
            dir = dir.display(),
            backend = self.backend_port,
            cert = p(&self.pki.proxy.cert),
            key = p(&self.pki.proxy.key),
            user = USER,
            group0 = GROUPS[0],
            group1 = GROUPS[1],
            client_cert = p(&self.pki.upstream_client.cert),
            client_key = p(&self.pki.upstream_client.key),
            ca = p(&self.pki.ca),
        );
        let child = start_nginx(dir, &conf, port)?;
        let sut = Sut {
            child: Some(child),
            signal: Signal::SIGTERM,
            what: "nginx".into(),
        };
        Ok((sut, port))
    }

    fn start_selkie(&self) -> anyhow::Result<(Sut, u16)> {
        let port = free_port()?;
        let q = |path: &Path| serde_json::to_string(&path.display().to_string()).unwrap_or_default();
        // The memory steps hold up to 10000 HTTP/1.1 watches, a connection each: the listener's
        // connection limit (default 1000) is lifted out of their way.
        let config = format!(
            "# Generated by selkie-perf-streams.\nlisten: 127.0.0.1:{port}\nservingCertificate:\n  certFile: {}\n  keyFile: {}\nupstream:\n  url: https://127.0.0.1:{}\n  caFile: {}\n  clientCertificate:\n    certFile: {}\n    keyFile: {}\nstaticIdentity:\n  username: {USER}\n  groups: [{}, {}]\nlistenerLimits:\n  maxConnections: 1000000\n",
            q(&self.pki.proxy.cert),
            q(&self.pki.proxy.key),
            self.backend_port,
            q(&self.pki.ca),
            q(&self.pki.upstream_client.cert),
            q(&self.pki.upstream_client.key),
            GROUPS[0],
            GROUPS[1],
        );
        let path = self.dir.join("selkie-S0.yaml");
        std::fs::write(&path, config)?;
        let mut child = Command::new("taskset")
            .args(["-c", "1"])
            .arg(self.bin_dir.join("selkie-concierge"))
            .arg("--config")
            .arg(&path)
            // Only the file watcher reads this; keep it out of the way.
            .args(["--watch-interval", "60s"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(self.dir.join("selkie-S0.err"))?)
            .spawn()
            .context("starting selkie-concierge (cargo build -p selkie-concierge)")?;
        wait_for_port(
            SocketAddr::from(([127, 0, 0, 1], port)),
            &mut child,
            "selkie-concierge",
        )?;
        let sut = Sut {
            child: Some(child),
            signal: Signal::SIGINT,
            what: "selkie-concierge".into(),
        };
        Ok((sut, port))
    }
}
