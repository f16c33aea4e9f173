//! The Kubernetes client of a server: from a kubeconfig file when one is configured, else the
//! in-cluster configuration (or `$KUBECONFIG`).

use std::path::Path;

use kube::{
    config::{KubeConfigOptions, Kubeconfig},
    Client, Config,
};

/// Why no client could be made. Names the file; never quotes credentials.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// The kubeconfig cannot be read or parsed.
    #[error("kubeconfig: reading {path}: {message}")]
    Read {
        /// The file.
        path: String,
        /// What went wrong.
        message: String,
    },
    /// The kubeconfig cannot be used.
    #[error("kubeconfig: {path} is unusable: {message}")]
    Unusable {
        /// The file.
        path: String,
        /// What went wrong.
        message: String,
    },
    /// No kubeconfig, and no in-cluster configuration either.
    #[error("no kubeconfig is configured and neither in-cluster configuration nor $KUBECONFIG works: {0}")]
    NoConfiguration(String),
    /// The client cannot be built from the configuration.
    #[error("building the Kubernetes client: {0}")]
    Build(String),
}

/// A client for `kubeconfig`, or for the in-cluster configuration when `None`.
pub async fn connect(kubeconfig: Option<&Path>) -> Result<Client, ClientError> {
    let config = match kubeconfig {
        Some(path) => {
            let shown = path.display().to_string();
            let kubeconfig = Kubeconfig::read_from(path).map_err(|e| ClientError::Read {
                path: shown.clone(),
                message: e.to_string(),
            })?;
            Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
                .await
                .map_err(|e| ClientError::Unusable {
                    path: shown,
                    message: e.to_string(),
                })?
        }
        None => Config::infer()
            .await
            .map_err(|e| ClientError::NoConfiguration(e.to_string()))?,
    };
    Client::try_from(config).map_err(|e| ClientError::Build(e.to_string()))
}
