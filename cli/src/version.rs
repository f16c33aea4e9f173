//! `selkie version`: the version, alone or as the pinniped CLI's `version -o json|yaml` fields.

use serde::Serialize;

/// Build information, with the field names of Kubernetes' `version.Info` (which the pinniped CLI
/// prints); fields Selkie's build does not record are empty.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct VersionInfo {
    /// Major version.
    pub major: String,
    /// Minor version.
    pub minor: String,
    /// `v<semver>`.
    pub git_version: String,
    /// The commit, when recorded.
    pub git_commit: String,
    /// `clean` or `dirty`, when recorded.
    pub git_tree_state: String,
    /// When built, when recorded.
    pub build_date: String,
    /// The compiler.
    pub compiler: String,
    /// `<os>/<arch>` in Go's spelling (`linux/amd64`).
    pub platform: String,
}

/// This binary's version.
pub fn info() -> VersionInfo {
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        other => other,
    };
    VersionInfo {
        major: env!("CARGO_PKG_VERSION_MAJOR").into(),
        minor: env!("CARGO_PKG_VERSION_MINOR").into(),
        git_version: concat!("v", env!("CARGO_PKG_VERSION")).into(),
        git_commit: String::new(),
        git_tree_state: String::new(),
        build_date: String::new(),
        compiler: "rustc".into(),
        platform: format!("{}/{arch}", std::env::consts::OS),
    }
}

/// What `selkie version -o <output>` prints: the bare version for `""`, indented JSON, or YAML.
pub fn render(output: &str) -> anyhow::Result<String> {
    let info = info();
    Ok(match output {
        "" => format!("{}\n", info.git_version),
        "json" => format!("{}\n", serde_json::to_string_pretty(&info)?),
        "yaml" => serde_yaml::to_string(&info)?,
        other => {
            anyhow::bail!("{other:?} is not a valid option for --output: use json or yaml, or leave it out")
        }
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn prints_the_version_like_the_pinniped_cli() {
        assert_eq!(
            super::render("").unwrap(),
            format!("v{}\n", env!("CARGO_PKG_VERSION"))
        );
        let json: serde_json::Value = serde_json::from_str(&super::render("json").unwrap()).unwrap();
        assert_eq!(json["gitVersion"], format!("v{}", env!("CARGO_PKG_VERSION")));
        assert!(super::render("xml").is_err());
    }
}
