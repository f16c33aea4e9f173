//! A real control plane: etcd and kube-apiserver on free loopback ports.

use std::{
    ffi::OsString,
    fs,
    path::{Path, PathBuf},
    sync::atomic::{AtomicUsize, Ordering},
    time::{Duration, Instant},
};

use base64::{engine::general_purpose::STANDARD as B64, Engine as _};
use k8s_openapi::api::core::v1::Namespace;
use kube::{
    api::{ObjectMeta, PostParams},
    config::{KubeConfigOptions, Kubeconfig},
    Api, Client, Config,
};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
    sync::OnceCell,
};

use crate::{
    components::Components,
    kubectl::Kubectl,
    pki::{CertAndKey, CertificateAuthority, ServiceAccountKey},
    process::ManagedProcess,
    HarnessError,
};

/// The admin user of every test cluster (a member of `system:masters`).
pub const ADMIN_USER: &str = "selkie-admin";
/// The common name of the front-proxy client certificate kube-apiserver presents to aggregated
/// API servers, and the only name `--requestheader-allowed-names` accepts.
pub const FRONT_PROXY_CLIENT_NAME: &str = "front-proxy-client";

const DEFAULT_ETCD_READY_TIMEOUT: Duration = Duration::from_secs(30);
const DEFAULT_APISERVER_READY_TIMEOUT: Duration = Duration::from_secs(90);
const POLL_INTERVAL: Duration = Duration::from_millis(250);

/// The PKI of a test cluster. The client CA's key is available: tests use it as the cluster
/// signing key, to mint users the apiserver trusts.
#[derive(Debug)]
pub struct ClusterPki {
    /// Signs the apiserver's serving certificate; clients trust it.
    pub server_ca: CertificateAuthority,
    /// `--client-ca-file`: every client certificate it signs is a user of the cluster.
    pub client_ca: CertificateAuthority,
    /// `--requestheader-client-ca-file`: signs the front-proxy client certificate.
    pub front_proxy_ca: CertificateAuthority,
    /// The front-proxy client certificate kube-apiserver presents to aggregated API servers.
    pub front_proxy_client: CertAndKey,
    /// Service-account token signing key.
    pub service_account: ServiceAccountKey,
    /// The admin user's client certificate.
    pub admin: CertAndKey,
}

impl ClusterPki {
    fn generate(rsa_client_ca: bool) -> Result<Self, HarnessError> {
        const CLIENT_CA: &str = "selkie-test-cluster-client-ca";
        let client_ca = if rsa_client_ca {
            CertificateAuthority::new_rsa(CLIENT_CA)?
        } else {
            CertificateAuthority::new(CLIENT_CA)?
        };
        let front_proxy_ca = CertificateAuthority::new("selkie-test-front-proxy-ca")?;
        Ok(Self {
            server_ca: CertificateAuthority::new("selkie-test-cluster-server-ca")?,
            front_proxy_client: front_proxy_ca.issue_client(FRONT_PROXY_CLIENT_NAME, &[])?,
            admin: client_ca.issue_client(ADMIN_USER, &["system:masters"])?,
            client_ca,
            front_proxy_ca,
            service_account: ServiceAccountKey::generate()?,
        })
    }
}

/// Options for [`Cluster::start`]; `Cluster::builder().start()` is the common case.
#[derive(Debug, Clone, Default)]
pub struct ClusterBuilder {
    dir: Option<PathBuf>,
    apiserver_port: Option<u16>,
    extra_apiserver_args: Vec<String>,
    apiserver_ready_timeout: Option<Duration>,
    rsa_client_ca: bool,
    node: bool,
}

impl ClusterBuilder {
    /// Keep the cluster's files (PKI, kubeconfig, logs, etcd data) in `dir` instead of a temporary
    /// directory that is removed with the cluster.
    pub fn dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.dir = Some(dir.into());
        self
    }

    /// Serve kube-apiserver on this loopback port instead of a free one.
    pub fn apiserver_port(mut self, port: u16) -> Self {
        self.apiserver_port = Some(port);
        self
    }

    /// Set a kube-apiserver flag (`--name=value`). It replaces the harness's own value of that flag,
    /// so list-valued flags such as `--etcd-servers` are replaced rather than appended to.
    pub fn apiserver_arg(mut self, arg: impl Into<String>) -> Self {
        self.extra_apiserver_args.push(arg.into());
        self
    }

    /// Make the client CA (the cluster signing key) RSA-2048 with its key in PKCS#1, as kubeadm
    /// makes `/etc/kubernetes/pki/ca.{crt,key}`, instead of P-256.
    pub fn rsa_client_ca(mut self) -> Self {
        self.rsa_client_ca = true;
        self
    }

    /// Join a real node to the cluster ([`crate::node`]): containerd, the kubelet, kube-proxy,
    /// kube-scheduler and kube-controller-manager as a static pod. kube-apiserver then listens on
    /// every address (pods reach it through the `kubernetes` Service at the host's address),
    /// admits pods with service accounts and authorizes the kubelet with the Node authorizer.
    /// Needs root; one node runs on a machine at a time.
    pub fn node(mut self) -> Self {
        self.node = true;
        self
    }

    /// How long to wait for `/readyz` (default 90 s).
    pub fn apiserver_ready_timeout(mut self, timeout: Duration) -> Self {
        self.apiserver_ready_timeout = Some(timeout);
        self
    }

    /// Builds the components if needed, generates the PKI, starts etcd and kube-apiserver and
    /// waits until the apiserver is ready and its default namespace exists.
    ///
    /// Fails with one [`HarnessError`] naming the component, its command and its log tail when a
    /// component cannot be built or started, exits, or is not ready in time. Whatever was already
    /// started is stopped before the error returns.
    pub async fn start(self) -> Result<Cluster, HarnessError> {
        Cluster::start_with(self).await
    }
}

/// Where this run's files are; a temporary directory is removed when the cluster drops.
#[derive(Debug)]
enum RunDir {
    Temporary(tempfile::TempDir),
    Kept(PathBuf),
}

impl RunDir {
    fn path(&self) -> &Path {
        match self {
            RunDir::Temporary(dir) => dir.path(),
            RunDir::Kept(path) => path,
        }
    }
}

/// A running etcd + kube-apiserver. Dropping it stops both (SIGTERM, then SIGKILL) and removes
/// its temporary files; if the test process dies instead, the kernel kills both.
#[derive(Debug)]
pub struct Cluster {
    // Field order is drop order: the node stops first, the apiserver before etcd, files last.
    node: Option<crate::node::Node>,
    apiserver: ManagedProcess,
    /// kube-apiserver's arguments, to start it again ([`Cluster::restart_apiserver`]).
    apiserver_args: Vec<OsString>,
    etcd: ManagedProcess,
    /// etcd's client and peer ports, to start it again ([`Cluster::restart_etcd`]).
    etcd_ports: (u16, u16),
    pki: ClusterPki,
    server_url: String,
    apiserver_port: u16,
    kubeconfig: PathBuf,
    components: &'static Components,
    started_in: Duration,
    dir: RunDir,
}

static SHARED: OnceCell<Result<Cluster, String>> = OnceCell::const_new();
static SHARED_NODE: OnceCell<Result<Cluster, String>> = OnceCell::const_new();
static UNIQUE: AtomicUsize = AtomicUsize::new(0);

impl Cluster {
    /// A builder with the default options.
    pub fn builder() -> ClusterBuilder {
        ClusterBuilder::default()
    }

    /// Starts a private cluster with the default options; see [`ClusterBuilder::start`].
    pub async fn start() -> Result<Cluster, HarnessError> {
        Self::builder().start().await
    }

    /// The one cluster of this test binary, started by the first test that asks for it. Tests
    /// share it and isolate themselves with their own namespaces ([`Cluster::create_namespace`])
    /// and uniquely named cluster-scoped objects. It is never dropped; its processes die with the
    /// test process (parent-death signal) and its files are swept by the next run.
    ///
    /// A failed start is remembered: every later caller gets the same error at once.
    pub async fn shared() -> Result<&'static Cluster, HarnessError> {
        SHARED
            .get_or_init(|| async { Cluster::start().await.map_err(|e| e.to_string()) })
            .await
            .as_ref()
            .map_err(|e| HarnessError::SharedCluster(e.clone()))
    }

    /// The one cluster with a node ([`ClusterBuilder::node`]) of this test binary, shared as
    /// [`Cluster::shared`] is. The `node_` tests share it: a machine runs one node at a time.
    pub async fn shared_node() -> Result<&'static Cluster, HarnessError> {
        SHARED_NODE
            .get_or_init(|| async { Cluster::builder().node().start().await.map_err(|e| e.to_string()) })
            .await
            .as_ref()
            .map_err(|e| HarnessError::SharedCluster(e.clone()))
    }

    /// The node, when the cluster was started with one.
    pub fn node(&self) -> Option<&crate::node::Node> {
        self.node.as_ref()
    }

    async fn start_with(options: ClusterBuilder) -> Result<Cluster, HarnessError> {
        crate::install_crypto_provider();
        let begun = Instant::now();
        let components = Components::get()?;
        let dir = match &options.dir {
            Some(dir) => {
                fs::create_dir_all(dir)
                    .map_err(|e| HarnessError::io(format!("creating {}", dir.display()), e))?;
                RunDir::Kept(dir.clone())
            }
            None => RunDir::Temporary(new_temp_run_dir()?),
        };
        let root = dir.path().to_path_buf();
        let pki = ClusterPki::generate(options.rsa_client_ca)?;
        let host_ip = options.node.then(crate::node::host_ip).transpose()?;
        let files = write_pki(&root, &pki, host_ip)?;

        let etcd_client_port = crate::free_port()?;
        let etcd_peer_port = crate::free_port()?;
        let mut etcd = start_etcd(components, &root, etcd_client_port, etcd_peer_port)?;
        wait_for_etcd(&mut etcd, etcd_client_port, DEFAULT_ETCD_READY_TIMEOUT).await?;

        let apiserver_port = match options.apiserver_port {
            Some(port) => port,
            None => crate::free_port()?,
        };
        let server_url = format!("https://127.0.0.1:{apiserver_port}");
        let mut overrides = match host_ip {
            Some(ip) => node_apiserver_args(&root, &pki, ip)?,
            None => Vec::new(),
        };
        overrides.extend(options.extra_apiserver_args.iter().cloned());
        let args = with_overrides(
            apiserver_args(&files, etcd_client_port, apiserver_port),
            &overrides,
        );
        let mut apiserver = ManagedProcess::spawn(
            "kube-apiserver",
            &components.kube_apiserver,
            &args,
            root.join("kube-apiserver.log"),
        )?;

        let kubeconfig = root.join("admin.kubeconfig");
        write_kubeconfig(
            &kubeconfig,
            &server_url,
            &pki.server_ca.cert_pem(),
            ADMIN_USER,
            &pki.admin,
        )?;
        let timeout = options
            .apiserver_ready_timeout
            .unwrap_or(DEFAULT_APISERVER_READY_TIMEOUT);
        wait_for_apiserver(&mut apiserver, &mut etcd, &kubeconfig, timeout).await?;

        let node = match host_ip {
            Some(host_ip) => Some(
                crate::node::Node::start(crate::node::ControlPlane {
                    root: &root,
                    pki: &pki,
                    host_ip,
                    apiserver_port,
                    admin_kubeconfig: &kubeconfig,
                    kubernetes_version: &components.kubernetes_version,
                    kubectl: &components.kubectl,
                    images: crate::images::node_images()?,
                })
                .await?,
            ),
            None => None,
        };

        Ok(Cluster {
            node,
            apiserver,
            apiserver_args: args,
            etcd,
            etcd_ports: (etcd_client_port, etcd_peer_port),
            pki,
            server_url,
            apiserver_port,
            kubeconfig,
            components,
            started_in: begun.elapsed(),
            dir,
        })
    }

    /// The apiserver's URL, `https://127.0.0.1:<port>`.
    pub fn server_url(&self) -> &str {
        &self.server_url
    }

    /// The apiserver's loopback port.
    pub fn apiserver_port(&self) -> u16 {
        self.apiserver_port
    }

    /// Path of a kubeconfig for the admin user (`system:masters`), with embedded credentials.
    pub fn admin_kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// The cluster's PKI, CA keys included.
    pub fn pki(&self) -> &ClusterPki {
        &self.pki
    }

    /// The directory holding the cluster's files and component logs.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The Kubernetes version the apiserver and kubectl were built at (for example `1.35.4`).
    pub fn kubernetes_version(&self) -> &str {
        &self.components.kubernetes_version
    }

    /// How long [`Cluster::start`] took, component builds (normally cached) included.
    pub fn started_in(&self) -> Duration {
        self.started_in
    }

    /// Process ids of etcd and kube-apiserver.
    pub fn pids(&self) -> Vec<u32> {
        vec![self.etcd.pid(), self.apiserver.pid()]
    }

    /// A new admin `kube::Client` bound to the calling tokio runtime. Clients are not stored:
    /// each test's runtime needs its own.
    pub async fn client(&self) -> Result<Client, HarnessError> {
        client_from_kubeconfig(&self.kubeconfig).await
    }

    /// The real kubectl (the same version as the apiserver) with the admin kubeconfig.
    pub fn kubectl(&self) -> Kubectl {
        Kubectl::new(&self.components.kubectl, &self.kubeconfig)
    }

    /// Issues a client certificate from the cluster client CA (`CN=<user>`, one `O=` per group)
    /// and writes a kubeconfig using it into the cluster directory; returns the kubeconfig path.
    pub fn user_kubeconfig(&self, user: &str, groups: &[&str]) -> Result<PathBuf, HarnessError> {
        self.kubeconfig_with(&self.pki.client_ca.issue_client(user, groups)?)
    }

    /// Writes a kubeconfig for this cluster that authenticates with `credential` (a client
    /// certificate and key) into the cluster directory; returns its path.
    pub fn kubeconfig_with(&self, credential: &CertAndKey) -> Result<PathBuf, HarnessError> {
        let n = UNIQUE.fetch_add(1, Ordering::Relaxed);
        let path = self.dir().join(format!("user-{n}.kubeconfig"));
        write_kubeconfig(
            &path,
            &self.server_url,
            &self.pki.server_ca.cert_pem(),
            "user",
            credential,
        )?;
        Ok(path)
    }

    /// Creates a namespace named `<prefix>-<random suffix>` and returns its name: the unit of
    /// isolation between tests sharing a cluster.
    pub async fn create_namespace(&self, client: &Client, prefix: &str) -> Result<String, HarnessError> {
        let namespace = Namespace {
            metadata: ObjectMeta {
                generate_name: Some(format!("{prefix}-")),
                ..ObjectMeta::default()
            },
            ..Namespace::default()
        };
        let created = Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &namespace)
            .await
            .map_err(|e| HarnessError::kube(format!("creating a namespace {prefix}-*"), e))?;
        created
            .metadata
            .name
            .ok_or_else(|| HarnessError::kube("creating a namespace", "no name returned"))
    }

    /// Stops kube-apiserver (SIGTERM, as a rolling control-plane upgrade does, then SIGKILL after
    /// 5 s), keeps it down for `down`, and starts it again with the same arguments on the same
    /// port and etcd; returns when it is ready again (90 s at most) with how long it took from
    /// the stop. Its log continues in `kube-apiserver.log`. Fails like [`ClusterBuilder::start`]
    /// when it does not come back.
    pub async fn restart_apiserver(&mut self, down: Duration) -> Result<Duration, HarnessError> {
        let stopped = Instant::now();
        self.apiserver.stop_async(Duration::from_secs(5)).await;
        tokio::time::sleep(down).await;
        self.apiserver = ManagedProcess::spawn(
            "kube-apiserver",
            &self.components.kube_apiserver,
            &self.apiserver_args,
            self.dir.path().join("kube-apiserver.log"),
        )?;
        self.wait_until_ready_again().await?;
        Ok(stopped.elapsed())
    }

    /// Black-holes kube-apiserver for `frozen`: SIGSTOP, then SIGCONT. Meanwhile the kernel
    /// still accepts connections to its port and acknowledges what is sent on open ones, but
    /// nothing is answered, as with a hung or black-holed apiserver behind a load balancer.
    /// Returns once it answers `/readyz` again (90 s at most), with how long it took from the
    /// freeze.
    pub async fn freeze_apiserver(&mut self, frozen: Duration) -> Result<Duration, HarnessError> {
        use nix::sys::signal::Signal;
        let began = Instant::now();
        self.signal_apiserver(Signal::SIGSTOP)?;
        tokio::time::sleep(frozen).await;
        self.signal_apiserver(Signal::SIGCONT)?;
        self.wait_until_ready_again().await?;
        Ok(began.elapsed())
    }

    /// Makes kube-apiserver slow for `total`: stopped (SIGSTOP) for `paused` of every `period`,
    /// running the rest, as an apiserver starved of CPU answers — late, but it answers. Returns
    /// once it answers `/readyz` after the last SIGCONT (90 s at most), with how long it took
    /// from the start. `paused` must be shorter than `period`.
    pub async fn slow_apiserver(
        &mut self,
        period: Duration,
        paused: Duration,
        total: Duration,
    ) -> Result<Duration, HarnessError> {
        use nix::sys::signal::Signal;
        if paused >= period {
            return Err(HarnessError::NotReady(format!(
                "slow_apiserver: paused {paused:?} is not shorter than the period {period:?}"
            )));
        }
        let began = Instant::now();
        while began.elapsed() + period <= total {
            self.signal_apiserver(Signal::SIGSTOP)?;
            tokio::time::sleep(paused).await;
            self.signal_apiserver(Signal::SIGCONT)?;
            tokio::time::sleep(period - paused).await;
        }
        self.wait_until_ready_again().await?;
        Ok(began.elapsed())
    }

    /// Sends `signal` to kube-apiserver.
    fn signal_apiserver(&self, signal: nix::sys::signal::Signal) -> Result<(), HarnessError> {
        let pid = nix::unistd::Pid::from_raw(self.apiserver.pid() as i32);
        nix::sys::signal::kill(pid, signal).map_err(|e| {
            HarnessError::io(
                format!("sending {signal} to kube-apiserver"),
                std::io::Error::from(e),
            )
        })
    }

    /// Stops etcd (SIGTERM, then SIGKILL after 5 s), keeps it down for `down`, and starts it
    /// again on the same ports and data directory, kube-apiserver staying up throughout; returns
    /// when etcd is healthy and kube-apiserver ready again (90 s at most) with how long it took
    /// from the stop. Its log continues in `etcd.log`. Fails when either does not come back.
    pub async fn restart_etcd(&mut self, down: Duration) -> Result<Duration, HarnessError> {
        let stopped = Instant::now();
        self.etcd.stop_async(Duration::from_secs(5)).await;
        tokio::time::sleep(down).await;
        let (client_port, peer_port) = self.etcd_ports;
        self.etcd = start_etcd(self.components, self.dir.path(), client_port, peer_port)?;
        wait_for_etcd(&mut self.etcd, client_port, DEFAULT_ETCD_READY_TIMEOUT).await?;
        self.wait_until_ready_again().await?;
        Ok(stopped.elapsed())
    }

    /// After a fault the cluster's own methods injected: waits (90 s at most) until
    /// kube-apiserver answers `/readyz` again, as at start-up, failing early when either process
    /// has exited.
    async fn wait_until_ready_again(&mut self) -> Result<(), HarnessError> {
        wait_for_apiserver(
            &mut self.apiserver,
            &mut self.etcd,
            &self.kubeconfig,
            DEFAULT_APISERVER_READY_TIMEOUT,
        )
        .await
    }

    /// Stops both components (the apiserver first) and removes temporary files.
    pub fn stop(self) {
        drop(self);
    }
}

/// Builds a `kube::Client` from a kubeconfig file, bound to the calling tokio runtime.
pub async fn client_from_kubeconfig(path: &Path) -> Result<Client, HarnessError> {
    let context = || format!("building a client from {}", path.display());
    let kubeconfig = Kubeconfig::read_from(path).map_err(|e| HarnessError::kube(context(), e))?;
    let mut config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(|e| HarnessError::kube(context(), e))?;
    config.connect_timeout = Some(Duration::from_secs(5));
    config.read_timeout = Some(Duration::from_secs(30));
    Client::try_from(config).map_err(|e| HarnessError::kube(context(), e))
}

/// Paths of the PKI files kube-apiserver reads.
struct PkiFiles {
    serving_cert: PathBuf,
    serving_key: PathBuf,
    client_ca: PathBuf,
    front_proxy_ca: PathBuf,
    front_proxy_client_cert: PathBuf,
    front_proxy_client_key: PathBuf,
    sa_public: PathBuf,
    sa_private: PathBuf,
}

/// kube-apiserver's flags for a cluster with a node at `host_ip`: it listens on every address and
/// advertises the host's (the `kubernetes` Service's endpoint), pods get service-account tokens,
/// the Node authorizer admits the kubelet, and kube-apiserver reaches the kubelet (exec, logs,
/// port-forward) with a client certificate.
fn node_apiserver_args(
    root: &Path,
    pki: &ClusterPki,
    host_ip: std::net::Ipv4Addr,
) -> Result<Vec<String>, HarnessError> {
    let kubelet_client = pki
        .client_ca
        .issue_client("kube-apiserver-kubelet-client", &["system:masters"])?;
    let cert = root.join("pki/kubelet-client.crt");
    let key = root.join("pki/kubelet-client.key");
    write_private_file(&cert, &kubelet_client.cert_pem)?;
    write_private_file(&key, &kubelet_client.key_pem)?;
    Ok(vec![
        "--bind-address=0.0.0.0".into(),
        format!("--advertise-address={host_ip}"),
        "--endpoint-reconciler-type=lease".into(),
        "--disable-admission-plugins=".into(),
        "--enable-admission-plugins=NodeRestriction".into(),
        "--authorization-mode=Node,RBAC".into(),
        format!("--kubelet-client-certificate={}", cert.display()),
        format!("--kubelet-client-key={}", key.display()),
        // The node's name is not in any DNS the host uses; its address is.
        "--kubelet-preferred-address-types=InternalIP,Hostname".into(),
    ])
}

fn write_pki(
    root: &Path,
    pki: &ClusterPki,
    host_ip: Option<std::net::Ipv4Addr>,
) -> Result<PkiFiles, HarnessError> {
    let host_ip = host_ip.map(|ip| ip.to_string());
    let mut sans = vec![
        "localhost",
        "127.0.0.1",
        "kubernetes",
        "kubernetes.default",
        "kubernetes.default.svc",
        "kubernetes.default.svc.cluster.local",
        "10.0.0.1",
    ];
    sans.extend(host_ip.as_deref());
    let serving = pki.server_ca.issue_serving("kube-apiserver", &sans)?;
    let dir = root.join("pki");
    fs::create_dir_all(&dir).map_err(|e| HarnessError::io(format!("creating {}", dir.display()), e))?;
    let write = |name: &str, contents: &str| -> Result<PathBuf, HarnessError> {
        let path = dir.join(name);
        write_private_file(&path, contents)?;
        Ok(path)
    };
    write("server-ca.crt", &pki.server_ca.cert_pem())?;
    write("client-ca.key", &pki.client_ca.key_pem())?;
    Ok(PkiFiles {
        serving_cert: write("serving.crt", &serving.cert_pem)?,
        serving_key: write("serving.key", &serving.key_pem)?,
        client_ca: write("client-ca.crt", &pki.client_ca.cert_pem())?,
        front_proxy_ca: write("front-proxy-ca.crt", &pki.front_proxy_ca.cert_pem())?,
        front_proxy_client_cert: write("front-proxy-client.crt", &pki.front_proxy_client.cert_pem)?,
        front_proxy_client_key: write("front-proxy-client.key", &pki.front_proxy_client.key_pem)?,
        sa_public: write("sa.pub", &pki.service_account.public_pem)?,
        sa_private: write("sa.key", &pki.service_account.private_pem)?,
    })
}

/// Writes a file readable by its owner only (it may hold a private key).
pub(crate) fn write_private_file(path: &Path, contents: &str) -> Result<(), HarnessError> {
    use std::{io::Write, os::unix::fs::OpenOptionsExt};
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| HarnessError::io(format!("writing {}", path.display()), e))?;
    file.write_all(contents.as_bytes())
        .map_err(|e| HarnessError::io(format!("writing {}", path.display()), e))
}

/// Writes a kubeconfig with embedded CA and client certificate data.
pub fn write_kubeconfig(
    path: &Path,
    server_url: &str,
    ca_pem: &str,
    user: &str,
    credential: &CertAndKey,
) -> Result<(), HarnessError> {
    let user_entry = serde_json::json!({
        "client-certificate-data": B64.encode(&credential.cert_pem),
        "client-key-data": B64.encode(&credential.key_pem),
    });
    write_kubeconfig_for_user(path, server_url, ca_pem, user, user_entry)
}

/// Writes a kubeconfig with an embedded CA and `user_entry` as the user (for example
/// `{"token": "…"}`), readable by its owner only.
pub fn write_kubeconfig_for_user(
    path: &Path,
    server_url: &str,
    ca_pem: &str,
    user: &str,
    user_entry: serde_json::Value,
) -> Result<(), HarnessError> {
    let kubeconfig = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "selkie-test", "cluster": {
            "server": server_url,
            "certificate-authority-data": B64.encode(ca_pem),
        }}],
        "users": [{"name": user, "user": user_entry}],
        "contexts": [{"name": "selkie-test", "context": {"cluster": "selkie-test", "user": user}}],
        "current-context": "selkie-test",
    });
    // JSON is valid YAML, and kubectl and kube-rs both read it.
    let text = serde_json::to_string_pretty(&kubeconfig)
        .map_err(|e| HarnessError::io("encoding a kubeconfig", std::io::Error::other(e)))?;
    write_private_file(path, &text)
}

/// Where temporary cluster directories live; stale ones of dead test processes are swept here.
pub(crate) fn temp_root() -> PathBuf {
    std::env::temp_dir().join("selkie-e2e")
}

/// Creates `<tmp>/selkie-e2e/cluster-<pid>-XXXX` after removing directories whose process is gone
/// (a shared cluster is never dropped, so its files are cleaned by the next run).
fn new_temp_run_dir() -> Result<tempfile::TempDir, HarnessError> {
    let root = temp_root();
    fs::create_dir_all(&root).map_err(|e| HarnessError::io(format!("creating {}", root.display()), e))?;
    if let Ok(entries) = fs::read_dir(&root) {
        for entry in entries.flatten() {
            let name = entry.file_name();
            let owner = name
                .to_str()
                .and_then(|n| n.strip_prefix("cluster-"))
                .and_then(|rest| rest.split('-').next())
                .and_then(|pid| pid.parse::<u32>().ok());
            if let Some(pid) = owner {
                if !Path::new(&format!("/proc/{pid}")).exists() {
                    // A node's kubelet and containerd mount below their run directory.
                    crate::node::unmount_under(&entry.path());
                    let _ = fs::remove_dir_all(entry.path());
                }
            }
        }
    }
    tempfile::Builder::new()
        .prefix(&format!("cluster-{}-", std::process::id()))
        .tempdir_in(&root)
        .map_err(|e| HarnessError::io(format!("creating a directory in {}", root.display()), e))
}

fn start_etcd(
    components: &Components,
    root: &Path,
    client_port: u16,
    peer_port: u16,
) -> Result<ManagedProcess, HarnessError> {
    let client_url = format!("http://127.0.0.1:{client_port}");
    let peer_url = format!("http://127.0.0.1:{peer_port}");
    let args: Vec<OsString> = [
        "--name=selkie-test".to_string(),
        format!("--data-dir={}", root.join("etcd-data").display()),
        format!("--listen-client-urls={client_url}"),
        format!("--advertise-client-urls={client_url}"),
        format!("--listen-peer-urls={peer_url}"),
        format!("--initial-advertise-peer-urls={peer_url}"),
        format!("--initial-cluster=selkie-test={peer_url}"),
        "--unsafe-no-fsync=true".to_string(),
        "--log-level=warn".to_string(),
    ]
    .into_iter()
    .map(OsString::from)
    .collect();
    ManagedProcess::spawn("etcd", &components.etcd, &args, root.join("etcd.log"))
}

fn apiserver_args(files: &PkiFiles, etcd_port: u16, port: u16) -> Vec<OsString> {
    let path = |p: &PathBuf| p.display().to_string();
    [
        format!("--etcd-servers=http://127.0.0.1:{etcd_port}"),
        "--bind-address=127.0.0.1".to_string(),
        format!("--secure-port={port}"),
        "--advertise-address=127.0.0.1".to_string(),
        // A loopback advertise address cannot be written to the `kubernetes` Endpoints.
        "--endpoint-reconciler-type=none".to_string(),
        format!("--tls-cert-file={}", path(&files.serving_cert)),
        format!("--tls-private-key-file={}", path(&files.serving_key)),
        format!("--client-ca-file={}", path(&files.client_ca)),
        "--authorization-mode=RBAC".to_string(),
        "--allow-privileged=true".to_string(),
        format!("--service-cluster-ip-range={}", crate::node::SERVICE_CIDR),
        // No controller-manager creates default service accounts, so pods would be refused.
        "--disable-admission-plugins=ServiceAccount".to_string(),
        format!("--service-account-issuer=https://127.0.0.1:{port}"),
        format!("--service-account-key-file={}", path(&files.sa_public)),
        format!("--service-account-signing-key-file={}", path(&files.sa_private)),
        // Aggregation: kube-apiserver authenticates to aggregated API servers with the
        // front-proxy client certificate and passes the user in X-Remote-* headers.
        format!("--requestheader-client-ca-file={}", path(&files.front_proxy_ca)),
        format!("--requestheader-allowed-names={FRONT_PROXY_CLIENT_NAME}"),
        "--requestheader-username-headers=X-Remote-User".to_string(),
        "--requestheader-uid-headers=X-Remote-Uid".to_string(),
        "--requestheader-group-headers=X-Remote-Group".to_string(),
        "--requestheader-extra-headers-prefix=X-Remote-Extra-".to_string(),
        format!(
            "--proxy-client-cert-file={}",
            path(&files.front_proxy_client_cert)
        ),
        format!("--proxy-client-key-file={}", path(&files.front_proxy_client_key)),
        "--enable-aggregator-routing=false".to_string(),
        "--profiling=false".to_string(),
    ]
    .into_iter()
    .map(OsString::from)
    .collect()
}

/// `defaults` with every flag named in `overrides` removed, then `overrides` appended.
fn with_overrides(defaults: Vec<OsString>, overrides: &[String]) -> Vec<OsString> {
    let name = |arg: &str| arg.split_once('=').map_or(arg, |(name, _)| name).to_string();
    let overridden: Vec<String> = overrides.iter().map(|o| name(o)).collect();
    defaults
        .into_iter()
        .filter(|arg| !overridden.contains(&name(&arg.to_string_lossy())))
        .chain(overrides.iter().map(OsString::from))
        .collect()
}

/// Waits until etcd answers `/health` with `"health":"true"` on its client port.
async fn wait_for_etcd(etcd: &mut ManagedProcess, port: u16, timeout: Duration) -> Result<(), HarnessError> {
    let deadline = Instant::now() + timeout;
    loop {
        etcd.check_running("during start-up")?;
        let last = match tokio::time::timeout(Duration::from_secs(2), etcd_health(port)).await {
            Ok(Ok(body)) if body.contains(r#""health":"true""#) => return Ok(()),
            Ok(Ok(body)) => format!("/health answered: {}", body.trim()),
            Ok(Err(e)) => format!("/health: {e}"),
            Err(_) => "/health did not answer within 2s".into(),
        };
        if Instant::now() >= deadline {
            return Err(etcd.failure(format!(
                "did not become healthy within {timeout:?} (last check: {last})"
            )));
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

async fn etcd_health(port: u16) -> std::io::Result<String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).await?;
    stream
        .write_all(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        .await?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response).await?;
    Ok(String::from_utf8_lossy(&response).into_owned())
}

/// Waits until `/readyz` answers `ok` and the `default` namespace exists, failing early when
/// either process exits.
async fn wait_for_apiserver(
    apiserver: &mut ManagedProcess,
    etcd: &mut ManagedProcess,
    kubeconfig: &Path,
    timeout: Duration,
) -> Result<(), HarnessError> {
    let deadline = Instant::now() + timeout;
    let client = client_from_kubeconfig(kubeconfig).await?;
    loop {
        apiserver.check_running("during start-up")?;
        etcd.check_running("while kube-apiserver was starting")?;
        let request = http_get("/readyz");
        let last = match tokio::time::timeout(Duration::from_secs(3), client.request_text(request)).await {
            Ok(Ok(body)) if body.trim() == "ok" => {
                let namespaces = Api::<Namespace>::all(client.clone());
                match tokio::time::timeout(Duration::from_secs(3), namespaces.get_opt("default")).await {
                    Ok(Ok(Some(_))) => return Ok(()),
                    Ok(Ok(None)) => "ready, but the default namespace does not exist yet".into(),
                    Ok(Err(e)) => format!("ready, but reading the default namespace failed: {e}"),
                    Err(_) => "ready, but reading the default namespace timed out".into(),
                }
            }
            Ok(Ok(body)) => format!("/readyz answered: {}", body.trim()),
            Ok(Err(e)) => format!("/readyz: {e}"),
            Err(_) => "/readyz did not answer within 3s".into(),
        };
        if Instant::now() >= deadline {
            return Err(apiserver.failure(format!(
                "did not become ready within {timeout:?} (last check: {last})"
            )));
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

fn http_get(path: &'static str) -> http::Request<Vec<u8>> {
    let mut request = http::Request::new(Vec::new());
    *request.uri_mut() = http::Uri::from_static(path);
    request
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_override_replaces_the_default_flag_of_the_same_name_and_keeps_the_rest() {
        let defaults: Vec<OsString> = ["--etcd-servers=http://a", "--secure-port=1", "--profiling=false"]
            .map(OsString::from)
            .to_vec();
        let args = with_overrides(defaults, &["--etcd-servers=http://b".into(), "--v=4".into()]);
        assert_eq!(
            args,
            [
                "--secure-port=1",
                "--profiling=false",
                "--etcd-servers=http://b",
                "--v=4"
            ]
            .map(OsString::from)
            .to_vec()
        );
    }
}
