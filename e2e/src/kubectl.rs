//! The real kubectl, run as a user would.

use std::{
    ffi::OsStr,
    path::{Path, PathBuf},
    process::Stdio,
    time::Duration,
};

use tokio::io::AsyncWriteExt;

use crate::HarnessError;

/// How long one kubectl invocation may take before the harness gives up on it, unless it is
/// given a longer `--timeout` of its own (see [`bound`]).
pub const KUBECTL_TIMEOUT: Duration = Duration::from_secs(60);

/// How long the harness waits for `kubectl <args>`: [`KUBECTL_TIMEOUT`], or kubectl's own
/// `--timeout=<N>s|<N>m` (as `kubectl wait` takes) and 15 s more to exit, whichever is longer.
fn bound(args: &[String]) -> Duration {
    let own = args.iter().find_map(|arg| {
        let value = arg.strip_prefix("--timeout=")?;
        let (number, unit) = value.split_at(value.find(|c: char| !c.is_ascii_digit())?);
        let seconds = number.parse::<u64>().ok()?
            * match unit {
                "s" => 1,
                "m" => 60,
                _ => return None,
            };
        Some(Duration::from_secs(seconds + 15))
    });
    own.map_or(KUBECTL_TIMEOUT, |own| own.max(KUBECTL_TIMEOUT))
}

/// kubectl with a kubeconfig. Each call is a separate process, exactly as a user runs it.
#[derive(Debug, Clone)]
pub struct Kubectl {
    binary: PathBuf,
    kubeconfig: PathBuf,
}

/// What one kubectl invocation did.
#[derive(Debug, Clone)]
pub struct KubectlOutput {
    /// Whether it exited 0.
    pub success: bool,
    /// The exit status, as text.
    pub status: String,
    /// Everything it printed on stdout.
    pub stdout: String,
    /// Everything it printed on stderr.
    pub stderr: String,
}

impl Kubectl {
    /// kubectl at `binary` using `kubeconfig` (and nothing from the environment's `KUBECONFIG`).
    pub fn new(binary: &Path, kubeconfig: &Path) -> Self {
        Self {
            binary: binary.to_path_buf(),
            kubeconfig: kubeconfig.to_path_buf(),
        }
    }

    /// The same kubectl with another kubeconfig.
    pub fn with_kubeconfig(&self, kubeconfig: &Path) -> Self {
        Self::new(&self.binary, kubeconfig)
    }

    /// The kubectl binary.
    pub fn binary(&self) -> &Path {
        &self.binary
    }

    /// Runs `kubectl <args>`, optionally feeding `stdin`, and returns what it did whatever its exit
    /// status. Fails only if it cannot be run or takes longer than its bound (60 s, or its own
    /// `--timeout` and 15 s).
    pub async fn output<S: AsRef<OsStr>>(
        &self,
        args: &[S],
        stdin: Option<&str>,
    ) -> Result<KubectlOutput, HarnessError> {
        let words: Vec<String> = args
            .iter()
            .map(|a| a.as_ref().to_string_lossy().into_owned())
            .collect();
        let shown = words.join(" ");
        let bound = bound(&words);
        let mut child = tokio::process::Command::new(&self.binary)
            .args(args)
            .env("KUBECONFIG", &self.kubeconfig)
            // Discovery cache beside the kubeconfig, not in the user's ~/.kube.
            .env("KUBECACHEDIR", self.kubeconfig.with_extension("kubectl-cache"))
            .env_remove("KUBERNETES_EXEC_INFO")
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| HarnessError::io(format!("starting kubectl {shown}"), e))?;
        // stdin is written while stdout and stderr are read: kubectl answers each object of a
        // long manifest as it goes, and once its output fills the pipe it reads no more input,
        // so writing all of the input first deadlocks (a manifest of ~1,400 objects did).
        let pipe = child.stdin.take();
        let write = async move {
            if let (Some(input), Some(mut pipe)) = (stdin, pipe) {
                pipe.write_all(input.as_bytes()).await?;
                // Dropped here: kubectl sees the end of its input.
            }
            Ok::<_, std::io::Error>(())
        };
        let exchange = async {
            let (written, output) = tokio::join!(write, child.wait_with_output());
            written.map_err(|e| HarnessError::io(format!("writing stdin of kubectl {shown}"), e))?;
            output.map_err(|e| HarnessError::io(format!("waiting for kubectl {shown}"), e))
        };
        let output = tokio::time::timeout(bound, exchange)
            .await
            .map_err(|_| HarnessError::Kubectl {
                args: shown.clone(),
                status: format!("no exit within {bound:?}"),
                stderr: String::new(),
            })??;
        Ok(KubectlOutput {
            success: output.status.success(),
            status: output.status.to_string(),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        })
    }

    /// The names (`secret/<name>`) of the Secrets in `namespace` that the label `selector`
    /// selects (`kubectl get secrets -l`), in kubectl's order; fails as [`Kubectl::run`].
    pub async fn secret_names(&self, namespace: &str, selector: &str) -> Result<Vec<String>, HarnessError> {
        let listed = self
            .run(&["get", "secrets", "-n", namespace, "-l", selector, "-o", "name"])
            .await?;
        Ok(listed.lines().map(str::to_string).collect())
    }

    /// Points an installed aggregated API at a process on loopback (a cluster without a node):
    /// replaces the Service `namespace/service` the manifests created with an `ExternalName` to
    /// `localhost`, and sets the port of each APIService of `api_services` to `port`.
    pub async fn serve_api_services_on_loopback(
        &self,
        namespace: &str,
        service: &str,
        api_services: &[&str],
        port: u16,
    ) -> Result<(), HarnessError> {
        self.run(&["delete", "service", "-n", namespace, service]).await?;
        let external = serde_json::json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": service, "namespace": namespace},
            "spec": {"type": "ExternalName", "externalName": "localhost"}})
        .to_string();
        self.run_with_stdin(&["create", "-f", "-"], Some(&external))
            .await?;
        let patch = serde_json::json!({"spec": {"service": {"port": port}}}).to_string();
        for api_service in api_services {
            self.run(&["patch", "apiservice", api_service, "--type=merge", "-p", &patch])
                .await?;
        }
        Ok(())
    }

    /// `kubectl create` of an OIDCClientSecretRequest for the OIDCClient `client` in `namespace`
    /// (the Supervisor's aggregated API): its JSON answer, or kubectl's stderr when the request
    /// was refused. Fails when kubectl cannot be run or its answer is not JSON.
    pub async fn create_client_secret_request(
        &self,
        namespace: &str,
        client: &str,
        generate: bool,
        revoke: bool,
    ) -> Result<Result<serde_json::Value, String>, HarnessError> {
        let request = serde_json::json!({
            "apiVersion": "clientsecret.supervisor.pinniped.dev/v1alpha1",
            "kind": "OIDCClientSecretRequest",
            "metadata": {"name": client, "namespace": namespace},
            "spec": {"generateNewSecret": generate, "revokeOldSecrets": revoke},
        })
        .to_string();
        let output = self
            .output(&["create", "-o", "json", "-f", "-"], Some(&request))
            .await?;
        if !output.success {
            return Ok(Err(output.stderr));
        }
        serde_json::from_str(&output.stdout).map(Ok).map_err(|e| {
            HarnessError::Unexpected(format!("an OIDCClientSecretRequest answer is not JSON: {e}"))
        })
    }

    /// `kubectl create role <name>` in `namespace` with `--verb=<verbs>` on `--resource=<resources>`
    /// (both comma-separated), then `kubectl create rolebinding <name>` of it to `subjects` (flags
    /// such as `--user=<name>` or `--group=<name>`). The harness runs no controller manager, so the
    /// aggregated ClusterRoles (`view`, `edit`) are empty: tests say what they need this way.
    pub async fn create_role_and_binding(
        &self,
        namespace: &str,
        name: &str,
        verbs: &str,
        resources: &str,
        subjects: &[&str],
    ) -> Result<(), HarnessError> {
        self.run(&[
            "create",
            "role",
            name,
            "-n",
            namespace,
            &format!("--verb={verbs}"),
            &format!("--resource={resources}"),
        ])
        .await?;
        let role = format!("--role={name}");
        let mut binding = vec!["create", "rolebinding", name, "-n", namespace, &role];
        binding.extend_from_slice(subjects);
        self.run(&binding).await?;
        Ok(())
    }

    /// Runs `kubectl <args>` and returns its stdout; a non-zero exit is an error carrying stderr.
    pub async fn run<S: AsRef<OsStr>>(&self, args: &[S]) -> Result<String, HarnessError> {
        self.run_with_stdin(args, None).await
    }

    /// Like [`Kubectl::run`], feeding `stdin` (for `kubectl apply -f -`).
    pub async fn run_with_stdin<S: AsRef<OsStr>>(
        &self,
        args: &[S],
        stdin: Option<&str>,
    ) -> Result<String, HarnessError> {
        let output = self.output(args, stdin).await?;
        if output.success {
            Ok(output.stdout)
        } else {
            Err(HarnessError::Kubectl {
                args: args
                    .iter()
                    .map(|a| a.as_ref().to_string_lossy())
                    .collect::<Vec<_>>()
                    .join(" "),
                status: output.status,
                stderr: output.stderr,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kubectl_timeout_longer_than_the_harnesss_extends_its_bound() {
        let words = |args: &[&str]| args.iter().map(|a| a.to_string()).collect::<Vec<_>>();
        assert_eq!(bound(&words(&["get", "pods"])), KUBECTL_TIMEOUT);
        assert_eq!(
            bound(&words(&["wait", "--timeout=120s", "apiservice/x"])),
            Duration::from_secs(135)
        );
        assert_eq!(bound(&words(&["wait", "--timeout=3m"])), Duration::from_secs(195));
        assert_eq!(bound(&words(&["wait", "--timeout=10s"])), KUBECTL_TIMEOUT);
        assert_eq!(bound(&words(&["wait", "--timeout=1h"])), KUBECTL_TIMEOUT);
        assert_eq!(bound(&words(&["wait", "--timeout=s"])), KUBECTL_TIMEOUT);
    }

    /// A program that answers its input as it reads it (as kubectl answers each object of a
    /// manifest) gets all of a large input, and all of its answer comes back: neither side waits
    /// for the other with a full pipe. `cat` stands in for kubectl; 1 MiB is 16 pipe buffers.
    #[tokio::test]
    async fn a_large_input_is_written_while_the_output_is_read() {
        let cat = Kubectl::new(Path::new("cat"), Path::new("/nonexistent/kubeconfig"));
        let input = "object: created\n".repeat(65_536);
        let output = tokio::time::timeout(Duration::from_secs(30), cat.output::<&str>(&[], Some(&input)))
            .await
            .expect("the exchange deadlocked")
            .unwrap();
        assert!(output.success, "{}", output.stderr);
        assert_eq!(output.stdout.len(), input.len());
    }
}
