//! `selkie-kube-cert-agent`: the program in the kube cert agent pod, which the Concierge's control
//! plane runs beside kube-controller-manager (`selkie_control_plane::kube_cert_agent`).
//!
//! * `selkie-kube-cert-agent sleep` waits until SIGTERM (or SIGINT) and exits 0; it is the pod's
//!   main process and does nothing else.
//! * `selkie-kube-cert-agent print` reads the files named by `CERT_PATH` and `KEY_PATH` and prints
//!   one JSON line, `{"tls.crt": <base64>, "tls.key": <base64>}` (Pinniped's agent output), then
//!   exits 0. The control plane runs it with `exec`.
//!
//! Any failure (no or unknown subcommand, an unset variable, an unreadable file) is one line on
//! stderr and exit status 1; the line never contains the files' contents.

use std::{io::Write as _, process::ExitCode};

use selkie_control_plane::kube_cert_agent::AgentOutput;

fn main() -> ExitCode {
    let subcommand = std::env::args().nth(1);
    let result = match subcommand.as_deref() {
        None => Err("missing subcommand (sleep or print)".to_string()),
        Some("sleep") => sleep(),
        Some("print") => print(),
        Some(other) => Err(format!("invalid subcommand {other:?} (sleep or print)")),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("selkie-kube-cert-agent: {message}");
            ExitCode::FAILURE
        }
    }
}

/// Reads the file named by the environment variable `variable`.
fn read(variable: &str) -> Result<Vec<u8>, String> {
    let path = std::env::var_os(variable)
        .filter(|path| !path.is_empty())
        .ok_or_else(|| format!("could not read {variable}: the variable is not set"))?;
    std::fs::read(&path).map_err(|error| {
        format!(
            "could not read {variable}: {}: {error}",
            std::path::Path::new(&path).display()
        )
    })
}

fn print() -> Result<(), String> {
    let cert = read("CERT_PATH")?;
    let key = read("KEY_PATH")?;
    let line = AgentOutput::new(&cert, &key).to_json_line();
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_all(line.as_bytes())
        .and_then(|()| stdout.flush())
        .map_err(|error| format!("failed to write output: {error}"))
}

fn sleep() -> Result<(), String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .map_err(|error| format!("starting: {error}"))?;
    runtime.block_on(async {
        use tokio::signal::unix::{signal, SignalKind};
        let mut terminate =
            signal(SignalKind::terminate()).map_err(|error| format!("handling SIGTERM: {error}"))?;
        let mut interrupt =
            signal(SignalKind::interrupt()).map_err(|error| format!("handling SIGINT: {error}"))?;
        tokio::select! {
            _ = terminate.recv() => {}
            _ = interrupt.recv() => {}
        }
        Ok(())
    })
}
