//! Container images built on this machine without pulling (`scripts/build-images.sh`, buildah on
//! a base made of this machine's Debian files), as docker archives a [`crate::node::Node`]
//! imports into its containerd.
//!
//! * the node's own images: the sandbox (`registry.k8s.io/pause`) from Kubernetes' pause.c, and
//!   `registry.k8s.io/kube-controller-manager` for its static pod;
//! * Selkie's images from the repository's `Containerfile` (the users' recipe) with the release
//!   binaries of this source tree, and a small busybox workload image.
//!
//! The script caches each image by its inputs, so a warm call costs seconds.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    process::Command,
    sync::OnceLock,
};

use crate::{components::tail_lines, HarnessError};

/// The image build script, run from the source tree this crate was compiled from.
pub const IMAGES_SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/build-images.sh");

/// One image: its reference (what a pod's `image:` names) and the archive holding it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Image {
    /// The full reference, for example `localhost/selkie-concierge:0123456789ab`.
    pub reference: String,
    /// The docker archive to import.
    pub archive: PathBuf,
}

impl Image {
    /// The repository part of the reference (before the last `:`).
    pub fn repository(&self) -> &str {
        self.reference
            .rsplit_once(':')
            .map_or(&self.reference, |(repo, _)| repo)
    }

    /// The tag part of the reference (after the last `:`).
    pub fn tag(&self) -> &str {
        self.reference.rsplit_once(':').map_or("", |(_, tag)| tag)
    }
}

/// Selkie's images and the test workload's.
#[derive(Debug, Clone)]
pub struct SelkieImages {
    /// The Concierge (and its kube cert agent).
    pub concierge: Image,
    /// The Supervisor.
    pub supervisor: Image,
    /// busybox, for the pods that exec, attach, port-forward and logs run against.
    pub workload: Image,
}

/// Where the archives are kept: `${SELKIE_CACHE_DIR:-~/.cache/selkie}/images`.
fn out_dir() -> PathBuf {
    let cache = std::env::var_os("SELKIE_CACHE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            std::env::var_os("XDG_CACHE_HOME")
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache"))
                .join("selkie")
        });
    cache.join("images")
}

/// The node's own images.
#[derive(Debug, Clone)]
pub struct NodeImages {
    /// The sandbox image, `registry.k8s.io/pause:<kubeadm's PauseVersion>`.
    pub pause: Image,
    /// `registry.k8s.io/kube-controller-manager:v<version>`, for its static pod.
    pub controller_manager: Image,
    /// `registry.k8s.io/coredns/coredns:v<version>`, the cluster DNS.
    pub coredns: Image,
}

impl NodeImages {
    /// Every image, to import.
    pub fn all(&self) -> [&Image; 3] {
        [&self.pause, &self.controller_manager, &self.coredns]
    }
}

/// The node's images, built once per process from the node components' binaries.
pub fn node_images() -> Result<&'static NodeImages, HarnessError> {
    static NODE: OnceLock<Result<NodeImages, String>> = OnceLock::new();
    NODE.get_or_init(|| build_node_images().map_err(|e| e.to_string()))
        .as_ref()
        .map_err(|e| HarnessError::Build {
            command: format!("bash {IMAGES_SCRIPT} node"),
            status: "failed".into(),
            tail: e.clone(),
        })
}

fn build_node_images() -> Result<NodeImages, HarnessError> {
    let node = crate::node::NodeComponents::get()?;
    let coredns_dir = node.coredns.parent().unwrap_or(Path::new("/"));
    let mut images = run(
        &[
            "node".as_ref(),
            node.kubernetes_node_bin.as_os_str(),
            coredns_dir.as_os_str(),
            out_dir().as_os_str(),
        ],
        None,
    )?;
    Ok(NodeImages {
        pause: take(&mut images, "pause", "node")?,
        controller_manager: take(&mut images, "kube-controller-manager", "node")?,
        coredns: take(&mut images, "coredns", "node")?,
    })
}

fn take(images: &mut HashMap<String, Image>, name: &str, mode: &str) -> Result<Image, HarnessError> {
    images.remove(name).ok_or_else(|| HarnessError::Build {
        command: format!("bash {IMAGES_SCRIPT} {mode}"),
        status: format!("succeeded but did not print `{name}=`"),
        tail: String::new(),
    })
}

/// Selkie's images from this source tree's release build (`cargo build --release` of the
/// Concierge and the Supervisor first), tagged by the binaries' hash; built once per process.
pub fn selkie_images() -> Result<&'static SelkieImages, HarnessError> {
    static SELKIE: OnceLock<Result<SelkieImages, String>> = OnceLock::new();
    SELKIE
        .get_or_init(|| build_selkie_images(None).map_err(|e| e.to_string()))
        .as_ref()
        .map_err(|e| HarnessError::Build {
            command: format!("bash {IMAGES_SCRIPT} selkie"),
            status: "failed".into(),
            tail: e.clone(),
        })
}

/// Selkie's images again under another tag (same binaries): a new image for a rolling upgrade.
pub fn selkie_images_tagged(tag: &str) -> Result<SelkieImages, HarnessError> {
    build_selkie_images(Some(tag))
}

fn build_selkie_images(tag: Option<&str>) -> Result<SelkieImages, HarnessError> {
    let binaries = release_binaries()?;
    let mut images = run(
        &["selkie".as_ref(), binaries.as_os_str(), out_dir().as_os_str()],
        tag,
    )?;
    Ok(SelkieImages {
        concierge: take(&mut images, "concierge", "selkie")?,
        supervisor: take(&mut images, "supervisor", "selkie")?,
        workload: take(&mut images, "workload", "selkie")?,
    })
}

/// Builds the release binaries the images carry and returns their directory (`target/release`).
fn release_binaries() -> Result<PathBuf, HarnessError> {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let args = [
        "build",
        "--release",
        "--locked",
        "-p",
        "selkie-concierge",
        "-p",
        "selkie-supervisor",
    ];
    let mut build = Command::new(&cargo);
    build.current_dir(&workspace).args(args);
    // A test process has the variables cargo set for *its* package (`CARGO_PKG_DESCRIPTION`, …);
    // the binaries read theirs at compile time, so passing these on would make cargo see changed
    // inputs and relink both (minutes with LTO) on every run.
    for (name, _) in std::env::vars_os() {
        let name = name.to_string_lossy();
        if [
            "CARGO_PKG_",
            "CARGO_CRATE_",
            "CARGO_MANIFEST_",
            "CARGO_BIN_",
            "CARGO_PRIMARY_PACKAGE",
            "CARGO_TARGET_TMPDIR",
        ]
        .iter()
        .any(|prefix| name.starts_with(prefix))
        {
            build.env_remove(name.as_ref());
        }
    }
    let output = build
        .output()
        .map_err(|e| HarnessError::io("running cargo build --release", e))?;
    if !output.status.success() {
        return Err(HarnessError::Build {
            command: format!("cargo {}", args.join(" ")),
            status: output.status.to_string(),
            tail: tail_lines(&String::from_utf8_lossy(&output.stderr), 30),
        });
    }
    let target = std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| workspace.join("target"), PathBuf::from);
    Ok(target.join("release"))
}

/// Runs the script and parses its `<name>=<archive> <reference>` lines.
fn run(args: &[&std::ffi::OsStr], tag: Option<&str>) -> Result<HashMap<String, Image>, HarnessError> {
    let command = format!(
        "bash {IMAGES_SCRIPT} {}",
        args.iter()
            .map(|a| a.to_string_lossy())
            .collect::<Vec<_>>()
            .join(" ")
    );
    let mut script = Command::new("bash");
    script.arg(IMAGES_SCRIPT).args(args);
    if let Some(tag) = tag {
        script.env("SELKIE_IMAGE_TAG", tag);
    }
    let output = script
        .output()
        .map_err(|e| HarnessError::io(format!("running `{command}`"), e))?;
    if !output.status.success() {
        return Err(HarnessError::Build {
            command,
            status: output.status.to_string(),
            tail: tail_lines(&String::from_utf8_lossy(&output.stderr), 40),
        });
    }
    Ok(parse_images(&String::from_utf8_lossy(&output.stdout)))
}

fn parse_images(stdout: &str) -> HashMap<String, Image> {
    stdout
        .lines()
        .filter_map(|line| {
            let (name, rest) = line.split_once('=')?;
            let (archive, reference) = rest.trim().split_once(' ')?;
            Some((
                name.to_string(),
                Image {
                    reference: reference.trim().to_string(),
                    archive: PathBuf::from(archive),
                },
            ))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_script_lines_name_each_image_with_its_archive_and_reference() {
        let images = parse_images(
            "concierge=/c/concierge.tar localhost/selkie-concierge:abc\nnoise\npause=/c/pause.tar registry.k8s.io/pause:3.10.1\n",
        );
        assert_eq!(images.len(), 2);
        let pause = &images["pause"];
        assert_eq!(pause.archive, PathBuf::from("/c/pause.tar"));
        assert_eq!(pause.repository(), "registry.k8s.io/pause");
        assert_eq!(pause.tag(), "3.10.1");
        assert_eq!(images["concierge"].reference, "localhost/selkie-concierge:abc");
    }
}
