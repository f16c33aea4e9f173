use std::{
    fs::{self, File},
    os::unix::fs::PermissionsExt as _,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
};

use super::*;

const ARGS: [&str; 6] = [
    "login",
    "static",
    "--enable-concierge",
    "--concierge-endpoint=https://127.0.0.1:8443",
    "--token-env",
    "T<&>",
];

fn args() -> Vec<String> {
    ARGS.iter().map(|arg| arg.to_string()).collect()
}

// The expected keys were computed by Go with the pinniped CLI's key struct and client-go's
// v1beta1.Cluster, hashed through json.NewEncoder as Pinniped's execcredcache does.
#[test]
fn keys_are_the_pinniped_cli_keys() {
    assert_eq!(
        cache_key(&args(), "tok\u{2028}en\n", None),
        "ef7e95a5c0e5b6f9c95381bbe31957e5ec382c0c2d60e7f83b419cdbb544e0f4"
    );
    let full: Cluster = serde_json::from_str(
        r#"{"server":"https://127.0.0.1:8443/x","tls-server-name":"proxy","insecure-skip-tls-verify":true,
            "certificate-authority-data":"LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCmFiYwo=",
            "proxy-url":"http://proxy:3128","disable-compression":true,"config":{ "a" : "<b>" }}"#,
    )
    .unwrap();
    assert_eq!(
        cache_key(&args(), "t", Some(&full)),
        "b50d43b61da73901172475740a220ea827f1761531bba658321e93c314431892"
    );
    let bare: Cluster = serde_json::from_str(r#"{"server":"https://127.0.0.1:8443"}"#).unwrap();
    assert_eq!(
        cache_key(&args(), "t", Some(&bare)),
        "92891429367b5d1dacc6d7dec8b3fac3b13e2e98b44cc50732872a01355a4d32"
    );
}

fn credential(expires_in: time::Duration, label: &str) -> CredentialStatus {
    CredentialStatus {
        expiration_timestamp: Some(timestamp::format(timestamp::now() + expires_in)),
        client_certificate_data: format!("CERT {label}"),
        client_key_data: format!("KEY {label}"),
        ..CredentialStatus::default()
    }
}

struct Fixture {
    _dir: tempfile::TempDir,
    cache: CredentialCache,
    fetches: Arc<AtomicUsize>,
    warnings: Vec<String>,
}

impl Fixture {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let cache = CredentialCache::new(dir.path().join("pinniped").join("credentials.yaml"));
        Self {
            _dir: dir,
            cache,
            fetches: Arc::default(),
            warnings: Vec::new(),
        }
    }

    /// `get_or_fetch` with a fetch that counts and returns a credential valid for `valid_for`.
    async fn get(&mut self, key: &str, valid_for: time::Duration) -> (CredentialStatus, Source) {
        let fetches = self.fetches.clone();
        let label = key.to_string();
        let warnings = &mut self.warnings;
        self.cache
            .get_or_fetch(
                key,
                || async move {
                    let n = fetches.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, String>(credential(valid_for, &format!("{label}-{n}")))
                },
                &mut |warning| warnings.push(warning.to_string()),
            )
            .await
            .unwrap()
    }

    fn file(&self) -> String {
        fs::read_to_string(self.cache.path()).unwrap()
    }

    fn mode(&self) -> u32 {
        fs::metadata(self.cache.path()).unwrap().permissions().mode() & 0o777
    }
}

const FIVE_MINUTES: time::Duration = time::Duration::minutes(5);

#[tokio::test]
async fn a_miss_is_fetched_and_stored_then_reused() {
    let mut fixture = Fixture::new();
    let (first, source) = fixture.get("k1", FIVE_MINUTES).await;
    assert_eq!(source, Source::Fetched);
    assert_eq!(fixture.mode(), 0o600);
    let file: serde_yaml::Value = serde_yaml::from_str(&fixture.file()).unwrap();
    assert_eq!(file["apiVersion"], API_VERSION);
    assert_eq!(file["kind"], KIND);
    assert_eq!(file["credentials"][0]["key"], "k1");
    assert_eq!(file["credentials"][0]["credential"]["clientKeyData"], "KEY k1-0");
    for field in ["creationTimestamp", "lastUsedTimestamp"] {
        let stamp = file["credentials"][0][field].as_str().unwrap();
        assert!(timestamp::parse(stamp).is_some(), "{field}: {stamp}");
    }

    let (again, source) = fixture.get("k1", FIVE_MINUTES).await;
    assert_eq!((source, &again), (Source::Cache, &first));
    let (other, source) = fixture.get("k2", FIVE_MINUTES).await;
    assert_eq!(source, Source::Fetched);
    assert_ne!(other, first);
    assert_eq!(fixture.fetches.load(Ordering::SeqCst), 2);
    assert!(fixture.warnings.is_empty(), "{:?}", fixture.warnings);
    assert!(fixture.cache.lock_path().exists());
}

#[tokio::test]
async fn a_credential_close_to_expiry_is_replaced() {
    let mut fixture = Fixture::new();
    fixture.get("k", time::Duration::seconds(5)).await;
    let (_, source) = fixture.get("k", FIVE_MINUTES).await;
    assert_eq!(source, Source::Fetched, "5 s left is too little");
    let file: CacheFile = serde_yaml::from_str(&fixture.file()).unwrap();
    assert_eq!(file.credentials.len(), 1, "replaced, not added");
    let (_, source) = fixture.get("k", FIVE_MINUTES).await;
    assert_eq!(source, Source::Cache);
}

#[tokio::test]
async fn stale_entries_are_pruned_like_pinniped_prunes_them() {
    let mut fixture = Fixture::new();
    let now = timestamp::now();
    let stamp = |offset: time::Duration| timestamp::format(now + offset);
    let entry = |key: &str, created: time::Duration, expires: Option<time::Duration>| Entry {
        key: key.into(),
        creation_timestamp: Some(stamp(created)),
        last_used_timestamp: Some(stamp(created)),
        credential: Some(CredentialStatus {
            expiration_timestamp: expires.map(stamp),
            token: "t".into(),
            ..CredentialStatus::default()
        }),
    };
    let file = CacheFile {
        credentials: vec![
            entry(
                "expired",
                -time::Duration::minutes(10),
                Some(-time::Duration::minutes(1)),
            ),
            entry(
                "too-old",
                -time::Duration::minutes(61),
                Some(time::Duration::hours(1)),
            ),
            entry("no-expiry", -time::Duration::minutes(1), None),
            entry(
                "younger",
                -time::Duration::minutes(1),
                Some(time::Duration::hours(1)),
            ),
            entry(
                "older",
                -time::Duration::minutes(2),
                Some(time::Duration::hours(1)),
            ),
        ],
        ..CacheFile::empty()
    };
    fs::create_dir_all(fixture.cache.path().parent().unwrap()).unwrap();
    fs::write(fixture.cache.path(), serde_yaml::to_string(&file).unwrap()).unwrap();
    fs::set_permissions(fixture.cache.path(), fs::Permissions::from_mode(0o600)).unwrap();

    let (reused, source) = fixture.get("younger", FIVE_MINUTES).await;
    assert_eq!((source, reused.token.as_str()), (Source::Cache, "t"));
    let file: CacheFile = serde_yaml::from_str(&fixture.file()).unwrap();
    let keys: Vec<&str> = file.credentials.iter().map(|e| e.key.as_str()).collect();
    assert_eq!(keys, ["older", "younger"], "pruned and ordered by creation");
}

#[tokio::test]
async fn reads_a_file_the_pinniped_cli_wrote() {
    let mut fixture = Fixture::new();
    let expires = timestamp::format(timestamp::now() + time::Duration::minutes(4));
    let created = timestamp::format(timestamp::now() - time::Duration::minutes(1));
    // sigs.k8s.io/yaml output: sorted keys, quoted timestamps, block scalars for PEM.
    let written_by_go = format!(
        "apiVersion: config.supervisor.pinniped.dev/v1alpha1\ncredentials:\n- creationTimestamp: \"{created}\"\n  \
         credential:\n    clientCertificateData: |\n      -----BEGIN CERTIFICATE-----\n      MIIB\n      -----END CERTIFICATE-----\n    \
         clientKeyData: |\n      -----BEGIN PRIVATE KEY-----\n      MIGH\n      -----END PRIVATE KEY-----\n    \
         expirationTimestamp: \"{expires}\"\n  key: go-key\n  lastUsedTimestamp: \"{created}\"\nkind: CredentialCache\n"
    );
    fs::create_dir_all(fixture.cache.path().parent().unwrap()).unwrap();
    fs::write(fixture.cache.path(), written_by_go).unwrap();
    let (credential, source) = fixture.get("go-key", FIVE_MINUTES).await;
    assert_eq!(source, Source::Cache);
    assert_eq!(
        credential.client_certificate_data,
        "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
    );
    assert_eq!(credential.expiration_timestamp.as_deref(), Some(expires.as_str()));
}

#[tokio::test]
async fn a_corrupt_file_is_set_aside_with_one_warning() {
    for (content, reason) in [
        (
            "credentials: [this is: not: yaml\n  secret-token-abc",
            "is not valid credential-cache YAML",
        ),
        (
            "apiVersion: config.supervisor.pinniped.dev/v2\nkind: CredentialCache\ncredentials: []\n",
            "not a CredentialCache of config.supervisor.pinniped.dev/v1alpha1",
        ),
        (
            "credentials: \"secret-token-abc\"\n",
            "is not valid credential-cache YAML",
        ),
    ] {
        let mut fixture = Fixture::new();
        fs::create_dir_all(fixture.cache.path().parent().unwrap()).unwrap();
        fs::write(fixture.cache.path(), content).unwrap();
        fs::set_permissions(fixture.cache.path(), fs::Permissions::from_mode(0o600)).unwrap();
        let (_, source) = fixture.get("k", FIVE_MINUTES).await;
        assert_eq!(source, Source::Fetched);
        assert_eq!(fixture.warnings.len(), 1, "{:?}", fixture.warnings);
        let warning = &fixture.warnings[0];
        assert!(warning.contains(reason), "{warning}");
        assert!(warning.contains(".corrupt"), "{warning}");
        assert!(!warning.contains("secret-token-abc"), "{warning}");
        assert_eq!(fs::read_to_string(fixture.cache.aside_path()).unwrap(), content);
        let file: CacheFile = serde_yaml::from_str(&fixture.file()).unwrap();
        assert_eq!(
            (file.api_version.as_str(), file.credentials.len()),
            (API_VERSION, 1)
        );
    }
}

#[tokio::test]
async fn a_file_others_can_read_is_tightened_with_a_warning() {
    let mut fixture = Fixture::new();
    fixture.get("k", FIVE_MINUTES).await;
    fs::set_permissions(fixture.cache.path(), fs::Permissions::from_mode(0o644)).unwrap();
    let (_, source) = fixture.get("k", FIVE_MINUTES).await;
    assert_eq!(source, Source::Cache);
    assert_eq!(fixture.warnings.len(), 1, "{:?}", fixture.warnings);
    assert!(
        fixture.warnings[0].contains("mode 0644"),
        "{}",
        fixture.warnings[0]
    );
    assert_eq!(fixture.mode(), 0o600);

    // Also when the login then fails and nothing is written.
    fs::set_permissions(fixture.cache.path(), fs::Permissions::from_mode(0o640)).unwrap();
    let result = fixture
        .cache
        .get_or_fetch(
            "other",
            || async { Err::<CredentialStatus, _>("refused") },
            &mut |_| {},
        )
        .await;
    assert!(result.is_err());
    assert_eq!(fixture.mode(), 0o600);
}

#[tokio::test]
async fn an_unusable_cache_is_a_warning_and_the_login_goes_on() {
    let mut fixture = Fixture::new();
    // A directory where the file should be: it can be neither read nor replaced.
    fs::create_dir_all(fixture.cache.path()).unwrap();
    let (_, source) = fixture.get("k", FIVE_MINUTES).await;
    assert_eq!(source, Source::Fetched);
    assert_eq!(fixture.warnings.len(), 1, "{:?}", fixture.warnings);
    assert!(
        fixture.warnings[0].contains("cannot use the credential cache"),
        "{}",
        fixture.warnings[0]
    );
    assert!(
        fixture.warnings[0].contains("--credential-cache \"\""),
        "{}",
        fixture.warnings[0]
    );
}

#[tokio::test]
async fn a_failed_fetch_stores_nothing() {
    let fixture = Fixture::new();
    let result = fixture
        .cache
        .get_or_fetch(
            "k",
            || async { Err::<CredentialStatus, _>("refused") },
            &mut |_| {},
        )
        .await;
    assert_eq!(result.unwrap_err(), "refused");
    assert!(!fixture.cache.path().exists());
}

#[tokio::test]
async fn a_held_lock_is_waited_for_then_given_up_with_a_warning() {
    let mut fixture = Fixture::new();
    fixture.cache = fixture
        .cache
        .clone()
        .with_lock_timeout(Duration::from_millis(200));
    fs::create_dir_all(fixture.cache.path().parent().unwrap()).unwrap();
    let holder = File::create(fixture.cache.lock_path()).unwrap();
    holder.lock().unwrap();
    let (_, source) = fixture.get("k", FIVE_MINUTES).await;
    assert_eq!(source, Source::Fetched);
    assert!(
        fixture.warnings[0].contains("was not released within"),
        "{:?}",
        fixture.warnings
    );
    assert!(
        !fixture.cache.path().exists(),
        "nothing is written without the lock"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_misses_fetch_once() {
    let fixture = Fixture::new();
    let fetches = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..20 {
        let cache = fixture.cache.clone();
        let fetches = fetches.clone();
        tasks.push(tokio::spawn(async move {
            cache
                .get_or_fetch(
                    "shared",
                    || async move {
                        fetches.fetch_add(1, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        Ok::<_, String>(credential(FIVE_MINUTES, "shared"))
                    },
                    &mut |warning| panic!("{warning}"),
                )
                .await
                .unwrap()
        }));
    }
    let mut sources = Vec::new();
    for task in tasks {
        sources.push(task.await.unwrap().1);
    }
    assert_eq!(fetches.load(Ordering::SeqCst), 1);
    assert_eq!(sources.iter().filter(|s| **s == Source::Fetched).count(), 1);
}
