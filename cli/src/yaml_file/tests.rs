use std::os::unix::fs::PermissionsExt as _;

use super::*;

#[derive(Debug, PartialEq, Serialize, Deserialize)]
struct Doc {
    #[serde(rename = "apiVersion", default)]
    api_version: String,
    #[serde(default)]
    kind: String,
    #[serde(default, deserialize_with = "null_as_empty")]
    items: Vec<String>,
}

impl Document for Doc {
    const NAME: &'static str = "thing";

    fn empty() -> Self {
        Self {
            api_version: "example.dev/v1".into(),
            kind: "Thing".into(),
            items: Vec::new(),
        }
    }

    fn header(&self) -> (&str, &str) {
        (&self.api_version, &self.kind)
    }
}

fn doc(items: &[&str]) -> Doc {
    Doc {
        items: items.iter().map(|item| item.to_string()).collect(),
        ..Doc::empty()
    }
}

struct Fixture {
    _dir: tempfile::TempDir,
    file: YamlFile,
}

impl Fixture {
    /// A file two directories below a fresh temporary directory; neither exists yet.
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let file = YamlFile::new(dir.path().join("a/b/things.yaml"));
        Self { _dir: dir, file }
    }

    /// Writes `content` as the file with `mode`.
    fn put(&self, content: &str, mode: u32) {
        fs::create_dir_all(self.file.path().parent().unwrap()).unwrap();
        fs::write(self.file.path(), content).unwrap();
        fs::set_permissions(self.file.path(), fs::Permissions::from_mode(mode)).unwrap();
    }

    fn mode(&self, path: &Path) -> u32 {
        fs::metadata(path).unwrap().permissions().mode() & 0o7777
    }
}

#[test]
fn a_missing_file_is_an_empty_document_and_stays_missing() {
    let fixture = Fixture::new();
    for open in [OpenToOthers::Tighten, OpenToOthers::Refuse] {
        let loaded = fixture.file.load::<Doc>(open).unwrap();
        assert_eq!(loaded.document, Doc::empty());
        assert!(loaded.tightened_from.is_none() && loaded.corrupt.is_none());
    }
    assert!(!fixture.file.path().exists());
    assert!(!fixture.file.aside_path().exists());
}

#[tokio::test]
async fn the_lock_makes_a_private_directory_and_lock_file() {
    let fixture = Fixture::new();
    let lock = fixture.file.lock(Duration::from_secs(1)).await.unwrap();
    let dir = fixture.file.path().parent().unwrap();
    assert_eq!(fixture.mode(dir), 0o700);
    assert_eq!(fixture.file.lock_path(), dir.join("things.yaml.lock"));
    assert_eq!(fixture.mode(&fixture.file.lock_path()), 0o600);
    assert!(!fixture.file.path().exists(), "locking writes no document");

    // Held: a second taker waits, then gives up; released: it gets it.
    let error = fixture.file.lock(Duration::from_millis(50)).await.unwrap_err();
    match &error {
        LockError::Timeout { lock, timeout } => {
            assert_eq!(
                (lock, *timeout),
                (&fixture.file.lock_path(), Duration::from_millis(50))
            );
        }
        other => panic!("{other:?}"),
    }
    assert!(error.to_string().contains("was not released within"), "{error}");
    drop(lock);
    fixture.file.lock(Duration::from_millis(50)).await.unwrap();
}

#[tokio::test]
async fn a_stored_document_loads_back_from_a_0600_file() {
    let fixture = Fixture::new();
    let lock = fixture.file.lock(Duration::from_secs(1)).await.unwrap();
    fixture.file.store(&doc(&["one", "two"])).unwrap();
    assert_eq!(fixture.mode(fixture.file.path()), 0o600);
    let text = fs::read_to_string(fixture.file.path()).unwrap();
    assert_eq!(
        text,
        "apiVersion: example.dev/v1\nkind: Thing\nitems:\n- one\n- two\n"
    );
    let loaded = fixture.file.load::<Doc>(OpenToOthers::Refuse).unwrap();
    assert_eq!(loaded.document, doc(&["one", "two"]));
    assert!(loaded.tightened_from.is_none() && loaded.corrupt.is_none());

    // A replacement is 0600 whatever the old file's mode, and leaves no temporary file behind.
    fs::set_permissions(fixture.file.path(), fs::Permissions::from_mode(0o644)).unwrap();
    fixture.file.store(&doc(&[])).unwrap();
    assert_eq!(fixture.mode(fixture.file.path()), 0o600);
    let names: Vec<_> = fs::read_dir(fixture.file.path().parent().unwrap())
        .unwrap()
        .map(|entry| entry.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(names.len(), 2, "the file and its lock: {names:?}");
    drop(lock);
}

#[test]
fn a_null_list_is_an_empty_one() {
    let fixture = Fixture::new();
    fixture.put("apiVersion: example.dev/v1\nkind: Thing\nitems: null\n", 0o600);
    let loaded = fixture.file.load::<Doc>(OpenToOthers::Refuse).unwrap();
    assert_eq!(loaded.document, Doc::empty());
    assert!(loaded.corrupt.is_none());
}

#[test]
fn a_corrupt_file_is_moved_aside_and_an_empty_document_returned() {
    for (content, reason) in [
        (
            "items: [not: yaml\n  secret-abc",
            "is not valid thing YAML (line ",
        ),
        (
            "items: \"secret-abc\"\n",
            "is not valid thing YAML (line 1 column ",
        ),
        (
            "apiVersion: example.dev/v2\nkind: Thing\nitems: [secret-abc]\n",
            "is a \"Thing\" of apiVersion \"example.dev/v2\", not a Thing of example.dev/v1",
        ),
        (
            "apiVersion: example.dev/v1\nitems: [secret-abc]\n",
            "is a \"\" of apiVersion \"example.dev/v1\", not a Thing of example.dev/v1",
        ),
    ] {
        let fixture = Fixture::new();
        fixture.put(content, 0o600);
        let loaded = fixture.file.load::<Doc>(OpenToOthers::Refuse).unwrap();
        assert_eq!(loaded.document, Doc::empty());
        let corrupt = loaded.corrupt.unwrap();
        assert!(corrupt.reason.starts_with(reason), "{}", corrupt.reason);
        assert!(!corrupt.reason.contains("secret-abc"), "{}", corrupt.reason);
        let aside = fixture.file.path().with_file_name("things.yaml.corrupt");
        assert_eq!(corrupt.moved.unwrap(), aside);
        assert_eq!(fixture.file.aside_path(), aside);
        assert_eq!(fs::read_to_string(&aside).unwrap(), content);
        assert!(!fixture.file.path().exists());
    }
}

#[test]
fn a_corrupt_file_that_cannot_be_moved_stays_where_it_is() {
    let fixture = Fixture::new();
    fixture.put("{{{", 0o600);
    // A non-empty directory where the file would go: the rename fails.
    fs::create_dir_all(fixture.file.aside_path().join("x")).unwrap();
    let loaded = fixture.file.load::<Doc>(OpenToOthers::Tighten).unwrap();
    assert_eq!(loaded.document, Doc::empty());
    let corrupt = loaded.corrupt.unwrap();
    assert!(
        corrupt.reason.starts_with("is not valid thing YAML"),
        "{}",
        corrupt.reason
    );
    assert!(corrupt.moved.is_err());
    assert_eq!(fs::read_to_string(fixture.file.path()).unwrap(), "{{{");
}

#[test]
fn a_file_open_to_others_is_tightened_or_refused_before_it_is_read() {
    let fixture = Fixture::new();
    fixture.put("apiVersion: example.dev/v1\nkind: Thing\nitems: [x]\n", 0o640);

    let error = fixture.file.load::<Doc>(OpenToOthers::Refuse).unwrap_err();
    assert!(
        matches!(error, LoadError::OpenToOthers { mode: 0o640 }),
        "{error:?}"
    );
    assert_eq!(fixture.mode(fixture.file.path()), 0o640, "refused, not changed");

    let loaded = fixture.file.load::<Doc>(OpenToOthers::Tighten).unwrap();
    assert_eq!(loaded.tightened_from, Some(0o640));
    assert_eq!(loaded.document, doc(&["x"]));
    assert_eq!(fixture.mode(fixture.file.path()), 0o600);

    // Refused content is not judged either: a corrupt open file stays in place.
    fixture.put("{{{", 0o604);
    let error = fixture.file.load::<Doc>(OpenToOthers::Refuse).unwrap_err();
    assert!(
        matches!(error, LoadError::OpenToOthers { mode: 0o604 }),
        "{error:?}"
    );
    assert!(!fixture.file.aside_path().exists());
}

#[test]
fn something_else_in_the_way_is_an_io_failure_and_is_left_alone() {
    let fixture = Fixture::new();
    fs::create_dir_all(fixture.file.path()).unwrap();
    fs::set_permissions(fixture.file.path(), fs::Permissions::from_mode(0o755)).unwrap();
    for open in [OpenToOthers::Tighten, OpenToOthers::Refuse] {
        match fixture.file.load::<Doc>(open).unwrap_err() {
            LoadError::Io(failure) => assert_eq!(failure.action, "reading it"),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(
        fixture.mode(fixture.file.path()),
        0o755,
        "a directory is not chmodded"
    );
    let failure = fixture.file.store(&doc(&[])).unwrap_err();
    assert_eq!(failure.action, "writing it");
    assert!(fixture.file.path().is_dir());
}
