//! A real load balancer in front of a node's Services: Debian's haproxy in TCP mode, as a cloud's
//! network load balancer fronts a `LoadBalancer` Service's node ports. TLS passes through it
//! untouched, so clients see the pods' own serving certificates.

use std::{
    ffi::OsString,
    net::SocketAddr,
    path::PathBuf,
    time::{Duration, Instant},
};

use crate::{process::ManagedProcess, Cluster, HarnessError};

/// A running haproxy forwarding one address to backends. Stopped on drop.
#[derive(Debug)]
pub struct LoadBalancer {
    process: ManagedProcess,
    address: SocketAddr,
    backends: Vec<SocketAddr>,
    dir: tempfile::TempDir,
}

impl LoadBalancer {
    /// Starts haproxy listening on `address` and spreading TCP connections over
    /// `backends` round-robin, with a TCP health check of each every second; waits until it
    /// accepts connections.
    ///
    /// Fails naming haproxy's log when haproxy is missing (Debian's `haproxy`, installed by
    /// `e2e/scripts/setup.sh`), refuses its configuration, or does not listen within 10 s.
    pub async fn start_on(
        address: SocketAddr,
        backends: &[SocketAddr],
    ) -> Result<LoadBalancer, HarnessError> {
        let dir = tempfile::Builder::new()
            .prefix("selkie-lb-")
            .tempdir()
            .map_err(|e| HarnessError::io("creating the load balancer's directory", e))?;
        let mut config = format!(
            "global\n  maxconn 4096\n\ndefaults\n  mode tcp\n  timeout connect 5s\n  timeout client 1h\n  \
             timeout server 1h\n  retries 3\n  option redispatch\n\nfrontend selkie\n  bind {address}\n  \
             default_backend pods\n\nbackend pods\n  balance roundrobin\n"
        );
        for (i, backend) in backends.iter().enumerate() {
            config.push_str(&format!(
                "  server backend{i} {backend} check inter 1s fall 2 rise 1\n"
            ));
        }
        let config_path = dir.path().join("haproxy.cfg");
        std::fs::write(&config_path, config)
            .map_err(|e| HarnessError::io(format!("writing {}", config_path.display()), e))?;
        let args = [
            OsString::from("-db"),
            OsString::from("-f"),
            config_path.into_os_string(),
        ];
        let mut process = ManagedProcess::spawn(
            "haproxy",
            &PathBuf::from("/usr/sbin/haproxy"),
            &args,
            dir.path().join("haproxy.log"),
        )?;
        let deadline = Instant::now() + Duration::from_secs(10);
        while tokio::net::TcpStream::connect(address).await.is_err() {
            process.check_running("during start-up")?;
            if Instant::now() >= deadline {
                return Err(process.failure(format!("did not listen on {address} within 10s")));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(LoadBalancer {
            process,
            address,
            backends: backends.to_vec(),
            dir,
        })
    }

    /// Starts haproxy on `address` in front of the Service `namespace/service` of `cluster`, at
    /// its (first) node port on the cluster's node, as a cloud's load balancer fronts a
    /// `LoadBalancer` or `NodePort` Service; waits up to 60 s for the Service to have a node
    /// port. Fails when the cluster has no node, or as [`LoadBalancer::start_on`].
    pub async fn for_service(
        cluster: &Cluster,
        namespace: &str,
        service: &str,
        address: SocketAddr,
    ) -> Result<LoadBalancer, HarnessError> {
        let node = cluster
            .node()
            .ok_or_else(|| HarnessError::NotReady("the cluster has no node to balance to".into()))?;
        let kubectl = cluster.kubectl();
        let deadline = Instant::now() + Duration::from_secs(60);
        let port = loop {
            let port = kubectl
                .run(&[
                    "get",
                    "service",
                    service,
                    "-n",
                    namespace,
                    "-o",
                    "jsonpath={.spec.ports[0].nodePort}",
                ])
                .await;
            match port.as_deref().map(|port| port.trim().parse::<u16>()) {
                Ok(Ok(port)) => break port,
                last if Instant::now() >= deadline => {
                    return Err(HarnessError::NotReady(format!(
                        "the Service {namespace}/{service} has no node port after 60 s: {last:?}"
                    )))
                }
                _ => tokio::time::sleep(Duration::from_millis(250)).await,
            }
        };
        Self::start_on(address, &[SocketAddr::new(node.ip().into(), port)]).await
    }

    /// Where clients connect.
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// Where it forwards to.
    pub fn backends(&self) -> &[SocketAddr] {
        &self.backends
    }

    /// The last `lines` lines of haproxy's log (its alerts and warnings: servers going DOWN and
    /// UP after health checks, backends without a server).
    pub fn log_tail(&self, lines: usize) -> String {
        crate::process::log_tail(&self.dir.path().join("haproxy.log"), lines)
    }

    /// Fails with haproxy's log tail if it has exited.
    pub fn check_running(&mut self) -> Result<(), HarnessError> {
        self.process.check_running("while balancing")
    }
}
