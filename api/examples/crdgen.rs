//! Writes the Concierge and Supervisor CRDs into `conf/crds/`, one file per CRD, from the types in `api/src`.
//!
//! ```text
//! cargo run -p selkie-api --example crdgen                       # conf/crds/, pinniped.dev
//! cargo run -p selkie-api --example crdgen -- --api-group-suffix acme.example.com OUT_DIR
//! ```
//!
//! With no directory it writes the committed `conf/crds/` (default suffix only) and removes any
//! other `.yaml` there, so a renamed CRD leaves no stale file behind. The drift test in
//! `selkie_api::crds` fails until this has been run after a type changes.

use std::path::PathBuf;

use anyhow::{bail, Context};

fn main() -> anyhow::Result<()> {
    let mut suffix = selkie_api::group_suffix::DEFAULT_API_GROUP_SUFFIX.to_owned();
    let mut out_dir = None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--api-group-suffix" => suffix = args.next().context("--api-group-suffix needs a value")?,
            "-h" | "--help" => {
                println!("usage: crdgen [--api-group-suffix SUFFIX] [OUT_DIR (default conf/crds)]");
                return Ok(());
            }
            flag if flag.starts_with('-') => bail!("unknown flag {flag}"),
            dir => out_dir = Some(PathBuf::from(dir)),
        }
    }
    let committed = out_dir.is_none();
    if committed && suffix != selkie_api::group_suffix::DEFAULT_API_GROUP_SUFFIX {
        bail!("conf/crds holds the default suffix only; give an OUT_DIR for --api-group-suffix {suffix}");
    }
    let out_dir = out_dir.unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../conf/crds"));
    std::fs::create_dir_all(&out_dir).with_context(|| format!("creating {}", out_dir.display()))?;

    let files = selkie_api::crds::render_all(&suffix)?;
    if committed {
        for entry in std::fs::read_dir(&out_dir)? {
            let path = entry?.path();
            let name = path
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or_default()
                .to_owned();
            if name.ends_with(".yaml") && !files.iter().any(|(file, _)| *file == name) {
                std::fs::remove_file(&path).with_context(|| format!("removing stale {}", path.display()))?;
                println!("removed {}", path.display());
            }
        }
    }
    for (name, yaml) in files {
        let path = out_dir.join(name);
        std::fs::write(&path, yaml).with_context(|| format!("writing {}", path.display()))?;
        println!("wrote {}", path.display());
    }
    Ok(())
}
