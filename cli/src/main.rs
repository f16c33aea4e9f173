//! # selkie
//!
//! The command users meet: a kubectl exec credential plugin and admin CLI with the commands and
//! flags of the pinniped CLI — `get kubeconfig`, `login oidc`, `login static`, `whoami`, `version`
//! — sharing its cache files so kubeconfigs and habits carry over.
//!
//! Status: only `selkie version` exists; the commands arrive with the CLI work.

use std::process::ExitCode;

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    match args.next().as_deref() {
        Some("version") | Some("--version") => {
            println!("selkie {}", env!("CARGO_PKG_VERSION"));
            ExitCode::SUCCESS
        }
        _ => {
            eprintln!("selkie: no commands are implemented yet except `selkie version`");
            ExitCode::from(2)
        }
    }
}
